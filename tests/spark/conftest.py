"""Spark backfill tests: real brokers (the sandbox) and spark-submit on local[2].

Every test under ``tests/spark`` is marked ``integration`` (it needs the sandbox) and, once the marker is registered
in pyproject.toml, ``spark`` too, so ``-m "not spark"`` leaves out the slow spark-submit runs. Under
``--strict-markers`` an unregistered marker is an error, so ``spark`` is only added when it is registered.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.conftest import unavailable

SPARK_TESTS = Path(__file__).resolve().parent


def _registered(config, name: str) -> bool:
    return any(line.split(":", 1)[0].strip() == name for line in config.getini("markers"))


def pytest_collection_modifyitems(config, items):
    spark = _registered(config, "spark")
    for item in items:
        if SPARK_TESTS in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
            if spark:
                item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark_available():
    """Skip (fail under CI) without pyspark or a JVM: spark-submit needs both."""
    if importlib.util.find_spec("pyspark") is None:
        unavailable("pyspark is not installed; the backfill job needs it (scripts/bootstrap.sh)")
    if shutil.which("java") is None:
        unavailable("java is not on PATH; spark-submit needs a JDK 17+")


@pytest.fixture(scope="session")
def clusters_file(sandbox, spark_available) -> Path:
    """The sandbox's clusters file (the backfill job's only source of client settings)."""
    return sandbox.write_clusters_file()
