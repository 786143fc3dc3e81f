"""The direction of imports (docs/architecture.md): ``mirror_core`` ← ``spark_apps``, ``shoal_airflow`` ← ``dags``.
mirror_core never imports Airflow, PySpark or the layers above it, and only the CLI entry point reads the environment;
shoal_airflow never imports the DAG files; no module imports the old package name ``plugins`` (only
shoal_airflow/legacy_paths.py still knows it, for trigger classpaths stored in Airflow databases)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "mirror_core"
MODULES = sorted(CORE.rglob("*.py"))
AIRFLOW_MODULES = sorted((ROOT / "shoal_airflow").rglob("*.py"))
EVERY_MODULE = sorted(p for top in ("mirror_core", "shoal_airflow", "spark_apps", "dags", "scripts", "tests", "bench")
                      for p in (ROOT / top).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_mirror_core_imports_neither_airflow_nor_pyspark(path):
    forbidden = _imports(path) & {"airflow", "pyspark", "shoal_airflow", "plugins", "dags", "spark_apps"}
    assert not forbidden, f"{path.name} imports {forbidden}: mirror_core must run without them"


@pytest.mark.parametrize("path", [p for p in MODULES if p.name != "cli.py"], ids=lambda p: str(p.relative_to(CORE)))
def test_only_the_cli_reads_the_environment(path):
    assert "os.environ" not in path.read_text() and "getenv(" not in path.read_text(), \
        f"{path.name} reads the environment; pass settings in from the entry point instead"


@pytest.mark.parametrize("path", AIRFLOW_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shoal_airflow_does_not_import_the_dag_files(path):
    assert not _imports(path) & {"dags"}, f"{path.name} imports dags: DAG files sit on top of shoal_airflow"


@pytest.mark.parametrize("path", EVERY_MODULE, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_imports_the_old_package_name(path):
    assert "plugins" not in _imports(path), f"{path.name} imports `plugins`: the package is shoal_airflow now"
