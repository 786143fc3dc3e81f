"""The backfill job's driver on real Spark (local[2]) and the sandbox brokers: fetches sized for a declared link
reach every unit, and a run whose driver fails still ends in its manifest. Small topics: each test is one
spark-submit (15-30 s here)."""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest

from mirror_core.engine.backfill import unsized_fetch_bytes
from mirror_core.services.backfill_link import MAX_ROUND_BYTES
from mirror_core.state.ledger import STATUS_OK, read_ledger, read_runs, run_dir
from tests.spark.test_backfill_spark import ROOT, by_partition, job_command, plan, submit_env

TASK_FETCH = re.compile(r"^shoal task: lane \S+ unit (\S+) .* fetch (\d+) bytes ", re.MULTILINE)


def small_topic(source_cluster, partitions: int = 2, records: int = 300) -> str:
    topic = f"shoal-test.bflink{uuid.uuid4().hex[:8]}"
    source_cluster.create_topic(topic, partitions)
    for p in range(partitions):
        source_cluster.produce(topic, [(b"k%d-%d" % (p, i), b"value %d-%d " % (p, i) * 8) for i in range(records)],
                               partition=p)
    return topic


def submit(plan_path, clusters_file, ledger, run_id, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(job_command(plan_path, clusters_file, ledger, run_id) + list(extra), cwd=ROOT,
                          env=submit_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(360)
def test_a_backfill_with_a_link_rate_carries_the_sized_fetch_into_every_unit(source_cluster, target_cluster,
                                                                           clusters_file, tmp_path):
    topic = small_topic(source_cluster)
    plan_path = tmp_path / "plan.json"
    # loopback round trips are well under a millisecond: a 100 GB/s link makes even that worth sizing for
    the_plan = plan(plan_path, f"p.{topic}", re.escape(topic), "--naming", "prefix:link.", "--no-deadlines",
                    "--link-mbps", "100000")
    assert the_plan["link_mb_s"] == 100000
    ledger = tmp_path / "ledger"

    done = submit(plan_path, clusters_file, ledger, "linked")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]

    [run] = [m for m in read_runs(ledger) if m.run_id == "linked"]
    link = run.link
    assert link is not None and link["rtt_ms"] is not None and link["rtt_ms"] > 0, "the round trip was measured"
    assert link["link_mb_s"] == 100000 and link["lanes_at_once"] == 2
    assert unsized_fetch_bytes(None) < link["fetch_bytes"] <= MAX_ROUND_BYTES // 2, link
    assert f"sized for the link: fetches of {link['fetch_bytes'] / 1e6:.1f} MB per lane" in output

    task_fetch = dict(TASK_FETCH.findall(output))
    assert set(task_fetch) == {u["unit_id"] for u in the_plan["units"]}, output[-4000:]
    assert set(task_fetch.values()) == {str(link["fetch_bytes"])}, "every unit ran with the driver's size"

    rows = read_ledger(ledger, "linked")
    assert {r.status for r in rows} == {STATUS_OK} and len(rows) == 2
    assert by_partition(target_cluster.read_all(f"link.{topic}")) == by_partition(source_cluster.read_all(topic))


@pytest.mark.timeout(360)
def test_a_driver_failure_ends_the_run_and_keeps_the_units_that_ended(source_cluster, target_cluster,
                                                                     clusters_file, tmp_path):
    topic = small_topic(source_cluster)
    plan_path = tmp_path / "plan.json"
    the_plan = plan(plan_path, f"p.{topic}", re.escape(topic), "--naming", "prefix:drvfail.", "--no-deadlines")
    ledger = tmp_path / "ledger"
    # the driver cannot write one unit's ledger row (a directory sits where the file goes): a plain Python error
    # in that lane's driver thread, not a failed Spark job
    blocked = the_plan["units"][0]["unit_id"]
    blocker = run_dir(ledger, "drvfail") / f"unit-{blocked}.parquet"
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("x")

    done = submit(plan_path, clusters_file, ledger, "drvfail")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    # (spark-submit's PythonRunner merges the driver's stderr into its stdout)
    assert "error: the driver failed: IsADirectoryError" in output, output[-4000:]
    [run] = [m for m in read_runs(ledger) if m.run_id == "drvfail"]
    assert not run.in_flight and run.exit_code == 1, "the run ended in its manifest, failed"

    (blocker / "keep").unlink()
    blocker.rmdir()
    rows = read_ledger(ledger, "drvfail")
    other = next(u["unit_id"] for u in the_plan["units"] if u["unit_id"] != blocked)
    assert [(r.unit_id, r.status) for r in rows] == [(other, STATUS_OK)], "the other lane's unit kept its row"
