"""A missing Spark connection fails the backfill task by name; it never falls back to the provider's ``yarn``."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest


def test_a_missing_spark_connection_fails_naming_the_connection_id(airflow_connections, work_dir, source_cluster,
                                                                   unique_name):
    from airflow.sdk.exceptions import AirflowFailException

    from mirror_core.plan_inputs import build_plan
    from mirror_core.planner import PlanRequest
    from plugins.hooks import ShoalKafkaHook
    from plugins.operators import ShoalSparkBackfillOperator

    topic = source_cluster.create_topic(unique_name("nospark"))
    source_cluster.produce(topic, [(b"k", b"v")] * 3)
    request = PlanRequest.parse(pipeline="nospark", source_cluster="shoal_source", target_cluster="shoal_target",
                                include=re.escape(topic), naming="prefix:ns.")
    plan = build_plan(ShoalKafkaHook("shoal_source").get_cluster(), ShoalKafkaHook("shoal_target").get_cluster(),
                      request)
    assert plan.units
    plan_path = work_dir / "plan.json"
    plan_path.write_text(plan.to_json())
    op = ShoalSparkBackfillOperator(task_id="backfill", source_conn_id="shoal_source", target_conn_id="shoal_target",
                                    plan_path=str(plan_path), ledger_dir=str(work_dir / "ledger"),
                                    shoal_run_id="no-spark", work_dir=str(work_dir), conn_id="shoal_spark_missing")
    with pytest.raises(AirflowFailException, match="Spark connection 'shoal_spark_missing' is not defined"):
        op.execute({"run_id": "manual__no_spark", "dag": SimpleNamespace(dag_id="shoal_backfill")})
    assert not list(work_dir.rglob("shoal-clusters-*")), "no clusters file is written before the refusal"
    assert not (work_dir / "ledger").exists()
