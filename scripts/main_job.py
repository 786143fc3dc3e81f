"""The README's main job: ``shoal_catchup_handoff`` end to end on the local embedded default.

Two sandbox Kafka clusters with realistic data (order events, keys, headers, zstd, committed and aborted
transactions), Spark local[2] for the back-fill rounds, Airflow 3 on SQLite (``.airflow/`` in the checkout) running
the DAG with ``dag.test()``, and the shallow mirror daemon taking over at the handoff. Prints a report: task states,
ledger, seams, and a record-by-record comparison after the daemon has copied traffic that arrived after the handoff.

Run through ``scripts/demo.sh`` (which installs what is needed first). Exit status 0 only if everything checks out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".airflow"
WORK = ROOT / ".shoal-work"
PIPELINE = f"demo-handoff-{int(time.time())}"  # fresh per run: the demo topic is recreated each time
TOPIC = "demo.orders"
TARGET_TOPIC = f"dr.{TOPIC}"
PARTITIONS = 3


def airflow_environment(sandbox) -> dict[str, str]:
    """Airflow on SQLite in ``.airflow/``, this checkout's DAGs, connections from the sandbox (AIRFLOW_CONN_*)."""
    def kafka(settings: dict) -> str:
        return json.dumps({"conn_type": "kafka", "extra": settings})

    return {
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME / 'airflow.db'}",
        "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* shoal_airflow.*",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SHOAL_SOURCE": kafka(sandbox.client_config("source")),
        "AIRFLOW_CONN_SHOAL_TARGET": kafka(sandbox.client_config("target")),
        "AIRFLOW_CONN_SHOAL_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_VAR_SHOAL_WORK_DIR": str(WORK),
    }


class DaemonAtHandoff:
    """Starts ``python -m mirror_core.daemon`` once the back-fill has written a checkpoint for every partition (the
    daemon leaves back-filled lanes alone until the DAG hands them off), and stops it with SIGTERM at the end."""

    def __init__(self, config_path: Path, target, log_path: Path):
        self.config_path, self.target, self.log_path = config_path, target, log_path
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        from mirror_core.kafka.wire_client import WireClient
        from mirror_core.state.checkpoint import CheckpointStore

        while not self._stop.wait(1.0):
            try:
                with WireClient.for_cluster(self.target) as client:
                    found = CheckpointStore(self.target, client).read_all(PIPELINE)
            except Exception:  # noqa: BLE001 - the checkpoint topic may not exist yet
                continue
            if len(found) >= PARTITIONS:
                with open(self.log_path, "w") as log:
                    self.proc = subprocess.Popen([sys.executable, "-m", "mirror_core.daemon", "--config",
                                                  str(self.config_path)], stdout=log, stderr=subprocess.STDOUT)
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> int:
    import yaml
    from rich.console import Console
    from rich.table import Table

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.demo_data import produce_demo_data, produce_demo_transactions
    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.kafka.topics import TopicAdmin
    from mirror_core.kafka.verify import compare_topics

    console = Console()
    sandbox = sandbox_from_environ(os.environ)
    with console.status("starting the sandbox clusters source and target…"):
        sandbox.up(["source", "target"])
    source = ClusterConfig("source", sandbox.client_config("source"))
    target = ClusterConfig("target", sandbox.client_config("target"))
    TopicAdmin(source).recreate(TOPIC, PARTITIONS, {"retention.ms": str(7 * 86_400_000)})
    TopicAdmin(target).delete(TARGET_TOPIC)
    with console.status(f"producing order events to source/{TOPIC}…"):
        produce_demo_data(source, TOPIC, 20_000)
        produce_demo_transactions(source, TOPIC)

    from shoal_airflow.local_airflow import LocalAirflowConfig, write_config

    # the same airflow.cfg as ./scripts/airflow.sh (DAGs from dags/, not Airflow's default .airflow/dags), so the UI
    # started afterwards on this home shows this run
    write_config(LocalAirflowConfig(home=HOME, dags_folder=ROOT / "dags"))
    os.environ.update(airflow_environment(sandbox))
    WORK.mkdir(exist_ok=True)
    with console.status("preparing Airflow's SQLite metadata DB (airflow db migrate)…"):
        migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                                 capture_output=True, text=True)
    if migrate.returncode != 0:
        console.print(f"[red]airflow db migrate failed[/]\n{migrate.stdout[-2000:]}{migrate.stderr[-2000:]}")
        return 1
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag

    if settings.Session is None:
        settings.configure_orm()
    bag = DagBag(dag_folder=str(ROOT / "dags" / "shoal_catchup_handoff.py"))
    if bag.import_errors:
        console.print(f"[red]DAG import errors[/]: {bag.import_errors}")
        return 1
    dag = bag.get_dag("shoal_catchup_handoff")

    pipeline_file = WORK / "pipeline.yaml"
    pipeline_file.write_text(yaml.safe_dump({
        "pipeline": PIPELINE, "source": sandbox.client_config("source"), "target": sandbox.client_config("target"),
        "include": TOPIC.replace(".", "\\."), "naming": "prefix:dr.", "rescan_interval_s": 2, "lease_ttl_s": 6,
        "poll_interval_ms": 100, "metrics_port": 0}))
    pipeline_file.chmod(0o600)
    started = time.monotonic()
    with DaemonAtHandoff(pipeline_file, target, WORK / "daemon.log") as daemon:
        console.print("running DAG shoal_catchup_handoff (back-fill rounds on Spark local[2] → caught up → "
                      "handoff to the daemon → seam check)…")
        run = dag.test(run_conf={"source_conn_id": "shoal_source", "target_conn_id": "shoal_target",
                                 "pipeline": PIPELINE, "include": TOPIC.replace(".", "\\."), "naming": "prefix:dr.",
                                 "max_lag": 0, "wait_for_daemon_s": 90})
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        seams = _xcom(run, "handoff") or {}
        after = 500
        produce_demo_data(source, TOPIC, after, seed=99)  # traffic after the handoff: the daemon's to copy
        comparison = _wait_equal(source, target, compare_topics, timeout_s=90)
        elapsed = time.monotonic() - started
        daemon_ran = daemon.proc is not None

    table = Table(title=f"DAG run {run.run_id}: {run.state}")
    table.add_column("task")
    table.add_column("state")
    for task_id, state in sorted(states.items()):
        table.add_row(task_id, state if state in ("success", "skipped") else f"[red]{state}[/]")
    console.print(table)
    for name, seam in sorted(seams.items()):
        console.print(f"seam {name}: {seam}", highlight=False)
    verdict = "[green]identical[/]" if comparison.equal else f"[red]DIFFERENT[/]: {comparison.first_difference}"
    console.print(f"source/{TOPIC} vs target/{TARGET_TOPIC} after {after} more orders arrived post-handoff: "
                  f"{comparison.records} records {verdict} (read_committed on both clusters) in {elapsed:.0f}s")
    console.print(f"Airflow home: {HOME} (click through it in the UI: `./scripts/airflow.sh`, then "
                  f"http://localhost:8080); work dir {WORK}; daemon log {WORK / 'daemon.log'}.")
    ok = str(run.state) == "success" and daemon_ran and comparison.equal and seams and \
        all(s.get("seam_ok") for s in seams.values())
    return 0 if ok else 1


def _xcom(dag_run, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id, XComModel.task_id == task_id,
            XComModel.key == "return_value")).first()
        return None if row is None else XComModel.deserialize_value(row)


def _wait_equal(source, target, compare, *, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        comparison = compare(source, TOPIC, target, TARGET_TOPIC)
        if comparison.equal or time.monotonic() > deadline:
            return comparison
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
