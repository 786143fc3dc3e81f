"""Rendering retention verdicts: table, JSON, the PNG/HTML chart (checked by its pixels), and the Prometheus gauges."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pytest
from PIL import Image
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from mirror_core.cli.deadlines_command import load_positions
from mirror_core.config.durations import parse_duration
from mirror_core.errors import ConfigError
from mirror_core.model.retention import Status
from mirror_core.services.deadlines_report import (
    CHART_WIDTH_PX,
    COLOURS,
    ETA_COLOUR,
    chart_height_px,
    format_duration,
    render_chart_html,
    render_chart_png,
    render_table,
    report_to_dict,
)
from mirror_core.services.retention_metrics import (
    register_retention_gauges,
    unregister_retention_gauges,
    update_retention_gauges,
)
from tests.unit.model.test_retention_model import MB, assess, snap


@pytest.fixture
def verdicts():
    """One partition per status: 0 SAFE, 1 LOSING (copy slower than ingest), 2 AT_RISK, 3 LOST."""
    out = [assess(snap(partition=0)), assess(snap(partition=1, ingest_bytes_per_s=50 * MB), copy=1 * MB),
           assess(snap(partition=2, size_bytes=9000 * MB), threshold=1000.0),
           assess(snap(partition=3, position=0, log_start=10))]
    assert [v.status for v in out] == [Status.SAFE, Status.LOSING, Status.AT_RISK, Status.LOST]
    return out


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _runs(img: Image.Image, colour: str) -> dict[int, int]:
    """Row → longest horizontal run of exactly ``colour`` in that row (bars are long runs; legend swatches short)."""
    mask = (np.asarray(img.convert("RGB")) == np.array(_rgb(colour), dtype=np.uint8)).all(axis=2)
    out = {}
    for y in np.flatnonzero(mask.any(axis=1)):
        edges = np.diff(np.concatenate(([0], mask[y].astype(np.int8), [0])))
        out[int(y)] = int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max())
    return out


def test_png_chart_has_a_bar_per_partition_in_urgency_order(verdicts, tmp_path):
    path = render_chart_png(verdicts, tmp_path / "deadlines.png", at_risk_below_s=1000)
    img = Image.open(path).convert("RGB")
    assert img.size == (CHART_WIDTH_PX, chart_height_px(4))
    axis_width = CHART_WIDTH_PX * 0.74
    bars = {}
    for status in Status:
        runs = {y: n for y, n in _runs(img, COLOURS[status]).items() if n > 60}   # longer than a legend swatch
        assert runs, f"no {status.value} bar drawn"
        bars[status] = (min(runs), max(runs), max(runs.values()))
    # most urgent on top: LOST, LOSING, AT_RISK, SAFE
    tops = [bars[s][0] for s in (Status.LOST, Status.LOSING, Status.AT_RISK, Status.SAFE)]
    assert tops == sorted(tops)
    # LOST spans the whole axis; 30 min to loss is the same length for SAFE, AT_RISK and LOSING
    assert bars[Status.LOST][2] >= axis_width * 0.98
    assert bars[Status.SAFE][2] == pytest.approx(bars[Status.AT_RISK][2], abs=3)
    assert bars[Status.SAFE][2] < axis_width * 0.95
    # ETA bars: the LOSING one (never) runs off the loss bar to the right edge; the AT_RISK one stops before it
    eta = {y: n for y, n in _runs(img, ETA_COLOUR).items() if n > 60}
    losing_eta = [n for y, n in eta.items() if bars[Status.LOSING][0] <= y <= bars[Status.LOSING][1]]
    at_risk_eta = [n for y, n in eta.items() if bars[Status.AT_RISK][0] <= y <= bars[Status.AT_RISK][1]]
    assert max(losing_eta) >= axis_width * 0.98
    assert 0.5 * bars[Status.AT_RISK][2] < max(at_risk_eta) < bars[Status.AT_RISK][2]
    # the SAFE partition's ETA of 1 s is at the axis origin: no visible ETA bar in its row
    assert not [y for y in eta if bars[Status.SAFE][0] <= y <= bars[Status.SAFE][1]]


def test_png_chart_height_follows_the_partition_count(verdicts, tmp_path):
    one = Image.open(render_chart_png(verdicts[:1], tmp_path / "one.png", at_risk_below_s=60))
    assert one.size == (CHART_WIDTH_PX, chart_height_px(1)) and chart_height_px(1) < chart_height_px(4)
    no_bars = {s: [n for n in _runs(one.convert("RGB"), COLOURS[s]).values() if n > 60] for s in Status}
    assert no_bars[Status.SAFE] and not no_bars[Status.LOST] and not no_bars[Status.AT_RISK]


def test_html_chart_is_self_contained_svg(verdicts, tmp_path):
    page = render_chart_html(verdicts, tmp_path / "deadlines.html", at_risk_below_s=1000).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page and "http" not in \
        page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    widths = {m.group(1): float(m.group(2))
              for m in re.finditer(r'class="ttl (\w+)" x="[\d.]+" y="[\d.]+" width="([\d.]+)"', page)}
    assert set(widths) == {"SAFE", "AT_RISK", "LOSING", "LOST"}
    assert widths["LOST"] == 700 and widths["SAFE"] == widths["AT_RISK"] < 700
    assert page.index("t-3") < page.index("t-1") < page.index("t-2") < page.index("t-0")
    assert "LOST [0, 10)" in page and "retention.ms to &gt;= 3700000" in page


def test_table_sorted_by_margin_with_remedies(verdicts):
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(render_table(verdicts))
    text = console.file.getvalue()
    rows = [line for line in text.splitlines() if re.match(r"^│ t-\d", line)]
    assert [r.split()[1] for r in rows] == ["t-3", "t-1", "t-2", "t-0"]
    assert "LOST" in rows[0] and "[0, 10)" in rows[0] and "-∞" in rows[1] and "2 streams" in rows[2]


def test_json_report(verdicts):
    report = json.loads(json.dumps(report_to_dict("source", verdicts, at_risk_below_s=1000, copy_how="measured")))
    assert report["counts"] == {"SAFE": 1, "AT_RISK": 1, "LOSING": 1, "LOST": 1}
    first, losing = report["partitions"][0], report["partitions"][1]
    assert first["status"] == "LOST" and first["lost_range"] == [0, 10] and first["lost_records"] == 10
    assert first["margin_s"] is None and first["deletion_at"] is None and first["remedy"]["accept_loss"]
    assert losing["eta_s"] is None and losing["time_to_loss_s"] == 1800.0 and losing["remedy"]["streams_needed"]
    assert report["partitions"][-1]["remedy"] is None


def test_durations():
    assert [format_duration(x) for x in (5.25, 45, 125, 7300, 200000, math.inf, -30)] == \
        ["5.2s", "45s", "2m 05s", "2h 01m", "2d 07h", "never", "-30s"]
    assert [parse_duration(x, what="d") for x in ("90", "90s", "15m", "2h", "1d", "500ms")] == \
        [90, 90, 900, 7200, 86400, 0.5]
    with pytest.raises(ConfigError, match="soon"):
        parse_duration("soon", what="--at-risk-below")


def test_positions_file(tmp_path):
    good = tmp_path / "positions.json"
    good.write_text(json.dumps({"orders": {"0": 15, "3": 0}, "users": {"1": 7}}))
    assert load_positions(good) == {("orders", 0): 15, ("orders", 3): 0, ("users", 1): 7}
    for content, message in (("[1]", "expected"), ('{"t": {"x": 1}}', "'x'"), ('{"t": {"0": -1}}', "-1"),
                             ('{"t": 5}', "must map"), ("{", "not valid JSON")):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_positions(bad)


def test_gauges_follow_the_latest_verdicts(verdicts):
    registry = CollectorRegistry()
    gauges = register_retention_gauges(registry)
    try:
        update_retention_gauges(verdicts)
        text = generate_latest(registry).decode()
        assert 'shoal_retention_margin_seconds{partition="3",topic="t"} -Inf' in text
        assert 'shoal_retention_margin_seconds{partition="0",topic="t"} 1799.0' in text
        assert 'shoal_retention_catchup_eta_seconds{partition="1",topic="t"} +Inf' in text
        assert 'shoal_retention_time_to_loss_seconds{partition="2",topic="t"} 1800.0' in text
        assert 'shoal_retention_unmirrored_bytes{partition="2",topic="t"} 9e+09' in text
        assert 'shoal_retention_lost_offsets{partition="3",topic="t"} 10.0' in text
        assert 'shoal_retention_status{partition="2",status="AT_RISK",topic="t"} 1.0' in text
        assert 'shoal_retention_status{partition="2",status="SAFE",topic="t"} 0.0' in text
        update_retention_gauges(verdicts[:1])       # partitions no longer assessed disappear
        text = generate_latest(registry).decode()
        assert 'partition="3"' not in text and 'partition="0"' in text
    finally:
        unregister_retention_gauges(registry, gauges)
    update_retention_gauges(verdicts)               # no registered set left: a no-op
    assert "shoal_retention" not in generate_latest(registry).decode()
