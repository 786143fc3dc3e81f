"""Review of the rescan (issue #18, branch i18-flat): what the rescan makes of a Metadata answer it cannot take at
face value.

- A topic answered with an error (its leader being elected on an older broker, a describe ACL briefly missing, a
  broker whose metadata lags) is still there: the group must not be told to drop it, or every daemon's lanes of it
  are revoked and closed until the next rescan answers cleanly.
- A topic whose lanes do not cover its partitions 0..n-1 (lanes adopted from the halted checkpoints of a deleted
  incarnation with more partitions, then the topic re-created) must get the missing lanes: the count of lanes
  alone does not say which partitions they are.

The source answers Metadata with kafka-python's encoding of a real MetadataResponse (the real decoder runs).
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest
from kafka.future import Future
from kafka.protocol.metadata import MetadataResponse

from mirror_core.daemon.lane_state import LaneState
from tests.unit.daemon.test_daemon_rescan import _lanes, rescan_daemon

T = MetadataResponse.MetadataResponseTopic
P = T.MetadataResponsePartition


class Source:
    """``topics`` (name → partitions) answered on the metadata connection; ``errors`` (name → error code) answered
    for those topics instead of their partitions, as a broker does."""

    cluster_name = "source"

    def __init__(self, topics: dict[str, int]):
        self.topics, self.errors = dict(topics), {}

    def metadata_connection(self):
        return self, False

    def version(self, api_key, low, high):
        return high

    def send_encoded(self, request, version, decoder, *, flexible_response):
        answer = MetadataResponse(
            throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, error_code=0, authorized_operations=None,
            topics=[T(error_code=self.errors.get(name, 0), name=name, topic_id=uuid.uuid4(), is_internal=False,
                      authorized_operations=None,
                      partitions=[] if name in self.errors else [
                          P(error_code=0, partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=[1],
                            isr_nodes=[1], offline_replicas=[]) for i in range(count)])
                    for name, count in self.topics.items()])
        return Future().success(decoder(memoryview(bytes(answer.encode(version=version)))))

    def wait(self, future):
        pass


@pytest.fixture
def daemon(monkeypatch):
    return rescan_daemon(monkeypatch, Source({"orders.a": 2, "orders.b": 1}))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("error", [Errors.LeaderNotAvailableError, Errors.TopicAuthorizationFailedError])
def test_a_topic_answered_with_an_error_stays_subscribed(daemon, error):
    """Failed before the fix: the errored topic vanished from the subscription (["orders.b"]), so the group
    revoked all its partitions from every daemon although nothing was deleted."""
    subscribed = []
    daemon.membership = NS(subscribe=subscribed.append)
    daemon._rescan()
    daemon.source.errors["orders.a"] = error.errno
    daemon._rescan()
    assert subscribed == [["orders.a", "orders.b"], ["orders.a", "orders.b"]]
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1), ("orders.b", 0)}   # no lane made or lost
    assert daemon.prepared == [[("orders.a", "dr.orders.a", 2), ("orders.b", "dr.orders.b", 1)]]


@pytest.mark.timeout(20)
def test_an_unknown_topic_in_the_answer_is_unsubscribed_like_a_deleted_one(daemon):
    subscribed = []
    daemon.membership = NS(subscribe=subscribed.append)
    daemon._rescan()
    daemon.source.errors["orders.a"] = Errors.UnknownTopicOrPartitionError.errno
    daemon._rescan()
    assert subscribed[-1] == ["orders.b"]


@pytest.mark.timeout(20)
def test_partitions_without_lanes_get_them_even_when_the_lane_count_matches(daemon):
    """Halted lanes of partitions 2 and 3 of a deleted 4-partition incarnation of orders.a were adopted from
    their checkpoints; orders.a now exists again with 2 partitions. Failed before the fix: two lanes for two
    partitions read as "in step", so partitions 0 and 1 never got lanes."""
    del daemon.source.topics["orders.a"]
    daemon._rescan()
    for p in (2, 3):
        daemon.lanes[f"dr.orders.a-{p}"] = LaneState("orders.a", p, "dr.orders.a", f"dr.orders.a-{p}",
                                                       health=daemon._new_health())
    daemon.source.topics["orders.a"] = 2
    daemon._rescan()
    assert {("orders.a", 0), ("orders.a", 1)} <= _lanes(daemon)
    assert daemon.prepared[-1] == [("orders.a", "dr.orders.a", 2)]


@pytest.mark.timeout(20)
def test_a_topic_recreated_with_fewer_partitions_is_not_prepared_again_at_every_rescan(daemon):
    """Lanes of partitions 0..3 (the old incarnation); the topic now has 2: its lanes cover 0..1, so it is in
    step. Failed before the fix: 4 lanes != 2 partitions sent it to the target's preflight at every rescan."""
    daemon.source.topics["orders.a"] = 4
    daemon._rescan()
    daemon.source.topics["orders.a"] = 2
    daemon._rescan()
    daemon._rescan()
    assert daemon.prepared == [[("orders.a", "dr.orders.a", 4), ("orders.b", "dr.orders.b", 1)]]
