"""The README's main job, run the way the README runs it (minus the install step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mirror_core.demo import DEMO_TOPIC

ROOT = Path(__file__).resolve().parents[2]


def test_demo_fills_source_and_leaves_target_untouched(source_cluster, target_cluster):
    result = subprocess.run([sys.executable, "-m", "mirror_core.cli", "demo", "--records", "3000"],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3000 records on source/demo.orders" in result.stdout
    records = source_cluster.read_all(DEMO_TOPIC)
    assert len(records) == 3000
    assert all(r.key.startswith(b"customer-") and b'"order_id"' in r.value for r in records)
    assert not target_cluster.admin.exists(DEMO_TOPIC)
