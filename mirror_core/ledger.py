"""The backfill ledger: one row per work unit and run, as Parquet.

Written by the Spark job's driver after every run; read by ``shoal backfill status``, the verify step and the DAGs.
A run's rows live in ``<ledger dir>/run=<run id>/ledger.parquet``, so runs never overwrite each other and the
directory reads as one partitioned dataset.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

STATUS_OK, STATUS_SKIPPED, STATUS_FAILED, STATUS_LOST, STATUS_RESUMED = "ok", "skipped", "failed", "lost", "resumed"


@dataclass(frozen=True)
class LedgerRow:
    run_id: str
    unit_id: str
    pipeline: str
    source_topic: str
    source_partition: int
    target_topic: str
    target_partition: int
    planned_start: int
    planned_end: int
    source_start: int | None  # where this run actually began (a resumed unit begins at its checkpoint)
    source_end: int | None
    target_start: int | None
    target_end: int | None
    records: int
    batches: int
    bytes: int
    deep_batches: int
    records_digest: str
    duration_s: float
    status: str  # ok | skipped (already complete) | failed | lost (accepted by the operator) | resumed (a halted lane)
    error: str | None


def _schema():
    import pyarrow as pa

    types = {int: pa.int64(), float: pa.float64(), str: pa.string()}
    cols = []
    for f in fields(LedgerRow):
        base = f.type.split(" | ")[0] if isinstance(f.type, str) else f.type
        py = {"int": int, "float": float, "str": str}.get(base, base)
        cols.append((f.name, types[py]))
    return pa.schema(cols)


def loss_rows(run_id: str, pipeline: str, losses: list[dict]) -> list[LedgerRow]:
    """Ledger rows recording the ranges the operator accepted as lost (``--accept-loss``): never silent."""
    return [LedgerRow(run_id=run_id, unit_id=f"{loss['topic']}-{loss['partition']}:lost", pipeline=pipeline,
                      source_topic=loss["topic"], source_partition=loss["partition"], target_topic="",
                      target_partition=-1, planned_start=loss["lost_start"], planned_end=loss["lost_end"],
                      source_start=None, source_end=None, target_start=None, target_end=None, records=0, batches=0,
                      bytes=0, deep_batches=0, records_digest="", duration_s=0.0, status=STATUS_LOST,
                      error=f"offsets [{loss['lost_start']}, {loss['lost_end']}) were deleted at the source before "
                            "they were copied; accepted with --accept-loss")
            for loss in losses]


def write_ledger(ledger_dir: Path, run_id: str, rows: list[LedgerRow]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(ledger_dir) / f"run={run_id}" / "ledger.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([asdict(r) for r in rows], schema=_schema())
    pq.write_table(table, path)
    return path


def read_ledger(ledger_dir: Path, run_id: str | None = None) -> list[LedgerRow]:
    """Rows of one run, or of every run (oldest run directories first)."""
    import pyarrow.parquet as pq

    base = Path(ledger_dir)
    paths = [base / f"run={run_id}" / "ledger.parquet"] if run_id else sorted(base.glob("run=*/ledger.parquet"))
    rows: list[LedgerRow] = []
    for path in paths:
        if path.exists():
            rows.extend(LedgerRow(**r) for r in pq.read_table(path, schema=_schema()).to_pylist())
    return rows
