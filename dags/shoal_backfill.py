"""
# shoal_backfill

Back-fill a bounded offset range of Kafka topics from a source to a target cluster as **raw record batches**
(no re-compression, exact offset maps), run as a PySpark job.

Trigger it from the UI: the form is validated when the run is triggered (connection ids, topic regexes, naming,
bounds, mode, throttle, the source link's rate). Then:

1. **validate** — cross-field checks (unknown connection, end before start, a copy onto itself); never retried.
   It claims the pipeline: a second active backfill of the same pipeline is refused, naming the run that holds it
   (the claim is released by **release_claim** when the run ends, or taken over once its run is no longer active).
2. **preflight** — every selected target topic is checked (and created when missing; not in a dry run).
3. **plan** — per-partition ranges, earliest retention deadline first, written as JSON under the work dir.
4. **retention_check** — refuses partitions that already lost data (unless *accept_loss*); AT_RISK and LOSING
   partitions are warned about and copied first (the plan is ordered earliest deadline first).
5. **backfill** — spark-submit of `spark_apps/backfill_job.py`; credentials travel in a 0600 file, never argv.
   With *link_mb_s* (a far source) the driver measures the round trip to the source once and sizes every lane's
   fetches so the link stays busy; the task log names the figures.
   While it runs the task log shows each lane's progress (offset, ~records, ~MB, rate, ETA; every
   `shoal_progress_interval_s`, default 10 s) and each unit's ledger row is written as the unit ends.
6. **verify** — every planned unit accounted for in the ledger; copied ranges compared record by record.
7. **report** — one summary in the log and in XCom.

Connections are `kafka` connections (librdkafka settings in extras) from `AIRFLOW_CONN_*` or the UI; the Spark
master comes from the `shoal_spark` connection. The work dir (plans, ledger) is the Variable `shoal_work_dir`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, task

from shoal_airflow.operators import (
    ShoalPlanOperator,
    ShoalPreflightOperator,
    ShoalRetentionCheckOperator,
    ShoalSparkBackfillOperator,
    ShoalVerifyOperator,
)
from shoal_airflow.params import backfill_params

WORK_DIR = "{{ var.value.get('shoal_work_dir', '/tmp/shoal') }}"
LEDGER_DIR = WORK_DIR + "/ledger"
PLAN = "{{ ti.xcom_pull(task_ids='plan')['plan_path'] }}"
P = "{{ params.%s }}"

with DAG(
    dag_id="shoal_backfill",
    doc_md=__doc__,
    description="Back-fill Kafka topics as raw batches with Spark (manual, form-driven)",
    schedule=None,
    catchup=False,
    max_active_runs=4,
    tags=["shoal", "kafka", "backfill"],
    params=backfill_params(),
    render_template_as_native_obj=True,
    default_args={"owner": "shoal", "retries": 2, "retry_delay": timedelta(minutes=1)},
):

    @task(retries=0)
    def validate(params=None, ti=None, run_id=None) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from shoal_airflow.params import claim_pipeline, validate_backfill_request

        checked = validate_backfill_request(dict(params))
        if not params["dry_run"]:
            holder = claim_pipeline(params["pipeline"], run_id, ti, by="shoal_backfill")
            if holder.run_id != run_id:
                raise AirflowFailException(
                    f"pipeline {params['pipeline']!r} already has an active backfill: run {holder.run_id} (started by "
                    f"{holder.by or 'a user'}); two backfills of one pipeline would fence each other's lanes. Wait "
                    "for it to end, or mark it failed if it is dead, then trigger again")
        return checked

    preflight = ShoalPreflightOperator(
        task_id="preflight", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        include=P % "include", exclude=P % "exclude", naming=P % "naming", pipeline=P % "pipeline",
        create_missing="{{ not params.dry_run }}", coalesce_small_batches=P % "coalesce_small_batches")
    plan = ShoalPlanOperator(
        task_id="plan", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        pipeline=P % "pipeline", include=P % "include", exclude=P % "exclude", naming=P % "naming",
        start=P % "start", end=P % "end", mode=P % "mode", exact_bounds=P % "exact_bounds",
        throttle_mb_s=P % "throttle_mb_s", accept_loss=P % "accept_loss", link_mb_s=P % "link_mb_s",
        coalesce_small_batches=P % "coalesce_small_batches", work_dir=WORK_DIR)
    retention = ShoalRetentionCheckOperator(
        task_id="retention_check", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        plan_path=PLAN,
        accept_loss=P % "accept_loss", fail_on=("LOST",), retries=0)

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def copy_requested(params=None) -> bool:
        return not params["dry_run"]

    backfill = ShoalSparkBackfillOperator(
        task_id="backfill", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        plan_path=PLAN, ledger_dir=LEDGER_DIR, work_dir=WORK_DIR, conn_id="shoal_spark",
        progress_interval_s="{{ var.value.get('shoal_progress_interval_s', 10) }}")
    verify = ShoalVerifyOperator(
        task_id="verify", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        plan_path=PLAN, ledger_dir=LEDGER_DIR, shoal_run_id="{{ ti.xcom_pull(task_ids='backfill')['run_id'] }}")

    @task(trigger_rule="none_failed")
    def report(ti=None, params=None) -> dict:
        planned = ti.xcom_pull(task_ids="plan") or {}
        copied = ti.xcom_pull(task_ids="backfill") or {}
        verified = ti.xcom_pull(task_ids="verify") or {}
        summary = {"plan_id": planned.get("plan_id"), "plan": planned.get("summary"), "dry_run": params["dry_run"],
                   "run_id": copied.get("run_id"), "units": copied.get("units"), "records": copied.get("records"),
                   "records_compared": verified.get("records_compared")}
        print(f"shoal_backfill report: {summary}")
        return summary

    @task(retries=3)
    def release_claim(params=None, run_id=None) -> bool:
        """The pipeline is free for the next backfill once this run has ended, however it ended (a teardown: it
        does not decide the run's state)."""
        from shoal_airflow.params import release_pipeline

        return release_pipeline(params["pipeline"], run_id)

    claimed, ended = validate(), report()
    claimed >> preflight >> plan >> retention >> copy_requested() >> backfill >> verify >> ended
    ended >> release_claim().as_teardown(setups=claimed)
