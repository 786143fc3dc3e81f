"""The backfill ledger: one row per work unit and run, as Parquet.

Written by the Spark job's driver as each unit finishes; read by ``shoal backfill status``, the verify step, the
DAGs and the UI. A run's rows live in ``<ledger dir>/run=<run id>/<part>.parquet`` — one file per finished unit
(``unit-<unit id>``), one for accepted losses, or ``ledger`` for a run written at once — so runs never overwrite
each other, a run in flight already shows its finished units, and the directory reads as one partitioned dataset.
Next to them ``_run.json`` (:class:`RunManifest`) says what the run planned and whether it has ended.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, fields
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


def write_ledger(ledger_dir: Path, run_id: str, rows: list[LedgerRow], *, part: str = "ledger") -> Path:
    """Write ``rows`` as ``run=<run_id>/<part>.parquet`` (atomically: a reader never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = run_dir(ledger_dir, run_id) / f"{_safe(part)}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([asdict(r) for r in rows], schema=_schema())
    partial = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, partial)
    partial.replace(path)
    return path


def read_ledger(ledger_dir: Path, run_id: str | None = None) -> list[LedgerRow]:
    """Rows of one run, or of every run (oldest run directories first); a run in flight gives its finished units."""
    import pyarrow.parquet as pq

    base = Path(ledger_dir)
    paths = sorted(run_dir(base, run_id).glob("*.parquet")) if run_id else sorted(base.glob("run=*/*.parquet"))
    rows: list[LedgerRow] = []
    for path in paths:
        if path.exists():
            rows.extend(LedgerRow(**r) for r in pq.read_table(path, schema=_schema()).to_pylist())
    return rows


def run_dir(ledger_dir: Path, run_id: str) -> Path:
    return Path(ledger_dir) / f"run={run_id}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name)


@dataclass
class RunManifest:
    """What a run set out to do (``units``: unit ids in plan order) and when it started and ended (``ended_ms``
    None: in flight, or its driver died — ``shoal backfill status`` shows which units have rows)."""

    run_id: str
    pipeline: str
    plan_id: str
    units: list[str] = field(default_factory=list)
    started_ms: int = 0
    ended_ms: int | None = None
    exit_code: int | None = None
    link: dict | None = None  # the link the fetches were sized for (services.backfill_link.LinkSizing), if any

    def write(self, ledger_dir: Path) -> Path:
        path = run_dir(ledger_dir, self.run_id) / "_run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name("._run.json.tmp")
        partial.write_text(json.dumps(asdict(self)))
        partial.replace(path)
        return path

    def end(self, ledger_dir: Path, exit_code: int) -> None:
        self.ended_ms, self.exit_code = int(time.time() * 1000), exit_code
        self.write(ledger_dir)

    @property
    def in_flight(self) -> bool:
        return self.ended_ms is None


def read_runs(ledger_dir: Path) -> list[RunManifest]:
    """Every run's manifest, oldest start first (runs written before manifests existed have none)."""
    out = []
    for path in Path(ledger_dir).glob("run=*/_run.json"):
        try:
            out.append(RunManifest(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda m: m.started_ms)


def run_summaries(ledger_dir: Path, pipeline: str, *, limit: int = 10) -> list[dict]:
    """A pipeline's backfill runs, newest first: in flight or ended (exit code), units finished of planned, records
    so far, failed units — what the Shoal page's ledger table shows."""
    out = []
    for manifest in reversed([m for m in read_runs(ledger_dir) if m.pipeline == pipeline][-limit:]):
        rows = read_ledger(ledger_dir, manifest.run_id)
        out.append({"run_id": manifest.run_id, "in_flight": manifest.in_flight, "exit_code": manifest.exit_code,
                    "started_ms": manifest.started_ms, "ended_ms": manifest.ended_ms, "units": len(manifest.units),
                    "finished": len({r.unit_id for r in rows} & set(manifest.units)),
                    "records": sum(r.records for r in rows),
                    "failed": [f"{r.unit_id}: {r.error}" for r in rows if r.status == STATUS_FAILED][:5]})
    return out
