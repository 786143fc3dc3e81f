"""The "Shoal" page in the Airflow UI: per pipeline, its lanes (owner, epoch, lease holder), positions, lag behind the
source's last stable offset, retention margins and the deadline chart (inline SVG).

A FastAPI app mounted by the api-server at ``/shoal`` (``fastapi_apps``) and a nav entry that shows it in an iframe
(``external_views``). Every route sits behind Airflow's own authentication: the JWT a browser carries in Airflow's
session cookie or a ``Authorization: Bearer`` token, resolved by the api-server's ``get_user``, then the auth
manager's ``is_authorized_custom_view(GET, "Shoal")`` (the simple auth manager grants it from the viewer role up).

What to show comes from the Airflow Variable ``shoal_pipelines``, a JSON list of
``{"pipeline", "source_conn_id", "target_conn_id", "topics"?, "at_risk_below"?}``; clusters and their secrets only
through ``kafka`` connections (:class:`plugins.hooks.ShoalKafkaHook`). The page is read-only: it reads checkpoints
and leases on the target and offsets, configs and sizes on the source, on every request. A pipeline that cannot be
read shows its error; the others still render.

Airflow loads plugin files in every process (scheduler, workers, DAG processor), so heavy imports — the api-server's
security module, Kafka clients — happen inside functions, when a request arrives.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

log = logging.getLogger(__name__)

PIPELINES_VARIABLE = "shoal_pipelines"
RESOURCE_NAME = "Shoal"
_SPEC_KEYS = {"pipeline", "source_conn_id", "target_conn_id", "topics", "at_risk_below", "retention"}


# -- configuration --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline the page shows. ``topics`` empty: the source topics the pipeline has checkpoints for."""

    pipeline: str
    source_conn_id: str
    target_conn_id: str
    topics: tuple[str, ...] = ()
    at_risk_below_s: float | None = None   # None: the policy's threshold
    retention: Mapping | None = None       # the pipeline's retention policy keys (mirror_core.retention_policy)

    @property
    def policy(self):
        from plugins.lag import retention_policy

        return retention_policy(self.retention, self.at_risk_below_s)

    @classmethod
    def parse(cls, entry: Any) -> PipelineSpec:
        from mirror_core.deadlines_command import parse_duration
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
    """The pipelines of the ``shoal_pipelines`` Variable (none when it is not set)."""
    from airflow.models.variable import Variable

    from mirror_core.errors import ConfigError

    entries = Variable.get(PIPELINES_VARIABLE, default_var=None, deserialize_json=True)
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"Variable {PIPELINES_VARIABLE} must be a JSON list of pipelines")
    return [PipelineSpec.parse(e) for e in entries]


# -- reading a pipeline's state --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneRow:
    """One source partition of a pipeline. ``position`` None: no checkpoint yet (lag counts from the log start)."""

    lane: str | None
    topic: str
    partition: int
    position: int | None
    last_stable: int
    lag: int
    target_topic: str | None = None
    target_partition: int | None = None
    target_next: int | None = None
    owner: str | None = None
    owner_epoch: int | None = None
    lease_holder: str | None = None
    lease_expires_ms: int | None = None
    updated_ms: int | None = None
    state: str = "copying"  # the lane state persisted with the checkpoint: copying, halted or retired
    reason: str = "none"
    state_detail: str | None = None  # the halt's sentence: what happened, which offsets, what to do
    state_range: tuple[int | None, int | None] | None = None  # (position, range end) the halt names


@dataclass
class PipelineView:
    spec: PipelineSpec
    lanes: list[LaneRow] = field(default_factory=list)
    retention: list[dict] = field(default_factory=list)  # deadlines_report.status_to_dict, most urgent first
    chart_svg: str = ""
    copy_throughput: str = ""
    error: str | None = None

    def to_dict(self) -> dict:
        body = asdict(self)
        body.pop("chart_svg")
        return body


def read_target_state(target, pipeline: str):
    """``(checkpoints, leases)`` of one pipeline on the target; both empty when there is no checkpoint topic."""
    from mirror_core.checkpoint import CHECKPOINT_TOPIC, CheckpointStore
    from mirror_core.kafka_wire import WireClient
    from mirror_core.leases import LeaseStore

    with WireClient.for_cluster(target) as client:
        meta = client.metadata([CHECKPOINT_TOPIC]).get(CHECKPOINT_TOPIC)
        if meta is None or meta.error_code:
            return {}, {}
        store = CheckpointStore(target, client, partitions=len(meta.partitions))
        return store.read_all(pipeline, whole_maps=False), LeaseStore(store, producer_config={}).read(pipeline)


def lane_rows(checkpoints: Mapping, leases: Mapping, parts: Sequence[tuple[str, int]], last_stable: Mapping,
              log_start: Mapping, pipeline: str) -> list[LaneRow]:
    """Join checkpoints, leases and source offsets per selected partition."""
    from mirror_core.checkpointed import default_lane

    rows = []
    for topic, p in parts:
        stable = last_stable[(topic, p)]
        cp = checkpoints.get((pipeline, topic, p))
        if cp is None:
            rows.append(LaneRow(None, topic, p, None, stable, max(0, stable - log_start[(topic, p)])))
            continue
        lane = default_lane(cp.target_topic, cp.target_partition)
        lease = leases.get(lane)
        stopped = getattr(cp, "lane_state", None)
        state = {} if stopped is None else {
            "state": stopped.state, "reason": stopped.reason, "state_detail": stopped.message,
            "state_range": (stopped.position, stopped.range_end)}
        rows.append(LaneRow(lane, topic, p, cp.position, stable, max(0, stable - cp.position), cp.target_topic,
                            cp.target_partition, cp.target_next, cp.owner, cp.owner_epoch,
                            lease.holder if lease else None, lease.expires_ms if lease else None, cp.updated_ms,
                            **state))
    return rows


def collect_pipeline(spec: PipelineSpec) -> PipelineView:
    """Everything the page shows about one pipeline; an error is reported in the view, not raised."""
    from mirror_core.copy_command import topic_metadata_or_error
    from mirror_core.deadlines_report import status_to_dict
    from mirror_core.kafka_wire import WireClient
    from mirror_core.plan_inputs import lookup_offsets
    from mirror_core.retention_inputs import assess_positions
    from plugins.hooks import ShoalKafkaHook

    view = PipelineView(spec)
    try:
        source = ShoalKafkaHook(spec.source_conn_id).get_cluster()
        target = ShoalKafkaHook(spec.target_conn_id).get_cluster()
        checkpoints, leases = read_target_state(target, spec.pipeline)
        topics = list(spec.topics) or sorted({t for (_pl, t, _p) in checkpoints})
        if not topics:
            return view
        with WireClient.for_cluster(source) as client:
            parts = [(t, p) for t in topics for p in sorted(topic_metadata_or_error(client, t).partitions)]
            stable = lookup_offsets(client, parts, "last_stable")
            start = lookup_offsets(client, parts, "earliest")
        view.lanes = lane_rows(checkpoints, leases, parts, stable, start, spec.pipeline)
        positions = {(r.topic, r.partition): r.position for r in view.lanes if r.position is not None}
        verdict = assess_positions(source, {t: None for t in topics}, positions, spec.policy, target=target)
        statuses, copy = verdict.statuses, verdict.copy
        view.retention = [status_to_dict(s) for s in statuses]
        view.chart_svg = chart_svg(statuses, verdict.policy.at_risk_below_s)
        view.copy_throughput = copy.how
    except Exception as exc:  # noqa: BLE001 - one unreadable pipeline must not hide the others
        log.exception("Shoal page: pipeline %s could not be read", spec.pipeline)
        view.error = f"{type(exc).__name__}: {exc}"
    return view


def chart_svg(statuses, at_risk_below_s: float) -> str:
    """The deadline chart as an inline ``<svg>`` (:func:`mirror_core.deadlines_report.render_chart_svg`)."""
    from mirror_core.deadlines_report import render_chart_svg

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
section{margin-bottom:32px}
"""


def _cell(value: Any, *, num: bool = False, cls: str = "") -> str:
    text = "–" if value is None else str(value)
    classes = " ".join(c for c in ("num" if num else "", cls) if c)
    return f'<td class="{classes}">{html.escape(text)}</td>' if classes else f"<td>{html.escape(text)}</td>"


def _table(headers: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _lease_text(row: LaneRow, now_ms: int) -> str | None:
    if row.lease_holder is None:
        return None
    left_s = (row.lease_expires_ms - now_ms) / 1000
    when = f"expires in {left_s:.0f}s" if left_s > 0 else f"expired {-left_s:.0f}s ago"
    return f"{row.lease_holder} ({when})"


def _lanes_table(view: PipelineView, now_ms: int) -> str:
    rows = []
    for r in view.lanes:
        target = None if r.target_topic is None else f"{r.target_topic}-{r.target_partition}"
        age = None if r.updated_ms is None else f"{max(0, now_ms - r.updated_ms) / 1000:.0f}s ago"
        rows.append('<tr class="lane">' + "".join((
            _cell(r.lane or "(no checkpoint)", cls="" if r.lane else "dim"), _cell(f"{r.topic}-{r.partition}"),
            _cell(target), _cell(r.owner), _cell(r.owner_epoch, num=True), _cell(_lease_text(r, now_ms)),
            _cell(r.position, num=True), _cell(r.last_stable, num=True), _cell(r.lag, num=True),
            _cell(r.target_next, num=True), _cell(age), _cell(r.state, cls=r.state),
            _cell(None if r.reason == "none" else r.reason), _cell(_state_text(r)))) + "</tr>")
    return _table(("lane", "source partition", "target partition", "owner", "epoch", "lease holder", "position",
                   "last stable offset", "lag", "target next", "checkpoint updated", "state", "reason",
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
    from mirror_core.deadlines_report import format_duration

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


def render_pipeline(view: PipelineView, now_ms: int) -> str:
    spec = view.spec
    parts = [f'<section class="pipeline" id="pipeline-{html.escape(spec.pipeline)}">',
             f"<h2>{html.escape(spec.pipeline)}</h2>",
             f'<p class="dim">{html.escape(spec.source_conn_id)} → {html.escape(spec.target_conn_id)}; topics: '
             f"{html.escape(', '.join(spec.topics) or 'those with checkpoints')}</p>"]
    if view.error:
        parts.append(f'<p class="error">{html.escape(view.error)}</p>')
    elif not view.lanes:
        parts.append("<p>No checkpoints on the target yet and no topics configured.</p>")
    else:
        total = sum(r.lag for r in view.lanes)
        halted = sum(1 for r in view.lanes if r.state == "halted")
        alert = f'<p class="halted">{halted} lane(s) halted: they copy nothing until an operator acts</p>' \
            if halted else ""
        parts += [f"<h3>Lanes <span class='dim'>(total lag {total} offsets)</span></h3>", alert,
                  _lanes_table(view, now_ms),
                  "<h3>Retention margins</h3>", _retention_table(view),
                  f'<p class="dim">copy throughput {html.escape(view.copy_throughput)}; AT_RISK below '
                  f"{_seconds(spec.policy.at_risk_below_s)}</p>", f'<div class="chart">{view.chart_svg}</div>']
    parts.append("</section>")
    return "".join(parts)


def render_page(views: Sequence[PipelineView], *, config_error: str | None = None, now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    body = [f"<h1>Shoal</h1><p class='dim'>read at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}</p>"]
    if config_error:
        body.append(f'<p class="error">{html.escape(config_error)}</p>')
    elif not views:
        body.append(f"<p>No pipelines configured. Set the Airflow Variable <code>{PIPELINES_VARIABLE}</code> to a "
                    "JSON list of <code>{\"pipeline\", \"source_conn_id\", \"target_conn_id\", \"topics\"}</code>."
                    "</p>")
    body += [render_pipeline(v, now_ms) for v in views]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Shoal</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>")


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
    except Exception as exc:  # noqa: BLE001 - shown on the page: the operator fixes the Variable
        return [], f"{type(exc).__name__}: {exc}"
    return [collect_pipeline(spec) for spec in specs], None


app = FastAPI(title="Shoal", description="Shoal pipelines: lanes, lag, retention margins",
              dependencies=[Depends(require_shoal_viewer)])


@app.get("/", response_class=HTMLResponse)
def shoal_page() -> HTMLResponse:
    views, error = _collect()
    return HTMLResponse(render_page(views, config_error=error))


@app.get("/pipelines.json")
def shoal_pipelines() -> dict:
    views, error = _collect()
    return {"error": error, "pipelines": [v.to_dict() for v in views]}


class ShoalUIPlugin(AirflowPlugin):
    """Mounts the Shoal page in the api-server and links it from the nav bar."""

    name = "shoal_ui"
    fastapi_apps = [{"app": app, "url_prefix": "/shoal", "name": "Shoal"}]
    external_views = [{"name": "Shoal", "href": "shoal/", "url_route": "shoal", "destination": "nav",
                       "nav_top_level": True}]
