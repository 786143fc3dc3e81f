"""The module paths from before the rename (``plugins.<module>``) still import, as the same objects, without ever
shadowing a real ``plugins`` package (shoal_airflow/legacy_paths.py). Each case runs in a fresh interpreter whose
``sys.path`` holds no other ``plugins`` package unless the case puts one there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# drop path entries that hold a `plugins` package (e.g. an older checkout of this project on the venv's path)
_CLEAN_PATH = "import sys, pathlib; sys.path[:] = [p for p in sys.path if not (pathlib.Path(p or '.') / 'plugins' " \
              "/ '__init__.py').exists()]; sys.path.insert(0, {root!r})\n"


def run(code: str, *extra_path: Path) -> subprocess.CompletedProcess:
    prelude = _CLEAN_PATH.format(root=str(ROOT)) + "".join(f"sys.path.insert(0, {str(p)!r})\n" for p in extra_path)
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                          cwd="/", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def test_the_stored_trigger_classpath_of_a_deferred_task_still_imports():
    result = run("import shoal_airflow.triggers as new\n"
                 "from airflow._shared.module_loading import import_string\n"
                 "cls = import_string('plugins.triggers.ShoalLagTrigger')\n"
                 "import plugins.operators, shoal_airflow.operators\n"
                 "assert cls is new.ShoalLagTrigger, cls\n"
                 "assert plugins.operators is shoal_airflow.operators\n"
                 "assert new.__spec__.name == 'shoal_airflow.triggers', new.__spec__\n"
                 "print(cls.__module__)\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "shoal_airflow.triggers"


def test_a_real_plugins_package_wins_over_the_alias(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "plugins" / "triggers.py").write_text("MINE = True\n")
    result = run("import shoal_airflow, plugins, plugins.triggers\n"
                 "assert plugins.MINE and plugins.triggers.MINE\n", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
