"""
# shoal_retention_guard

Every few minutes: for each partition a pipeline mirrors, how long until the source deletes data not yet copied,
against how long the copy will take (the retention model, at the pipeline's checkpoints). Warn **before** loss.

1. **assess** — status per partition: SAFE, AT_RISK (margin under *at_risk_below_s*), LOSING (the copy cannot
   finish before deletion) or LOST (already deleted before it was copied), with a remedy for each.
2. **trigger_backfill** — optional (*trigger_backfill*): starts `shoal_backfill` from the pipeline's checkpoints
   for the same selection when any partition is not SAFE — at most one: the pipeline is claimed for the run first,
   so while a backfill of the pipeline is queued or running, another guard run reports it instead of starting a
   second; a paused `shoal_backfill` is called out in the log and in the alarm.
3. **alarm** — fails the run loudly, naming every AT_RISK / LOSING / LOST partition and its remedy; a failed task
   calls the notifier configured in the Variable `shoal_failure_notifier` (see `shoal_airflow/notify.py`).

Thresholds and copy-capacity assumptions are the shared retention policy (*retention*, defaults: 1 h, 100 MB/s
link, measured round trips), the same verdict as `shoal deadlines`, the daemon and the Shoal page.

A partition without a checkpoint counts as not mirrored at all. Connections are `kafka` connections from
`AIRFLOW_CONN_*` or the UI.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, task

from shoal_airflow.notify import notify_failure
from shoal_airflow.operators import ShoalRetentionCheckOperator
from shoal_airflow.params import CONN_ID, NAME

P = "{{ params.%s }}"

with DAG(
    dag_id="shoal_retention_guard",
    doc_md=__doc__,
    description="Retention deadlines of a pipeline; fails loudly on AT_RISK / LOSING / LOST",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=4),
    tags=["shoal", "kafka", "retention"],
    render_template_as_native_obj=True,
    params={
        "source_conn_id": Param("shoal_source", type="string", pattern=CONN_ID),
        "target_conn_id": Param("shoal_target", type="string", pattern=CONN_ID),
        "pipeline": Param("mirror", type="string", pattern=NAME),
        "include": Param(".*", type="string", format="regex", minLength=1),
        "exclude": Param(None, type=["null", "string"], format="regex"),
        "naming": Param("identity", type="string", description="naming policy for a triggered backfill"),
        "at_risk_below_s": Param(None, type=["null", "number"], minimum=0,
                                 description="margin under which a partition is AT_RISK (null: the policy's, 1 h)"),
        "retention": Param({}, type="object", description="the pipeline's retention policy (keys as in the "
                           "pipeline file's retention: section: at_risk_below, link_mb_s, fetch_bytes, "
                           "throughput_mb_s, ingest_sample_s); empty: the defaults every Shoal component uses"),
        "trigger_backfill": Param(False, type="boolean"),
    },
    default_args={"owner": "shoal", "retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": notify_failure},
):
    assess = ShoalRetentionCheckOperator(
        task_id="assess", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        pipeline=P % "pipeline", include=P % "include", exclude=P % "exclude", fail_on=(), accept_loss=True,
        at_risk_below_s=P % "at_risk_below_s", retention=P % "retention")

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def backfill_needed(ti=None, params=None, run_id=None) -> bool:
        """Claims the pipeline for the backfill it is about to trigger: idempotent per pipeline (an active backfill
        of the pipeline is reported, not doubled), loud when shoal_backfill is paused."""
        statuses = (ti.xcom_pull(task_ids="assess") or {}).get("statuses", {})
        if not (params["trigger_backfill"] and any(k != "SAFE" for k in statuses)):
            return False
        from shoal_airflow.params import BACKFILL_DAG_ID, claim_pipeline

        pipeline = params["pipeline"]
        wanted = f"guard__{pipeline}__{run_id}"
        holder = claim_pipeline(pipeline, wanted, ti, by="shoal_retention_guard")
        if holder.run_id != wanted:
            print(f"WARNING: pipeline {pipeline}: backfill run {holder.run_id} (by {holder.by or 'a user'}) is "
                  "already active; not triggering another")
            ti.xcom_push(key="backfill_run", value={"run_id": holder.run_id, "triggered": False})
            return False
        paused = bool(ti.get_dag(BACKFILL_DAG_ID).is_paused)
        if paused:
            print(f"ERROR: the DAG {BACKFILL_DAG_ID} is PAUSED: the backfill run {wanted} for pipeline {pipeline} "
                  "will wait in the queue until someone unpauses it")
        ti.xcom_push(key="backfill_run", value={"run_id": wanted, "triggered": True, "paused": paused})
        return True

    trigger = TriggerDagRunOperator(
        task_id="trigger_backfill", trigger_dag_id="shoal_backfill",
        trigger_run_id="{{ ti.xcom_pull(task_ids='backfill_needed', key='backfill_run')['run_id'] }}",
        conf={"source_conn_id": P % "source_conn_id", "target_conn_id": P % "target_conn_id",
              "pipeline": P % "pipeline", "include": P % "include", "exclude": P % "exclude",
              "naming": P % "naming", "start": "checkpoint", "end": "latest"},
        wait_for_completion=False)

    @task(trigger_rule="all_done", retries=0)
    def alarm(ti=None) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        result = ti.xcom_pull(task_ids="assess")
        if not result:
            raise AirflowFailException("the retention assessment did not complete: see the assess task")
        statuses = result["statuses"]
        bad = {k: v for k, v in statuses.items() if k != "SAFE"}
        backfill = ti.xcom_pull(task_ids="backfill_needed", key="backfill_run") or {}
        note = ""
        if backfill.get("paused"):
            note = f" — shoal_backfill is PAUSED: the triggered backfill {backfill['run_id']} waits until unpaused"
        elif backfill.get("run_id"):
            note = f" — backfill {backfill['run_id']} {'triggered' if backfill['triggered'] else 'already active'}"
        if bad:
            counts = ", ".join(f"{len(parts)} {status}" for status, parts in sorted(bad.items()))
            raise AirflowFailException(f"retention deadlines: {counts}{note}: " + "; ".join(result["not_safe"][:20]))
        print(f"retention guard: {len(statuses.get('SAFE', []))} partitions SAFE")
        return {"safe": len(statuses.get("SAFE", []))}

    gate = backfill_needed()
    assess >> gate >> trigger >> alarm()
