"""``shoal_retention_guard`` and ``shoal_dr_rehearsal`` with ``dag.test()`` against the sandbox brokers."""

from __future__ import annotations

import json
import os
import re

from tests.airflow.test_backfill_dag import task_states, xcom_of


def test_retention_guard_passes_when_every_partition_is_safe(fresh_dag, airflow_connections, source_cluster,
                                                             unique_name):
    topic = unique_name("forever")
    source_cluster.create_topic(topic, partitions=1, config={"retention.ms": "-1"})
    source_cluster.produce(topic, [(b"k", b"v", [])] * 10)
    dr = fresh_dag("shoal_retention_guard").test(
        run_conf={"pipeline": "guard-safe", "include": re.escape(topic)})
    assert str(dr.state) == "success", task_states(dr)
    assert xcom_of(dr, "assess")["statuses"] == {"SAFE": [f"{topic}-0"]}
    assert task_states(dr)["trigger_backfill"] == "skipped"


def test_retention_guard_fails_loudly_notifies_and_triggers_one_backfill_per_pipeline(
        fresh_dag, airflow_connections, work_dir, source_cluster, unique_name, capfd, tmp_path, monkeypatch):
    notes = tmp_path / "notified.jsonl"
    monkeypatch.setenv("AIRFLOW_VAR_SHOAL_FAILURE_NOTIFIER", "tests.airflow.notify_probe.record")
    monkeypatch.setenv("AIRFLOW_VAR_SHOAL_FAILURE_NOTIFIER_KWARGS", json.dumps({"path": str(notes)}))
    set_paused("shoal_backfill", True)
    topic = unique_name("short")
    source_cluster.create_topic(topic, partitions=1, config={"retention.ms": "120000"})
    source_cluster.produce(topic, [(b"k", b"v", [])] * 10)
    conf = {"pipeline": unique_name("guard"), "include": re.escape(topic), "naming": "prefix:guard.",
            "trigger_backfill": True}
    dr = fresh_dag("shoal_retention_guard").test(run_conf=conf)
    states = task_states(dr)
    assert str(dr.state) == "failed", states
    assert states["assess"] == "success" and states["alarm"] == "failed"
    out, err = capfd.readouterr()
    assert re.search(rf"{re.escape(topic)}-0 (AT_RISK|LOSING)", out + err)
    assert "shoal_backfill is PAUSED" in out + err                       # said loudly, in the alarm too
    assert states["trigger_backfill"] == "success"
    [triggered] = backfill_runs_for(topic)
    assert triggered["start"] == "checkpoint" and triggered["naming"] == "prefix:guard."
    [note] = [json.loads(line) for line in notes.read_text().splitlines()]
    assert (note["dag_id"], note["task_id"]) == ("shoal_retention_guard", "alarm")

    again = fresh_dag("shoal_retention_guard").test(run_conf=conf)       # the first backfill is still queued
    assert task_states(again)["trigger_backfill"] == "skipped"
    assert len(backfill_runs_for(topic)) == 1
    out, err = capfd.readouterr()
    assert "is already active; not triggering another" in out + err

    second = fresh_dag("shoal_backfill").test(run_conf={"pipeline": conf["pipeline"], "include": conf["include"],
                                                         "naming": "prefix:guard."})
    assert task_states(second)["validate"] == "failed" and task_states(second)["preflight"] == "upstream_failed"
    out, err = capfd.readouterr()
    assert f"pipeline '{conf['pipeline']}' already has an active backfill: run guard__" in out + err


def set_paused(dag_id: str, paused: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        if model is not None:
            model.is_paused = paused


def backfill_runs_for(topic: str) -> list[dict]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == "shoal_backfill")).all()
        return [dict(r.conf) for r in runs if r.conf and r.conf.get("include") == re.escape(topic)]


def test_retention_deadline_sensor_waits_while_a_partition_is_at_risk(airflow_connections, source_cluster,
                                                                      unique_name):
    from shoal_airflow.sensors import ShoalRetentionDeadlineSensor

    safe, risky = unique_name("safe"), unique_name("risky")
    source_cluster.create_topic(safe, partitions=1, config={"retention.ms": "-1"})
    source_cluster.create_topic(risky, partitions=1, config={"retention.ms": "120000"})
    for topic in (safe, risky):
        source_cluster.produce(topic, [(b"k", b"v", [])] * 5)

    def sensor(topic):
        return ShoalRetentionDeadlineSensor(task_id="deadline", source_conn_id="shoal_source",
                                            target_conn_id="shoal_target", pipeline="sensor", include=re.escape(topic),
                                            at_risk_below_s=600)

    assert sensor(safe).poke({}) is True
    assert sensor(risky).poke({}) is False


def test_dr_rehearsal_rebuilds_verifies_records_rto_and_cleans_up(fresh_dag, airflow_connections, work_dir,
                                                                  source_cluster, target_cluster, unique_name):
    from mirror_core.kafka.topics import TopicAdmin
    from mirror_core.services.rehearsal import read_rehearsals

    topic = unique_name("dr")
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.produce(topic, [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(60)])
    prefix = "shoal-test-dr."
    dr = fresh_dag("shoal_dr_rehearsal").test(
        run_conf={"source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "include": re.escape(topic),
                  "scratch_prefix": prefix})
    states = task_states(dr)
    assert str(dr.state) == "success", states
    verified = xcom_of(dr, "verify")
    assert verified["records_compared"] == 60 and verified["offset_maps_checked"] == 2
    [rehearsal] = [r for r in read_rehearsals(work_dir / "ledger") if topic in r.topics]
    assert rehearsal.verified and rehearsal.records == 60 and rehearsal.units == 2
    assert rehearsal.rto_s > 0 and rehearsal.rpo_offsets == 0
    dropped = xcom_of(dr, "cleanup")
    assert len(dropped) == 1 and dropped[0].startswith(prefix) and dropped[0].endswith(topic)
    assert dropped[0] not in TopicAdmin(target_cluster.config).list_topics()
    assert os.path.isdir(work_dir / "ledger")
