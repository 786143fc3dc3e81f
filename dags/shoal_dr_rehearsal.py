"""
# shoal_dr_rehearsal

Scheduled disaster-recovery rehearsal: rebuild the chosen topics from a cluster (normally the DR mirror) into a
**scratch prefix** on a target cluster, prove the rebuild, measure it, and clean up.

1. **plan** — earliest → latest of the chosen topics, named `<scratch_prefix><run stamp>.<topic>`, under a fresh
   pipeline `dr-rehearsal-<run stamp>` (its own checkpoints, so it never touches a real pipeline's lanes).
2. **rebuild** — the Spark backfill job (raw batches).
3. **verify** — every unit in the ledger; each copied range equal record by record; each offset map translates
   the ledger's source range onto its target range.
4. **record** — RTO (plan start → verified) and RPO (offsets and seconds the rebuild trails the source) written
   next to the ledger (`rehearsals/run=<id>/rehearsal.parquet`) and to XCom.
5. **cleanup** — the scratch topics are dropped (always, even after a failure), unless *keep_scratch*.

Connections are `kafka` connections from `AIRFLOW_CONN_*` or the UI; the work dir is the Variable `shoal_work_dir`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from shoal_airflow.notify import notify_failure
from shoal_airflow.operators import (
    ShoalDropTopicsOperator,
    ShoalPlanOperator,
    ShoalSparkBackfillOperator,
    ShoalVerifyOperator,
)
from shoal_airflow.params import CONN_ID, NAME

WORK_DIR = "{{ var.value.get('shoal_work_dir', '/tmp/shoal') }}"
LEDGER_DIR = WORK_DIR + "/ledger"
PLAN = "{{ ti.xcom_pull(task_ids='plan')['plan_path'] }}"
STAMP = "{{ ts_nodash | lower }}"
SCRATCH = "{{ params.scratch_prefix }}" + STAMP + "."
P = "{{ params.%s }}"

with DAG(
    dag_id="shoal_dr_rehearsal",
    doc_md=__doc__,
    description="Rebuild topics into a scratch prefix, verify, record RTO/RPO, clean up",
    schedule="0 3 * * 6",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["shoal", "kafka", "dr"],
    render_template_as_native_obj=True,
    params={
        "source_conn_id": Param("shoal_dr", type="string", pattern=CONN_ID,
                                description="cluster rebuilt from (normally the DR mirror)"),
        "target_conn_id": Param("shoal_scratch", type="string", pattern=CONN_ID,
                                description="cluster the scratch topics are created on"),
        "include": Param(".*", type="string", format="regex", minLength=1, description="topics to rebuild"),
        "exclude": Param(None, type=["null", "string"], format="regex"),
        "scratch_prefix": Param("shoal-dr-rehearsal.", type="string", pattern=NAME, minLength=3),
        "keep_scratch": Param(False, type="boolean", description="keep the scratch topics for inspection"),
    },
    default_args={"owner": "shoal", "retries": 1, "retry_delay": timedelta(minutes=2),
                  "on_failure_callback": notify_failure},
):
    plan = ShoalPlanOperator(
        task_id="plan", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        pipeline="dr-rehearsal-" + STAMP, include=P % "include", exclude=P % "exclude",
        naming="prefix:" + SCRATCH, start="earliest", end="latest", work_dir=WORK_DIR, use_deadlines=False)
    rebuild = ShoalSparkBackfillOperator(
        task_id="rebuild", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        plan_path=PLAN, ledger_dir=LEDGER_DIR, work_dir=WORK_DIR, conn_id="shoal_spark")
    verify = ShoalVerifyOperator(
        task_id="verify", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        plan_path=PLAN, ledger_dir=LEDGER_DIR, shoal_run_id="{{ ti.xcom_pull(task_ids='rebuild')['run_id'] }}",
        check_offset_maps=True, retries=0)

    @task
    def record(ti=None, params=None) -> dict:
        import time

        from airflow.sdk import Variable

        from mirror_core.services.rehearsal import RehearsalRecord, measure_rpo, write_rehearsal
        from shoal_airflow.hooks import ShoalKafkaHook
        from shoal_airflow.operators import load_plan

        planned, rebuilt = ti.xcom_pull(task_ids="plan"), ti.xcom_pull(task_ids="rebuild")
        plan = load_plan(planned["plan_path"])
        started_ms = plan.created_ms
        verified_ms = int(time.time() * 1000)
        behind, rpo_s = measure_rpo(ShoalKafkaHook(params["source_conn_id"]).get_cluster(),
                                    ShoalKafkaHook(params["target_conn_id"]).get_cluster(), plan.units)
        scratch = plan.units[0].target_topic[: -len(plan.units[0].topic)] if plan.units else ""
        entry = RehearsalRecord(
            rehearsal_id=plan.pipeline, backfill_run_id=rebuilt["run_id"], pipeline=plan.pipeline,
            source_cluster=plan.source_cluster, target_cluster=plan.target_cluster, scratch_prefix=scratch,
            topics=",".join(sorted({u.topic for u in plan.units})), units=len(plan.units), records=rebuilt["records"],
            started_ms=started_ms, verified_ms=verified_ms, rto_s=(verified_ms - started_ms) / 1000,
            rpo_offsets=behind, rpo_s=rpo_s, verified=True)
        ledger_dir = Variable.get("shoal_work_dir", default="/tmp/shoal") + "/ledger"
        path = write_rehearsal(ledger_dir, entry)
        print(f"DR rehearsal {entry.rehearsal_id}: RTO {entry.rto_s:.1f} s, RPO {behind} offsets / "
              f"{rpo_s if rpo_s is None else round(rpo_s, 1)} s; {entry.records} records; recorded in {path}")
        return {"rto_s": entry.rto_s, "rpo_offsets": behind, "rpo_s": rpo_s, "records": entry.records,
                "path": str(path)}

    @task.short_circuit(trigger_rule="all_done", ignore_downstream_trigger_rules=False)
    def drop_scratch(ti=None, params=None) -> bool:
        return not params["keep_scratch"] and bool(ti.xcom_pull(task_ids="plan"))

    cleanup = ShoalDropTopicsOperator(
        task_id="cleanup", target_conn_id=P % "target_conn_id", plan_path=PLAN,
        required_prefix="{{ params.scratch_prefix }}", trigger_rule="all_done")

    @task(trigger_rule="all_done")
    def outcome(ti=None) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        if not ti.xcom_pull(task_ids="record"):
            raise AirflowFailException("the rehearsal did not complete: see the rebuild and verify tasks")

    recorded = record()
    gate = drop_scratch()
    plan >> rebuild >> verify >> recorded >> gate >> cleanup >> outcome()
