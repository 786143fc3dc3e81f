"""A backfill run's driver-side work, the user action behind ``shoal backfill run`` (the Spark job in
``spark_apps/backfill_job.py`` is its edge): prepare the targets before any task, and keep the run's ledger — the
manifest first (so a run in flight shows), the planned losses, then one row per unit the moment the unit ends — and
the one-active-backfill-per-pipeline claim the backfill DAG and the retention guard take.

The copying itself is :mod:`mirror_core.engine.backfill` (one Spark task per lane); the ledger's layout is
:mod:`mirror_core.state.ledger`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.wire_client import WireClient
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.ledger import LedgerRow, RunManifest, loss_rows, write_ledger
from mirror_core.state.run_claims import Claim, PipelineClaims


def check_plan(plan: dict) -> None:
    """Every field of a plan read as JSON checked as :class:`~mirror_core.model.plan.Plan` does (ConfigError naming
    the field): the driver works on the dict, and a hand-edited value must not reach preflight or the tasks."""
    from mirror_core.model.plan import Plan

    Plan.from_dict(plan)


def prepare_targets(plan: dict, source: ClusterConfig, target: ClusterConfig, *,
                    emit: Callable[[str], None] = print) -> None:
    """Before any task: preflight every target topic of the plan (create or refuse; each finding emitted) and make
    sure the checkpoint topic exists."""
    for topic, target_topic in sorted({(u["topic"], u["target_topic"]) for u in plan["units"]}):
        report = run_preflight(source, target, topic, target_topic=target_topic,
                               start_offsets={u["partition"]: u["start"] for u in plan["units"] if u["topic"] == topic},
                               coalesce_bytes=int(plan.get("coalesce_bytes") or 0))
        for finding in report.findings:
            emit(f"preflight {finding.severity.name}: {finding.message}")
        report.raise_if_refused()
    with WireClient.for_cluster(target) as client:
        CheckpointStore(target, client).ensure_topic()


def run_manifest(run_id: str, plan: dict, *, link: dict | None = None) -> RunManifest:
    """The run's manifest, started now (:func:`begin_run` writes it; ``manifest.end`` closes it however the run
    ends)."""
    return RunManifest(run_id, plan["pipeline"], plan["plan_id"], [u["unit_id"] for u in plan["units"]],
                       started_ms=int(time.time() * 1000), link=link)


def begin_run(ledger: Path, manifest: RunManifest, plan: dict) -> list[LedgerRow]:
    """Write the manifest (the run shows in flight) and the plan's accepted losses as ledger rows; return those."""
    manifest.write(ledger)
    losses = loss_rows(manifest.run_id, plan["pipeline"], plan.get("losses", []))
    if losses:
        write_ledger(ledger, manifest.run_id, losses, part="losses")
    return losses


def record_unit(ledger: Path, run_id: str, row: LedgerRow) -> None:
    """One unit's ledger row, the moment the unit ends."""
    write_ledger(ledger, run_id, [row], part=f"unit-{row.unit_id}")


def claim_pipeline(claims_dir: Path, pipeline: str, run_id: str, *, is_active: Callable[[str], bool],
                   by: str = "") -> Claim:
    """One active backfill per pipeline: claim ``pipeline`` for ``run_id``; returns the holder afterwards
    (``run_id``'s own claim when it won or already held it, else the active run that holds it:
    :mod:`mirror_core.state.run_claims`)."""
    return PipelineClaims(claims_dir).claim(pipeline, run_id, is_active=is_active, by=by)


def release_pipeline(claims_dir: Path, pipeline: str, run_id: str) -> bool:
    """Drop ``run_id``'s claim of ``pipeline`` (never another run's); True when it was held."""
    return PipelineClaims(claims_dir).release(pipeline, run_id)
