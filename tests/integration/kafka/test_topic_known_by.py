"""A target topic's deletion is confirmed broker by broker (mirror_core.engine.lane_session.target_topic_gone, on
ClusterMetadata.broker_ids / topic_known_by), against a real broker: the broker list comes from the cluster's own
Metadata answer, a broker asked directly says whether it knows the topic (with the topic id it has now), and a
topic deleted for real is confirmed gone while one that exists is not — so the second look that keeps a lagging
broker from halting a lane never hides a real deletion."""

from __future__ import annotations

import time

import mirror_core.engine.lane_session as lane_session
from mirror_core.kafka.wire_client import WireClient


def _eventually(check, timeout_s: float = 15.0):
    """``check()`` once the broker has applied a topic change the controller already acknowledged."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the broker did not apply the topic change in time"
        time.sleep(0.2)


def test_a_broker_asked_directly_tells_a_topic_it_knows_from_a_deleted_one(target_cluster, unique_name,
                                                                           monkeypatch):
    monkeypatch.setattr(lane_session, "TARGET_DELETION_CONFIRM_S", 0.0)
    topic = target_cluster.create_topic(unique_name())
    with WireClient(target_cluster.name, dict(target_cluster.config.settings)) as client:
        pinned = str(client.topic_metadata(topic, refresh=True).topic_id)
        nodes = client.broker_ids()
        assert nodes and all(isinstance(node, int) and node >= 0 for node in nodes)
        assert {client.topic_known_by(node, topic) for node in nodes} == {pinned}
        assert not lane_session.target_topic_gone(client, topic)           # it exists: no confirmation

        target_cluster.recreate_topic(topic)
        _eventually(lambda: {client.topic_known_by(node, topic) for node in nodes} - {None, pinned})
        new_id = client.topic_known_by(nodes[0], topic)
        assert new_id != pinned                                             # the new incarnation's id
        assert not lane_session.target_topic_gone(client, topic)           # recreated is not gone: ids judge that

        target_cluster.admin.delete(topic)
        _eventually(lambda: all(client.topic_known_by(node, topic) is None for node in nodes))
        assert lane_session.target_topic_gone(client, topic)
        assert client.topic_known_by(nodes[0], unique_name("never")) is None
