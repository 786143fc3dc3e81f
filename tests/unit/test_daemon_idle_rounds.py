"""An idle round costs no per-lane metrics work (issue #18: per-round cost must not grow with idle lanes), and what
a user reads — ``/readyz`` lane states, the lag gauge — still follows every change at the next round."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon as D
from mirror_core.broker_fetch import PartitionOutcome
from mirror_core.daemon_config import pipeline_config_from_mapping
from mirror_core.fetcher import FetchResult
from mirror_core.lane_status import COPYING, RETRYING, STALLED

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}
LANES = 50


@pytest.fixture
def daemon():
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    for p in range(LANES):
        lane = f"orders-{p}"
        daemon.lanes[lane] = D.LaneState("orders", p, "orders", lane, health=daemon._new_health())
        daemon.held.add(lane)
    return daemon


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
    health.failed("target_unavailable", "broker down", D.now_ms(), position=3)
    daemon._publish_lane_states()
    assert len(published) == 2 and _lane_states(daemon)["orders-7"] == RETRYING
    health.since_ms -= 3_600_000  # failing for an hour: past stall_after_s, with no new event
    daemon._publish_lane_states()
    assert _lane_states(daemon)["orders-7"] == STALLED
    daemon.lanes["orders-7"].health.succeeded()
    daemon._publish_lane_states()
    assert _lane_states(daemon)["orders-7"] == COPYING
    daemon.lanes["orders-new"] = D.LaneState("orders", LANES, "orders", "orders-new", health=daemon._new_health())
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


@pytest.mark.timeout(10)
def test_a_round_compares_the_health_of_the_lanes_it_touched_and_every_lane_once_a_second(daemon, monkeypatch):
    walks = []
    real = daemon._publish_lane_states
    monkeypatch.setattr(daemon, "_publish_lane_states", lambda: (walks.append(1), real()))
    daemon._publish_round_states([])   # first round: every lane is new to /readyz
    assert len(walks) == 1
    for _ in range(5):                 # idle rounds: nothing touched, no lane walked
        daemon._publish_round_states([])
    assert len(walks) == 1
    state = daemon.lanes["orders-7"]
    state.health.failed("source_unavailable", "leader moved", D.now_ms(), position=3)
    daemon._publish_round_states([daemon.lanes["orders-2"]])   # touched, unchanged: no walk
    assert len(walks) == 1
    daemon._publish_round_states([state])                      # touched and changed: published at once
    assert len(walks) == 2 and _lane_states(daemon)["orders-7"] == RETRYING
    state.health.since_ms -= 3_600_000    # stalled by time alone, in no round's news ...
    daemon._publish_round_states([])
    assert _lane_states(daemon)["orders-7"] == RETRYING
    daemon._next_health_walk = 0.0        # ... shows at the next walk (at most HEALTH_WALK_S later)
    daemon._publish_round_states([])
    assert _lane_states(daemon)["orders-7"] == STALLED


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


@pytest.mark.timeout(10)
def test_the_retention_watch_gets_positions_on_its_cadence_not_every_round(daemon, monkeypatch):
    published = []
    monkeypatch.setattr(daemon.retention, "publish", published.append)
    daemon.lanes["orders-4"].start = 40
    for _ in range(20):
        daemon._publish_positions_if_due()
    assert len(published) == 1 and published[0] == {("orders", 4): 40}
    daemon._next_positions = 0.0
    daemon._publish_positions_if_due()
    assert len(published) == 2
