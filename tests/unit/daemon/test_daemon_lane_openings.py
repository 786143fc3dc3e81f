"""A round looks only at the lanes whose standing changed (issue #18: per-round cost must not grow with idle lanes) —
and still never leaves a lane that should copy unopened (DESIGN §3): a lane whose retry time passes while nothing
else happens is reopened, a lane reset by a failure is reopened after its backoff, a halted lane stays out, and the
audit repairs a lane missing from the books."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import lane_sessions
from mirror_core.daemon.lane_openings import LaneOpenings, audit
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState
from mirror_core.daemon.lane_workers import TaskOutcome
from mirror_core.errors import MirrorError
from mirror_core.model.lane_status import HALTED, PersistedLaneState
from mirror_core.state.leases import now_ms

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}
LANES = 200


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(D.time, "monotonic", clock)
    return clock


def opening_daemon(monkeypatch, mapping: dict, lanes: int) -> D.ShallowMirrorDaemon:
    """A daemon holding ``lanes`` lanes whose opening is faked (a session and a fetcher at 0; ``daemon.opened``
    lists the lanes each ``_open_lanes`` call opened)."""
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(mapping), worker_id="me")
    daemon.pruner = NS(floors=lambda: {})
    daemon.opened = []

    def open_lanes(states, began):
        daemon.opened.append(sorted(state.lane for state in states))
        return [TaskOutcome(value=(session or NS(position=0, prune_floor=None), NS(position=0)))
                for state, (session, _gen) in zip(states, began, strict=True)]

    monkeypatch.setattr(daemon, "_open_lanes", open_lanes)
    for p in range(lanes):
        lane = f"orders-{p}"
        daemon.lanes[lane] = LaneState("orders", p, "orders", lane, health=daemon._new_health())
        daemon.held.add(lane)
    return daemon


@pytest.fixture
def daemon(clock, monkeypatch):
    daemon = opening_daemon(monkeypatch, BASE, LANES)
    daemon._next_openings_audit = clock.t + 3600  # the audit is tested on its own below
    return daemon


def _round(daemon) -> set[str]:
    return {state.lane for state, _position in daemon._open_ready()}


@pytest.mark.timeout(10)
def test_idle_rounds_look_at_no_lane(daemon, monkeypatch):
    assert len(_round(daemon)) == LANES and daemon.opened == [sorted(daemon.lanes)]
    looked = []
    real = daemon.openings.take
    monkeypatch.setattr(daemon.openings, "take", lambda now: looked.append(real(now)) or looked[-1])
    for _ in range(5):
        assert len(_round(daemon)) == LANES
    assert looked == [[]] * 5 and len(daemon.opened) == 1
    assert daemon._open_ready() is daemon._open_ready()  # nothing touched: the same list, none built per round
    daemon.openings.touch("orders-0")
    assert "orders-0" in _round(daemon) and len(daemon.opened) == 1  # looked at: still open, not reopened


@pytest.mark.timeout(10)
def test_a_lane_reset_by_a_failure_reopens_after_its_backoff_with_nothing_else_happening(daemon, clock):
    _round(daemon)
    state = daemon.lanes["orders-7"]
    daemon._failed(state, MirrorError("the target went away"))
    assert state.session is None and state.retry_at > clock.t
    assert "orders-7" not in _round(daemon)  # backing off: not fetched, not opened
    assert daemon.opened[1:] == []
    clock.t = state.retry_at + 0.01  # its time comes; no other event
    assert "orders-7" in _round(daemon)
    assert daemon.opened[1:] == [["orders-7"]] and state.session is not None and state.fetcher is not None


@pytest.mark.timeout(10)
def test_a_lane_whose_fetch_failed_keeps_its_session_and_returns_at_its_retry_time(daemon, clock):
    import kafka.errors as Errors
    _round(daemon)
    state = daemon.lanes["orders-3"]
    session, fetcher = state.session, state.fetcher
    daemon._failed(state, Errors.NotLeaderForPartitionError(), fetching=True)
    assert "orders-3" not in _round(daemon)
    clock.t = state.retry_at
    assert "orders-3" in _round(daemon)
    assert state.session is session and state.fetcher is fetcher and daemon.opened[1:] == []


@pytest.mark.timeout(10)
def test_dropped_halted_and_reacquired_lanes(daemon, monkeypatch):
    _round(daemon)
    daemon._drop("orders-1", "not assigned")
    assert "orders-1" not in _round(daemon)
    daemon.held.add("orders-1")  # acquired again: reopened (InitProducerId) by the next round
    assert "orders-1" in _round(daemon) and daemon.opened[-1] == ["orders-1"]
    monkeypatch.setattr(daemon, "_persist", lambda *a: True)
    daemon._halt(daemon.lanes["orders-2"], MirrorError("bad batch"), "rejected")
    for _ in range(3):
        assert "orders-2" not in _round(daemon)
    daemon.held.add("orders-2")  # even held again (a stale assignment), a halted lane is not opened
    assert "orders-2" not in _round(daemon) and daemon.lanes["orders-2"].health.state == HALTED


@pytest.mark.timeout(10)
def test_a_resumed_lane_is_opened_again(daemon, monkeypatch):
    _round(daemon)
    state = daemon.lanes["orders-4"]
    state.health.stop(PersistedLaneState(HALTED, "rejected", "bad", now_ms(), 5, None))
    state.halt_stored = True
    daemon.openings.touch("orders-4")
    assert "orders-4" not in _round(daemon)
    daemon.store = NS(read_own=lambda *a: NS(lane_state=None))
    daemon._follow_persisted_state(state, NS(lane_state=None, position=5, lost_ranges=()))  # the operator resumed
    assert "orders-4" in _round(daemon)


@pytest.mark.timeout(10)
def test_the_audit_repairs_a_lane_missing_from_the_books(daemon, clock):
    _round(daemon)
    state = daemon.lanes["orders-9"]
    state.reset()  # a reset no hook saw, and the lane gone from the books: it would never be opened again
    daemon.openings.ready.pop("orders-9")
    _round(daemon)
    _round(daemon)
    assert state.session is None and state.fetcher is None and daemon.opened[1:] == []  # not reopened
    events = []
    real_event = lane_sessions.event
    lane_sessions.event = lambda name, *a, **k: (events.append((name, k)), real_event(name, *a, **k))
    try:
        daemon._next_openings_audit = clock.t  # the audit period comes
        assert "orders-9" in _round(daemon)
    finally:
        lane_sessions.event = real_event
    assert tuple(name for name, _ in events if name == "lane_openings_repaired") == ("lane_openings_repaired", )
    assert [k for name, k in events if name == "lane_openings_repaired"][0]["first"] == "orders-9"
    assert state.session is not None and state.fetcher is not None


@pytest.mark.timeout(10)
def test_audit_finds_each_kind_of_discrepancy():
    openings = LaneOpenings()
    lane = lambda **k: NS(health=NS(stopped=k.get("stopped", False)), session=k.get("session", 1),  # noqa: E731
                          fetcher=k.get("fetcher", 1), retry_at=k.get("retry_at", 0.0))
    lanes = {"ok": lane(), "missing": lane(), "closed": lane(fetcher=None), "early": lane(retry_at=50.0),
             "halted": lane(stopped=True), "waiting": lane(retry_at=50.0), "gone": lane()}
    for name in ("ok", "closed", "early", "halted", "gone"):
        openings.ready[name] = lanes[name]
    openings.wait("waiting", 50.0)
    held = set(lanes) - {"gone"}
    assert audit(openings, held, lanes, now=10.0) == ["closed", "early", "gone", "halted", "missing"]
    assert audit(openings, held, lanes, now=10.0) == []  # repaired: each is looked at by the next take
    assert openings.take(10.0) == ["closed", "early", "gone", "halted", "missing"]
    assert openings.take(49.0) == [] and openings.take(50.0) == ["waiting"]


class FenceSession:
    """An at-least-once session's fence clock (LaneSession.fence_due/fence_due_at), counting who looks at it."""
    INTERVAL = 60.0

    def __init__(self, clock: Clock) -> None:
        self.clock, self.fenced_at, self.looked, self.renewals = clock, clock.t, 0, 0

    @property
    def fence_due_at(self) -> float:
        return self.fenced_at + self.INTERVAL

    @property
    def fence_due(self) -> bool:
        self.looked += 1
        return self.clock.t >= self.fence_due_at

    def renew_fence_if_due(self) -> None:
        if self.clock.t >= self.fence_due_at:
            self.fenced_at, self.renewals = self.clock.t, self.renewals + 1


@pytest.fixture
def fenced(clock, monkeypatch):
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "mode": "at-least-once"}), worker_id="me")
    daemon.workers = NS(run=lambda tasks, tick=None: [TaskOutcome(value=fn(None)) for _lane, fn in tasks],
                        release=lambda lane: None)
    daemon._next_fence_walk = clock.t + 3600
    for p in range(LANES):
        lane = f"orders-{p}"
        state = daemon.lanes[lane] = LaneState("orders", p, "orders", lane, health=daemon._new_health())
        daemon.held.add(lane)
        state.session = FenceSession(clock)
        if p % 2:  # half the lanes were opened 30 s later: their fences fall due 30 s later
            state.session.fenced_at += 30.0
        daemon._schedule_fence(state)
    return daemon


@pytest.mark.timeout(10)
def test_fences_are_renewed_when_due_without_a_walk_of_every_lane(fenced, clock):
    sessions = [fenced.lanes[f"orders-{p}"].session for p in range(LANES)]
    for _ in range(5):
        fenced._renew_fences()  # rounds before any fence is due: no lane looked at
    assert sum(s.looked for s in sessions) == 0
    clock.t += 60.0  # the even lanes' fences fall due; nothing else happens
    fenced._renew_fences()
    assert [s.renewals for s in sessions] == [1, 0] * (LANES // 2)
    clock.t += 30.0
    fenced._renew_fences()
    assert [s.renewals for s in sessions] == [1] * LANES
    looked = sum(s.looked for s in sessions)
    fenced._renew_fences()
    assert sum(s.looked for s in sessions) == looked  # renewed ones are due again in 60 s: not looked at now
    clock.t += 30.0  # 60 s after the even lanes' renewal, 30 s after the odd ones'
    fenced._renew_fences()
    assert [s.renewals for s in sessions] == [2, 1] * (LANES // 2)


@pytest.mark.timeout(10)
def test_the_fence_walk_renews_a_session_never_scheduled(fenced, clock):
    state = fenced.lanes["orders-5"]
    state.session = FenceSession(clock)  # installed without _schedule_fence
    clock.t += 61.0
    fenced._renew_fences()
    assert state.session.renewals == 0  # not scheduled: not seen by the heap ...
    fenced._next_fence_walk = clock.t  # ... until the walk (every AUDIT_MAX_S)
    fenced._renew_fences()
    assert state.session.renewals == 1


@pytest.mark.timeout(10)
def test_dropped_lanes_fences_are_not_renewed(fenced, clock):
    fenced._drop("orders-0", "not assigned")
    clock.t += 100.0
    fenced._renew_fences()
    assert all(fenced.lanes[f"orders-{p}"].session.renewals == 1 for p in range(1, LANES))


@pytest.mark.timeout(10)
def test_halts_in_one_pass_publish_the_lane_states_once(daemon, monkeypatch):
    _round(daemon)
    daemon._publish_lane_states()
    published = []
    real = daemon.metrics.publish_lanes
    monkeypatch.setattr(daemon.metrics, "publish_lanes", lambda *a: (published.append(1), real(*a)))
    monkeypatch.setattr(daemon, "_persist", lambda *a: True)
    for p in range(10):
        daemon._halt(daemon.lanes[f"orders-{p}"], MirrorError("bad batch"), "rejected")
    assert published == []
    daemon._publish_pending_states()
    assert len(published) == 1
    states = {lane["lane"]: lane["state"] for lane in daemon.metrics.readiness()[1]["lanes"]}
    assert [states[f"orders-{p}"] for p in range(10)] == [HALTED] * 10
    daemon._publish_pending_states()
    assert len(published) == 1


class FakeStore:
    """The checkpoint store as the group round sees it: refreshed, a content version, the pipeline's checkpoints."""

    def __init__(self) -> None:
        self.checkpoints: dict = {}
        self.version = 0
        self.decodes = 0
        self.damaged: dict = {}   # checkpoint topic partitions that cannot be read (none here)
        self.partitions = 8
        self.topic = "__shoal_checkpoints"

    def refresh(self, *, skip_damaged: bool = False) -> None:
        pass

    def content_version(self) -> int:
        return self.version

    @classmethod
    def owning_every_lane(cls) -> FakeStore:
        """A store holding a daemon-owned checkpoint of every lane of the ``daemon`` fixture."""
        store = cls()
        for p in range(LANES):
            store.write("orders", p, NS(owner=DAEMON_OWNER, lane_state=None, target_topic="orders",
                                        target_partition=p))
        return store

    def write(self, topic: str, partition: int, cp) -> None:
        self.checkpoints[("p", topic, partition)] = cp
        self.version += 1

    def read_all(self, pipeline, *, whole_maps=True, refresh=True):
        self.decodes += len(self.checkpoints)
        return dict(self.checkpoints)


@pytest.mark.timeout(10)
def test_the_group_round_decodes_checkpoints_only_when_they_changed_and_still_sees_a_new_owner(daemon, monkeypatch):
    store = daemon.store = FakeStore.owning_every_lane()
    assert daemon._eligible() == sorted(daemon.lanes) and store.decodes == LANES
    for _ in range(5):  # group rounds with nothing changed: nothing decoded, same answer
        assert len(daemon._eligible()) == LANES
    assert store.decodes == LANES
    store.write("orders", 5, NS(owner="backfill", lane_state=None, target_topic="orders", target_partition=5))
    assert "orders-5" not in daemon._eligible()  # a handoff back to a backfill: the lane is not ours to hold
    assert store.decodes == 2 * LANES
    monkeypatch.setattr(daemon, "_persist", lambda *a: False)
    daemon._halt(daemon.lanes["orders-6"], MirrorError("bad batch"), "rejected")  # halted here (not stored)
    assert "orders-6" not in daemon._eligible()
    daemon.lanes["orders-new"] = LaneState("orders", LANES, "orders", "orders-new", health=daemon._new_health())
    assert "orders-new" in daemon._eligible()  # discovered by a rescan: eligible at once
    stored = PersistedLaneState(HALTED, "rejected", "bad", now_ms(), 3, None)
    store.write("orders", 7, NS(owner=DAEMON_OWNER, lane_state=stored, target_topic="orders", target_partition=7))
    assert "orders-7" not in daemon._eligible()  # halted by another daemon (persisted): followed here
    assert daemon.lanes["orders-7"].health.state == HALTED


@pytest.mark.timeout(10)
def test_prune_floors_follow_the_held_lanes_without_a_copy_of_them_per_pass(daemon):
    published = []
    daemon.pruner = NS(version=0, floors=lambda: {("orders", 1): 40}, publish=lambda parts: published.append(parts))
    _round(daemon)
    daemon._apply_prune_floors()
    assert len(published) == 1 and len(published[0]) == LANES
    assert daemon.lanes["orders-1"].session.prune_floor == 40
    for _ in range(5):
        daemon._apply_prune_floors()  # nothing changed: nothing published
    assert len(published) == 1
    daemon._drop("orders-3", "not assigned")
    daemon._apply_prune_floors()
    assert len(published) == 2 and ("orders", 3) not in published[1]
    daemon.held.add("orders-3")
    daemon._apply_prune_floors()
    assert len(published) == 3 and ("orders", 3) in published[2]
    daemon.pruner.version = 1  # the watch gathered new floors
    daemon._apply_prune_floors()
    assert len(published) == 4


@pytest.mark.timeout(10)
def test_lanes_failing_to_open_are_published_once_per_pass_not_once_per_lane(daemon, monkeypatch):
    """A source outage makes every reopening lane fail at once: one walk of the lane states for all of them, not one
    per failing lane (2,000 lanes: 2,000 walks of 2,000 lanes on the main thread); /readyz shows them all after the
    loop's pass."""
    _round(daemon)
    for state in daemon.lanes.values():
        daemon._failed(state, MirrorError("the target went away"))
    monkeypatch.setattr(daemon, "_open_lanes", lambda states, began: [
        TaskOutcome(error=MirrorError("no broker of cluster 'source' is reachable now")) for _ in states])
    walks = []
    real = daemon._publish_lane_states
    monkeypatch.setattr(daemon, "_publish_lane_states", lambda: (walks.append(1), real()))
    for state in daemon.lanes.values():
        state.retry_at = 0.0
        daemon.openings.touch(state.lane)
    assert _round(daemon) == set()
    daemon._publish_pending_states()   # the loop's pass ends
    assert len(walks) <= 1, "a walk of every lane per failing lane"
    states = {lane["lane"]: lane for lane in daemon.metrics.readiness()[1]["lanes"]}
    assert len(states) == LANES
    assert all(s["state"] == "retrying" and "reachable" in s["message"] for s in states.values())


@pytest.mark.timeout(10)
def test_the_audits_walk_the_held_lanes_every_audit_period_not_every_rescan(clock, monkeypatch):
    """Each audit walks every held lane; on a 1 s rescan interval they ran every second — most of an idle
    round's cost per held lane (issue #18). They run every AUDIT_MAX_S, whatever the rescan interval."""
    daemon = opening_daemon(monkeypatch, {**BASE, "rescan_interval_s": 1}, LANES)
    walks = []
    real = lane_sessions.audit_openings
    monkeypatch.setattr(lane_sessions, "audit_openings", lambda *a: (walks.append(clock.t), real(*a))[1])
    audits = []
    rounds = NS(sync=lambda lanes: None, audit=lambda: (audits.append(clock.t), [])[1],
                send=lambda **k: NS())
    monkeypatch.setattr(daemon, "_standing", lambda: rounds)
    start = clock.t
    for _ in range(int(AUDIT_MAX_S) * 4):  # idle rounds, a quarter second apart, for one audit period
        ready = daemon._open_ready()
        daemon._send_round(ready)
        clock.t += 0.25
    assert walks == [start] and audits == [start], "the held lanes were walked on the rescan cadence"
    daemon._open_ready()
    daemon._send_round([])
    assert walks == [start, clock.t] and audits == [start, clock.t]


@pytest.mark.timeout(10)
def test_a_damaged_checkpoint_partition_halts_its_lanes_here_until_it_reads_again(daemon, monkeypatch):
    from mirror_core.state.checkpoint import checkpoint_key, checkpoint_partition

    store = daemon.store = FakeStore.owning_every_lane()
    monkeypatch.setattr(daemon, "_persist", lambda *a: False)
    placed = []
    monkeypatch.setattr(daemon, "_place_failed_lane", lambda state, position: placed.append(state.lane))
    stored_in = {f"orders-{p}": checkpoint_partition(checkpoint_key(daemon.config.pipeline, "orders", p), 8)
                 for p in range(LANES)}
    assert stored_in["orders-0"] != stored_in["orders-1"]
    hit = {lane for lane, part in stored_in.items() if part in (stored_in["orders-0"], stored_in["orders-1"])}
    assert daemon._eligible() == sorted(daemon.lanes)
    daemon._halt(daemon.lanes["orders-0"], MirrorError("bad batch"), "batch_rejected")   # halted before (not stored)

    store.damaged = {stored_in["orders-0"]: MirrorError("CRC"), stored_in["orders-1"]: MirrorError("CRC")}
    store.version += 1
    eligible = set(daemon._eligible())
    assert eligible == set(daemon.lanes) - hit                       # every other lane goes on
    one = daemon.lanes["orders-1"].health
    assert (one.state, one.reason) == (HALTED, "corrupt_batch") and "cannot be read" in one.message
    assert "orders-1" in placed and "orders-0" not in placed        # still watched by retention while halted
    zero = daemon.lanes["orders-0"].health
    assert (zero.state, zero.reason) == (HALTED, "batch_rejected")  # its own halt kept, not relabelled

    store.damaged = {}
    store.version += 1
    eligible = set(daemon._eligible())
    assert "orders-1" in eligible and daemon.lanes["orders-1"].health.state == "copying"   # resumed by itself
    assert "orders-0" not in eligible and zero.reason == "batch_rejected"   # the repair lifts only its own halt
