"""Verify a backfill run, the user action behind the ``shoal_backfill`` DAG's verify task: every planned unit
accounted for in the run's ledger (ok or skipped, reaching its planned end), each copied range compared record by
record (key, value, headers, timestamp, order) through the ledger's offset ranges, and — for rebuilt copies — each
unit's stored offset map checked against what the ledger recorded.

Each check returns problems as sentences naming the unit and the offsets; the caller decides what fails. The record
comparison is :mod:`mirror_core.kafka.verify`; the ledger is :mod:`mirror_core.state.ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.verify import compare_ranges
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.plan import Plan
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.ledger import STATUS_FAILED, LedgerRow, read_ledger


def ledger_rows(ledger_dir: str | Path, run_id: str) -> list[LedgerRow]:
    """The run's ledger rows, as written."""
    return read_ledger(Path(ledger_dir), run_id)


def run_rows(ledger_dir: str | Path, run_id: str) -> dict[str, LedgerRow]:
    """The run's ledger rows by unit id."""
    return {r.unit_id: r for r in ledger_rows(ledger_dir, run_id)}


def failed_rows(rows: Iterable[LedgerRow]) -> list[LedgerRow]:
    """The rows of units that failed."""
    return [r for r in rows if r.status == STATUS_FAILED]


def ledger_problems(plan: Plan, rows: dict[str, LedgerRow], run_id: str) -> list[str]:
    """Every planned unit has a row in the run, did not fail, and reached its planned end."""
    problems: list[str] = []
    for unit in plan.units:
        row = rows.get(unit.unit_id)
        if row is None:
            problems.append(f"{unit.unit_id}: no ledger row in run {run_id}")
        elif row.status == STATUS_FAILED:
            problems.append(f"{unit.unit_id}: failed: {row.error}")
        elif row.source_end is not None and row.source_end < unit.end:
            problems.append(f"{unit.unit_id}: copied to {row.source_end}, planned end {unit.end}")
    return problems


def compare_copied(source: ClusterConfig, target: ClusterConfig, rows: Iterable[LedgerRow]) -> tuple[int, list[str]]:
    """``(records compared, problems)``: each copied range of the source against the target range the ledger says
    it landed in."""
    compared, problems = 0, []
    for row in rows:
        if row.source_start is None or row.target_start is None:
            continue
        same = compare_ranges(
            source, (row.source_topic, row.source_partition, row.source_start, row.source_end),
            target, (row.target_topic, row.target_partition, row.target_start, row.target_end))
        compared += same.records
        if not same.equal:
            problems.append(f"{row.unit_id}: source [{row.source_start}, {row.source_end}) differs "
                            f"from {row.target_topic}-{row.target_partition} [{row.target_start}, "
                            f"{row.target_end}): {same.first_difference}")
    return compared, problems


def check_offset_maps(target: ClusterConfig, pipeline: str, rows: Iterable[LedgerRow]) -> tuple[list[str], int]:
    """Each copied unit's stored offset map translates its first and next source offsets to the target offsets the
    ledger recorded, and its checkpoint reached the copied end."""

    problems, checked = [], 0
    with WireClient.for_cluster(target) as client:
        store = CheckpointStore(target, client)
        for row in rows:
            if row.source_start is None or row.target_start is None or row.source_end == row.source_start:
                continue
            cp = store.read(pipeline, row.source_topic, row.source_partition)
            omap = None if cp is None else cp.offset_map
            if omap is None:
                problems.append(f"{row.unit_id}: no checkpoint with an offset map for pipeline {pipeline!r}")
                continue
            checked += 1
            first, after = omap.translate(row.source_start), omap.translate(row.source_end)
            if cp.position < row.source_end or (first, after) != (row.target_start, row.target_end):
                problems.append(f"{row.unit_id}: offset map gives [{first}, {after}) for source "
                                f"[{row.source_start}, {row.source_end}), ledger says [{row.target_start}, "
                                f"{row.target_end}); checkpoint at {cp.position}")
    return problems, checked
