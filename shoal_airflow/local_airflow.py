"""The README's local Airflow: Airflow 3 on SQLite with the LocalExecutor, this checkout's DAGs, Shoal's page and
the connections the main job uses, as four processes (api-server, scheduler, dag-processor, triggerer).

    ./scripts/airflow.sh [--port 8080] [--clusters clusters.yaml]      # = python -m shoal_airflow.local_airflow up

What it does, in order:

1. :func:`write_config` writes ``<home>/airflow.cfg`` (0600) with every setting the four processes must agree on:
   the DAGs folder (this checkout's ``dags/``, not Airflow's default ``<home>/dags``), SQLite, LocalExecutor, the
   simple auth manager (user ``admin``; Airflow generates the password into ``<home>/passwords.json``), one
   ``jwt_secret``/``fernet_key``/``secret_key`` kept across restarts, the execution API URL on the api-server's
   own port, and log-server ports. Airflow would otherwise generate a default file on first use, pointing at
   ``<home>/dags``; writing ours first is the fix. The main job (``scripts/main_job.py``) uses the same function.
2. ``airflow db migrate``.
3. :func:`store_settings` writes the connections ``shoal_source``/``shoal_target`` (``kafka``, librdkafka settings
   from a clusters file: by default the Kafka sandbox's ``clusters.yaml``, started or reused here) and
   ``shoal_spark`` into the metadata DB, and the Variable ``shoal_work_dir``. Secrets travel from file to DB;
   never on a command line, never in the environment of the four processes.
4. :class:`LocalAirflow` starts the four processes, each in its own process group with its output in
   ``<home>/logs/<process>.log``, writes their pids to ``<home>/local-airflow.pids``, and waits until
   ``/api/v2/monitor/health`` reports every component healthy. SIGINT/SIGTERM, or any process exiting, stops all of
   them (SIGTERM to each group, SIGKILL after a grace period).

Tests start it the same way: ``tests/airflow/local_airflow.py``.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")
HEALTH_COMPONENTS = ("metadatabase", "scheduler", "dag_processor", "triggerer")
ADMIN_USER = "admin"
PASSWORDS_FILE = "passwords.json"
PIDS_FILE = "local-airflow.pids"
READY_LINE = "ready after"  # how the launcher's output says every component is healthy (tests wait for it)
SOURCE_CONN, TARGET_CONN, SPARK_CONN = "shoal_source", "shoal_target", "shoal_spark"
# secrets generated once and kept when the file is rewritten: a new fernet key would make stored connections
# unreadable, a new jwt_secret would invalidate the tokens of running tasks
_KEPT = {("core", "fernet_key"), ("api_auth", "jwt_secret"), ("api", "secret_key")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LocalAirflowConfig:
    """Where the local Airflow lives and which ports it uses."""

    home: Path
    dags_folder: Path = CHECKOUT / "dags"
    port: int = 8080
    worker_log_port: int = 8793
    trigger_log_port: int = 8794
    parallelism: int = 4

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def write_config(cfg: LocalAirflowConfig) -> Path:
    """``<home>/airflow.cfg`` for the local Airflow (0600 in a 0700 home: it holds the JWT secret and the fernet
    key)."""
    home = cfg.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    # private to the user: the DB holds the connections, the logs the admin password Airflow prints at start
    home.chmod(0o700)
    (home / "plugins").mkdir(exist_ok=True)  # Airflow insists on a plugins folder; Shoal's page is an entry point
    path = home / "airflow.cfg"
    old = configparser.ConfigParser(interpolation=None)
    if path.exists():
        old.read(path)
    values = {
        ("core", "dags_folder"): str(cfg.dags_folder.resolve()),
        ("core", "plugins_folder"): str(home / "plugins"),
        ("core", "executor"): "LocalExecutor",
        ("core", "parallelism"): str(cfg.parallelism),
        ("core", "load_examples"): "False",
        ("core", "auth_manager"): "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        ("core", "simple_auth_manager_users"): f"{ADMIN_USER}:admin",
        ("core", "simple_auth_manager_passwords_file"): str(home / PASSWORDS_FILE),
        ("core", "allowed_deserialization_classes"): "airflow.* shoal_airflow.*",
        ("core", "execution_api_server_url"): f"{cfg.base_url}/execution/",
        ("core", "fernet_key"): _fernet_key(),
        ("database", "sql_alchemy_conn"): f"sqlite:///{home / 'airflow.db'}",
        ("api", "host"): "127.0.0.1",
        ("api", "port"): str(cfg.port),
        ("api", "base_url"): cfg.base_url,
        ("api", "workers"): "1",
        ("api", "secret_key"): secrets.token_hex(32),
        ("api_auth", "jwt_secret"): secrets.token_hex(64),
        ("logging", "base_log_folder"): str(home / "logs"),
        ("logging", "logging_level"): "INFO",
        ("logging", "worker_log_server_port"): str(cfg.worker_log_port),
        ("logging", "trigger_log_server_port"): str(cfg.trigger_log_port),
    }
    out = configparser.ConfigParser(interpolation=None)
    for (section, key), value in values.items():
        if (section, key) in _KEPT and old.get(section, key, fallback=""):
            value = old.get(section, key)
        if not out.has_section(section):
            out.add_section(section)
        out.set(section, key, value)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("# Written by shoal_airflow.local_airflow.write_config; rewritten on every start (secrets kept).\n")
        out.write(fh)
    return path


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def airflow_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Airflow process: ``AIRFLOW_HOME`` and nothing that overrides airflow.cfg (an
    ``AIRFLOW__*`` or ``AIRFLOW_CONN_*`` variable of the calling shell would silently win over the file)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home.resolve())
    return env


def airflow_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def migrate(home: Path) -> None:
    result = subprocess.run(airflow_command("db", "migrate"), env=airflow_env(home), cwd=home, capture_output=True,
                            text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def connections_from_clusters(clusters: Mapping[str, Mapping[str, str]], *, source: str, target: str,
                              spark_master: str) -> dict[str, dict]:
    """``{conn_id: {conn_type, extra|host}}`` for the main job's three connections."""
    missing = [name for name in (source, target) if name not in clusters]
    if missing:
        raise SystemExit(f"clusters file has no cluster {' or '.join(map(repr, missing))}; "
                         f"it has: {', '.join(sorted(clusters)) or 'nothing'}")
    return {SOURCE_CONN: {"conn_type": "kafka", "extra": dict(clusters[source])},
            TARGET_CONN: {"conn_type": "kafka", "extra": dict(clusters[target])},
            SPARK_CONN: {"conn_type": "spark", "host": spark_master}}


def store_settings(home: Path, connections: Mapping[str, Mapping], variables: Mapping[str, str]) -> None:
    """Write connections and Variables into the metadata DB, replacing any of the same id (in a child process that
    reads this home's airflow.cfg; the settings reach it through a 0600 file, which is deleted afterwards)."""
    spec = home / ".settings.json"
    fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"connections": connections, "variables": variables}, fh)
    try:
        result = subprocess.run([sys.executable, "-m", "shoal_airflow.local_airflow", "_store", str(spec)],
                                env=airflow_env(home), cwd=home, capture_output=True, text=True, timeout=300)
    finally:
        spec.unlink(missing_ok=True)
    if result.returncode != 0:
        raise RuntimeError(f"storing connections failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def _store(spec_path: str) -> None:
    from airflow.models.connection import Connection
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    spec = json.loads(Path(spec_path).read_text())
    with create_session() as session:
        for conn_id, conn in spec["connections"].items():
            session.execute(delete(Connection).where(Connection.conn_id == conn_id))
            session.add(Connection(conn_id=conn_id, conn_type=conn["conn_type"], host=conn.get("host"),
                                   extra=json.dumps(conn["extra"]) if "extra" in conn else None))
    for key, value in spec["variables"].items():
        Variable.set(key, value)


@dataclass
class LocalAirflow:
    """The four processes. Invariant: every process it started is stopped by :meth:`stop` (whole process groups:
    the api-server's, scheduler's and dag-processor's children with them), and their pids are in ``PIDS_FILE``
    while they may run, so an outside caller can stop them even if this object's process died."""

    cfg: LocalAirflowConfig
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self) -> None:
        logs = self.cfg.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = airflow_env(self.cfg.home)
        for name in PROCESSES:
            with open(logs / f"{name}.log", "ab") as log:
                # cwd: the home, not the checkout; `python -m` puts the cwd on sys.path, and a checkout holding
                # build metadata (shoal.egg-info) there would make Airflow see Shoal's entry points twice
                self.procs[name] = subprocess.Popen(airflow_command(name), env=env, cwd=self.cfg.home, stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True)
            (self.cfg.home / PIDS_FILE).write_text(json.dumps({n: p.pid for n, p in self.procs.items()}))

    def health(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.cfg.base_url}/api/v2/monitor/health", timeout=5) as response:
                return json.load(response)
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def unhealthy(self) -> list[str]:
        body = self.health()
        if body is None:
            return ["api-server"]
        return [c for c in HEALTH_COMPONENTS if (body.get(c) or {}).get("status") != "healthy"]

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self, grace_s: float = 30.0) -> None:
        stop_process_groups({n: p.pid for n, p in self.procs.items()}, grace_s=grace_s)
        for proc in self.procs.values():
            proc.poll()
        (self.cfg.home / PIDS_FILE).unlink(missing_ok=True)


def stop_process_groups(pids: Mapping[str, int], *, grace_s: float = 30.0) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for all of them, SIGKILL what is left."""
    def signal_all(sig) -> None:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def alive() -> bool:
        for pid in pids.values():
            try:
                os.killpg(pid, 0)
                return True
            except ProcessLookupError:
                continue
        return False

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        for pid in pids.values():  # reap our own children so they do not linger as zombies
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    if alive():
        signal_all(signal.SIGKILL)


def _clusters(args) -> dict[str, dict[str, str]]:
    import yaml

    if args.clusters:
        return yaml.safe_load(Path(args.clusters).read_text()) or {}
    from mirror_core.dev.sandbox import sandbox_from_environ

    sandbox = sandbox_from_environ(os.environ)
    print(f"starting (or reusing) the Kafka sandbox clusters {args.source} and {args.target}…", flush=True)
    sandbox.up([args.source, args.target])
    return yaml.safe_load(sandbox.write_clusters_file().read_text()) or {}


def up(args) -> int:
    began = time.monotonic()
    home = Path(args.home).resolve()
    cfg = LocalAirflowConfig(home=home, dags_folder=Path(args.dags_folder), port=args.port,
                             worker_log_port=args.worker_log_port or free_port(),
                             trigger_log_port=args.trigger_log_port or free_port())
    connections = connections_from_clusters(_clusters(args), source=args.source, target=args.target,
                                            spark_master=args.spark_master)
    write_config(cfg)
    print(f"Airflow home {home}: airflow db migrate…", flush=True)
    migrate(home)
    work_dir = Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    store_settings(home, connections, {"shoal_work_dir": str(work_dir)})
    airflow = LocalAirflow(cfg)
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        airflow.start()
        print(f"starting {', '.join(PROCESSES)} (logs in {home / 'logs'})…", flush=True)
        started = time.monotonic()
        while not stopping:
            waiting = airflow.unhealthy()
            if not waiting:
                break
            if airflow.exited() or time.monotonic() - started > args.start_timeout:
                print(f"Airflow did not start: exited {airflow.exited()}, not healthy: {', '.join(waiting)}; see "
                      f"{home / 'logs'}/<process>.log", file=sys.stderr, flush=True)
                return 1
            time.sleep(1.0)
        if stopping:
            return 0
        print(f"{READY_LINE} {time.monotonic() - began:.0f} s: {cfg.base_url} — user {ADMIN_USER}, password in "
              f"{home / PASSWORDS_FILE}; DAGs from {cfg.dags_folder}; connections {SOURCE_CONN}, {TARGET_CONN}, "
              f"{SPARK_CONN}. Ctrl-C stops Airflow.", flush=True)
        while not stopping:
            if airflow.exited():
                print(f"Airflow process(es) exited: {airflow.exited()}; stopping the others", file=sys.stderr)
                return 1
            time.sleep(1.0)
        return 0
    finally:
        print("stopping Airflow…", flush=True)
        airflow.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal_airflow.local_airflow", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start the local Airflow in the foreground (Ctrl-C stops it)")
    p.add_argument("--home", default=str(CHECKOUT / ".airflow"), help="AIRFLOW_HOME (default: .airflow/)")
    p.add_argument("--dags-folder", default=str(CHECKOUT / "dags"))
    p.add_argument("--port", type=int, default=8080, help="api-server port (UI and REST API)")
    p.add_argument("--worker-log-port", type=int, default=0, help="default: a free port")
    p.add_argument("--trigger-log-port", type=int, default=0, help="default: a free port")
    p.add_argument("--clusters", help="YAML/JSON {name: librdkafka settings}; default: the Kafka sandbox's "
                                      "clusters.yaml (the sandbox is started or reused)")
    p.add_argument("--source", default="source", help="cluster of the clusters file behind shoal_source")
    p.add_argument("--target", default="target", help="cluster of the clusters file behind shoal_target")
    p.add_argument("--spark-master", default="local[2]", help="host of the shoal_spark connection")
    p.add_argument("--work-dir", default=str(CHECKOUT / ".shoal-work"), help="Variable shoal_work_dir")
    p.add_argument("--start-timeout", type=float, default=300.0)
    s = sub.add_parser("_store")  # internal: store_settings' child process
    s.add_argument("spec")
    args = parser.parse_args(argv)
    if args.command == "_store":
        _store(args.spec)
        return 0
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
