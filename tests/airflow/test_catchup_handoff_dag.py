"""``shoal_catchup_handoff`` with ``dag.test()``: back-fill rounds (Spark local[2]), the caught-up sensor, the
handoff to a real daemon (``python -m mirror_core.daemon --config``, started once the back-fill has checkpoints, as
an operator would) and the seam proof; then the daemon keeps copying new records. Plus the lag trigger on its own."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.airflow.test_backfill_dag import task_states, xcom_of


class DaemonStarter:
    """Starts the daemon once every partition of the pipeline has a back-fill checkpoint; stops it at exit."""

    def __init__(self, config_path, target, pipeline: str, partitions: int, log_path):
        self.config_path, self.target, self.pipeline, self.partitions = config_path, target, pipeline, partitions
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def _run(self):
        from mirror_core.services.lag import stored_positions

        while not self._stop.wait(1.0):
            if len(stored_positions(self.target, self.pipeline)) >= self.partitions:
                with open(self.log_path, "w") as log:
                    self.proc = subprocess.Popen([sys.executable, "-m", "mirror_core.daemon", "--config",
                                                  str(self.config_path)], stdout=log, stderr=subprocess.STDOUT)
                return

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_catchup_rounds_then_handoff_to_the_daemon_with_a_clean_seam(
        fresh_dag, airflow_connections, work_dir, sandbox, source_cluster, target_cluster, unique_name, tmp_path):
    topic = unique_name("handoff")
    pipeline = f"airflow-handoff-{os.getpid()}-{int(time.time())}"
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.produce(topic, [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(80)])
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": pipeline, "source": sandbox.client_config("source"), "target": sandbox.client_config("target"),
        "include": re.escape(topic), "naming": "prefix:ho.", "rescan_interval_s": 1, "lease_ttl_s": 5,
        "poll_interval_ms": 100, "metrics_port": 0}))
    with DaemonStarter(config, target_cluster.config, pipeline, 2, tmp_path / "daemon.log") as daemon:
        dr = fresh_dag("shoal_catchup_handoff").test(run_conf={
            "source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "pipeline": pipeline,
            "include": re.escape(topic), "naming": "prefix:ho.", "max_lag": 0, "wait_for_daemon_s": 60})
        states = task_states(dr)
        assert str(dr.state) == "success", (states, (tmp_path / "daemon.log").read_text()[-3000:]
                                            if (tmp_path / "daemon.log").exists() else "daemon never started")
        assert states["round_1.backfill"] == "success"
        assert states["round_2.lagging"] == "success" and states["round_2.backfill"] == "skipped"
        seams = xcom_of(dr, "handoff")
        assert set(seams) == {f"{topic}-0", f"{topic}-1"}
        assert all(s["seam_ok"] for s in seams.values()), seams
        assert daemon.proc is not None
        source_cluster.produce(topic, [(f"n{i}".encode(), f"new{i}".encode(), []) for i in range(20)])
        deadline = time.monotonic() + 60
        while len(target_cluster.read_all(f"ho.{topic}")) < 100 and time.monotonic() < deadline:
            time.sleep(1)
        values = sorted(r.value for r in target_cluster.read_all(f"ho.{topic}"))
    assert values == sorted([f"v{i}".encode() for i in range(80)] + [f"new{i}".encode() for i in range(20)])


def run_trigger(trigger):
    async def first():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first(), 60))


@pytest.mark.parametrize(("max_lag", "timeout_s", "status"), [(10**9, 60, "caught_up"), (0, 0.5, "timeout")])
def test_lag_trigger_fires_on_threshold_or_timeout(airflow_connections, source_cluster, unique_name, max_lag,
                                                   timeout_s, status):
    from shoal_airflow.triggers import ShoalLagTrigger

    topic = unique_name("lag")
    source_cluster.create_topic(topic, partitions=1)
    source_cluster.produce(topic, [(b"k", b"v", [])] * 5)
    event = run_trigger(ShoalLagTrigger(source_conn_id="shoal_source", target_conn_id="shoal_target",
                                        pipeline="never-ran", include=re.escape(topic), max_lag=max_lag,
                                        poll_interval_s=0.2, timeout_s=timeout_s))
    assert event["status"] == status
    if status == "caught_up":
        assert event["lag"] == 5 and event["partitions"] == {f"{topic}-0": 5}


def test_lag_trigger_reports_an_unknown_connection_instead_of_crashing(airflow_connections):
    from shoal_airflow.triggers import ShoalLagTrigger

    event = run_trigger(ShoalLagTrigger(source_conn_id="no_such_conn", target_conn_id="shoal_target",
                                        pipeline="p", include="x"))
    assert event["status"] == "error" and "no_such_conn" in event["message"]


def test_caught_up_sensor_defers_to_the_lag_trigger_and_maps_its_events(airflow_connections, source_cluster,
                                                                        unique_name):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

    from shoal_airflow.sensors import ShoalCaughtUpSensor
    from shoal_airflow.triggers import ShoalLagTrigger

    topic = unique_name("defer")
    source_cluster.create_topic(topic, partitions=1)
    source_cluster.produce(topic, [(b"k", b"v", [])] * 3)
    sensor = ShoalCaughtUpSensor(task_id="caught_up", source_conn_id="shoal_source", target_conn_id="shoal_target",
                                 pipeline="never-ran", include=re.escape(topic), max_lag=0, timeout=120)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, ShoalLagTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.serialize()[1]["max_lag"] == 0 and trigger.serialize()[1]["timeout_s"] == 120
    assert sensor.execute_complete({}, {"status": "caught_up", "lag": 0})["lag"] == 0
    with pytest.raises(AirflowFailException):
        sensor.execute_complete({}, {"status": "error", "message": "topic recreated"})
    with pytest.raises(AirflowException):
        sensor.execute_complete({}, {"status": "timeout", "message": "still behind"})
