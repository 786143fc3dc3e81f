"""The README's local Airflow as real processes, for tests: started through the documented code path
(``python -m shoal_airflow.local_airflow up``, which ``scripts/airflow.sh`` runs after the install step) on a free
port, a throw-away AIRFLOW_HOME and a clusters file naming the Kafka sandbox; stopped at the end of the session.

Use the session fixture ``local_airflow`` (tests/airflow/conftest.py) from any module under ``tests/airflow/``; every
module of a session shares the same processes, so a module adds seconds, not a start-up::

    def test_something(local_airflow):
        token = local_airflow.token()                     # a JWT from /auth/token (simple auth manager, admin)
        status, body = local_airflow.api("GET", "/api/v2/dags")
        page = local_airflow.get_text("/shoal/")          # any api-server path, with the bearer token
        local_airflow.base_url                            # e.g. for a headless browser: log in at base_url
        local_airflow.username, local_airflow.password    # what the login form takes

The processes are one Airflow: state written by one test (DAG runs, Variables, paused flags) is seen by the next;
use unique pipeline and topic names. Teardown sends SIGTERM to the launcher (which stops its four processes), then
stops any process group listed in the home's pid file, and checks that the api-server port is free again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from shoal_airflow.local_airflow import PASSWORDS_FILE, PIDS_FILE, READY_LINE, free_port, stop_process_groups

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300


@dataclass
class RunningAirflow:
    """A started local Airflow: where it listens and how to talk to its REST API as the admin user."""

    base_url: str
    home: Path
    work_dir: Path
    launcher: subprocess.Popen
    output: Path
    username: str = "admin"
    _token: str | None = field(default=None, repr=False)

    @property
    def password(self) -> str:
        return json.loads((self.home / PASSWORDS_FILE).read_text())[self.username]

    def token(self) -> str:
        if self._token is None:
            status, body = self.api("POST", "/auth/token", {"username": self.username, "password": self.password},
                                    auth=False)
            assert status == 201, (status, body)
            self._token = body["access_token"]
        return self._token

    def request(self, method: str, path: str, body: dict | None = None, *, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def api(self, method: str, path: str, body: dict | None = None, *, auth: bool = True):
        status, raw = self.request(method, path, body, auth=auth)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def get_text(self, path: str) -> tuple[int, str]:
        status, raw = self.request("GET", path)
        return status, raw.decode(errors="replace")

    def logs_tail(self, chars: int = 3000) -> str:
        parts = [f"--- launcher\n{self.output.read_text(errors='replace')[-chars:]}"]
        for log in sorted((self.home / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


def start_local_airflow(base: Path, clusters: dict[str, dict[str, str]]) -> RunningAirflow:
    """Start the launcher; return once it prints its ready line (every component healthy), or raise with the logs."""
    home, work = base / "airflow-home", base / "work"
    clusters_file = base / "clusters.json"
    clusters_file.touch(mode=0o600)
    clusters_file.write_text(json.dumps(clusters))  # JSON is YAML: the launcher reads either
    port = free_port()
    output = base / "launcher.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    with open(output, "wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "shoal_airflow.local_airflow", "up", "--home", str(home), "--port", str(port),
             "--clusters", str(clusters_file), "--work-dir", str(work)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    running = RunningAirflow(f"http://127.0.0.1:{port}", home, work, launcher, output)
    deadline = time.monotonic() + START_TIMEOUT_S
    while READY_LINE not in output.read_text(errors="replace"):
        if launcher.poll() is not None or time.monotonic() > deadline:
            tail = running.logs_tail()
            stop_local_airflow(running)
            raise RuntimeError(f"the local Airflow did not start (launcher exit {launcher.returncode}):\n{tail}")
        time.sleep(1.0)
    return running


def stop_local_airflow(running: RunningAirflow) -> None:
    """SIGTERM the launcher (it stops its processes), then stop whatever is still listed in the pid file."""
    if running.launcher.poll() is None:
        running.launcher.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.launcher.wait(90)
    pids_file = running.home / PIDS_FILE
    if pids_file.exists():
        stop_process_groups(json.loads(pids_file.read_text()), grace_s=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.launcher.pid, signal.SIGKILL)
    running.launcher.wait(10)


def port_is_free(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
