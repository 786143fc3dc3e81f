"""The daemon's rescan with the Metadata decoded only to partition counts and the lanes per topic kept between
rescans (issue #18: an idle rescan costs per topic, not per lane) still promises what it did: a new topic gets its
lanes, a topic that gained partitions gets the new ones, a rescan finding nothing new prepares nothing, a deleted
topic is still confirmed deleted (twice missing, DELETION_CONFIRM_S apart) and a source that cannot be reached
for the rescan's Metadata counts as unreachable.

The source here answers Metadata with kafka-python's encoding of a real MetadataResponse (the real decoder runs).
"""

from __future__ import annotations

import logging
import time
import uuid
from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest
from kafka.future import Future
from kafka.protocol.metadata import MetadataResponse

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import lane_failures
from mirror_core.daemon.lane_state import LaneState
from mirror_core.kafka.source_reachability import UNREACHABLE_AFTER_S

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*", "naming": "prefix:dr."}
T = MetadataResponse.MetadataResponseTopic
P = T.MetadataResponsePartition


class Source:
    """The source cluster as the rescan sees it: ``topics`` (name → partitions) answered on its metadata
    connection, or ``down`` (every request fails like a refused connection); ``metadata([...])`` as the deletion
    confirmation asks it."""

    cluster_name = "source"

    def __init__(self, topics: dict[str, int]):
        self.topics = dict(topics)
        self.down = False
        self.asked = 0
        self.closed = False

    # the fast connection's surface topic_counts uses
    def metadata_connection(self):
        return self, False

    def version(self, api_key, low, high):
        return high

    def send_encoded(self, request, version, decoder, *, flexible_response):
        self.asked += 1
        future = Future()
        if self.down:
            return future.failure(Errors.KafkaConnectionError("connection refused"))
        answer = MetadataResponse(
            throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, error_code=0, authorized_operations=None,
            topics=[T(error_code=0, name=name, topic_id=uuid.uuid4(), is_internal=False, authorized_operations=None,
                      partitions=[P(error_code=0, partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=[1],
                                    isr_nodes=[1], offline_replicas=[]) for i in range(count)])
                    for name, count in self.topics.items()])
        return future.success(decoder(memoryview(bytes(answer.encode(version=version)))))

    def wait(self, future):
        pass

    def metadata(self, topics):
        if self.down:
            raise Errors.KafkaConnectionError("connection refused")
        unknown = Errors.UnknownTopicOrPartitionError.errno
        return {t: NS(error_code=0 if t in self.topics else unknown) for t in topics}


def rescan_daemon(monkeypatch, source) -> D.ShallowMirrorDaemon:
    """A daemon (no group: no subscription) reading ``source``, whose target preparation passes and is recorded
    (``prepared``), as are its config syncs (``synced``)."""
    d = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    d.source = source
    d.prepared = []

    def prepare(unprepared):
        if unprepared:
            d.prepared.append(list(unprepared))
        return list(unprepared), None

    monkeypatch.setattr(d, "_prepare_targets", prepare)
    d.synced = []
    monkeypatch.setattr(d, "_sync_configs", d.synced.append)
    return d


@pytest.fixture
def daemon(monkeypatch):
    return rescan_daemon(monkeypatch, Source({"orders.a": 2, "payments": 4}))


def _lanes(daemon) -> set[tuple[str, int]]:
    return {(s.topic, s.partition) for s in daemon.lanes.values()}


@pytest.mark.timeout(20)
def test_a_new_topic_gets_its_lanes_at_the_next_rescan(daemon):
    daemon._rescan()
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1)}
    daemon.source.topics["orders.b"] = 3
    daemon._rescan()
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1), ("orders.b", 0), ("orders.b", 1), ("orders.b", 2)}
    assert daemon.prepared[-1] == [("orders.b", "dr.orders.b", 3)]   # only the new topic's target prepared


@pytest.mark.timeout(20)
def test_a_topic_that_gained_partitions_gets_the_new_lanes(daemon):
    daemon._rescan()
    daemon.source.topics["orders.a"] = 5
    daemon._rescan()
    assert daemon.prepared[-1] == [("orders.a", "dr.orders.a", 5)]   # the target gains them first
    assert _lanes(daemon) == {("orders.a", p) for p in range(5)}
    assert sorted(daemon.lanes) == sorted(f"dr.orders.a-{p}" for p in range(5))


@pytest.mark.timeout(20)
def test_a_rescan_finding_nothing_new_prepares_nothing_even_for_lanes_added_elsewhere(daemon):
    """Lanes added outside the rescan (a halted lane adopted from its checkpoint) count for their topic: the
    kept book is extended by them, not stale."""
    daemon._rescan()
    daemon.source.topics["orders.c"] = 1
    daemon.lanes["dr.orders.c-0"] = LaneState("orders.c", 0, "dr.orders.c", "dr.orders.c-0",
                                                health=daemon._new_health())
    daemon._rescan()
    daemon._rescan()
    assert daemon.prepared == [[("orders.a", "dr.orders.a", 2)]]
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1), ("orders.c", 0)}


@pytest.mark.timeout(20)
def test_the_group_subscribes_to_the_listed_topics_with_lanes(daemon):
    subscribed = []
    daemon.membership = NS(subscribe=subscribed.append)
    daemon._rescan()
    daemon.source.topics["orders.b"] = 1
    daemon._rescan()
    del daemon.source.topics["orders.a"]                             # deleted: its lanes stay, unsubscribed
    daemon._rescan()
    assert subscribed == [["orders.a"], ["orders.a", "orders.b"], ["orders.b"]]


@pytest.mark.timeout(20)
def test_a_deleted_topic_is_still_confirmed_deleted(daemon, monkeypatch):
    daemon._rescan()
    del daemon.source.topics["orders.a"]
    daemon._rescan()                                                 # the rescan drops no lane by itself
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1)}
    slept = []
    monkeypatch.setattr(lane_failures.time, "sleep", slept.append)
    assert daemon._deleted_source_topics({"orders.a"}) == {"orders.a"}
    assert slept == [lane_failures.DELETION_CONFIRM_S]                           # missing twice, this far apart


@pytest.mark.timeout(20)
def test_a_source_that_cannot_answer_the_rescan_is_reported_unreachable(daemon, caplog):
    daemon.source.down = True
    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        daemon._housekeeping("rescan", daemon._rescan)
    assert any("event=rescan_failed" in r.getMessage() for r in caplog.records)
    change = daemon.source_reachability.check(time.monotonic() + UNREACHABLE_AFTER_S + 1)
    assert change is not None and change.unreachable
    assert daemon.lanes == {}
    daemon.source.down = False
    daemon._housekeeping("rescan", daemon._rescan)                   # answered again: reachable, lanes made
    change = daemon.source_reachability.check(time.monotonic() + UNREACHABLE_AFTER_S + 2)
    assert change is not None and not change.unreachable
    assert _lanes(daemon) == {("orders.a", 0), ("orders.a", 1)}


@pytest.mark.timeout(20)
def test_configs_are_synced_for_every_selected_topic_with_its_lanes_in_one_call_when_due(daemon):
    daemon.source.topics["orders.b"] = 1
    daemon._rescan()                                                 # lanes made now: nothing in step to sync yet
    daemon._rescan()                                                 # not due
    daemon._next_config_sync = 0.0
    daemon.source.topics["orders.c"] = 2                             # new now: prepared, synced at the next one
    daemon._rescan()
    assert daemon.synced == [[], [("orders.a", "dr.orders.a"), ("orders.b", "dr.orders.b")]]
