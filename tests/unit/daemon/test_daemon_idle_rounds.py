"""An idle round costs no per-lane metrics work (issue #18: per-round cost must not grow with idle lanes), and what
a user reads — ``/readyz`` lane states, the lag gauge — still follows every change at the next round."""

from __future__ import annotations

from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import compat_leases, group_lanes, lane_failures, lane_health
from mirror_core.daemon.lane_state import LaneState
from mirror_core.kafka.broker_fetch import PartitionOutcome
from mirror_core.kafka.fetcher import FetchResult
from mirror_core.model.lane_status import COPYING, RETRYING, STALLED
from mirror_core.state.lane_health_records import HEALTH_REFRESH_S
from mirror_core.state.leases import now_ms

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}
LANES = 50


def set_clock(monkeypatch, clock) -> None:
    """The daemon's wall clock (``now_ms``), in every daemon module that reads it."""
    for module in (compat_leases, group_lanes, lane_failures, lane_health):
        monkeypatch.setattr(module, "now_ms", clock)


def held_daemon(lanes: int) -> D.ShallowMirrorDaemon:
    """A daemon (no I/O) holding ``lanes`` lanes of topic ``orders``, none opened."""
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    for p in range(lanes):
        lane = f"orders-{p}"
        daemon.lanes[lane] = LaneState("orders", p, "orders", lane, health=daemon._new_health())
        daemon.held.add(lane)
    return daemon


@pytest.fixture
def daemon():
    return held_daemon(LANES)


def _lane_states(daemon) -> dict[str, str]:
    return {lane["lane"]: lane["state"] for lane in daemon.metrics.readiness()[1]["lanes"]}


def _gauge(daemon, name: str, partition: int) -> float | None:
    return daemon.metrics.registry.get_sample_value(name, {"topic": "orders", "partition": str(partition)})


@pytest.mark.timeout(10)
def test_idle_rounds_publish_lane_states_only_when_one_changed(daemon, monkeypatch):
    published = []
    real = daemon.metrics.publish_lanes
    monkeypatch.setattr(daemon.metrics, "publish_lanes", lambda *a: (published.append(1), real(*a)))
    daemon._publish_lane_states()
    assert len(published) == 1 and set(_lane_states(daemon).values()) == {COPYING}
    for _ in range(5):  # idle rounds: nothing changed
        daemon._publish_lane_states()
    assert len(published) == 1
    health = daemon.lanes["orders-7"].health
    health.failed("target_unavailable", "broker down", now_ms(), position=3)
    daemon._publish_lane_states()
    assert len(published) == 2 and _lane_states(daemon)["orders-7"] == RETRYING
    health.since_ms -= 3_600_000  # failing for an hour: past stall_after_s, with no new event
    daemon._publish_lane_states()
    assert _lane_states(daemon)["orders-7"] == STALLED
    daemon.lanes["orders-7"].health.succeeded()
    daemon._publish_lane_states()
    assert _lane_states(daemon)["orders-7"] == COPYING
    daemon.lanes["orders-new"] = LaneState("orders", LANES, "orders", "orders-new", health=daemon._new_health())
    daemon._publish_lane_states()  # a lane discovered by a rescan shows at once
    assert "orders-new" in _lane_states(daemon)


@pytest.mark.timeout(10)
def test_idle_lane_lag_gauge_is_set_once_and_follows_changes(daemon, monkeypatch):
    state = daemon.lanes["orders-3"]
    state.fetcher = NS(position=10)
    calls = []
    real = daemon.metrics.lag.labels
    monkeypatch.setattr(daemon.metrics.lag, "labels", lambda *a: (calls.append(a), real(*a))[1])

    def idle_share(last_stable: int):
        result = FetchResult([], 10, last_stable, last_stable, 0)
        assert daemon._share_fetched(state, 10, PartitionOutcome(result=result)) is None

    for _ in range(5):
        idle_share(12)
    assert _gauge(daemon, "shoal_lag_records", 3) == 2
    assert len(calls) == 1
    idle_share(15)  # records arrived past a transaction still open: the lag shows it
    assert _gauge(daemon, "shoal_lag_records", 3) == 5
    daemon._drop("orders-3", "revoked by the group")  # the gauge leaves with the lane ...
    assert _gauge(daemon, "shoal_lag_records", 3) is None
    daemon.held.add("orders-3")
    state.fetcher = NS(position=10)
    idle_share(15)  # ... and comes back with it, though the value is the same
    assert _gauge(daemon, "shoal_lag_records", 3) == 5


class Publications:
    """Counts the full lane-state publications (every lane) and the incremental ones (the lanes named)."""

    def __init__(self, daemon, monkeypatch):
        self.full, self.updates = [], []
        real_full, real_update = daemon.metrics.publish_lanes, daemon.metrics.update_lanes
        monkeypatch.setattr(daemon.metrics, "publish_lanes",
                            lambda pipeline, lanes: (self.full.append(len(lanes)), real_full(pipeline, lanes)))
        monkeypatch.setattr(daemon.metrics, "update_lanes",
                            lambda pipeline, lanes: (self.updates.append(sorted(lanes)),
                                                     real_update(pipeline, lanes)))


def _fail(daemon, lane: str, error: str = "broker down") -> None:
    """A lane's copy failed (the daemon's own path: classified, backoff, health)."""
    daemon._failed(daemon.lanes[lane], Errors.KafkaConnectionError(error))


@pytest.mark.timeout(10)
def test_a_round_publishes_only_the_lanes_whose_health_changed(daemon, monkeypatch):
    seen = Publications(daemon, monkeypatch)
    daemon._publish_round_states([])   # first round: every lane is new to /readyz
    assert seen.full == [LANES] and seen.updates == []
    for _ in range(5):                 # idle rounds: nothing touched, nothing compared, nothing published
        daemon._publish_round_states([])
    assert seen.full == [LANES] and seen.updates == []
    daemon._publish_round_states([daemon.lanes["orders-2"]])   # touched, unchanged: nothing published
    assert seen.updates == []
    _fail(daemon, "orders-7")          # outside a round: shown at once, that lane alone
    assert seen.updates == [["orders-7"]] and seen.full == [LANES]
    assert _lane_states(daemon)["orders-7"] == RETRYING and daemon.metrics.readiness()[0]
    daemon.lanes["orders-7"].health.succeeded()                # its next round's news: copying again
    daemon._publish_round_states([daemon.lanes["orders-7"]])
    assert seen.updates[-1] == ["orders-7"] and _lane_states(daemon)["orders-7"] == COPYING
    assert set(_lane_states(daemon).values()) == {COPYING} and len(_lane_states(daemon)) == LANES


@pytest.mark.timeout(10)
def test_a_retrying_lane_turns_stalled_by_time_alone_with_no_event_and_no_walk(daemon, monkeypatch):
    seen = Publications(daemon, monkeypatch)
    daemon._publish_round_states([])
    clock = {"ms": now_ms()}
    set_clock(monkeypatch, lambda: clock["ms"])
    _fail(daemon, "orders-7")
    assert _lane_states(daemon)["orders-7"] == RETRYING
    stall_ms = daemon.config.stall_after_s * 1000
    clock["ms"] += stall_ms - 1000     # not yet: idle rounds show it retrying
    for _ in range(3):
        daemon._publish_round_states([])
    assert _lane_states(daemon)["orders-7"] == RETRYING and daemon.metrics.readiness()[0]
    clock["ms"] += 2000                # past stall_after_s: the next idle round shows it stalled, /readyz fails
    daemon._publish_pending_states()   # (also when no round runs: every lane backing off)
    assert _lane_states(daemon)["orders-7"] == STALLED
    assert daemon.metrics.readiness()[1]["not_ready_lanes"] == ["orders-7"]
    assert seen.full == [LANES], "no walk of every lane: the stall came from the lane's own due time"
    assert all(update == ["orders-7"] for update in seen.updates)


@pytest.mark.timeout(10)
def test_the_walk_of_every_lane_still_runs_as_a_check(daemon, monkeypatch):
    seen = Publications(daemon, monkeypatch)
    daemon._publish_round_states([])
    health = daemon.lanes["orders-9"].health
    health.failed("unknown", "changed behind the daemon's back", now_ms())  # no event told the books
    daemon._publish_round_states([])
    assert _lane_states(daemon)["orders-9"] == COPYING
    daemon._next_health_walk = 0.0     # HEALTH_WALK_S later
    daemon._publish_round_states([])
    assert _lane_states(daemon)["orders-9"] == RETRYING and seen.full == [LANES, LANES]


@pytest.mark.timeout(10)
def test_health_records_look_only_at_lanes_that_failed(daemon, monkeypatch):
    written = []
    daemon.health_records = NS(write=lambda pipeline, holder, writes, clears, now: written.append(
        (sorted(writes), sorted(clears))))
    looked = []
    real = lane_health.live_health
    monkeypatch.setattr(lane_health, "live_health", lambda health: (looked.append(1), real(health))[1])
    daemon._write_health_records(now_ms())
    assert written == [] and looked == [], "no lane failed: no lane looked at"
    _fail(daemon, "orders-3")
    _fail(daemon, "orders-5")
    daemon._write_health_records(now_ms())
    assert written == [(["orders-3", "orders-5"], [])] and len(looked) == 2
    daemon.lanes["orders-3"].health.succeeded()
    daemon._write_health_records(now_ms())
    assert written[-1] == ([], ["orders-3"])
    looked.clear()
    daemon._write_health_records(now_ms())  # orders-5's record is fresh: nothing due; orders-3 left the watch
    assert len(written) == 2 and len(looked) == 1
    later = now_ms() + int(HEALTH_REFRESH_S * 1000) + 1  # still failing: rewritten every HEALTH_REFRESH_S
    daemon.lanes["orders-5"].health.stall_after_s = 1e9
    daemon._write_health_records(later)
    assert written[-1] == (["orders-5"], [])


@pytest.mark.timeout(10)
def test_a_round_takes_only_its_news_and_a_lane_with_news_no_longer_ready_reopens(daemon):
    ready, gone = daemon.lanes["orders-1"], daemon.lanes["orders-2"]
    ready.fetcher, gone.fetcher = NS(position=14), NS(position=9)
    quiet = daemon.lanes["orders-3"]
    quiet.fetcher = NS(position=5)
    outcome = PartitionOutcome(result=FetchResult([], 14, 14, 14, 0))
    daemon._in_flight = NS(collect=lambda: [("orders-1", ready.fetcher, 10, outcome),
                                            ("orders-2", gone.fetcher, 7, PartitionOutcome(result=outcome.result))],
                           answered=1, sent_at=0.0)
    shares, answered, _sent_at = daemon._take_round([(ready, 14), (quiet, 5)])   # orders-2 is backing off: not ready
    assert [(s.lane, start) for s, _f, start, _o in shares] == [("orders-1", 10)] and answered == 1
    assert gone.fetcher is None, "its position moved past an answer not copied: it reopens at its checkpoint"
    assert quiet.fetcher is not None


def _idle_share(daemon, lane: str, position: int, high_watermark: int) -> None:
    """A round's news for ``lane``: nothing new, the partition's high watermark as the broker reported it."""
    state = daemon.lanes[lane]
    result = FetchResult([], position, high_watermark, high_watermark, 0)
    assert daemon._share_fetched(state, position, PartitionOutcome(result=result)) is None


@pytest.mark.timeout(10)
def test_retention_positions_follow_the_news_and_lanes_without_news_keep_theirs(daemon):
    for p in range(3):  # opened: a session at its checkpoint, a fetcher there
        state = daemon.lanes[f"orders-{p}"]
        state.fetcher, state.session = NS(position=10 * p), NS(position=10 * p)
    _idle_share(daemon, "orders-0", 0, 0)      # at the high watermark: caught up
    _idle_share(daemon, "orders-1", 10, 10)
    _idle_share(daemon, "orders-2", 20, 25)    # an open transaction past it, say: behind
    _fail(daemon, "orders-3")                  # never answered, its open failed, no checkpoint: from the log start
    assert daemon.positions.snapshot() == ({("orders", 2): 20, ("orders", 3): None},
                                           {("orders", 0): 0, ("orders", 1): 10})
    daemon.lanes["orders-3"].start = 30
    _fail(daemon, "orders-3")
    for _ in range(5):                         # idle rounds: no news, every position stays reported
        daemon._publish_round_states([])
    behind, caught = daemon.positions.snapshot()
    assert behind == {("orders", 2): 20, ("orders", 3): 30} and caught == {("orders", 0): 0, ("orders", 1): 10}
    _idle_share(daemon, "orders-1", 10, 12)    # the high watermark moved: behind at once
    assert not daemon.positions.is_caught_up(("orders", 1))
    _fail(daemon, "orders-0")                  # a failed copy: behind at its committed position, kept while reset
    assert daemon.positions.snapshot()[0][("orders", 0)] == 0 and daemon.lanes["orders-0"].session is None
    daemon._drop("orders-2", "revoked by the group")
    assert daemon.positions.position(("orders", 2)) is None


@pytest.mark.timeout(10)
def test_a_caught_up_lane_that_lost_its_fetcher_is_put_behind_by_the_check(daemon):
    state = daemon.lanes["orders-4"]
    state.fetcher, state.session = NS(position=7), NS(position=7)
    _idle_share(daemon, "orders-4", 7, 7)
    assert daemon.positions.is_caught_up(("orders", 4))
    state.fetcher = None                       # reset by a path that forgot to say so
    daemon._next_health_walk = 0.0
    daemon._publish_round_states([])
    assert not daemon.positions.is_caught_up(("orders", 4)) and daemon.positions.position(("orders", 4)) == 7


@pytest.mark.timeout(20)
def test_a_lane_turns_stalled_while_another_lanes_commit_hangs(daemon, monkeypatch):
    """The main thread waits in the lane pool while one lane's commit hangs on the target (real worker threads):
    another lane that has been retrying past ``stall_after_s`` shows ``stalled`` during that wait, not only once
    the hanging commit returns. Before, the pool's tick did membership work only and the stall waited for the
    batch to end (up to write_retry_s, 25 s by default, or longer)."""
    import threading

    from mirror_core.daemon.lane_workers import LaneWorkerPool

    daemon._publish_round_states([])
    clock = {"ms": now_ms()}
    set_clock(monkeypatch, lambda: clock["ms"])
    _fail(daemon, "orders-7")
    assert _lane_states(daemon)["orders-7"] == RETRYING
    seen_stalled = threading.Event()

    def hanging_commit(_clients):  # orders-3's commit: hangs until the stall shows, or gives up
        clock["ms"] += int(daemon.config.stall_after_s * 1000) + 1000  # the wait outlasts orders-7's stall time
        deadline = D.time.monotonic() + 5
        while D.time.monotonic() < deadline:
            if _lane_states(daemon)["orders-7"] == STALLED:
                seen_stalled.set()
                return "committed"
            D.time.sleep(0.05)
        return "committed"

    _fail(daemon, "orders-3")  # retrying too, and its reopen is the work that runs (and hangs) now
    pool = daemon.workers = LaneWorkerPool(2, lambda: NS(close=lambda: None))
    try:
        outcomes = pool.run([("orders-3", hanging_commit)], tick=daemon._leases_busy)
    finally:
        pool.close()
    assert outcomes[0].value == "committed"
    assert seen_stalled.is_set(), "orders-7 turned stalled only after the other lane's hanging commit returned"
    # the lane whose own work was running is not shown stalled meanwhile (its outcome decides: a reopen that
    # succeeds is copying a moment later); it is published after the batch, here still failing: stalled
    assert daemon.metrics.readiness()[1]["not_ready_lanes"] == ["orders-7"]
    assert _lane_states(daemon)["orders-3"] == RETRYING
    daemon._publish_due_states()
    assert daemon.metrics.readiness()[1]["not_ready_lanes"] == ["orders-3", "orders-7"]
