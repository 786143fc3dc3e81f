"""Render retention verdicts (:class:`~mirror_core.model.retention.RetentionStatus`): a coloured table, JSON, and a
chart of time to loss against catch-up ETA per partition (PNG through matplotlib's Agg canvas; HTML as inline SVG).

The chart puts one row per partition, most urgent on top. A wide bar is the time to loss, coloured by status; a
thin dark bar inside it is the ETA: where the dark bar sticks out past the coloured one, the copy will not make it.
The time axis is logarithmic (seconds to weeks on one axis) and the dashed line is the AT_RISK threshold. A
partition without a deadline runs to the right edge ("never"); a LOST one is a red bar naming the lost offsets.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Sequence
from pathlib import Path

from mirror_core.errors import ConfigError
from mirror_core.model.copy_capacity import CopyCapacity
from mirror_core.model.retention import RetentionStatus, Status, order_by_deadline

COLOURS = {Status.SAFE: "#2e7d32", Status.AT_RISK: "#f9a825", Status.LOSING: "#ef6c00", Status.LOST: "#c62828"}
ETA_COLOUR = "#1a237e"
RICH_STYLES = {Status.SAFE: "green", Status.AT_RISK: "yellow", Status.LOSING: "bold dark_orange",
               Status.LOST: "bold red"}
CHART_WIDTH_PX = 1000
CHART_DPI = 100
MAX_CHART_ROWS = 40
_X_MIN_S = 1.0
TICKS = ((1, "1s"), (10, "10s"), (60, "1m"), (600, "10m"), (3600, "1h"), (6 * 3600, "6h"), (86400, "1d"),
         (7 * 86400, "1w"), (30 * 86400, "30d"), (365 * 86400, "1y"))


def format_duration(seconds: float) -> str:
    """``45s``, ``12m 05s``, ``3h 20m``, ``2d 04h``; ``never`` for infinity, ``-12s`` when overdue."""
    if math.isinf(seconds):
        return "never" if seconds > 0 else "-never"
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 60:
        return f"{sign}{s:.0f}s" if s >= 10 else f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


def format_margin(s: RetentionStatus) -> str:
    """A margin for people: ``-`` when LOST, ``∞`` without a deadline, ``-∞`` when the copy never catches up."""
    if s.status is Status.LOST:
        return "-"
    if math.isinf(s.margin_s):
        return "∞" if s.margin_s > 0 else "-∞"
    return format_duration(s.margin_s)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 3)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


# -- JSON -----------------------------------------------------------------------------------------------------------


def status_to_dict(s: RetentionStatus) -> dict:
    """JSON-ready; ``null`` seconds mean unbounded: ``time_to_loss_s``/``eta_s`` never, ``margin_s`` +∞ without a
    deadline or -∞ when LOST or when the copy never catches up."""
    deletion_at = s.deletion_at_ms()
    return {
        "topic": s.topic, "partition": s.partition, "status": s.status.value,
        "position": s.position, "log_start": s.log_start, "log_end": s.log_end,
        "unmirrored_records": s.unmirrored_records, "unmirrored_bytes": s.unmirrored_bytes,
        "time_to_loss_s": _finite(s.time_to_loss_s), "loss_cause": s.loss_cause.value if s.loss_cause else None,
        "deletion_at": _iso(deletion_at) if deletion_at is not None else None,
        "deletion_window_s": [round(x, 3) for x in s.deletion_window_s] if s.deletion_window_s else None,
        "deadlines_s": {k: _finite(v) for k, v in s.deadlines_s.items()},
        "eta_s": _finite(s.eta_s), "margin_s": _finite(s.margin_s),
        "ingest_bytes_per_s": round(s.ingest_bytes_per_s, 3), "copy_bytes_per_s": round(s.copy_bytes_per_s, 3),
        "lost_range": list(s.lost_range) if s.lost_range else None, "lost_records": s.lost_records,
        "remedy": {"streams_needed": s.remedy.streams_needed, "config_changes": dict(s.remedy.config_changes),
                   "accept_loss": s.remedy.accept_loss, "text": s.remedy.text} if s.status is not Status.SAFE else None,
        "observed_at": _iso(s.observed_at_ms),
    }


def report_to_dict(cluster: str, statuses: Sequence[RetentionStatus], *, at_risk_below_s: float,
                   copy_how: str = "", copy: CopyCapacity | None = None) -> dict:
    """The report as JSON; ``copy``: the capacity behind the ETAs, whose figures (link rate, round trip, fetch
    size) are included as ``copy_figures``."""
    ordered = order_by_deadline(statuses)
    counts = {st.value: sum(1 for s in ordered if s.status is st) for st in Status}
    out = {"cluster": cluster, "at_risk_below_s": at_risk_below_s, "copy_throughput": copy_how, "counts": counts,
           "partitions": [status_to_dict(s) for s in ordered]}
    if copy is not None:
        out["copy_figures"] = copy.figures()
    return out


# -- table ----------------------------------------------------------------------------------------------------------


def render_table(statuses: Sequence[RetentionStatus], *, title: str = "retention deadlines"):
    """A rich Table, most urgent first."""
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (("partition", "left"), ("status", "left"), ("time to loss", "right"), ("cause", "left"),
                         ("ETA", "right"), ("margin", "right"), ("unmirrored", "right"), ("lost offsets", "left"),
                         ("what would fix it", "left")):
        table.add_column(col, justify=justify, no_wrap=col not in ("what would fix it",))
    for s in order_by_deadline(statuses):
        style = RICH_STYLES[s.status]
        ttl = "lost" if s.status is Status.LOST else format_duration(s.time_to_loss_s)
        table.add_row(
            f"{s.topic}-{s.partition}", f"[{style}]{s.status.value}[/]", ttl,
            s.loss_cause.value if s.loss_cause else "-", format_duration(s.eta_s), format_margin(s),
            f"{s.unmirrored_records} / {s.unmirrored_bytes / 1e6:.2f} MB",
            f"[{s.lost_range[0]}, {s.lost_range[1]})" if s.lost_range else "-", s.remedy.text or "-")
    return table


# -- chart ----------------------------------------------------------------------------------------------------------


def _chart_rows(statuses: Sequence[RetentionStatus]) -> tuple[list[RetentionStatus], int]:
    ordered = order_by_deadline(statuses)
    return ordered[:MAX_CHART_ROWS], max(0, len(ordered) - MAX_CHART_ROWS)


def _x_max(rows: Sequence[RetentionStatus], threshold: float) -> float:
    finite = [v for s in rows for v in (s.time_to_loss_s, s.eta_s, threshold) if not math.isinf(v) and v > 0]
    return max(60.0, max(finite, default=60.0) * 3)


def _bar_end(value: float, x_max: float) -> float:
    """Where a bar of ``value`` seconds ends on the clamped log axis [_X_MIN_S, x_max]."""
    if math.isinf(value):
        return x_max if value > 0 else _X_MIN_S
    return min(max(value, _X_MIN_S), x_max)


def _label(s: RetentionStatus) -> str:
    if s.status is Status.LOST:
        return f"LOST [{s.lost_range[0]}, {s.lost_range[1]})"
    return f"{s.status.value}  loss {format_duration(s.time_to_loss_s)}, ETA {format_duration(s.eta_s)}"


def _short(name: str, limit: int = 34) -> str:
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def chart_height_px(n_rows: int) -> int:
    return int(round((1.6 + 0.45 * max(n_rows, 1)) * CHART_DPI))


def render_chart_png(statuses: Sequence[RetentionStatus], path: str | Path, *, at_risk_below_s: float,
                     title: str = "Retention deadlines: time to loss vs catch-up ETA") -> Path:
    """Write the chart as a PNG ``CHART_WIDTH_PX`` wide and :func:`chart_height_px` high."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        raise ConfigError("a PNG chart needs matplotlib (see requirements.txt); an .html chart does not") from None

    rows, hidden = _chart_rows(statuses)
    x_max = _x_max(rows, at_risk_below_s)
    height_in = chart_height_px(len(rows)) / CHART_DPI
    fig = Figure(figsize=(CHART_WIDTH_PX / CHART_DPI, height_in), dpi=CHART_DPI)
    FigureCanvasAgg(fig)
    band = 0.75 / height_in   # title and legend above, ticks and axis label below
    ax = fig.add_axes((0.24, band, 0.74, 1 - 2 * band))
    ax.set_xscale("log")
    ax.set_xlim(_X_MIN_S, x_max)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    for i, s in enumerate(rows):
        ttl_end = x_max if s.status is Status.LOST else _bar_end(s.time_to_loss_s, x_max)
        ax.barh(i, ttl_end - _X_MIN_S, left=_X_MIN_S, height=0.7, color=COLOURS[s.status], edgecolor="none",
                antialiased=False)
        if s.status is not Status.LOST and s.eta_s > 0:
            ax.barh(i, _bar_end(s.eta_s, x_max) - _X_MIN_S, left=_X_MIN_S, height=0.22, color=ETA_COLOUR,
                    edgecolor="none", antialiased=False)
        ax.text(_X_MIN_S * 1.15, i - 0.22, _label(s), va="center", ha="left", fontsize=8, color="white",
                fontweight="bold")
    ax.axvline(max(at_risk_below_s, _X_MIN_S), color="#555555", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [_short(f"{s.topic}-{s.partition}") for s in rows], fontsize=8)
    ticks = [(t, label) for t, label in TICKS if t <= x_max]
    ax.xaxis.set_major_locator(FixedLocator([t for t, _ in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([label for _, label in ticks], fontsize=8)
    ax.set_xlabel("seconds from now (log scale); dashed: AT_RISK threshold" +
                  (f"; {hidden} less urgent partitions not shown" if hidden else ""), fontsize=8)
    fig.text(0.01, 1 - 0.3 / height_in, title, fontsize=11, fontweight="bold", va="center")
    handles = [Patch(color=COLOURS[st], label=st.value) for st in Status] + [Patch(color=ETA_COLOUR, label="ETA")]
    fig.legend(handles=handles, loc="center right", bbox_to_anchor=(0.99, 1 - 0.3 / height_in), ncol=5, fontsize=8,
               frameon=False)
    out = Path(path)
    fig.savefig(out, format="png", dpi=CHART_DPI)
    return out


CHART_TITLE = "Retention deadlines: time to loss vs catch-up ETA"


def render_chart_html(statuses: Sequence[RetentionStatus], path: str | Path, *, at_risk_below_s: float,
                      title: str = CHART_TITLE) -> Path:
    """The same chart as a self-contained HTML page with inline SVG (hover a bar for its numbers)."""
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>" + html.escape(title) +
            "</title></head><body>" + render_chart_svg(statuses, at_risk_below_s=at_risk_below_s, title=title) +
            "</body></html>")
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out


def render_chart_svg(statuses: Sequence[RetentionStatus], *, at_risk_below_s: float, title: str = CHART_TITLE) -> str:
    """The chart as one ``<svg>`` element, for embedding in a page (the Airflow UI plugin, the HTML report)."""
    rows, hidden = _chart_rows(statuses)
    x_max = _x_max(rows, at_risk_below_s)
    left, width, row_h, top = 260, 700, 30, 50
    height = top + row_h * max(len(rows), 1) + 70

    def x(seconds: float) -> float:
        return left + width * math.log(_bar_end(seconds, x_max) / _X_MIN_S) / math.log(x_max / _X_MIN_S)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" height="{height}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="{left}" y="25" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    for i, s in enumerate(rows):
        y = top + i * row_h
        end = left + width if s.status is Status.LOST else x(s.time_to_loss_s)
        tip = html.escape(f"{s.topic}-{s.partition}: {_label(s)}; margin {format_margin(s)}; "
                          f"{s.remedy.text or 'no action needed'}")
        parts.append(f'<g><title>{tip}</title>'
                     f'<text x="{left - 8}" y="{y + 19}" text-anchor="end">{html.escape(f"{s.topic}-{s.partition}")}'
                     f'</text><rect class="ttl {s.status.value}" x="{left}" y="{y + 4}" width="{end - left:.1f}" '
                     f'height="22" fill="{COLOURS[s.status]}"/>')
        if s.status is not Status.LOST and s.eta_s > 0:
            parts.append(f'<rect class="eta" x="{left}" y="{y + 11}" width="{x(s.eta_s) - left:.1f}" height="8" '
                         f'fill="{ETA_COLOUR}"/>')
        parts.append(f'<text x="{left + 6}" y="{y + 19}" fill="white" font-weight="bold">'
                     f'{html.escape(_label(s))}</text></g>')
    axis_y = top + row_h * max(len(rows), 1) + 5
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#333"/>')
    for t, label in TICKS:
        if t <= x_max:
            parts.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle">{label}</text>')
    tx = x(max(at_risk_below_s, _X_MIN_S))
    parts.append(f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{axis_y}" stroke="#555" stroke-dasharray="5,4"/>')
    legend = " ".join(f'<tspan fill="{COLOURS[st]}">■ {st.value}</tspan>' for st in Status)
    note = f"; {hidden} less urgent partitions not shown" if hidden else ""
    parts.append(f'<text x="{left}" y="{axis_y + 40}">{legend} <tspan fill="{ETA_COLOUR}">■ ETA</tspan> '
                 f'— log time axis; dashed: AT_RISK threshold{html.escape(note)}</text></svg>')
    return "".join(parts)
