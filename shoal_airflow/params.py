"""The backfill form: Airflow Params (JSON Schema, checked when the run is triggered), the cross-field checks
the schema cannot express (run by the first task of the DAG, which never retries), and the one-active-backfill-per-
pipeline claim (:func:`claim_pipeline`, through :func:`mirror_core.services.backfill_run.claim_pipeline`) that the
backfill DAG and the retention guard take."""

from __future__ import annotations

from typing import Any

CONN_ID = r"^[A-Za-z0-9_.-]+$"
NAME = r"^[A-Za-z0-9._-]+$"
NAMING = r"^(identity|prefix:[A-Za-z0-9._-]+|map:[^=,]+=[^=,]+(,[^=,]+=[^=,]+)*)$"
_ISO_TIME = r"\d{4}-\d\d-\d\d([T ][0-9:.]+(Z|[+-]\d\d:?\d\d)?)?"
_OFFSETS = r"[^:=,]+:\d+=\d+(,[^:=,]+:\d+=\d+)*"
BOUND = rf"^(earliest|latest|checkpoint|{_ISO_TIME}|{_OFFSETS})$"


def backfill_params() -> dict[str, Any]:
    from airflow.sdk import Param

    return {
        "source_conn_id": Param("shoal_source", type="string", pattern=CONN_ID, title="Source connection",
                                description="Airflow connection (type kafka) of the source cluster"),
        "target_conn_id": Param("shoal_target", type="string", pattern=CONN_ID, title="Target connection",
                                description="Airflow connection (type kafka) of the target cluster"),
        "pipeline": Param("backfill", type="string", pattern=NAME, minLength=1, maxLength=100,
                          description="checkpoint namespace and transactional.id prefix"),
        "include": Param(".*", type="string", format="regex", minLength=1,
                         description="topic regex matched against whole names; a comma also means 'or'"),
        "exclude": Param(None, type=["null", "string"], format="regex", description="topic regex to leave out"),
        "naming": Param("identity", type="string", pattern=NAMING,
                        description="identity | prefix:<prefix> | map:<src>=<dst>,..."),
        "start": Param("earliest", type="string", pattern=BOUND,
                       description="earliest | latest | checkpoint | ISO time | topic:partition=offset,..."),
        "end": Param("latest", type="string", pattern=BOUND,
                     description="latest | ISO time | topic:partition=offset,..."),
        "mode": Param("exactly-once", type="string", enum=["exactly-once", "at-least-once"]),
        "exact_bounds": Param(False, type="boolean", description="trim batches that straddle a bound"),
        "throttle_mb_s": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=10000,
                               description="limit the whole run to this many MB/s"),
        "link_mb_s": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=100000,
                           description="the source link's rate in MB/s: the run measures the round trip to the "
                                       "source and sizes its fetches to keep the link busy (a far source)"),
        "coalesce_small_batches": Param(False, type="boolean",
                                        description="merge runs of small batches (one record each, say) into batches "
                                                    "of up to 64 KiB: far fewer Produce requests; re-encodes records "
                                                    "(offsets, keys, values, headers, timestamps stay), counted as "
                                                    "deep"),
        "dry_run": Param(False, type="boolean", description="plan and check only; copy nothing"),
        "accept_loss": Param(False, type="boolean",
                             description="plan past data already deleted from the source, recording the loss"),
    }


def validate_backfill_request(params: dict[str, Any]) -> dict[str, Any]:
    """Cross-field checks: connections exist and are valid kafka connections, a copy onto itself, bounds that
    parse and whose end is not before their start. Raises AirflowFailException naming the field."""
    from airflow.sdk.exceptions import AirflowFailException

    from mirror_core.config.plan_request import BoundSpec, PlanRequest
    from mirror_core.errors import MirrorError
    from shoal_airflow.hooks import ShoalKafkaHook

    problems: list[str] = []
    clusters = {}
    for field in ("source_conn_id", "target_conn_id"):
        conn_id = params[field]
        try:
            clusters[field] = ShoalKafkaHook(conn_id).get_cluster()
        except MirrorError as exc:
            problems.append(f"{field}: {exc}")
        except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and friends
            problems.append(f"{field}: connection {conn_id!r} is not defined ({type(exc).__name__}: {exc})")
    if params["source_conn_id"] == params["target_conn_id"] and params["naming"] == "identity":
        problems.append("naming: source and target are the same connection, so identity naming would copy every "
                        "topic onto itself; use prefix:<p> or map:")
    try:
        request = PlanRequest.parse(
            pipeline=params["pipeline"], source_cluster=params["source_conn_id"],
            target_cluster=params["target_conn_id"], include=params["include"], exclude=params.get("exclude"),
            naming=params["naming"], start=params["start"], end=params["end"], mode=params["mode"],
            exact_bounds=bool(params.get("exact_bounds")), throttle_mb_s=params.get("throttle_mb_s"),
            accept_loss=bool(params.get("accept_loss")), link_mb_s=params.get("link_mb_s"),
            coalesce_bytes=coalesce_bytes(params.get("coalesce_small_batches")))
    except MirrorError as exc:
        problems.append(f"start/end/naming: {exc}")
    else:
        problems += _offset_order(request.start, request.end)
        if request.start == BoundSpec("latest"):
            problems.append("start: 'latest' copies nothing; did you mean checkpoint or earliest?")
    if problems:
        raise AirflowFailException("invalid backfill request: " + "; ".join(problems))
    return {"source": params["source_conn_id"], "target": params["target_conn_id"], "pipeline": params["pipeline"],
            "include": params["include"], "dry_run": bool(params.get("dry_run"))}


def _offset_order(start, end) -> list[str]:
    if start.kind != "offsets" or end.kind != "offsets":
        return []
    return [f"end: {t}:{p}={e} is before start {t}:{p}={start.offset_for(t, p)}"
            for t, p, e in end.offsets if start.offset_for(t, p) is not None and e < start.offset_for(t, p)]


BACKFILL_DAG_ID = "shoal_backfill"
ACTIVE_STATES = ["queued", "running"]


def claims_dir(work_dir: str | None = None):
    """``<work dir>/claims``: the work dir is the Variable ``shoal_work_dir`` (shared by every worker)."""
    from pathlib import Path

    if work_dir is None:
        from airflow.sdk import Variable

        work_dir = Variable.get("shoal_work_dir", default="/tmp/shoal")
    return Path(work_dir) / "claims"


def claim_pipeline(pipeline: str, run_id: str, ti, *, by: str, work_dir: str | None = None):
    """Claim ``pipeline`` for the ``shoal_backfill`` run ``run_id``; returns the holder (``run_id``'s claim, or the
    queued/running backfill run that already holds the pipeline)."""
    from mirror_core.services.backfill_run import claim_pipeline as claim

    def active(holder_run_id: str) -> bool:
        return ti.get_dr_count(dag_id=BACKFILL_DAG_ID, run_ids=[holder_run_id], states=ACTIVE_STATES) > 0

    return claim(claims_dir(work_dir), pipeline, run_id, is_active=active, by=by)


def release_pipeline(pipeline: str, run_id: str, *, work_dir: str | None = None) -> bool:
    from mirror_core.services.backfill_run import release_pipeline as release

    return release(claims_dir(work_dir), pipeline, run_id)


def coalesce_bytes(flag: Any) -> int:
    """The form's ``coalesce_small_batches`` as a size: the default size when on, 0 when off."""
    from mirror_core.config.coalescing import DEFAULT_COALESCE_BYTES

    on = flag.strip().lower() in ("true", "1", "yes") if isinstance(flag, str) else bool(flag)
    return DEFAULT_COALESCE_BYTES if on else 0
