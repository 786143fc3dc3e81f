"""The "Shoal" page in the Airflow UI, for the operator at 3 a.m.: per pipeline its lanes with their state (copying,
stalled, halted with the reason and offsets, retired), lag in offsets, bytes and seconds, daemon health (the
pipeline's daemon group: its members and who holds which lane, read from the source; lease-based daemons of an
older release during an upgrade), retention margins and the deadline chart (inline SVG), the backfill ledger
with runs in flight, links to the DAG runs and to trigger a backfill; and the DR rehearsal history (RTO/RPO).

A FastAPI app mounted by the api-server at ``/shoal`` (``fastapi_apps``) and a nav entry that shows it in an iframe
(``external_views``). Every route sits behind Airflow's own authentication: the JWT a browser carries in Airflow's
session cookie or a ``Authorization: Bearer`` token, resolved by the api-server's ``get_user``, then the auth
manager's ``is_authorized_custom_view(GET, "Shoal")`` (the simple auth manager grants it from the viewer role up).

Which pipelines: the configuration the DAGs and the daemon already have — the daemon's pipeline files (Airflow
config ``[shoal] pipeline_files``, comma-separated globs: clusters, ``stall_after_s`` and the ``retention:`` policy
come from the file) and the pipelines recent runs of the Shoal DAGs were triggered for (their connection ids) — plus,
optionally, the Variable ``shoal_pipelines`` (a JSON list of ``{"pipeline", "source_conn_id", "target_conn_id",
"topics"?, "at_risk_below"?, "retention"?}``). Secrets only through ``kafka`` connections or the pipeline files; the
JSON view never carries cluster settings. The ledger is read from ``<Variable shoal_work_dir>/ledger``.

Reads go through a short cache (``CACHE_TTL_S``) and a page deadline (``READ_DEADLINE_S``): a slow cluster shows
its last reading (marked with its age) or "still reading", never a hung page. A pipeline that cannot be read shows
its error; the others still render.

Airflow loads plugin files in every process (scheduler, workers, DAG processor), so heavy imports — the api-server's
security module, Kafka clients — happen inside functions, when a request arrives.
"""

from __future__ import annotations

import dataclasses
import html
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

if TYPE_CHECKING:
    from mirror_core.services.pipeline_view import LaneRow

log = logging.getLogger(__name__)

PIPELINES_VARIABLE = "shoal_pipelines"
RESOURCE_NAME = "Shoal"
_SPEC_KEYS = {"pipeline", "source_conn_id", "target_conn_id", "topics", "at_risk_below", "retention"}
SHOAL_DAGS = {"shoal_backfill": "backfill", "shoal_retention_guard": "mirror", "shoal_catchup_handoff": "mirror"}
CACHE_TTL_S = 15.0       # a reading younger than this is shown again instead of asking the clusters
READ_DEADLINE_S = 10.0   # the page waits this long for a pipeline's reading, then shows the last one
RECENT_RUNS = 200        # DAG runs looked at for pipelines and links


# -- configuration --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline the page shows. ``topics`` empty: the source topics the pipeline has checkpoints for."""

    pipeline: str
    source_conn_id: str
    target_conn_id: str
    topics: tuple[str, ...] = ()
    at_risk_below_s: float | None = None   # None: the policy's threshold
    retention: Mapping | None = None       # the pipeline's retention policy keys (mirror_core.model.retention_policy)
    pipeline_file: str | None = None       # the daemon's pipeline file: clusters, stall_after_s, retention policy
    origin: str = "variable"               # where the page found it: variable, pipeline file, DAG runs

    @property
    def policy(self):
        if self.pipeline_file:
            return self.config().retention.overridden(at_risk_below_s=self.at_risk_below_s)
        from mirror_core.services.lag import retention_policy

        return retention_policy(self.retention, self.at_risk_below_s)

    def config(self):
        from pathlib import Path

        from mirror_core.config.pipeline_file import load_pipeline_config

        return load_pipeline_config(Path(self.pipeline_file))

    def clusters(self):
        """(source, target) cluster configs: from the pipeline file, else the ``kafka`` connections."""
        if self.pipeline_file:
            cfg = self.config()
            return cfg.source, cfg.target
        from shoal_airflow.hooks import ShoalKafkaHook

        return ShoalKafkaHook(self.source_conn_id).get_cluster(), ShoalKafkaHook(self.target_conn_id).get_cluster()

    @property
    def stall_after_s(self) -> float:
        return self.config().stall_after_s if self.pipeline_file else 300.0

    @classmethod
    def parse(cls, entry: Any) -> PipelineSpec:
        from mirror_core.config.durations import parse_duration
        from mirror_core.errors import ConfigError

        where = f"Variable {PIPELINES_VARIABLE}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: every entry must be an object, got {entry!r}")
        unknown = sorted(set(entry) - _SPEC_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_SPEC_KEYS))})")
        for key in ("pipeline", "source_conn_id", "target_conn_id"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}: {key!r} is required and must be a non-empty string")
        topics = entry.get("topics") or []
        if isinstance(topics, str) or not all(isinstance(t, str) and t for t in topics):
            raise ConfigError(f"{where}: pipeline {entry['pipeline']!r}: 'topics' must be a list of topic names")
        threshold = None if entry.get("at_risk_below") is None else parse_duration(
            str(entry["at_risk_below"]), what=f"{where}: 'at_risk_below'")
        spec = cls(entry["pipeline"], entry["source_conn_id"], entry["target_conn_id"], tuple(topics), threshold,
                   entry.get("retention"))
        spec.policy  # noqa: B018 - validated here, at the edge
        return spec


def load_pipeline_specs() -> list[PipelineSpec]:
    """Every pipeline to show, first finding wins: the Variable (optional), the daemon's pipeline files, recent
    runs of the Shoal DAGs."""
    from airflow.models.variable import Variable

    from mirror_core.errors import ConfigError

    specs: list[PipelineSpec] = []
    entries = Variable.get(PIPELINES_VARIABLE, default_var=None, deserialize_json=True)
    if entries is not None:
        if not isinstance(entries, list):
            raise ConfigError(f"Variable {PIPELINES_VARIABLE} must be a JSON list of pipelines")
        specs += [PipelineSpec.parse(e) for e in entries]
    specs += pipelines_from_files(_pipeline_file_globs())
    specs += pipelines_from_runs(recent_runs())
    seen: set[str] = set()
    return [s for s in specs if not (s.pipeline in seen or seen.add(s.pipeline))]


def _pipeline_file_globs() -> str:
    from airflow.configuration import conf

    return conf.get("shoal", "pipeline_files", fallback="") or ""


def pipelines_from_files(globs: str) -> list[PipelineSpec]:
    """One spec per daemon pipeline file matching the comma-separated ``globs`` (an unreadable file still shows)."""
    import glob

    from mirror_core.config.pipeline_file import load_pipeline_config

    out = []
    for pattern in (g.strip() for g in globs.split(",") if g.strip()):
        for path in sorted(glob.glob(pattern)):
            try:
                name = load_pipeline_config(Path(path)).pipeline
            except Exception:  # noqa: BLE001 - shown as that pipeline's error when it is read
                name = Path(path).stem
            out.append(PipelineSpec(name, "(pipeline file)", "(pipeline file)", pipeline_file=path,
                                    origin="pipeline file"))
    return out


def pipelines_from_runs(runs) -> list[PipelineSpec]:
    """The pipelines recent Shoal DAG runs were for (newest first), with their connection ids (the DAGs'
    defaults where the run's conf left them out)."""
    out = []
    for run in runs:
        default = SHOAL_DAGS.get(run.dag_id)
        if default is None:
            continue
        conf = dict(run.conf or {})
        out.append(PipelineSpec(str(conf.get("pipeline") or default),
                                str(conf.get("source_conn_id") or "shoal_source"),
                                str(conf.get("target_conn_id") or "shoal_target"), origin=f"{run.dag_id} runs"))
    return out


def recent_runs() -> list:
    """The newest runs of the Shoal DAGs (the api-server reads the metadata DB)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id.in_([*SHOAL_DAGS, "shoal_dr_rehearsal"]))
                               .order_by(DagRun.id.desc()).limit(RECENT_RUNS)).all()
        for run in runs:
            session.expunge(run)
        return list(runs)


# -- reading a pipeline's state --------------------------------------------------------------------------------------




@dataclass
class PipelineView:
    spec: PipelineSpec
    lanes: list[LaneRow] = field(default_factory=list)
    retention: list[dict] = field(default_factory=list)  # deadlines_report.status_to_dict, most urgent first
    chart_svg: str = ""
    copy_throughput: str = ""
    daemon: list[str] = field(default_factory=list)        # daemon health sentences
    runs: list[dict] = field(default_factory=list)         # backfill runs, newest first, with units finished
    read_ms: int = 0                                       # when this reading was taken
    stale: str | None = None                               # why an older reading is shown
    error: str | None = None

    def to_dict(self) -> dict:
        body = asdict(self)
        body.pop("chart_svg")
        return body










def collect_pipeline(spec: PipelineSpec, *, ledger_dir: str | None = None, now_ms: int | None = None) -> PipelineView:
    """Everything the page shows about one pipeline (read by :mod:`mirror_core.services.pipeline_view`); an error is
    reported in the view, not raised."""
    from mirror_core.services.deadlines_report import status_to_dict
    from mirror_core.services.pipeline_view import read_holders, read_lanes, read_runs

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    view = PipelineView(spec, read_ms=now_ms)
    try:
        if ledger_dir:
            view.runs = read_runs(ledger_dir, spec.pipeline)
        source, target = spec.clusters()
        checkpoints, holders, view.daemon = read_holders(source, target, spec.pipeline, now_ms)
        topics = list(spec.topics) or sorted({t for (_pl, t, _p) in checkpoints})
        if not topics:
            return view
        view.lanes, verdict = read_lanes(source, target, spec.pipeline, topics, checkpoints, holders,
                                         lambda: spec.policy, stall_after_s=spec.stall_after_s, now_ms=now_ms)
        view.retention = [status_to_dict(s) for s in verdict.statuses]
        view.chart_svg = chart_svg(verdict.statuses, verdict.policy.at_risk_below_s)
        view.copy_throughput = verdict.copy.how
    except Exception as exc:  # noqa: BLE001 - one unreadable pipeline must not hide the others
        log.exception("Shoal page: pipeline %s could not be read", spec.pipeline)
        view.error = f"{type(exc).__name__}: {exc}"
    return view


def chart_svg(statuses, at_risk_below_s: float) -> str:
    """The deadline chart as an inline ``<svg>`` (:func:`mirror_core.services.deadlines_report.render_chart_svg`)."""
    from mirror_core.services.deadlines_report import render_chart_svg

    return render_chart_svg(statuses, at_risk_below_s=at_risk_below_s)


# -- HTML -------------------------------------------------------------------------------------------------------------

_STYLE = """
body{font-family:sans-serif;font-size:14px;margin:16px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}
.error{color:#c62828;font-weight:bold}
.SAFE{color:#2e7d32}.AT_RISK{color:#b28704}.LOSING{color:#ef6c00}.LOST{color:#c62828;font-weight:bold}
.dim{color:#777}
.copying{color:#2e7d32}.retired{color:#777}.halted{color:#c62828;font-weight:bold}
.stalled,.retrying{color:#ef6c00;font-weight:bold}.running{color:#1565c0;font-weight:bold}
.stale{background:#fff8e1;padding:4px}
section{margin-bottom:32px}
"""


def _cell(value: Any, *, num: bool = False, cls: str = "") -> str:
    text = "–" if value is None else str(value)
    classes = " ".join(c for c in ("num" if num else "", cls) if c)
    return f'<td class="{classes}">{html.escape(text)}</td>' if classes else f"<td>{html.escape(text)}</td>"


def _table(headers: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _holder_text(row: LaneRow) -> str | None:
    if row.holder is None and row.held is None and row.lane is not None:
        return "? (daemon group not readable)"
    return row.holder


def _lanes_table(view: PipelineView, now_ms: int) -> str:
    rows = []
    for r in view.lanes:
        target = None if r.target_topic is None else f"{r.target_topic}-{r.target_partition}"
        age = None if r.updated_ms is None else f"{max(0, now_ms - r.updated_ms) / 1000:.0f}s ago"
        rows.append('<tr class="lane">' + "".join((
            _cell(r.lane or "(no checkpoint)", cls="" if r.lane else "dim"), _cell(f"{r.topic}-{r.partition}"),
            _cell(target), _cell(r.owner), _cell(r.owner_epoch, num=True), _cell(_holder_text(r)),
            _cell(r.position, num=True), _cell(r.last_stable, num=True), _cell(r.lag, num=True),
            _cell(None if r.lag_bytes is None else f"{r.lag_bytes / 1e6:.2f} MB", num=True),
            _cell(None if r.lag_s is None else _seconds(r.lag_s), num=True),
            _cell(r.target_next, num=True), _cell(age), _cell(r.state, cls=r.state),
            _cell(None if r.reason == "none" else r.reason), _cell(_state_text(r)))) + "</tr>")
    return _table(("lane", "source partition", "target partition", "owner", "epoch", "held by", "position",
                   "last stable offset", "lag (offsets)", "lag (bytes)", "lag (oldest uncopied)", "target next",
                   "checkpoint updated", "state", "reason",
                   "what happened"), rows)


def _state_text(row: LaneRow) -> str | None:
    if row.state_detail is None:
        return None
    position, end = row.state_range or (None, None)
    where = f"at offset {position}" + (f", range end {end}" if end is not None else "") if position is not None \
        else ""
    remedy = " — `shoal lanes resume` once the cause is fixed" if row.state == "halted" else ""
    return f"{where}: {row.state_detail}{remedy}" if where else f"{row.state_detail}{remedy}"


def _seconds(value: float | None) -> str:
    from mirror_core.services.deadlines_report import format_duration

    return "never" if value is None else format_duration(value)


def _retention_table(view: PipelineView) -> str:
    rows = []
    for s in view.retention:
        margin = "–" if s["status"] == "LOST" else ("∞" if s["margin_s"] is None else _seconds(s["margin_s"]))
        lost = None if not s["lost_range"] else f"[{s['lost_range'][0]}, {s['lost_range'][1]})"
        remedy = (s["remedy"] or {}).get("text") or None
        rows.append("<tr>" + "".join((
            _cell(f"{s['topic']}-{s['partition']}"), _cell(s["status"], cls=s["status"]),
            _cell(_seconds(s["time_to_loss_s"]), num=True), _cell(s["loss_cause"]),
            _cell(_seconds(s["eta_s"]), num=True),
            _cell(margin, num=True), _cell(s["unmirrored_records"], num=True), _cell(lost), _cell(remedy))) + "</tr>")
    return _table(("partition", "status", "time to loss", "cause", "ETA", "margin", "unmirrored records",
                   "lost offsets", "what would fix it"), rows)


def render_pipeline(view: PipelineView, now_ms: int, links: Mapping[str, tuple[str, str]] | None = None) -> str:
    spec = view.spec
    trigger_conf = {"pipeline": spec.pipeline, "source_conn_id": spec.source_conn_id,
                    "target_conn_id": spec.target_conn_id, "start": "checkpoint", "end": "latest"}
    parts = [f'<section class="pipeline" id="pipeline-{html.escape(spec.pipeline)}">',
             f"<h2>{html.escape(spec.pipeline)}</h2>",
             f'<p class="dim">{html.escape(spec.source_conn_id)} → {html.escape(spec.target_conn_id)}; topics: '
             f"{html.escape(', '.join(spec.topics) or 'those with checkpoints')}; from {html.escape(spec.origin)}"
             f"{'' if not spec.pipeline_file else ' ' + html.escape(spec.pipeline_file)}</p>",
             f'<p><a class="trigger" target="_top" href="../dags/shoal_backfill">Trigger a backfill</a> '
             f'<span class="dim">(form values: <code>{html.escape(json.dumps(trigger_conf))}</code>)</span> · '
             f'<a target="_top" href="../dags/shoal_backfill/runs">backfill runs</a> · '
             f'<a target="_top" href="../dags/shoal_retention_guard/runs">retention guard runs</a></p>']
    if view.stale:
        parts.append(f'<p class="stale">{html.escape(view.stale)}</p>')
    if view.error:
        parts.append(f'<p class="error">{html.escape(view.error)}</p>')
    if view.daemon:
        parts.append("<h3>Daemon</h3><ul class='daemon'>" + "".join(f"<li>{html.escape(d)}</li>" for d in view.daemon)
                     + "</ul>")
    if not view.lanes and not view.error:
        parts.append("<p>No checkpoints on the target yet and no topics configured.</p>")
    elif view.lanes:
        total = sum(r.lag for r in view.lanes)
        halted = sum(1 for r in view.lanes if r.state == "halted")
        stalled = sum(1 for r in view.lanes if r.state == "stalled")
        alert = f'<p class="halted">{halted} lane(s) halted: they copy nothing until an operator acts</p>' \
            if halted else ""
        if stalled:
            alert += f'<p class="stalled">{stalled} lane(s) stalled: data waits and nothing moves</p>'
        parts += [f"<h3>Lanes <span class='dim'>(total lag {total} offsets)</span></h3>", alert,
                  _lanes_table(view, now_ms),
                  "<h3>Retention margins</h3>", _retention_table(view),
                  f'<p class="dim">copy throughput {html.escape(view.copy_throughput)}; AT_RISK below '
                  f"{_seconds(spec.policy.at_risk_below_s)}</p>", f'<div class="chart">{view.chart_svg}</div>']
    parts += ["<h3>Backfill ledger</h3>", _runs_table(view.runs, links or {}, now_ms), "</section>"]
    return "".join(parts)


def _run_link(run_id: str, links: Mapping[str, tuple[str, str]]) -> str:
    target = links.get(run_id)
    if target is None:
        return html.escape(run_id)
    dag_id, airflow_run = target
    href = f"../dags/{quote(dag_id)}/runs/{quote(airflow_run, safe='')}"
    return f'<a target="_top" href="{html.escape(href)}">{html.escape(run_id)}</a>'


def _runs_table(runs: Sequence[dict], links: Mapping[str, tuple[str, str]], now_ms: int) -> str:
    if not runs:
        return '<p class="dim">no backfill runs in the ledger</p>'
    rows = []
    for r in runs:
        state = "running" if r["in_flight"] else ("ok" if r["exit_code"] == 0 else f"failed (exit {r['exit_code']})")
        took = ((r["ended_ms"] or now_ms) - r["started_ms"]) / 1000
        rows.append('<tr class="run">' + f"<td>{_run_link(r['run_id'], links)}</td>" + "".join((
            _cell(state.upper() if r["in_flight"] else state, cls="running" if r["in_flight"] else ""),
            _cell(f"{r['finished']} of {r['units']}", num=True), _cell(r["records"], num=True),
            _cell(_seconds(took) + (" so far" if r["in_flight"] else ""), num=True),
            _cell("; ".join(r["failed"]) or None))) + "</tr>")
    return _table(("run", "state", "units finished", "records", "duration", "failed units"), rows)


def _rehearsals_table(rehearsals: Sequence, links: Mapping[str, tuple[str, str]]) -> str:
    if not rehearsals:
        return '<p class="dim">no DR rehearsal recorded yet (DAG shoal_dr_rehearsal)</p>'
    rows = []
    for r in rehearsals:
        rows.append("<tr>" + f"<td>{_run_link(r.rehearsal_id, links)}</td>" + "".join((
            _cell(r.topics), _cell(r.records, num=True), _cell(_seconds(r.rto_s), num=True),
            _cell(r.rpo_offsets, num=True), _cell(None if r.rpo_s is None else _seconds(r.rpo_s), num=True),
            _cell("verified" if r.verified else "NOT verified", cls="" if r.verified else "halted"))) + "</tr>")
    return _table(("rehearsal", "topics", "records", "RTO", "RPO (offsets)", "RPO (age)", "result"), rows)


def render_page(views: Sequence[PipelineView], *, config_error: str | None = None, now_ms: int | None = None,
                links: Mapping[str, tuple[str, str]] | None = None, rehearsals: Sequence = ()) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    body = [f"<h1>Shoal</h1><p class='dim'>read at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}</p>"]
    if config_error:
        body.append(f'<p class="error">{html.escape(config_error)}</p>')
    elif not views:
        body.append("<p>No pipelines found: none in the daemon's pipeline files (Airflow config <code>[shoal] "
                    "pipeline_files</code>), no run of the Shoal DAGs yet, and no Variable "
                    f"<code>{PIPELINES_VARIABLE}</code>.</p>")
    body += [render_pipeline(v, now_ms, links) for v in views]
    body += ["<section><h2>DR rehearsals</h2>", _rehearsals_table(rehearsals[::-1][:20], links or {}), "</section>"]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Shoal</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>")


# -- reading through a short cache ------------------------------------------------------------------------------------

_reads: list = []   # the page's ReadCache, made at the first request


def _spec_key(spec: PipelineSpec) -> tuple:
    return (spec.pipeline, spec.source_conn_id, spec.target_conn_id, spec.topics, spec.pipeline_file)


def cached_views(specs: Sequence[PipelineSpec], *, read=collect_pipeline, cache=None) -> list[PipelineView]:
    """Each spec's view through the page's :class:`~mirror_core.services.read_cache.ReadCache` (``CACHE_TTL_S``,
    ``READ_DEADLINE_S``): past the deadline the last reading is shown with its age, or "still reading"."""
    from mirror_core.services.read_cache import ReadCache

    if cache is None:
        if not _reads:
            _reads.append(ReadCache(ttl_s=CACHE_TTL_S, deadline_s=READ_DEADLINE_S))
        cache = _reads[0]
    readings = cache.get_many([(_spec_key(spec), lambda spec=spec: read(spec)) for spec in specs])
    views = []
    for spec, reading in zip(specs, readings, strict=True):
        if reading.value is None:
            views.append(PipelineView(spec, stale="still reading (the clusters are slow to answer); refresh in a "
                                                  "moment") if reading.still_reading else
                         PipelineView(spec, error="could not be read"))
        elif reading.still_reading:
            views.append(dataclasses.replace(reading.value, stale=f"the clusters are slow to answer: showing the "
                                                                  f"reading from {reading.age_s:.0f}s ago; still "
                                                                  "reading"))
        else:
            views.append(reading.value)
    return views


def _ledger_dir() -> str:
    from airflow.models.variable import Variable

    return str(Path(Variable.get("shoal_work_dir", default_var="/tmp/shoal")) / "ledger")


def run_links(runs) -> dict[str, tuple[str, str]]:
    """Ledger run id (the Airflow run id made file-safe, ``-roundN`` for catch-up rounds) → (dag id, run id)."""
    import re

    out: dict[str, tuple[str, str]] = {}
    for run in runs:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", run.run_id)
        out[safe] = (run.dag_id, run.run_id)
        for n in range(1, 4):
            out[re.sub(r"[^A-Za-z0-9._-]", "_", f"{run.run_id}-round{n}")] = (run.dag_id, run.run_id)
    return out


# -- the app ----------------------------------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False)


async def require_shoal_viewer(request: Request,
                               credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Any:
    """Airflow's authentication (bearer token, else the session cookie; 401/403 otherwise), then the auth
    manager's verdict on the custom view ``Shoal`` (403)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import get_user

    user = await get_user(request, _oauth_token=None, bearer_credentials=credentials)
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE_NAME, user=user):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="Forbidden")
    return user


def _collect() -> tuple[list[PipelineView], str | None]:
    try:
        specs = load_pipeline_specs()
        ledger = _ledger_dir()
    except Exception as exc:  # noqa: BLE001 - shown on the page: the operator fixes the configuration
        return [], f"{type(exc).__name__}: {exc}"
    return cached_views(specs, read=lambda spec: collect_pipeline(spec, ledger_dir=ledger)), None


def _page_extras() -> tuple[dict, list]:
    """Links to DAG runs and the rehearsal history (best effort: the page renders without them)."""
    from mirror_core.services.rehearsal import read_rehearsals

    try:
        links = run_links(recent_runs())
    except Exception:  # noqa: BLE001
        log.exception("Shoal page: DAG runs not read")
        links = {}
    try:
        rehearsals = read_rehearsals(_ledger_dir())
    except Exception:  # noqa: BLE001
        log.exception("Shoal page: rehearsals not read")
        rehearsals = []
    return links, rehearsals


app = FastAPI(title="Shoal", description="Shoal pipelines: lanes, lag, retention margins",
              dependencies=[Depends(require_shoal_viewer)])


@app.get("/", response_class=HTMLResponse)
def shoal_page() -> HTMLResponse:
    views, error = _collect()
    links, rehearsals = _page_extras()
    return HTMLResponse(render_page(views, config_error=error, links=links, rehearsals=rehearsals))


@app.get("/pipelines.json")
def shoal_pipelines() -> dict:
    views, error = _collect()
    _links, rehearsals = _page_extras()
    return {"error": error, "pipelines": [v.to_dict() for v in views],
            "rehearsals": [dataclasses.asdict(r) for r in rehearsals]}


class ShoalUIPlugin(AirflowPlugin):
    """Mounts the Shoal page in the api-server and links it from the nav bar."""

    name = "shoal_ui"
    fastapi_apps = [{"app": app, "url_prefix": "/shoal", "name": "Shoal"}]
    external_views = [{"name": "Shoal", "href": "shoal/", "url_route": "shoal", "destination": "nav",
                       "nav_top_level": True}]
