"""The README's first command, as written (minus the install step): ``shoal_catchup_handoff`` end to end on the
local embedded default, with the daemon taking over and traffic after the handoff copied too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_main_job_runs_catchup_handoff_end_to_end(sandbox):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # the job sets up its own Airflow
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "main_job.py")], capture_output=True, text=True,
                            cwd=ROOT, env={**env, "COLUMNS": "200"}, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "identical" in result.stdout and "seam demo.orders-0" in result.stdout
    assert "'seam_ok': True" in result.stdout
