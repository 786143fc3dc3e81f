"""Spark backfill tests: real brokers (the sandbox) and spark-submit on local[2], or on a real standalone cluster
(a master and two worker JVMs, tests/spark/standalone.py).

The root conftest marks every test here ``spark`` and ``integration``, so ``-m "not spark"`` leaves out the slow
spark-submit runs.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.conftest import unavailable


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
