"""Review attacks on the event-driven round bookkeeping (issue #18, follow-up 2: i18-rounds-2).

The promise (DESIGN §3): never a silent stall, never a silent skip, a handed-off lane is dropped. Each test here
failed on ``stage`` at 99df613 before the fix that follows it."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import fences
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState
from mirror_core.daemon.lane_workers import TaskOutcome
from mirror_core.model.lane_status import HALTED, PersistedLaneState
from mirror_core.state.leases import now_ms
from tests.unit.daemon.test_daemon_lane_openings import Clock, FakeStore, FenceSession, opening_daemon

HOURLY = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
          "include": "orders.*", "rescan_interval_s": 3600}  # a pipeline that rescans hourly
LANES = 20


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(D.time, "monotonic", clock)
    return clock


def _daemon(monkeypatch, mapping: dict) -> D.ShallowMirrorDaemon:
    return opening_daemon(monkeypatch, mapping, LANES)


def _round(daemon) -> set[str]:
    return {state.lane for state, _position in daemon._open_ready()}


class ReadOwnStore(FakeStore):
    """Like the real store, ``read_own`` refreshes the lane's checkpoint partition: a record written after the group
    round's own refresh enters the cache there (here: ``arrive_before_read_own``)."""

    def __init__(self) -> None:
        super().__init__()
        self.arriving: list = []

    def arrive_before_read_own(self, topic: str, partition: int, cp) -> None:
        self.arriving.append((topic, partition, cp))

    def read_own(self, pipeline, topic, partition):
        for args in self.arriving:
            self.write(*args)
        self.arriving = []
        return self.checkpoints.get((pipeline, topic, partition))


def _cp(p: int, owner: str = DAEMON_OWNER, lane_state=None):
    return NS(owner=owner, lane_state=lane_state, target_topic="orders", target_partition=p, position=5,
              lost_ranges=())


@pytest.mark.timeout(10)
def test_a_handoff_read_into_the_cache_by_a_resume_check_is_not_hidden_by_the_eligible_cache(clock, monkeypatch):
    """The group round's ``_eligible`` caches its answer under the store's content version. A resume check in the
    walk (``read_own``) refreshes a checkpoint partition: a backfill's handoff landing then is in the cache but not
    in the answer. Stored under the version as of *after* the walk, the stale answer (the handed-off lane still
    eligible) stands until some other checkpoint write — on an idle pipeline, indefinitely."""
    daemon = _daemon(monkeypatch, HOURLY)
    store = daemon.store = ReadOwnStore()
    halt = PersistedLaneState(HALTED, "rejected", "bad", now_ms(), 5, None)
    for p in range(LANES):
        store.write("orders", p, _cp(p, lane_state=halt if p == 4 else None))
    assert "orders-4" not in daemon._eligible() and daemon.lanes["orders-4"].health.stopped
    store.write("orders", 4, _cp(4))  # the operator resumes orders-4 ...
    store.arrive_before_read_own("orders", 5, _cp(5, owner="backfill"))  # ... as a backfill takes orders-5 back
    first = daemon._eligible()
    assert "orders-4" in first and not daemon.lanes["orders-4"].health.stopped  # resumed
    # nothing more is written: the next group round must see the handoff already in the cache
    assert "orders-5" not in daemon._eligible(), "a lane handed off to a backfill stays eligible (stale cache)"


@pytest.mark.timeout(10)
def test_a_lane_lost_from_the_openings_books_is_reopened_within_the_audit_cap_on_an_hourly_rescan(clock,
                                                                                                  monkeypatch):
    """The openings audit is the only net for a lane a hook missed (held, closed, in none of ready/due/waiting: no
    round opens it, nothing is logged). The standing round's audit is capped at AUDIT_MAX_S for exactly this; the
    openings audit ran only every ``rescan_interval_s`` — an hour here: an hour of a silently unopened lane."""
    daemon = _daemon(monkeypatch, HOURLY)
    assert len(_round(daemon)) == LANES  # the first round audits (nothing wrong) and opens every lane
    state = daemon.lanes["orders-3"]
    state.reset()  # a reset no hook saw: the lane leaves the books
    daemon.openings.ready.pop("orders-3")
    clock.t += AUDIT_MAX_S + 1
    _round(daemon)
    assert daemon.opened[1:] == [["orders-3"]], "a held lane stays unopened until the hourly rescan audits the books"
    assert state.session is not None and state.fetcher is not None and "orders-3" in _round(daemon)


def _one_lane_at_least_once() -> tuple[D.ShallowMirrorDaemon, LaneState]:
    """An at-least-once daemon on an hourly rescan holding one lane, its worker tasks run inline."""
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**HOURLY, "mode": "at-least-once"}),
                                   worker_id="me")
    daemon.workers = NS(run=lambda tasks, tick=None: [TaskOutcome(value=fn(None)) for _lane, fn in tasks],
                        release=lambda lane: None)
    state = daemon.lanes["orders-0"] = LaneState("orders", 0, "orders", "orders-0", health=daemon._new_health())
    daemon.held.add("orders-0")
    return daemon, state


@pytest.mark.timeout(10)
def test_a_fence_missed_by_the_heap_is_renewed_within_the_audit_cap_on_an_hourly_rescan(clock, monkeypatch):
    """At-least-once: the fence walk is the net for a session the heap never saw; on an hourly rescan it ran
    hourly, so such a fence stayed lapsed for up to an hour (the heap's whole point is that idle lanes still renew)."""
    daemon, state = _one_lane_at_least_once()
    daemon._renew_fences()  # the first pass: the walk runs (nothing held open yet) and is scheduled again
    state.session = FenceSession(clock)  # installed without _schedule_fence (a missed hook)
    clock.t += 61.0  # its fence is due
    daemon._renew_fences()
    clock.t += AUDIT_MAX_S
    daemon._renew_fences()
    assert state.session.renewals == 1, "a held lane's fence stays lapsed until the hourly walk"


class TickingClock(Clock):
    """Every read of the clock moves it on a little (as time.monotonic does between two statements)."""

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


class TickingFenceSession(FenceSession):
    @property
    def fence_due(self) -> bool:
        self.looked += 1
        return D.time.monotonic() >= self.fence_due_at


@pytest.mark.timeout(10)
def test_the_fence_walk_does_not_cry_repaired_for_a_fence_the_heap_holds(monkeypatch):
    """The walk compared ``fence_due`` (a fresh clock read) with a heap drained at an earlier ``now``: a session
    scheduled correctly, falling due between the two reads, was reported ``fence_renewal_repaired`` — a WARNING
    claiming a missed hook that did not happen (with 2,000 lanes, every few walks)."""
    clock = TickingClock()
    monkeypatch.setattr(D.time, "monotonic", clock)
    events = []
    real_event = fences.event
    monkeypatch.setattr(fences, "event", lambda name, *a, **k: (events.append(name), real_event(name, *a, **k)))
    daemon, state = _one_lane_at_least_once()
    state.session = TickingFenceSession(clock)
    state.session.fenced_at = clock.t - state.session.INTERVAL + 0.0015  # falls due just after the next ``now``
    daemon._schedule_fence(state)  # scheduled, as every opened session is
    daemon._next_fence_walk = 0.0  # this pass walks
    daemon._renew_fences()
    assert "fence_renewal_repaired" not in events
