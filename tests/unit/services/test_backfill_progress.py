"""Progress of a running backfill from the lanes' checkpoints (mirror_core.services.backfill_progress), and a ledger
that shows a run in flight (mirror_core.state.ledger)."""

from __future__ import annotations

from mirror_core.cli.backfill_command import run_lines
from mirror_core.services.backfill_progress import BackfillProgress, ProgressReporter
from mirror_core.state.ledger import STATUS_OK, LedgerRow, RunManifest, read_ledger, read_runs, write_ledger

UNITS = [{"unit_id": "t-0", "lane": "dr.t-0", "topic": "t", "partition": 0, "start": 100, "end": 1100,
          "bytes_estimate": 100_000_000},
         {"unit_id": "t-1", "lane": "dr.t-1", "topic": "t", "partition": 1, "start": 0, "end": 10,
          "bytes_estimate": 1_000}]


def test_a_lane_reports_offset_records_bytes_rate_and_eta():
    progress = BackfillProgress("r1", UNITS)
    first = progress.tick({("t", 0): 100}, at=0.0)
    assert "t-0 lane dr.t-0: offset 100 of [100, 1100) 0.0%" in first[0] and "rate unknown" in first[0]
    lines = progress.tick({("t", 0): 350}, at=10.0)
    assert lines[0] == ("progress t-0 lane dr.t-0: offset 350 of [100, 1100) 25.0%, ~250 records, ~25.0 MB; "
                        "25 offsets/s, ~2.50 MB/s; ETA 30s")
    assert lines[-1].startswith("progress run r1: 0/2 units ended, 250 of 1,010 offsets")


def test_only_lanes_that_moved_are_listed_and_positions_never_fall():
    progress = BackfillProgress("r1", UNITS)
    progress.tick({("t", 0): 500, ("t", 1): 5}, at=0.0)
    lines = progress.tick({("t", 0): 400, ("t", 1): 5}, at=5.0)      # an older checkpoint read late, an idle lane
    assert len(lines) == 1 and lines[0].startswith("progress run r1")
    assert progress.lanes["t-0"].position == 500


def test_a_finished_unit_counts_whole_and_leaves_the_lane_lines():
    progress = BackfillProgress("r1", UNITS)
    progress.finish("t-1")
    lines = progress.tick({("t", 1): 10, ("t", 0): 600}, at=1.0)
    assert [line for line in lines if "lane dr.t-1" in line] == []
    assert "1/2 units ended, 510 of 1,010 offsets" in lines[-1]


def test_the_reporter_survives_a_failed_read():
    emitted: list[str] = []
    calls = iter([RuntimeError("target down"), {("t", 0): 200}])

    def read():
        value = next(calls, {("t", 0): 200})
        if isinstance(value, Exception):
            raise value
        return value

    reporter = ProgressReporter(BackfillProgress("r1", UNITS), read, interval_s=0.05, emit=emitted.append).start()
    import time
    deadline = time.monotonic() + 5
    while not any("offset 200" in line for line in emitted) and time.monotonic() < deadline:
        time.sleep(0.02)
    reporter.stop()
    assert any("checkpoints not read (RuntimeError: target down)" in line for line in emitted)
    assert any("offset 200" in line for line in emitted)


def _row(unit: str) -> LedgerRow:
    return LedgerRow(run_id="r1", unit_id=unit, pipeline="p", source_topic="t", source_partition=0,
                     target_topic="dr.t", target_partition=0, planned_start=0, planned_end=10, source_start=0,
                     source_end=10, target_start=0, target_end=10, records=10, batches=1, bytes=100, deep_batches=0,
                     records_digest="d", duration_s=1.0, status=STATUS_OK, error=None)


def test_a_run_in_flight_shows_its_finished_units(tmp_path):
    manifest = RunManifest("r1", "p", "plan1", ["t-0", "t-1"], started_ms=1)
    manifest.write(tmp_path)
    write_ledger(tmp_path, "r1", [_row("t-1")], part="unit-t-1")
    [run] = read_runs(tmp_path)
    assert run.in_flight
    assert [r.unit_id for r in read_ledger(tmp_path, "r1")] == ["t-1"]
    assert run_lines(read_runs(tmp_path), read_ledger(tmp_path)) == [
        "run r1 (pipeline p, plan plan1): IN FLIGHT, 1 of 2 units finished"]
    write_ledger(tmp_path, "r1", [_row("t-0")], part="unit-t-0")
    manifest.end(tmp_path, 0)
    assert run_lines(read_runs(tmp_path), read_ledger(tmp_path)) == [
        "run r1 (pipeline p, plan plan1): ended (exit 0), 2 of 2 units finished"]
