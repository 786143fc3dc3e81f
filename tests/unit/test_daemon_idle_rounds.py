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
