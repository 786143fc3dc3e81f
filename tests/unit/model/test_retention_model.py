"""The retention-deadline model (pure): time to loss, ETA, margin, status and remedy per partition."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirror_core.errors import ConfigError, RetentionLossError
from mirror_core.model.copy_capacity import CopyCapacity, catch_up_eta, estimate_copy_throughput, streams_needed
from mirror_core.model.retention import (
    INF,
    LossCause,
    PartitionSnapshot,
    Status,
    TopicRetention,
    assess_partition,
    guard_plan,
    order_by_deadline,
)

NOW = 1_800_000_000_000
MB = 1_000_000
HOUR_MS = 3_600_000
DELETE_1H = TopicRetention(retention_ms=HOUR_MS, segment_ms=600_000)


def snap(**kw) -> PartitionSnapshot:
    base = dict(topic="t", partition=0, position=0, log_start=0, log_end=1000, size_bytes=10 * MB,
                observed_at_ms=NOW, ingest_bytes_per_s=0.0, position_ts=NOW - 1_800_000, newest_ts=NOW - 1000)
    base.update(kw)
    return PartitionSnapshot(**base)


def assess(s: PartitionSnapshot, topic: TopicRetention = DELETE_1H, copy: float = 10 * MB, *,
           threshold: float = 600.0, ceiling: float | None = None, check_ms: int = 1000):
    return assess_partition(s, topic, CopyCapacity(copy, ceiling), at_risk_below_s=threshold,
                            check_interval_ms=check_ms)


def test_empty_partition_has_nothing_at_risk():
    result = assess(snap(log_start=500, log_end=500, position=500, size_bytes=0, position_ts=None, newest_ts=None))
    assert result.status is Status.SAFE
    assert result.unmirrored_records == 0 and result.unmirrored_bytes == 0
    assert math.isinf(result.time_to_loss_s) and result.eta_s == 0 and math.isinf(result.margin_s)
    assert result.remedy.text == ""


def test_caught_up_partition_is_safe_even_with_tiny_retention():
    result = assess(snap(position=1000), TopicRetention(retention_ms=1000, retention_bytes=1))
    assert result.status is Status.SAFE and result.deadlines_s == {}


def test_idle_partition_still_expires_by_time_but_never_by_size():
    topic = TopicRetention(retention_ms=HOUR_MS, retention_bytes=20 * MB, segment_ms=600_000)
    result = assess(snap(ingest_bytes_per_s=0.0), topic)
    # the oldest unmirrored batch is 30 min old: 30 min left, size never reached without ingest
    assert result.deadlines_s == {LossCause.TIME.value: pytest.approx(1800.0)}
    assert result.loss_cause is LossCause.TIME
    assert result.eta_s == pytest.approx(1.0)          # 10 MB at 10 MB/s, nothing coming in
    assert result.status is Status.SAFE and result.margin_s == pytest.approx(1799.0)


def test_infinite_retention_has_no_deadline_even_when_the_copy_falls_behind():
    topic = TopicRetention.from_configs({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"})
    assert topic.retention_ms is None and topic.retention_bytes is None
    result = assess(snap(ingest_bytes_per_s=50 * MB), topic, copy=1 * MB)
    assert math.isinf(result.time_to_loss_s) and math.isinf(result.eta_s)
    assert result.status is Status.SAFE and result.margin_s == INF


def test_compact_only_risks_tombstones_not_retention():
    topic = TopicRetention.from_configs({"cleanup.policy": "compact", "retention.ms": "1000",
                                         "retention.bytes": "1", "delete.retention.ms": str(HOUR_MS),
                                         "min.compaction.lag.ms": "600000"})
    result = assess(snap(position_ts=NOW - 3_000_000), topic)
    # cleaned no earlier than ts + 10 min, tombstone gone delete.retention.ms (1 h) later: 70 - 50 = 20 min left
    assert result.deadlines_s == {LossCause.TOMBSTONE.value: pytest.approx(1200.0)}
    assert result.loss_cause is LossCause.TOMBSTONE and result.status is Status.SAFE


def test_compact_only_lagging_past_the_delete_retention_is_losing_deletes():
    topic = TopicRetention(cleanup_policy=frozenset({"compact"}), delete_retention_ms=HOUR_MS)
    result = assess(snap(position_ts=NOW - 2 * HOUR_MS), topic)
    assert result.status is Status.LOSING and result.loss_cause is LossCause.TOMBSTONE
    assert result.remedy.config_changes["delete.retention.ms"] == HOUR_MS + math.ceil(
        (result.eta_s + 600 - result.time_to_loss_s) * 1000)


def test_compact_delete_takes_whichever_comes_first():
    topic = TopicRetention.from_configs({"cleanup.policy": "compact,delete", "retention.ms": str(HOUR_MS),
                                         "delete.retention.ms": "600000", "segment.ms": "600000"})
    assert topic.compacts and topic.deletes
    result = assess(snap(position_ts=NOW - 1_800_000), topic)
    assert result.deadlines_s == {LossCause.TIME.value: pytest.approx(1800.0),
                                  LossCause.TOMBSTONE.value: pytest.approx(-1200.0)}
    assert result.loss_cause is LossCause.TOMBSTONE and result.status is Status.LOSING
    later = assess(snap(position_ts=NOW - 1_800_000),
                   TopicRetention(cleanup_policy=frozenset({"compact", "delete"}), retention_ms=HOUR_MS,
                                  delete_retention_ms=10 * HOUR_MS))
    assert later.loss_cause is LossCause.TIME and later.time_to_loss_s == pytest.approx(1800.0)


def test_size_based_deletion_comes_first():
    # 10 MB unmirrored, retention.bytes 12 MB, 1 MB/s ingest: 2 MB of room = 2 s, long before the 30 min by time
    topic = TopicRetention(retention_ms=HOUR_MS, retention_bytes=12 * MB, segment_ms=600_000)
    result = assess(snap(ingest_bytes_per_s=1 * MB), topic, copy=2 * MB, threshold=1.0)
    assert result.loss_cause is LossCause.SIZE
    assert result.deadlines_s[LossCause.SIZE.value] == pytest.approx(2.0)
    assert result.eta_s == pytest.approx(10.0)         # 10 MB at 2 - 1 MB/s net
    assert result.status is Status.LOSING
    assert result.remedy.config_changes["retention.bytes"] >= 12 * MB + 9 * MB
    assert result.remedy.streams_needed == 6           # within 2 - 1 s: 1 MB/s ingest + 10 MB/s backlog = 11 MB/s


def test_size_already_over_retention_bytes_is_due_now():
    topic = TopicRetention(retention_ms=None, retention_bytes=5 * MB)
    result = assess(snap(ingest_bytes_per_s=0.0), topic)
    assert result.deadlines_s == {LossCause.SIZE.value: 0.0} and result.status is Status.LOSING


def test_throughput_below_ingest_never_catches_up():
    result = assess(snap(ingest_bytes_per_s=5 * MB), copy=4 * MB)
    assert math.isinf(result.eta_s) and result.margin_s == -INF
    assert result.status is Status.LOSING
    # 30 min left, minus the 10 min threshold: 5 MB/s ingest + 10 MB / 1200 s → 2 streams of 4 MB/s
    assert result.remedy.streams_needed == 2
    assert "not faster than ingest" in result.remedy.text and not result.remedy.config_changes


def test_at_risk_names_streams_and_retention_needed():
    # 30 min to loss; 9000 MB at 10 MB/s = 900 s ETA → margin 900 s, under a 1000 s threshold
    result = assess(snap(size_bytes=9000 * MB), threshold=1000.0)
    assert result.status is Status.AT_RISK and result.margin_s == pytest.approx(900.0)
    assert result.remedy.streams_needed == 2
    assert result.remedy.config_changes == {"retention.ms": HOUR_MS + 100_000}
    assert "2 streams" in result.remedy.text and "retention.ms to >= 3700000" in result.remedy.text


def test_link_ceiling_caps_streams():
    s = snap(size_bytes=9000 * MB)
    # 9000 MB within 500 s needs 18 MB/s: two 10 MB/s streams, unless the link stops at 15 MB/s
    assert streams_needed(s.unmirrored_bytes, 0.0, CopyCapacity(10 * MB, 15 * MB), 500) is None
    assert streams_needed(s.unmirrored_bytes, 0.0, CopyCapacity(10 * MB, 30 * MB), 500) == 2
    assert streams_needed(s.unmirrored_bytes, 0.0, CopyCapacity(10 * MB), 0) is None


def test_lost_names_exactly_the_deleted_offsets_and_guards_the_plan():
    result = assess(snap(position=100, log_start=400, position_ts=NOW - 60_000))
    assert result.status is Status.LOST
    assert result.lost_range == (100, 400) and result.lost_records == 300
    assert result.time_to_loss_s == 0 and result.margin_s == -INF
    assert result.unmirrored_records == 600            # what is left to copy from the log start
    assert "[100, 400)" in result.remedy.text and result.remedy.accept_loss
    with pytest.raises(RetentionLossError) as refused:
        guard_plan("source", [result], accept_loss=False)
    assert "t-0 [100, 400)" in str(refused.value) and "--accept-loss" in str(refused.value)
    records = guard_plan("source", [result], accept_loss=True)
    assert [(r.topic, r.partition, r.first_offset, r.end_offset, r.records) for r in records] == \
        [("t", 0, 100, 400, 300)]
    assert guard_plan("source", [assess(snap())], accept_loss=False) == []


def test_deletion_window_exact_when_the_probe_saw_the_segment_end():
    s = snap(position_ts=NOW - 1_800_000, probe_max_ts=NOW - 1_700_000, probe_reached_segment_end=True,
             probe_bytes=1 * MB)
    result = assess(s, check_ms=5000)
    # the segment's largest timestamp is known: deleted 1 h after it, on the next check (≤ 5 s later)
    assert result.time_to_loss_s == pytest.approx(1900.0)
    assert result.deletion_window_s == (pytest.approx(1900.0), pytest.approx(1905.0))
    assert result.deletion_at_ms() == NOW + 1_900_000


def test_deletion_window_spans_one_segment_roll_otherwise():
    s = snap(position_ts=NOW - 1_800_000, probe_max_ts=None, newest_ts=NOW - 1000)
    result = assess(s, TopicRetention(retention_ms=HOUR_MS, segment_ms=300_000), check_ms=1000)
    assert result.deletion_window_s == (pytest.approx(1800.0), pytest.approx(1800.0 + 300 + 1))
    # without newer data the segment cannot hold anything newer than the newest record
    quiet = assess(snap(position_ts=NOW - 1_800_000, newest_ts=NOW - 1_790_000),
                   TopicRetention(retention_ms=HOUR_MS, segment_ms=300_000), check_ms=1000)
    assert quiet.deletion_window_s == (pytest.approx(1800.0), pytest.approx(1811.0))


def test_probe_saw_segment_end_refines_size_deadline():
    topic = TopicRetention(retention_ms=None, retention_bytes=12 * MB)
    coarse = assess(snap(ingest_bytes_per_s=1 * MB), topic)
    fine = assess(snap(ingest_bytes_per_s=1 * MB, probe_reached_segment_end=True, probe_bytes=3 * MB), topic)
    assert coarse.time_to_loss_s == pytest.approx(2.0) and fine.time_to_loss_s == pytest.approx(5.0)


def test_copy_throughput_estimate():
    b, d = 100 * MB, 4 * 1024 * 1024
    assert estimate_copy_throughput(b, 0.01, d) == pytest.approx(b * d / (b * 0.01 + d))
    assert estimate_copy_throughput(b, 0.0, d) == pytest.approx(b)                  # no latency: the link
    assert estimate_copy_throughput(1e15, 0.05, d) == pytest.approx(d / 0.05, rel=1e-6)  # latency-bound
    with pytest.raises(ConfigError):
        estimate_copy_throughput(0, 0.01, d)
    cap = CopyCapacity.estimate(bandwidth_bytes_per_s=b, rtt_s=0.01, fetch_bytes=d)
    assert cap.ceiling_bytes_per_s == b and "RTT 10.00 ms" in cap.how


def test_catch_up_eta_edges():
    assert catch_up_eta(0, 5.0, 1.0) == 0.0
    assert catch_up_eta(100, 5.0, 5.0) == INF
    assert catch_up_eta(100, 0.0, 50.0) == 2.0


def test_order_is_most_urgent_first():
    safe = assess(snap(partition=0))
    losing = assess(snap(partition=1, ingest_bytes_per_s=50 * MB), copy=1 * MB)
    at_risk = assess(snap(partition=2, size_bytes=9000 * MB), threshold=1000.0)
    lost = assess(snap(partition=3, position=0, log_start=10))
    assert [s.partition for s in order_by_deadline([safe, losing, at_risk, lost])] == [3, 1, 2, 0]


def test_from_configs_defaults_and_bad_values():
    topic = TopicRetention.from_configs({})
    assert topic.cleanup_policy == frozenset({"delete"}) and topic.retention_bytes is None
    assert topic.retention_ms == 7 * 24 * HOUR_MS
    with pytest.raises(ConfigError, match="retention.ms='soon'"):
        TopicRetention.from_configs({"retention.ms": "soon"})


@given(copy=st.floats(1e3, 1e9), more=st.floats(1.0, 100.0), ingest=st.floats(0, 1e8),
       age_s=st.integers(0, 7200), size=st.integers(1, 10**11))
def test_faster_copy_never_worsens_the_verdict(copy, more, ingest, age_s, size):
    s = snap(size_bytes=size, ingest_bytes_per_s=ingest, position_ts=NOW - age_s * 1000)
    slow, fast = assess(s, copy=copy), assess(s, copy=copy * more)
    assert fast.status.severity <= slow.status.severity
    assert fast.margin_s >= slow.margin_s
    assert (slow.status in (Status.LOSING, Status.LOST)) == (slow.margin_s < 0)
