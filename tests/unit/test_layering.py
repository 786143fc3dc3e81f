"""The direction of imports (docs/architecture.md): mirror_core never imports Airflow or PySpark, and only the
CLI entry point reads the environment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "mirror_core"
MODULES = sorted(CORE.rglob("*.py"))


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
    forbidden = _imports(path) & {"airflow", "pyspark", "plugins", "dags", "spark_apps"}
    assert not forbidden, f"{path.name} imports {forbidden}: mirror_core must run without them"


@pytest.mark.parametrize("path", [p for p in MODULES if p.name != "cli.py"], ids=lambda p: str(p.relative_to(CORE)))
def test_only_the_cli_reads_the_environment(path):
    assert "os.environ" not in path.read_text() and "getenv(" not in path.read_text(), \
        f"{path.name} reads the environment; pass settings in from the entry point instead"
