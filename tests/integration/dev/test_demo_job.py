"""The README's main job, run the way the README runs it (minus the install step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mirror_core.dev.demo_data import DEMO_TOPIC
from mirror_core.dev.demo_job import DR_TOPIC

ROOT = Path(__file__).resolve().parents[3]


def test_demo_copies_the_orders_exactly_once_and_reports(source_cluster, target_cluster):
    result = subprocess.run([sys.executable, "-m", "mirror_core.cli", "demo", "--records", "3000"],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identical" in result.stdout and "exactly once" in result.stdout
    source = source_cluster.read_all(DEMO_TOPIC)
    assert len(source) == 3000 + 3 * 25  # orders plus the three committed correction transactions
    assert not any(b'"aborted": true' in (r.value or b"") for r in source)
    target = target_cluster.read_all(DR_TOPIC)
    assert [(r.partition, r.content()) for r in target] == [(r.partition, r.content()) for r in source]
