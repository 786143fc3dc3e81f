"""A backfill of ~200 MB through ``shoal_backfill`` (``dag.test()``, spark-submit on local[2], real brokers) is not
silent while it runs: the task log carries each lane's progress from the Spark driver, and the ledger shows the
finished unit of the short lane while the long lane is still copying (what ``shoal backfill status`` and the Shoal
page read). The run is throttled so the long lane lasts ~15 s on any machine."""

from __future__ import annotations

import os
import re
import threading

import pytest

from mirror_core.state.ledger import read_ledger, read_runs
from tests.airflow.test_backfill_dag import task_states, xcom_of

pytestmark = pytest.mark.timeout(300)

RECORD_BYTES = 500_000
LONG_RECORDS = 400          # ~200 MB on partition 1
SHORT_RECORDS = 4           # ~2 MB on partition 0


class LedgerWatcher:
    """Samples (run in flight?, unit rows) of the ledger dir while the DAG runs."""

    def __init__(self, ledger_dir):
        self.ledger_dir, self.samples = ledger_dir, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        while not self._stop.wait(0.3):
            try:
                runs = read_runs(self.ledger_dir)
                rows = read_ledger(self.ledger_dir)
            except Exception:  # noqa: BLE001 - the directory appears mid-run
                continue
            if runs:
                self.samples.append((runs[-1].in_flight, sorted(r.unit_id for r in rows)))


def test_a_running_backfill_reports_progress_and_finished_units(fresh_dag, airflow_connections, work_dir,
                                                                source_cluster, unique_name, capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_SHOAL_PROGRESS_INTERVAL_S", "1")
    topic = unique_name("big")
    source_cluster.create_topic(topic, partitions=2)
    blob = os.urandom(RECORD_BYTES)
    source_cluster.produce(topic, [(b"s", blob, [])] * SHORT_RECORDS, partition=0)
    source_cluster.produce(topic, [(str(i).encode(), blob, []) for i in range(LONG_RECORDS)], partition=1)

    with LedgerWatcher(work_dir / "ledger") as watcher:
        dr = fresh_dag("shoal_backfill").test(run_conf={
            "source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "pipeline": unique_name("prog"),
            "include": re.escape(topic), "naming": "prefix:prog.", "throttle_mb_s": 20})
    assert str(dr.state) == "success", task_states(dr)
    rows = read_ledger(work_dir / "ledger")
    assert {r.unit_id: (r.status, r.source_end) for r in rows} == {
        f"{topic}-0": ("ok", SHORT_RECORDS), f"{topic}-1": ("ok", LONG_RECORDS)}
    # what this run copied was compared record by record (a retried task resumes: its rows cover the rest)
    assert xcom_of(dr, "verify")["records_compared"] == sum(r.records for r in rows) > 0

    in_flight = [units for running, units in watcher.samples if running]
    assert [f"{topic}-0"] in in_flight, watcher.samples[:20]   # the short unit's row, while the run went on
    assert not watcher.samples[-1][0] and len(watcher.samples[-1][1]) == 2

    out, err = capfd.readouterr()
    log = out + err
    lane = re.compile(rf"progress {re.escape(topic)}-1 lane \S+: offset (\d+) of \[0, {LONG_RECORDS}\) [\d.]+%, "
                      r"~[\d,]+ records, ~[\d.]+ MB; [\d,]+ offsets/s, ~[\d.]+ MB/s; ETA \S+")
    offsets = [int(m.group(1)) for m in lane.finditer(log)]
    assert len(set(offsets)) >= 3 and offsets == sorted(offsets), offsets   # it moved, several times, forward
    end = log.rindex("records copied;")
    assert all(m.start() < end for m in lane.finditer(log))                  # printed while it ran
    assert re.search(rf"unit {re.escape(topic)}-0 ok: {SHORT_RECORDS} records", log)
    assert "Spark UI http" in log                                          # the UI stays on
