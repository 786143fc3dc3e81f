"""The harness's promise: with CI=true a missing prerequisite fails the run; elsewhere it skips with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_INTEGRATION_TEST = "tests/integration/dev/test_sandbox_clusters.py::test_round_trip_on_target"


def _run_without_java(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": str(tmp_path), "CI": ci, "SHOAL_SANDBOX_DIR": str(tmp_path / "sandbox")}
    return subprocess.run([sys.executable, "-m", "pytest", ONE_INTEGRATION_TEST, "-q", "-rs", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_missing_jvm_fails_under_ci(tmp_path):
    result = _run_without_java(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "CI=true and a prerequisite is missing" in result.stdout
    assert "java and mvn not on PATH" in result.stdout


def test_missing_jvm_skips_with_the_reason_outside_ci(tmp_path):
    result = _run_without_java(tmp_path, "")
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout and "java and mvn not on PATH" in result.stdout
