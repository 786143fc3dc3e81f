"""A real Spark standalone cluster for tests: one master and N workers, each its own JVM process.

Started with ``spark-class`` from the pyspark wheel (which has no ``sbin`` start scripts), bound to loopback on
free ports, each worker with its own work dir, ``--cores`` and ``--memory``. :meth:`stop` ends every process group
it started (a worker's executors are its children) and reports any process that outlived it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StandaloneCluster:
    spark_home: Path
    base_dir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def worker_dir(self, n: int) -> Path:
        return self.base_dir / f"worker-{n}" / "work"

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": self.daemon_memory,
               "SPARK_HOME": str(self.spark_home), "SPARK_CONF_DIR": str(self.base_dir / "daemon-conf")}
        (self.base_dir / "daemon-conf").mkdir(parents=True, exist_ok=True)
        self._spawn("master", env, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.master_port), "--webui-port", str(self.master_ui_port))
        for n in range(self.workers):
            self.worker_dir(n).mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker-{n}", env, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--port", str(free_port()), "--webui-port", str(free_port()),
                        "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                        "--work-dir", str(self.worker_dir(n)), self.url)
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"a Spark daemon exited with {proc.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.alive_workers()} of {self.workers} workers registered with the master "
                                     f"in {timeout_s:.0f} s: {self.logs()}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=2) as resp:
                state = json.load(resp)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self, grace_s: float = 15.0) -> list[str]:
        """Stop workers (and with them their executors), then the master; returns the command lines of processes
        that were still alive after ``grace_s`` and had to be killed."""
        survivors: list[str] = []
        for proc in reversed(self.procs):
            members = self._group(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            _, alive = psutil.wait_procs(members, timeout=grace_s)
            for p in alive:
                try:
                    survivors.append(" ".join(p.cmdline())[:160])
                    p.kill()
                except psutil.Error:
                    pass
            proc.wait(timeout=grace_s)
        self.procs.clear()
        return survivors

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.base_dir.glob("*.log")))

    def _spawn(self, name: str, env: dict, main_class: str, *args: str) -> None:
        log = open(self.base_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until stop()
        self.procs.append(subprocess.Popen([str(self.spark_home / "bin" / "spark-class"), main_class, *args],
                                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        log.close()

    @staticmethod
    def _group(pgid: int) -> list[psutil.Process]:
        members = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid:
                    members.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return members
