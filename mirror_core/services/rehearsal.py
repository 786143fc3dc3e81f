"""DR rehearsal results next to the backfill ledger: ``<ledger dir>/rehearsals/run=<id>/rehearsal.parquet``, one row
per rehearsal with its measured RTO (plan start → verified) and RPO (how far the rebuilt copy trails the source at
the end: offsets, and seconds since the newest copied record), so the history reads as one dataset.

(The backfill ledger's schema is per work unit and owned by mirror_core; a rehearsal row lives beside it.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RehearsalRecord:
    rehearsal_id: str
    backfill_run_id: str
    pipeline: str
    source_cluster: str
    target_cluster: str
    scratch_prefix: str
    topics: str  # comma-separated source topics
    units: int
    records: int
    started_ms: int
    verified_ms: int
    rto_s: float
    rpo_offsets: int
    rpo_s: float | None
    verified: bool


def write_rehearsal(ledger_dir: str | Path, record: RehearsalRecord) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(ledger_dir) / "rehearsals" / f"run={record.rehearsal_id}" / "rehearsal.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([asdict(record)]), path)
    return path


def read_rehearsals(ledger_dir: str | Path) -> list[RehearsalRecord]:
    import pyarrow.parquet as pq

    rows = []
    for path in sorted((Path(ledger_dir) / "rehearsals").glob("run=*/rehearsal.parquet")):
        rows.extend(RehearsalRecord(**r) for r in pq.read_table(path).to_pylist())
    return rows


def measure_rpo(source, target, units) -> tuple[int, float | None]:
    """Offsets the source holds past each unit's end now, and seconds since the newest record on the rebuilt
    copy (None when it is empty)."""
    import time

    from mirror_core.kafka.list_offsets import lookup_offsets, newest_timestamp
    from mirror_core.kafka.wire_client import WireClient

    with WireClient.for_cluster(source) as client:
        stable = lookup_offsets(client, [(u.topic, u.partition) for u in units], "last_stable")
    behind = sum(max(0, stable[(u.topic, u.partition)] - u.end) for u in units)
    with WireClient.for_cluster(target) as client:
        stamps = [newest_timestamp(client, u.target_topic, u.target_partition) for u in units]
    newest = max((t for t in stamps if t is not None), default=None)
    return behind, None if newest is None else max(0.0, time.time() - newest / 1000)
