"""The retention ETA uses the copy's link figures (mirror_core.model.retention_policy.RetentionPolicy.capacity): the
declared link rate, the measured round trip and the fetch size the copy sizes for them. Pure."""

from __future__ import annotations

import json

import pytest

from mirror_core.model.retention_policy import DEFAULT_FETCH_BYTES, RetentionPolicy
from mirror_core.services.deadlines_report import report_to_dict

MiB = 1024 * 1024


def test_a_declared_link_gives_the_eta_of_the_copy_sized_for_it():
    cap = RetentionPolicy().capacity(0.2, link_bytes_per_s=20e6, rtt_how="measured: source broker 1")
    assert cap.fetch_bytes == 36_000_000, "9 × bandwidth × RTT, what the copy fetches at 200 ms and 20 MB/s"
    assert cap.bytes_per_s == pytest.approx(18e6), "90 % of the link, not the 4 MiB fetch's 10 MB/s"
    assert cap.link_bytes_per_s == 20e6 and cap.rtt_s == 0.2 and cap.ceiling_bytes_per_s == 20e6
    assert "RTT 200.00 ms (measured: source broker 1)" in cap.how
    assert "fetch 36000000 B (sized for the link)" in cap.how and "link 20MB/s (declared for the copy)" in cap.how


def test_without_a_declared_link_the_policy_figures_are_used_and_named():
    cap = RetentionPolicy().capacity(0.2)
    assert cap.fetch_bytes == DEFAULT_FETCH_BYTES and cap.link_bytes_per_s == 100e6
    assert cap.bytes_per_s == pytest.approx(100e6 * 4 * MiB / (100e6 * 0.2 + 4 * MiB))
    assert "link 100MB/s (assumed)" in cap.how and "(configured)" in cap.how


def test_a_near_source_keeps_the_configured_fetch_and_a_throttle_keeps_the_figures():
    near = RetentionPolicy().capacity(0.0005, link_bytes_per_s=20e6)
    assert near.fetch_bytes == DEFAULT_FETCH_BYTES and "enough for the link" in near.how
    throttled = RetentionPolicy().capacity(0.2, link_bytes_per_s=20e6, throttle_bytes_per_s=4e6, streams=2)
    assert throttled.bytes_per_s == 2e6 and throttled.fetch_bytes == 36_000_000 and throttled.rtt_s == 0.2


def test_a_measured_throughput_has_no_estimate_figures_and_the_json_report_carries_them():
    measured = RetentionPolicy(throughput_bytes_per_s=5e6).capacity(0.2, link_bytes_per_s=20e6)
    assert measured.bytes_per_s == 5e6 and measured.rtt_s is None
    cap = RetentionPolicy().capacity(0.05, link_bytes_per_s=20e6)
    report = json.loads(json.dumps(report_to_dict("source", [], at_risk_below_s=60, copy_how=cap.how, copy=cap)))
    assert report["copy_figures"]["link_bytes_per_s"] == 20e6 and report["copy_figures"]["rtt_ms"] == 50.0
    assert report["copy_figures"]["fetch_bytes"] == 9_000_000   # 9 × 20 MB/s × 50 ms, above the 4 MiB floor
