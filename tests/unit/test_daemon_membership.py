"""The membership's decisions and its revocation hand-shake, without a broker (the group itself is exercised on
real brokers in tests/integration/test_daemon_group.py). The hand-shake is driven through its callbacks with a
recording stand-in for the consumer: what matters here is *when* the partitions are given up."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TopicPartition

from mirror_core.cluster import ClusterConfig
from mirror_core.daemon_config import pipeline_config_from_mapping
from mirror_core.daemon_membership import GroupMembership, choose_protocol, consumer_settings, group_id
from mirror_core.errors import ConfigError
from mirror_core.leases import Lease

SOURCE = ClusterConfig("source", {"bootstrap.servers": "127.0.0.1:1"})


class RecordingConsumer:
    def __init__(self):
        self.calls: list[tuple[str, list[tuple[str, int]], float]] = []

    def _record(self, what, tps):
        self.calls.append((what, [(tp.topic, tp.partition) for tp in tps], time.monotonic()))

    def incremental_assign(self, tps):
        self._record("assign", tps)

    def pause(self, tps):
        self._record("pause", tps)

    def incremental_unassign(self, tps):
        self._record("unassign", tps)


def membership(revoke_timeout_s: float = 5.0) -> GroupMembership:
    return GroupMembership(SOURCE, "p1", "w1", protocol="consumer", revoke_timeout_s=revoke_timeout_s)


def test_protocol_follows_the_broker_version_unless_chosen():
    assert choose_protocol("auto", (4, 0)) == "consumer"
    assert choose_protocol("auto", (3, 9)) == "classic"
    assert choose_protocol("auto", None) == "classic"
    assert choose_protocol("classic", (4, 2)) == "classic"
    with pytest.raises(ConfigError, match="group_protocol 'range'"):
        choose_protocol("range", (4, 0))


def test_the_group_never_commits_and_classic_uses_cooperative_sticky():
    kip848 = consumer_settings(SOURCE, "orders-dr", "w1", "consumer")
    assert kip848["group.id"] == group_id("orders-dr") == "shoal.orders-dr.daemons"
    assert kip848["enable.auto.commit"] is False and kip848["enable.auto.offset.store"] is False
    assert kip848["group.protocol"] == "consumer" and kip848["client.id"] == "w1"
    assert "session.timeout.ms" not in kip848 and "partition.assignment.strategy" not in kip848  # broker-side
    classic = consumer_settings(SOURCE, "orders-dr", "w1", "classic", classic_session_timeout_ms=6000)
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert classic["session.timeout.ms"] == 6000 and classic["heartbeat.interval.ms"] < 6000


def test_assigned_partitions_are_paused_in_the_same_callback():
    m, consumer = membership(), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert [c[:2] for c in consumer.calls] == [("assign", [("t", 0), ("t", 1)]), ("pause", [("t", 0), ("t", 1)])]
    assert m.assigned() == {("t", 0), ("t", 1)}


def test_revocation_waits_for_the_loop_to_release_the_lanes():
    m, consumer = membership(), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    callback = threading.Thread(target=m._on_revoke, args=(consumer, [TopicPartition("t", 1)]))
    callback.start()
    time.sleep(0.3)
    assert callback.is_alive(), "the callback gave the partition up before the loop released it"
    assert m.revoking() == {("t", 1)} and m.assigned() == {("t", 0)}  # the loop stops copying it now
    released_at = time.monotonic()
    m.released([("t", 1)])
    callback.join(2)
    assert not callback.is_alive()
    what, parts, at = consumer.calls[-1]
    assert (what, parts) == ("unassign", [("t", 1)]) and at >= released_at
    assert m.revoking() == frozenset() and m.view().assigned == {("t", 0)}


def test_revocation_gives_up_after_its_timeout():
    m, consumer = membership(revoke_timeout_s=0.5), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0)])
    started = time.monotonic()
    m._on_revoke(consumer, [TopicPartition("t", 0)])  # nobody releases it
    assert 0.5 <= time.monotonic() - started < 2.0
    assert consumer.calls[-1][:2] == ("unassign", [("t", 0)])
    assert m.assigned() == frozenset() and m.revoking() == frozenset()


def test_a_lost_assignment_is_dropped_without_waiting():
    m, consumer = membership(revoke_timeout_s=5.0), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0)])
    started = time.monotonic()
    m._on_lost(consumer, [TopicPartition("t", 0)])
    assert time.monotonic() - started < 0.5 and m.assigned() == frozenset()


def test_revocation_timeout_must_stay_below_the_rebalance_timeout():
    with pytest.raises(ConfigError, match="revoke_timeout_s"):
        GroupMembership(SOURCE, "p1", "w1", protocol="consumer", revoke_timeout_s=200)


def test_group_daemons_are_blocked_only_by_live_leases_of_lease_based_daemons():
    now = 1_000_000
    assert Lease("p", "l", "old-1", now + 5000).blocks_group_daemon("new-1", now)
    assert not Lease("p", "l", "old-1", now - 1).blocks_group_daemon("new-1", now)  # expired
    assert not Lease("p", "l", "new-2", now + 5000, group=True).blocks_group_daemon("new-1", now)  # the group decides
    assert not Lease("p", "l", "new-1", now + 5000).blocks_group_daemon("new-1", now)  # our own


def test_pipeline_membership_settings_are_validated():
    base = {"pipeline": "p", "source": {"bootstrap.servers": "a:1"}, "target": {"bootstrap.servers": "b:1"},
            "include": "x"}
    config = pipeline_config_from_mapping(base)
    assert (config.membership, config.group_protocol, config.lease_compat) == ("group", "auto", True)
    with pytest.raises(ConfigError, match="membership 'zookeeper'"):
        pipeline_config_from_mapping({**base, "membership": "zookeeper"})
    with pytest.raises(ConfigError, match="revoke_timeout_s"):
        pipeline_config_from_mapping({**base, "revoke_timeout_s": 600})
