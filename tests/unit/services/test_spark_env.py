"""What a remote Spark submit ships (mirror_core/services/spark_env.py): the right distributions, a venv layout
executors can run, and no remote submit without it."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mirror_core.cli.backfill_command import spark_submit_command
from mirror_core.errors import ConfigError
from mirror_core.services.spark_env import (
    EXECUTOR_DISTRIBUTIONS,
    EXECUTOR_PYTHON,
    code_zip,
    default_cache_dir,
    distribution_closure,
    executor_environment,
    is_local_master,
    ship,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_packed_distributions_cover_everything_a_backfill_task_imports():
    probe = ("import sys, json, importlib.metadata as md; before = set(sys.modules)\n"
             "import mirror_core.engine.backfill, kafka.codec\n"
             "tops = {m.split('.')[0] for m in set(sys.modules) - before}\n"
             "pd = md.packages_distributions()\n"
             "print(json.dumps(sorted({d for m in tops for d in pd.get(m, [])})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout)) - {"shoal"}  # Shoal's own code travels in the code zip
    packed = {d.metadata["Name"] for d in distribution_closure()}
    assert imported <= packed, f"tasks import {sorted(imported - packed)}, which the environment archive lacks"
    assert set(EXECUTOR_DISTRIBUTIONS) <= packed


@pytest.mark.parametrize("master, local", [("local", True), ("local[2]", True), ("local[*]", True),
                                           ("local[2,3]", True), ("spark://h:7077", False), ("yarn", False),
                                           ("k8s://https://h:6443", False), ("localhost:7077", False)])
def test_only_local_masters_run_tasks_in_the_driver_interpreter(master, local):
    assert is_local_master(master) is local


def test_a_remote_submit_without_a_shipment_is_refused_by_name():
    with pytest.raises(ConfigError, match="spark://h:7077"):
        spark_submit_command("spark://h:7077", ["--plan", "p.json"])


def test_the_archive_is_a_venv_whose_python_is_the_base_interpreter_and_is_built_once(tmp_path):
    archive = executor_environment(tmp_path / "cache")
    assert executor_environment(tmp_path / "cache") == archive and archive.stat().st_mtime_ns == \
        executor_environment(tmp_path / "cache").stat().st_mtime_ns
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/python"].issym() and Path(members["bin/python"].linkname).is_absolute()
    assert "pyvenv.cfg" in members
    tag = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"lib/{tag}/site-packages/kafka/__init__.py" in members
    assert not any(name.startswith(("environment/", "/")) for name in members), "members sit at the archive root"


def test_the_submit_ships_archive_code_and_the_executor_python(tmp_path):
    shipment = ship(tmp_path / "cache", tmp_path / "staging")
    cmd = spark_submit_command("spark://h:7077", ["--plan", "p.json"], shipment)
    assert cmd[cmd.index("--archives") + 1] == f"{shipment.environment}#environment"
    assert f"spark.pyspark.python={EXECUTOR_PYTHON}" in cmd
    assert f"spark.pyspark.driver.python={sys.executable}" in cmd
    import zipfile

    names = zipfile.ZipFile(cmd[cmd.index("--py-files") + 1]).namelist()
    assert "mirror_core/engine/backfill.py" in names and "spark_apps/backfill_job.py" in names
    assert not any("__pycache__" in n for n in names)
    assert code_zip(tmp_path / "staging") == shipment.code


def test_the_cache_dir_is_configurable():
    assert default_cache_dir({"SHOAL_SPARK_ENV_DIR": "/x/y"}) == Path("/x/y")
