"""A backfill on a real Spark standalone cluster: a master and two workers, each its own JVM, one core each.

``shoal backfill run --master spark://…`` is the product's remote submit: it ships Shoal's code (``--py-files``)
and a packed environment (``--archives …#environment``) and the executors run ``./environment/bin/python``.
The test proves what a user of a remote cluster relies on: the copy is exact (independent reader), the lanes ran on
both workers, and each executor's Python was the unpacked archive's, not the driver's interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mirror_core.state.ledger import STATUS_OK, read_ledger
from tests.spark.standalone import StandaloneCluster
from tests.spark.test_backfill_spark import ROOT, SMALL_BATCHES, by_partition, plan, rand_values

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4  # four lanes on two one-core executors: both executors get tasks in the first wave
TASK_LINE = re.compile(r"^shoal task: lane (\S+) .* python (\S+)$", re.MULTILINE)
SUBMIT_DEFAULTS = {  # what an operator puts in spark-defaults.conf for this cluster
    "spark.cores.max": "2",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.driver.memory": "512m",
    "spark.scheduler.minRegisteredResourcesRatio": "1",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
}


@pytest.fixture(scope="module")
def standalone(spark_available, tmp_path_factory):
    import pyspark

    cluster = StandaloneCluster(Path(pyspark.__file__).parent, tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield cluster.start()
    finally:
        survivors = cluster.stop()
        assert not survivors, f"Spark processes outlived SIGTERM and were killed: {survivors}"


def executor_tasks(worker_dir: Path) -> list[tuple[Path, str, str]]:
    """(executor dir, lane, python) for every task line in the worker's executor logs."""
    found = []
    for log in sorted(worker_dir.glob("app-*/*/std*")):
        found.extend((log.parent, lane, python) for lane, python in TASK_LINE.findall(log.read_text()))
    return found


def test_backfill_on_a_standalone_cluster_runs_on_both_workers_with_the_shipped_environment(
        standalone, source_cluster, target_cluster, clusters_file, unique_name, tmp_path):
    topic = source_cluster.create_topic(unique_name("orders"), partitions=PARTITIONS)
    records = rand_values(15, 2000)
    source_cluster.produce(topic, records, **SMALL_BATCHES)
    pipeline = unique_name("standalone").replace(".", "-")
    planned = plan(tmp_path / "plan.json", pipeline, re.escape(topic), "--naming", "prefix:sa.")
    assert len({u["lane"] for u in planned["units"]}) == PARTITIONS

    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SUBMIT_DEFAULTS.items()))
    ledger, run_id = tmp_path / "ledger", "standalone-run"
    done = subprocess.run([sys.executable, "-m", "mirror_core.cli", "backfill", "run", "--plan",
                           str(tmp_path / "plan.json"), "--clusters", str(clusters_file), "--ledger", str(ledger),
                           "--run-id", run_id, "--master", standalone.url], cwd=ROOT, capture_output=True, text=True,
                          timeout=200, env={**os.environ, "COLUMNS": "400", "SPARK_CONF_DIR": str(conf_dir)})
    assert done.returncode == 0, f"backfill failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n" \
                                 f"{standalone.logs()}"

    # exact copy, read back by a stock consumer
    copied = target_cluster.read_all("sa." + topic)
    assert by_partition(copied) == by_partition(source_cluster.read_all(topic))
    assert len(copied) == len(records)
    rows = read_ledger(ledger, run_id)
    assert sorted(r.status for r in rows) == [STATUS_OK] * PARTITIONS and sum(r.records for r in rows) == len(records)

    # every lane ran on an executor of this cluster, both workers ran lanes, each with the unpacked archive's Python
    per_worker = [executor_tasks(standalone.worker_dir(n)) for n in range(standalone.workers)]
    assert all(per_worker), f"a worker ran no task: {per_worker}\n{standalone.logs()}"
    ran = [task for tasks in per_worker for task in tasks]
    assert sorted(lane for _, lane, _ in ran) == sorted({u["lane"] for u in planned["units"]})
    for executor_dir, lane, python in ran:
        assert Path(python) == executor_dir / "environment" / "bin" / "python", (lane, python)
        assert python != sys.executable
        assert (executor_dir / "environment" / "pyvenv.cfg").is_file()
