"""How the backfill task submits to Spark: a missing Spark connection fails by name (it never falls back to the
provider's ``yarn``), and a remote master gets Shoal shipped (code zip and packed environment), never the Airflow
worker's interpreter path. (The job itself on a real standalone cluster: tests/spark/test_standalone_cluster.py.)"""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest


def _plan_file(work_dir, source_cluster, unique_name) -> str:
    from mirror_core.config.plan_request import PlanRequest
    from mirror_core.services.plan_inputs import build_plan
    from shoal_airflow.hooks import ShoalKafkaHook

    topic = source_cluster.create_topic(unique_name("submit"))
    source_cluster.produce(topic, [(b"k", b"v")] * 3)
    request = PlanRequest.parse(pipeline="submit", source_cluster="shoal_source", target_cluster="shoal_target",
                                include=re.escape(topic), naming="prefix:sb.")
    plan = build_plan(ShoalKafkaHook("shoal_source").get_cluster(), ShoalKafkaHook("shoal_target").get_cluster(),
                      request)
    assert plan.units
    plan_path = work_dir / "plan.json"
    plan_path.write_text(plan.to_json())
    return str(plan_path)


def test_a_missing_spark_connection_fails_naming_the_connection_id(airflow_connections, work_dir, source_cluster,
                                                                   unique_name):
    from airflow.sdk.exceptions import AirflowFailException

    from shoal_airflow.operators import ShoalSparkBackfillOperator

    plan_path = _plan_file(work_dir, source_cluster, unique_name)
    op = ShoalSparkBackfillOperator(task_id="backfill", source_conn_id="shoal_source", target_conn_id="shoal_target",
                                    plan_path=plan_path, ledger_dir=str(work_dir / "ledger"),
                                    shoal_run_id="no-spark", work_dir=str(work_dir), conn_id="shoal_spark_missing")
    with pytest.raises(AirflowFailException, match="Spark connection 'shoal_spark_missing' is not defined"):
        op.execute({"run_id": "manual__no_spark", "dag": SimpleNamespace(dag_id="shoal_backfill")})
    assert not list(work_dir.rglob("shoal-clusters-*")), "no clusters file is written before the refusal"
    assert not (work_dir / "ledger").exists()


def test_a_remote_master_gets_the_code_and_a_packed_environment_not_this_interpreter(
        airflow_connections, work_dir, source_cluster, unique_name, monkeypatch, tmp_path):
    """The spark-submit command and environment the provider's hook would run (captured where the provider's
    execute would start it: no cluster is needed to check what is shipped)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from shoal_airflow.operators import ShoalSparkBackfillOperator

    monkeypatch.setenv("AIRFLOW_CONN_SHOAL_SPARK_REMOTE",
                       json.dumps({"conn_type": "spark", "host": "spark://spark-master", "port": 7077}))
    monkeypatch.setenv("SHOAL_SPARK_ENV_DIR", str(tmp_path / "env-cache"))
    captured = {}

    def capture(self, context):
        captured["cmd"] = self._hook._build_spark_submit_command(self.application)
        captured["env"] = dict(self._hook._env or {})

    monkeypatch.setattr(SparkSubmitOperator, "execute", capture)
    op = ShoalSparkBackfillOperator(task_id="backfill", source_conn_id="shoal_source", target_conn_id="shoal_target",
                                    plan_path=_plan_file(work_dir, source_cluster, unique_name),
                                    ledger_dir=str(work_dir / "ledger"), shoal_run_id="remote",
                                    work_dir=str(work_dir), conn_id="shoal_spark_remote")
    monkeypatch.setattr(op, "_ledger_summary", lambda run_id: {})
    op.execute({"run_id": "manual__remote", "dag": SimpleNamespace(dag_id="shoal_backfill")})
    cmd = captured["cmd"]
    assert cmd[cmd.index("--master") + 1] == "spark://spark-master:7077"
    archive, alias = cmd[cmd.index("--archives") + 1].split("#")
    assert alias == "environment" and archive.startswith(str(tmp_path / "env-cache"))
    assert "spark.pyspark.python=./environment/bin/python" in cmd
    assert cmd[cmd.index("--py-files") + 1].endswith("shoal-code.zip")
    assert captured["env"].get("PYSPARK_PYTHON") != sys.executable, "executors must not be told the worker's path"
