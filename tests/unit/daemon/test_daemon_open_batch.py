"""Lanes opened together (issue 18's batched start-up, DESIGN.md §3.4): what one lane's trouble does to the others.

The daemon opens every lane it holds in three steps, each for all of them at once: one checkpoint read
(``read_own_many``), InitProducerIds side by side, one more read. These tests attack that batching with a checkpoint
store stand-in that behaves like :class:`~mirror_core.state.checkpoint.CheckpointStore` where it matters here: it
decodes each lane's stored value with the real :meth:`Checkpoint.from_value`, and a checkpoint partition without a
leader fails every read that touches it.
"""
from __future__ import annotations

import json
import threading

import kafka.errors as Errors
import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import lane_sessions
from mirror_core.daemon.lane_state import LaneState
from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool
from mirror_core.model.lane_status import HALTED
from mirror_core.state.checkpoint import Checkpoint, checkpoint_key, checkpoint_partition

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}
CHECKPOINT_PARTITIONS = 4
LANES = 8  # orders-0 .. orders-7, spread over the checkpoint partitions


def _value(partition: int, position: int, *, version: int | None = None) -> bytes:
    value = Checkpoint(pipeline="p", topic="orders", partition=partition, position=position, target_topic="orders",
                       target_partition=partition, target_next=None, owner=DAEMON_OWNER, owner_epoch=1,
                       updated_ms=1_700_000_000_000).to_value()
    if version is None:
        return value
    body = json.loads(value)
    body["v"] = version  # written by a newer Shoal: this one cannot decode it
    return json.dumps(body).encode()


def _part(partition: int) -> int:
    return checkpoint_partition(checkpoint_key("p", "orders", partition), CHECKPOINT_PARTITIONS)


class Store:
    """The daemon's checkpoint store: ``values`` per lane; reads through ``offline`` checkpoint partitions fail."""

    partitions = CHECKPOINT_PARTITIONS

    def __init__(self, values: dict[int, bytes], offline: set[int] = frozenset()):
        self.values, self.offline, self.calls = values, set(offline), []

    def read_own_many(self, pipeline, lanes):
        lanes = list(lanes)
        self.calls.append(lanes)
        for _topic, partition in lanes:  # the real one refreshes every partition it needs first
            if _part(partition) in self.offline:
                raise Errors.LeaderNotAvailableError(f"checkpoint partition {_part(partition)}")
        return {(t, p): None if p not in self.values else Checkpoint.from_value(self.values[p]) for t, p in lanes}

    def cached(self, pipeline, topic, partition):  # no request: what the cache holds (a failed lane's placement)
        return None if partition not in self.values else Checkpoint.from_value(self.values[partition])


class Session:
    def __init__(self):
        self.checkpoint, self.position, self.position_epoch = None, None, None
        self.source_topic_id, self.prune_floor = None, None

    def resume(self, checkpoint, *, epoch_end=None):
        self.checkpoint = checkpoint
        self.position = None if checkpoint is None else checkpoint.position

    def write_first_checkpoint(self, start):
        self.position = start


def _daemon(monkeypatch, store: Store):
    class FakeCopier:  # the lane's InitProducerId: nothing to wait for here
        def __init__(self, *a, **k):
            pass

        def open_lane(self, *a, read_checkpoint=True, **k):
            assert read_checkpoint is False, "a batched open reads the checkpoints itself, after every fence"
            return Session()

    monkeypatch.setattr(lane_sessions, "CheckpointedCopier", FakeCopier)
    monkeypatch.setattr(lane_sessions, "list_offsets", lambda *a, **k: 0)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    daemon.workers = LaneWorkerPool(2, lambda: LaneClients(None, None, None))
    daemon.source = None
    daemon.store = store
    daemon.lanes = {f"orders-{p}": LaneState("orders", p, "orders", f"orders-{p}", health=daemon._new_health())
                    for p in range(LANES)}
    daemon.held = set(daemon.lanes)
    monkeypatch.setattr(daemon, "_maintain_group", lambda: None)
    return daemon


def _open(daemon) -> dict[str, int]:
    try:
        ready = daemon._open_ready()
    finally:
        daemon.workers.close()
    return {state.lane: position for state, position in ready}


@pytest.mark.timeout(20)
def test_a_checkpoint_this_shoal_cannot_read_stops_only_its_own_lane(monkeypatch):
    """One lane's checkpoint written by a newer Shoal (or otherwise undecodable): that lane cannot open — every
    other lane can, as it could when each lane read its own checkpoint. Failed on i18-startup: the one-pass read
    raised for the batch and all 8 lanes failed with the one lane's error."""
    poisoned = 3
    store = Store({p: _value(p, 100 + p, version=99 if p == poisoned else None) for p in range(LANES)})
    daemon = _daemon(monkeypatch, store)

    opened = _open(daemon)

    assert opened == {f"orders-{p}": 100 + p for p in range(LANES) if p != poisoned}, (
        f"opened {sorted(opened)}: one undecodable checkpoint (orders-{poisoned}) kept the other lanes closed")
    bad = daemon.lanes[f"orders-{poisoned}"]
    assert bad.session is None and bad.failures == 1
    assert "format 99" in (bad.health.message or "")


@pytest.mark.timeout(20)
def test_a_leaderless_checkpoint_partition_stops_only_the_lanes_stored_there(monkeypatch):
    """A checkpoint partition without a leader: the lanes whose checkpoints live there wait; lanes stored in the
    other partitions open. Failed on i18-startup: every lane failed with that partition's error."""
    offline = _part(0)
    store = Store({p: _value(p, 100 + p) for p in range(LANES)}, offline={offline})
    daemon = _daemon(monkeypatch, store)
    stuck = {f"orders-{p}" for p in range(LANES) if _part(p) == offline}
    assert 0 < len(stuck) < LANES, "the stand-in spreads the lanes over several checkpoint partitions"

    opened = _open(daemon)

    assert set(opened) == set(daemon.lanes) - stuck, (
        f"opened {sorted(opened)}: checkpoint partition {offline} without a leader kept every lane closed")
    for lane in stuck:
        state = daemon.lanes[lane]
        assert state.session is None and state.failures == 1 and state.health.state != HALTED


@pytest.mark.timeout(20)
def test_each_lane_resumes_from_the_read_after_every_fence(monkeypatch):
    """Guard of the ordering (passes on i18-startup): a lane resumes from the second read — taken after every
    InitProducerId returned — not from the first; a checkpoint its former holder committed between the two (the
    zombie, before our fence) is the one resumed from."""
    store = Store({p: _value(p, 100 + p) for p in range(LANES)})
    daemon = _daemon(monkeypatch, store)
    fenced = threading.Event()
    real_fence = daemon._fence_lane

    def fence(state, handed_over, clients, **hints):
        session = real_fence(state, handed_over, clients, **hints)
        store.values[state.partition] = _value(state.partition, 200 + state.partition)  # committed before the fence
        fenced.set()
        return session

    monkeypatch.setattr(daemon, "_fence_lane", fence)

    opened = _open(daemon)

    assert fenced.is_set() and len(store.calls) == 2
    assert opened == {f"orders-{p}": 200 + p for p in range(LANES)}


@pytest.mark.timeout(20)
def test_a_lane_whose_fence_failed_or_that_was_dropped_meanwhile_is_not_resumed(monkeypatch):
    """Guard (passes on i18-startup): a lane whose InitProducerId raised, and a lane the group took away while the
    fences ran, are not in the second read and get no session; the others open from it."""
    store = Store({p: _value(p, 100 + p) for p in range(LANES)})
    daemon = _daemon(monkeypatch, store)
    real_fence = daemon._fence_lane

    def fence(state, handed_over, clients, **hints):
        if state.partition == 1:
            raise Errors.CoordinatorNotAvailableError("orders-1's InitProducerId")
        if state.partition == 2:
            daemon._drop("orders-2", "rebalance")  # what a group round (the pool's tick) does
        return real_fence(state, handed_over, clients, **hints)

    monkeypatch.setattr(daemon, "_fence_lane", fence)
    monkeypatch.setattr(daemon.workers, "release", lambda lane: None)  # dropped from a worker thread here

    opened = _open(daemon)

    assert len(store.calls) == 2 and {p for _t, p in store.calls[1]} == set(range(LANES)) - {1, 2}
    assert opened == {f"orders-{p}": 100 + p for p in range(LANES) if p not in (1, 2)}
    assert daemon.lanes["orders-1"].session is None and daemon.lanes["orders-1"].failures == 1
    assert daemon.lanes["orders-2"].session is None and daemon.lanes["orders-2"].failures == 0
