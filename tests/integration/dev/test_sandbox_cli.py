"""``shoal sandbox`` as a user runs it: reuse on a second ``up``, nothing left behind by ``down``, and a failed
start that prints the broker log's tail and the command to rerun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mirror_core.dev.sandbox import SandboxBroker
from mirror_core.dev.sandbox.spec import CLUSTERS, ClusterSpec
from mirror_core.errors import SandboxError

ROOT = Path(__file__).resolve().parents[3]


def shoal(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=300)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_up_twice_reuses_and_down_leaves_no_broker(legacy_cluster, session_sandbox):
    broker = session_sandbox.sandbox.broker("legacy")
    pid_before = broker.pid()
    assert pid_before is not None
    again = shoal("sandbox", "up", "legacy")
    assert again.returncode == 0, again.stderr
    assert broker.pid() == pid_before, "a second `up` must reuse the running broker"

    down = shoal("sandbox", "down", "legacy")
    assert down.returncode == 0, down.stderr
    assert "legacy" in down.stdout
    assert broker.pid() is None
    assert _processes_with(str(broker.properties)) == [], "no broker process may survive `down`"
    status = shoal("sandbox", "status", "--json")
    assert '"running": false' in status.stdout.replace("\n", "").replace("  ", " ") or "false" in status.stdout


def test_failed_start_prints_log_tail_and_rerun_command(tmp_path, session_sandbox):
    session_sandbox.ensure("source")  # make sure Java and the jars are there: this test is about the failure
    good = CLUSTERS["target"]
    port, controller = _free_port(), _free_port()  # fixed numbers could collide with a client's ephemeral port
    broken = ClusterSpec("broken", good.version, port, controller, heap="-Xmx1k")  # the JVM refuses this heap
    broker = SandboxBroker(broken, tmp_path, session_sandbox.sandbox.cache_dir)
    with pytest.raises(SandboxError) as info:
        broker.start(timeout=30)
    message = str(info.value)
    assert "sandbox cluster 'broken'" in message
    assert "rerun:" in message
    assert "heap" in message.lower(), f"the JVM's own complaint should be in the tail:\n{message}"
    assert broker.pid() is None


def test_unknown_cluster_is_a_one_line_usage_error():
    result = shoal("sandbox", "up", "nosuchcluster")
    assert result.returncode == 2
    assert "unknown sandbox cluster 'nosuchcluster'" in result.stderr
    assert "Traceback" not in result.stderr
