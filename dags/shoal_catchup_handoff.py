"""
# shoal_catchup_handoff

Bring a pipeline's target up to date with back-fill rounds, then hand every partition to the continuous shallow
mirror daemon at exactly the offset where the back-fill stopped, and prove the seam.

1. **round_N** (up to three) — if the lag (source last stable offset − checkpoint, summed over the selection) is
   above *max_lag*: plan from the pipeline's checkpoints (from *first_start* when it has none yet) and run the
   Spark backfill. Each round copies what arrived during the previous one, so rounds shrink; once the lag is
   under the threshold the remaining rounds are skipped.
2. **caught_up** — a deferrable sensor (the triggerer polls the lag) waits until the lag is ≤ *max_lag*.
3. **handoff** — each back-filled partition's checkpoint passes to the daemon (owner epoch + 1, fencing the
   backfill's writer); waits until a daemon (`python -m mirror_core.daemon --config pipeline.yaml`, same pipeline,
   clusters and selection) holds every lane; then checks each seam record by record: no gap, no duplicate.

The daemon is a long-running service started outside Airflow (compose, systemd); start it before the handoff,
not before the first round (it would take lanes that have no checkpoint yet). Connections are `kafka`
connections from `AIRFLOW_CONN_*` or the UI; the Spark master is the `shoal_spark` connection.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, TaskGroup, task

from shoal_airflow.operators import ShoalHandoffOperator, ShoalPlanOperator, ShoalSparkBackfillOperator
from shoal_airflow.params import CONN_ID, NAME, NAMING
from shoal_airflow.sensors import ShoalCaughtUpSensor

ROUNDS = 3
WORK_DIR = "{{ var.value.get('shoal_work_dir', '/tmp/shoal') }}"
P = "{{ params.%s }}"

with DAG(
    dag_id="shoal_catchup_handoff",
    doc_md=__doc__,
    description="Back-fill rounds until the lag is small, then hand off to the daemon and verify the seam",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["shoal", "kafka", "handoff"],
    render_template_as_native_obj=True,
    params={
        "source_conn_id": Param("shoal_source", type="string", pattern=CONN_ID),
        "target_conn_id": Param("shoal_target", type="string", pattern=CONN_ID),
        "pipeline": Param("mirror", type="string", pattern=NAME, description="the daemon's pipeline name"),
        "include": Param(".*", type="string", format="regex", minLength=1),
        "exclude": Param(None, type=["null", "string"], format="regex"),
        "naming": Param("identity", type="string", pattern=NAMING, description="must match the daemon's"),
        "first_start": Param("earliest", type="string", description="start of a partition never back-filled"),
        "max_lag": Param(1000, type="integer", minimum=0, description="offsets behind at which to hand off"),
        "wait_for_daemon_s": Param(120, type="integer", minimum=0, maximum=3600),
        "mode": Param("exactly-once", type="string", enum=["exactly-once", "at-least-once"]),
    },
    default_args={"owner": "shoal", "retries": 2, "retry_delay": timedelta(minutes=1)},
):
    previous = None
    for n in range(1, ROUNDS + 1):
        with TaskGroup(group_id=f"round_{n}") as round_group:

            @task.short_circuit(task_id="lagging", ignore_downstream_trigger_rules=False)
            def lagging(params=None) -> bool:
                from mirror_core.services.lag import measure_lag
                from shoal_airflow.hooks import ShoalKafkaHook

                lag = measure_lag(ShoalKafkaHook(params["source_conn_id"]).get_cluster(),
                                  ShoalKafkaHook(params["target_conn_id"]).get_cluster(), params["pipeline"],
                                  params["include"], params["exclude"])
                print(f"pipeline {params['pipeline']}: lag {lag.total} offsets (threshold {params['max_lag']})")
                return lag.total > params["max_lag"]

            plan = ShoalPlanOperator(
                task_id="plan", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
                pipeline=P % "pipeline", include=P % "include", exclude=P % "exclude", naming=P % "naming",
                start="checkpoint", start_without_checkpoints=P % "first_start", end="latest", mode=P % "mode",
                work_dir=WORK_DIR + f"/round_{n}")
            backfill = ShoalSparkBackfillOperator(
                task_id="backfill", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
                plan_path=f"{{{{ ti.xcom_pull(task_ids='round_{n}.plan')['plan_path'] }}}}",
                ledger_dir=WORK_DIR + "/ledger", work_dir=WORK_DIR + f"/round_{n}",
                shoal_run_id="{{ run_id }}" + f"-round{n}", conn_id="shoal_spark")
            lagging() >> plan >> backfill
        if previous is not None:
            previous >> round_group
        previous = round_group

    caught_up = ShoalCaughtUpSensor(
        task_id="caught_up", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        pipeline=P % "pipeline", include=P % "include", exclude=P % "exclude", max_lag=P % "max_lag",
        poll_interval_s=5, timeout=3600, trigger_rule="none_failed")
    handoff = ShoalHandoffOperator(
        task_id="handoff", source_conn_id=P % "source_conn_id", target_conn_id=P % "target_conn_id",
        pipeline=P % "pipeline", include=P % "include", exclude=P % "exclude",
        wait_for_daemon_s=P % "wait_for_daemon_s")
    previous >> caught_up >> handoff
