"""The daemon's retention watch assesses only lanes with something unmirrored (issue #18): a caught-up lane costs no
request and keeps the verdict an assessment would give it (SAFE, nothing unmirrored); a lane that falls behind is
assessed by the next assessment and warned about; gauges change only where a verdict changed."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace as NS

import pytest

import mirror_core.services.deadlines as deadlines
import mirror_core.services.retention_metrics as metrics_module
from mirror_core.config.cluster import ClusterConfig
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.model.retention import Status

LANES = 100


class FakeAssessor:
    """assess_positions as the watch calls it: records what it was asked, answers the verdicts it is given."""

    def __init__(self):
        self.calls: list[dict] = []
        self.verdicts: dict[tuple[str, int], Status] = {}
        self.fail = False

    def __call__(self, source, topics, positions, policy, **_kwargs):
        if self.fail:
            raise OSError("source unreachable")
        self.calls.append(dict(positions))
        statuses = []
        for tp, position in sorted(positions.items()):
            status = self.verdicts.get(tp, Status.SAFE)
            statuses.append(NS(topic=tp[0], partition=tp[1], status=status, position=position,
                               margin_s=60.0 if status is Status.AT_RISK else 9e9, time_to_loss_s=120.0,
                               eta_s=60.0, unmirrored_bytes=4096, lost_records=0))
        return NS(statuses=statuses)


@pytest.fixture
def watch(monkeypatch):
    assessor = FakeAssessor()
    monkeypatch.setattr(deadlines, "assess_positions", assessor)
    cluster = ClusterConfig("src", {"bootstrap.servers": "a:9092"})
    watch = RetentionWatch(cluster, cluster, DaemonMetrics(), interval_s=60, fetch_bytes=1 << 20)
    watch.assessor = assessor
    for p in range(LANES):
        watch.positions.caught_up(("orders", p), 100 + p, 100 + p)
    return watch


def _sample(watch, name: str, partition: int, **labels) -> float | None:
    return watch.metrics.registry.get_sample_value(name, {"topic": "orders", "partition": str(partition), **labels})


def _status(watch, partition: int) -> str | None:
    for status in Status:
        if _sample(watch, "shoal_retention_status", partition, status=status.value) == 1.0:
            return status.value
    return None


@pytest.mark.timeout(10)
def test_caught_up_lanes_cost_no_request_and_show_safe(watch):
    assert watch.assess_once() == []
    assert watch.assessor.calls == [], "every lane caught up: nothing asked of the source"
    for p in (0, 57, LANES - 1):
        assert _status(watch, p) == "SAFE"
        assert _sample(watch, "shoal_retention_margin_seconds", p) == math.inf
        assert _sample(watch, "shoal_retention_unmirrored_bytes", p) == 0
        assert _sample(watch, "shoal_retention_lost_offsets", p) == 0


@pytest.mark.timeout(10)
def test_a_caught_up_lane_that_falls_behind_is_assessed_next_time_and_warned_about(watch, caplog):
    watch.assess_once()
    watch.positions.caught_up(("orders", 7), 107, 5_000)  # new data past it: the high watermark moved
    watch.assessor.verdicts[("orders", 7)] = Status.AT_RISK
    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        watch.assess_once()
    assert watch.assessor.calls == [{("orders", 7): 107}], "only the lane with something unmirrored"
    assert _status(watch, 7) == "AT_RISK" and _sample(watch, "shoal_retention_margin_seconds", 7) == 60.0
    assert "event=retention_at_risk topic=orders partition=7 position=107" in caplog.text
    assert _status(watch, 8) == "SAFE"
    watch.positions.caught_up(("orders", 7), 5_000, 5_000)  # copied up to the high watermark: caught up again
    watch.assess_once()
    assert len(watch.assessor.calls) == 1 and _status(watch, 7) == "SAFE"
    assert _sample(watch, "shoal_retention_margin_seconds", 7) == math.inf


@pytest.mark.timeout(10)
def test_unchanged_verdicts_set_no_gauge_and_dropped_lanes_leave(watch, monkeypatch):
    watch.positions.behind(("orders", 3), 50)
    watch.assess_once()
    sets = []
    real = metrics_module.set_retention_verdict
    monkeypatch.setattr(metrics_module, "set_retention_verdict", lambda *a: (sets.append(a[1:3]), real(*a)))
    watch.assess_once()
    assert sets == [] and len(watch.assessor.calls) == 2, "the lane behind assessed again, its verdict the same"
    watch.positions.forget(("orders", 3))
    watch.positions.forget(("orders", 4))
    watch.assess_once()
    assert _status(watch, 3) is None and _status(watch, 4) is None and _status(watch, 5) == "SAFE"
    assert sets == []


@pytest.mark.timeout(10)
def test_a_failed_assessment_keeps_the_gauges(watch):
    watch.positions.behind(("orders", 9), 10)
    watch.assessor.verdicts[("orders", 9)] = Status.AT_RISK
    watch.assess_once()
    watch.assessor.fail = True
    with pytest.raises(OSError):
        watch.assess_once()
    assert _status(watch, 9) == "AT_RISK" and _status(watch, 10) == "SAFE"


@pytest.mark.timeout(10)
def test_publish_of_a_whole_map_assesses_every_lane_of_it(watch):
    watch.publish({("orders", 1): 5, ("orders", 2): 6})
    watch.assess_once()
    assert watch.assessor.calls == [{("orders", 1): 5, ("orders", 2): 6}]
    assert _status(watch, 3) is None


@pytest.mark.timeout(10)
def test_a_lane_is_caught_up_only_at_a_known_high_watermark():
    from mirror_core.model.held_positions import HeldPositions

    positions = HeldPositions()
    positions.caught_up(("t", 0), 5, None)   # no high watermark known (an answer without one)
    positions.caught_up(("t", 1), 5, -1)
    positions.caught_up(("t", 2), 5, 6)
    positions.caught_up(("t", 3), 6, 6)
    assert positions.snapshot() == ({("t", 0): 5, ("t", 1): 5, ("t", 2): 5}, {("t", 3): 6})
    positions.behind(("t", 3))               # a failure: behind at the position it had
    positions.behind(("t", 9))               # no position known: stays out
    assert positions.snapshot()[0][("t", 3)] == 6 and positions.position(("t", 9)) is None
