"""``shoal_backfill`` end to end with ``dag.test()``: real brokers, spark-submit on local[2], SQLite metadata DB.

The source is read through its SASL_SSL/SCRAM listener, so the run also proves the password stays out of task
logs, XCom, rendered template fields and the spark-submit command line (sampled from /proc while the job runs).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from mirror_core.state.ledger import read_ledger

RECORDS = 120


class CmdlineSampler:
    """Collects the command lines of every process running the backfill job (spark-submit and its JVM)."""

    def __init__(self):
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "backfill_job.py" in cmd:
                    self.seen.add(cmd)
            self._stop.wait(0.2)


def stored_values(dag_id: str) -> list[str]:
    """Every XCom value and rendered template field stored for ``dag_id``, as text."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id)).all()
        rendered = session.scalars(select(RenderedTaskInstanceFields)
                                   .where(RenderedTaskInstanceFields.dag_id == dag_id)).all()
        return [repr(x.value) for x in xcoms] + [repr(r.rendered_fields) for r in rendered]


def xcom_of(dag_run, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(XComModel.dag_id == dag_run.dag_id,
                                                      XComModel.run_id == dag_run.run_id,
                                                      XComModel.task_id == task_id,
                                                      XComModel.key == "return_value")).first()
        return None if row is None else XComModel.deserialize_value(row)


def task_states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def test_backfill_copies_and_verifies_without_leaking_the_password(
        fresh_dag, airflow_connections, work_dir, source_cluster, target_cluster, unique_name, capfd):
    topic = unique_name("orders")
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.produce(topic, [(f"k{i}".encode(), f"v{i}".encode(), [("h", b"1")]) for i in range(RECORDS)])
    dag = fresh_dag("shoal_backfill")
    with CmdlineSampler() as sampler:
        dr = dag.test(run_conf={"source_conn_id": "shoal_source_secure", "target_conn_id": "shoal_target",
                                "pipeline": "airflow-e2e", "include": re.escape(topic), "naming": "prefix:dr."})
    states = task_states(dr)
    assert str(dr.state) == "success", states
    target_topic = f"dr.{topic}"
    copied = target_cluster.read_all(target_topic)
    assert sorted(r.value for r in copied) == sorted(f"v{i}".encode() for i in range(RECORDS))
    rows = read_ledger(work_dir / "ledger")
    assert {r.unit_id for r in rows} == {f"{topic}-0", f"{topic}-1"}
    assert all(r.status == "ok" for r in rows) and sum(r.records for r in rows) == RECORDS
    assert xcom_of(dr, "verify")["records_compared"] == RECORDS
    assert xcom_of(dr, "report")["records"] == RECORDS

    password = airflow_connections["password"]
    assert sampler.seen, "the spark-submit command line was never sampled"
    assert not [c for c in sampler.seen if password in c]
    stored = stored_values("shoal_backfill")
    assert any("backfill_job.py" in v for v in stored), "the Spark task's rendered fields were not stored"
    assert any("plan_path" in v for v in stored), "no XCom was stored"
    assert not [v for v in stored if password in v]
    out, err = capfd.readouterr()
    assert "spark-submit backfill of plan" in out + err, "task logs were not captured"
    assert password not in out + err
    for log_file in (Path(os.environ["AIRFLOW_HOME"]) / "logs").rglob("*"):
        assert not (log_file.is_file() and password.encode() in log_file.read_bytes()), log_file
    assert not list(work_dir.rglob("shoal-clusters-*")), "the clusters file outlived the job"


@pytest.mark.parametrize(("conf", "param"), [
    ({"include": "orders[", "naming": "prefix:dr."}, "include"),
    ({"exclude": "(unclosed"}, "exclude"),
    ({"mode": "fastest"}, "mode"),
    ({"throttle_mb_s": -5}, "throttle_mb_s"),
    ({"naming": "upper"}, "naming"),
    ({"start": "yesterday"}, "start"),
])
def test_bad_form_input_is_refused_at_trigger_time(fresh_dag, airflow_connections, work_dir, conf, param):
    from airflow.sdk.exceptions import ParamValidationError

    dag = fresh_dag("shoal_backfill")
    with pytest.raises(ParamValidationError, match=param):
        dag.test(run_conf={"include": "x", **conf})
    assert not any(work_dir.iterdir()), "something was written for a refused form"


@pytest.mark.parametrize(("conf", "expected"), [
    ({"source_conn_id": "no_such_conn"}, "source_conn_id"),
    ({"start": "2026-11-20T10:00:00Z", "end": "2026-11-20T09:00:00Z"}, "before start"),
    ({"start": "t:0=50", "end": "t:0=10", "include": "t"}, "before start"),
    ({"target_conn_id": "shoal_source"}, "onto itself"),
])
def test_cross_field_errors_fail_the_validation_task_without_retries(
        fresh_dag, airflow_connections, work_dir, conf, expected, capfd):
    dag = fresh_dag("shoal_backfill")
    dr = dag.test(run_conf={"source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "include": "x",
                            **conf})
    states = task_states(dr)
    assert str(dr.state) == "failed"
    assert states["validate"] == "failed"
    assert states["preflight"] == "upstream_failed" and states["backfill"] == "upstream_failed"
    ti = next(t for t in dr.get_task_instances() if t.task_id == "validate")
    assert ti.try_number == 1
    out, err = capfd.readouterr()
    assert "invalid backfill request" in out + err and expected in out + err
    assert not any(work_dir.iterdir())


def test_the_form_can_coalesce_small_batches_and_verify_still_holds(fresh_dag, airflow_connections, work_dir,
                                                                     source_cluster, target_cluster, unique_name):
    """``coalesce_small_batches`` in the trigger form: one-record batches reach the target merged (far fewer
    batches, counted as deep in the ledger), and the DAG's own verify task compares every record."""
    import json

    from tests.copy_helpers import raw_batches

    topic = unique_name("small")
    source_cluster.create_topic(topic, partitions=1)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i, [("h", b"1")]) for i in range(RECORDS)], partition=0,
                           **{"batch.num.messages": 1, "linger.ms": 0})
    dr = fresh_dag("shoal_backfill").test(run_conf={
        "source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "include": re.escape(topic),
        "naming": "prefix:dr.", "pipeline": "airflow-coalesce", "coalesce_small_batches": True})
    states = task_states(dr)
    assert str(dr.state) == "success", states
    assert json.loads(Path(xcom_of(dr, "plan")["plan_path"]).read_text())["coalesce_bytes"] == 65536
    rows = read_ledger(work_dir / "ledger")
    assert sum(r.records for r in rows) == RECORDS and sum(r.deep_batches for r in rows) >= 1
    merged = raw_batches(target_cluster, f"dr.{topic}")
    assert len(merged) <= 5, f"{len(merged)} target batches for {RECORDS} one-record source batches"
    assert xcom_of(dr, "verify")["records_compared"] == RECORDS


def test_dry_run_plans_and_checks_but_writes_nothing_to_the_target(fresh_dag, airflow_connections, work_dir,
                                                                   source_cluster, target_cluster, unique_name):
    import json

    topic = unique_name("dry")
    source_cluster.create_topic(topic, partitions=1)
    source_cluster.produce(topic, [(b"k", b"v", [])] * 7)
    dr = fresh_dag("shoal_backfill").test(run_conf={
        "source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "include": re.escape(topic),
        "naming": "prefix:dry.", "dry_run": True})
    states = task_states(dr)
    assert str(dr.state) == "success", states
    assert states["backfill"] == "skipped" and states["verify"] == "skipped" and states["report"] == "success"
    plan = json.loads(Path(xcom_of(dr, "plan")["plan_path"]).read_text())
    assert plan["summary"]["offsets"] == 7 and plan["source_cluster"] == "shoal_source"
    assert f"dry.{topic}" not in target_cluster.admin.list_topics()
    assert not (work_dir / "ledger").exists()


def test_a_refused_preflight_fails_at_once_without_retries(fresh_dag, airflow_connections, work_dir, source_cluster,
                                                           target_cluster, unique_name, capfd):
    topic = unique_name("narrow")
    source_cluster.create_topic(topic, partitions=3)
    source_cluster.produce(topic, [(b"k", b"v", [])] * 3)
    target_cluster.create_topic(f"dr.{topic}", partitions=1)  # fewer partitions than the source: refused
    dr = fresh_dag("shoal_backfill").test(run_conf={
        "source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "include": re.escape(topic),
        "naming": "prefix:dr."})
    states = task_states(dr)
    assert states["preflight"] == "failed" and states["plan"] == "upstream_failed", states
    ti = next(t for t in dr.get_task_instances() if t.task_id == "preflight")
    assert ti.try_number == 1, "a non-retriable refusal was retried"
    out, err = capfd.readouterr()
    assert "PreflightError" in out + err and "partitions" in out + err
    assert not (work_dir / "ledger").exists()


def test_a_job_that_refuses_its_input_fails_the_spark_task_without_retries(airflow_connections, work_dir,
                                                                          source_cluster, target_cluster,
                                                                          unique_name):
    """Exit 2 of the backfill job (bad input: here a target topic with too few partitions) is not retriable."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from mirror_core.config.plan_request import PlanRequest
    from mirror_core.services.plan_inputs import build_plan
    from shoal_airflow.hooks import ShoalKafkaHook
    from shoal_airflow.operators import ShoalSparkBackfillOperator

    topic = unique_name("exit2")
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.produce(topic, [(b"k", b"v", [])] * 4)
    request = PlanRequest.parse(pipeline="exit2", source_cluster="shoal_source", target_cluster="shoal_target",
                                include=re.escape(topic), naming="prefix:x2.")
    plan = build_plan(ShoalKafkaHook("shoal_source").get_cluster(), ShoalKafkaHook("shoal_target").get_cluster(),
                      request)
    plan_path = work_dir / "plan.json"
    plan_path.write_text(plan.to_json())
    target_cluster.create_topic(f"x2.{topic}", partitions=1)
    op = ShoalSparkBackfillOperator(task_id="backfill", source_conn_id="shoal_source", target_conn_id="shoal_target",
                                    plan_path=str(plan_path), ledger_dir=str(work_dir / "ledger"),
                                    shoal_run_id="exit2-run", work_dir=str(work_dir), conn_id="shoal_spark")
    context = {"run_id": "manual__exit2", "dag": SimpleNamespace(dag_id="shoal_backfill")}
    with pytest.raises(AirflowFailException, match="exit 2"):
        op.execute(context)
    assert not list(work_dir.rglob("shoal-clusters-*"))
