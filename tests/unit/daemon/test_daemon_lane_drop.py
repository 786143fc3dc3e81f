"""A lane dropped while its worker works on it (DESIGN.md §3.4: one live writer per lane).

The lane pool's progress tick runs membership work (a group round) on the main thread while workers open
lanes, renew fences and copy. A lane that round drops must stay dropped: the session and fetcher its worker opened
are not installed (a later acquisition reopens: InitProducerId, checkpoint read), and an error of that work is not
classified (no 'retrying' or halt for a lane another daemon holds now) — even when the lane was acquired again
before the work returned."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import lane_sessions
from mirror_core.daemon.lane_state import LaneState
from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool
from mirror_core.errors import MirrorError
from mirror_core.model.lane_status import COPYING
from tests.unit.daemon.test_daemon_membership import StubMembership

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}
OPEN_S = 0.6  # a lane open: InitProducerId (then checkpoint read, position validation) (here: a sleep)


def _daemon(monkeypatch, open_lane):
    class FakeCopier:
        def __init__(self, *a, **k):
            pass

        def open_lane(self, *a, **k):
            time.sleep(OPEN_S)
            return open_lane()

    monkeypatch.setattr(lane_sessions, "CheckpointedCopier", FakeCopier)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    daemon.workers = LaneWorkerPool(2, lambda: LaneClients(None, None, NS(read_own=lambda *a: None)))
    daemon.source = None
    daemon.store = NS(read_own_many=lambda pipeline, lanes: {lane: None for lane in lanes})  # no checkpoints yet
    state = LaneState("orders", 0, "orders", "orders-0", health=daemon._new_health())
    daemon.lanes = {"orders-0": state}
    daemon.held = {"orders-0"}
    daemon._next_lease = time.monotonic() + OPEN_S / 2  # the group round falls due while the worker opens the lane
    daemon.membership = StubMembership({("orders", 0)})
    return daemon, state


def _opened():
    return NS(checkpoint=None, position=5, position_epoch=None, source_topic_id=None, prune_floor=None,
              resume=lambda checkpoint, **_: None)


def _drops(daemon, *, reacquire: bool):
    def lease_round():
        daemon._drop("orders-0", "rebalance")
        if reacquire:
            daemon.held.add("orders-0")
    return lease_round


@pytest.mark.parametrize("reacquire", [False, True], ids=["dropped", "dropped-and-acquired-again"])
@pytest.mark.timeout(20)
def test_a_lane_dropped_while_it_opens_does_not_keep_the_opened_session(monkeypatch, reacquire):
    daemon, state = _daemon(monkeypatch, _opened)
    monkeypatch.setattr(daemon, "_maintain_group", _drops(daemon, reacquire=reacquire))
    try:
        ready = daemon._open_ready()
    finally:
        daemon.workers.close()
    assert ready == []
    assert ("orders-0" in daemon.held) is reacquire
    assert state.session is None and state.fetcher is None, (
        f"the dropped lane keeps session={state.session!r} fetcher={state.fetcher!r}: reacquired, it would not "
        "be reopened (no InitProducerId, a stale checkpoint)")


@pytest.mark.parametrize("reacquire", [False, True], ids=["dropped", "dropped-and-acquired-again"])
@pytest.mark.timeout(20)
def test_a_lane_dropped_while_its_open_fails_is_not_marked_retrying(monkeypatch, reacquire):
    def failing():
        raise MirrorError("the target went away")

    daemon, state = _daemon(monkeypatch, failing)
    monkeypatch.setattr(daemon, "_maintain_group", _drops(daemon, reacquire=reacquire))
    try:
        daemon._open_ready()
    finally:
        daemon.workers.close()
    assert state.health.state == COPYING and state.failures == 0 and state.retry_at == 0.0, (
        f"a lane another daemon holds now shows {state.health.state!r} after {state.failures} failure(s)")


@pytest.mark.timeout(20)
def test_a_lane_kept_installs_what_its_worker_opened(monkeypatch):
    daemon, state = _daemon(monkeypatch, _opened)
    rounds = threading.Event()
    monkeypatch.setattr(daemon, "_maintain_group", rounds.set)  # a group round that keeps the lane
    try:
        ready = daemon._open_ready()
    finally:
        daemon.workers.close()
    assert rounds.is_set()
    assert [(s.lane, position) for s, position in ready] == [("orders-0", 5)]
    assert state.session is not None and state.fetcher is not None and state.fetcher.position == 5
