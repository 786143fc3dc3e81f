"""Airflow tests: a throw-away AIRFLOW_HOME with a SQLite metadata DB (``airflow db migrate`` once per session),
the project's ``dags/`` folder, and connections from ``AIRFLOW_CONN_*`` built from the Kafka sandbox.

The environment is set when this module is imported, before anything imports airflow: Airflow reads its
configuration once. Every test here is marked ``airflow`` (once that marker is registered in pyproject.toml) and,
when it needs brokers, ``integration``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_TESTS = Path(__file__).resolve().parent
_HOME = Path(tempfile.mkdtemp(prefix="shoal-airflow-"))
atexit.register(shutil.rmtree, _HOME, True)
os.environ.update({
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* shoal_airflow.*",
})


def _registered(config, name: str) -> bool:
    return any(line.split(":", 1)[0].strip() == name for line in config.getini("markers"))


def pytest_collection_modifyitems(config, items):
    airflow_marker = _registered(config, "airflow")
    for item in items:
        if AIRFLOW_TESTS in Path(str(item.fspath)).resolve().parents:
            if airflow_marker:
                item.add_marker(pytest.mark.airflow)
            if "sandbox" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def airflow_db():
    """``airflow db migrate`` into the session's SQLite file (once), then the ORM configured in-process."""
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy(),
                            timeout=300)
    if result.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    from airflow import settings

    if settings.Session is None:
        settings.configure_orm()
    return _HOME


def kafka_conn(settings: dict) -> str:
    return json.dumps({"conn_type": "kafka", "extra": settings})


@pytest.fixture(scope="session")
def airflow_connections(sandbox, airflow_db):
    """``shoal_source`` / ``shoal_target`` (PLAINTEXT), ``shoal_source_secure`` (SASL_SSL/SCRAM) and
    ``shoal_spark`` (local[2]) as AIRFLOW_CONN_* variables. Returns the secure connection's password."""
    secure = sandbox.client_config("source", secure=True)
    env = {
        "AIRFLOW_CONN_SHOAL_SOURCE": kafka_conn(sandbox.client_config("source")),
        "AIRFLOW_CONN_SHOAL_TARGET": kafka_conn(sandbox.client_config("target")),
        "AIRFLOW_CONN_SHOAL_SOURCE_SECURE": kafka_conn(secure),
        "AIRFLOW_CONN_SHOAL_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    }
    os.environ.update(env)
    yield {"password": secure["sasl.password"]}
    for key in env:
        os.environ.pop(key, None)


@pytest.fixture
def work_dir(tmp_path, monkeypatch):
    """The DAGs' work dir (plans, clusters files, ledger) through the ``shoal_work_dir`` Variable."""
    path = tmp_path / "shoal-work"
    path.mkdir()
    monkeypatch.setenv("AIRFLOW_VAR_SHOAL_WORK_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture
def fresh_dag(airflow_db):
    """A newly parsed DAG per ``dag.test()``: a run renders templates into the task objects in place (fine in a
    worker process, which runs one task and exits), so reusing a DAG object would leak one run's values into the
    next."""
    from airflow.dag_processing.dagbag import DagBag

    def load(dag_id: str):
        bag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py"))
        assert not bag.import_errors, bag.import_errors
        return bag.get_dag(dag_id)

    return load


@pytest.fixture(scope="session")
def local_airflow(sandbox, tmp_path_factory):
    """The README's local Airflow (api-server, scheduler, dag-processor, triggerer; SQLite, LocalExecutor) as real
    processes for the whole session, with ``shoal_source``/``shoal_target`` on the sandbox clusters. How to use it
    from another module: tests/airflow/local_airflow.py."""
    from importlib.metadata import entry_points

    from tests.airflow.local_airflow import port_is_free, start_local_airflow, stop_local_airflow

    if not [ep for ep in entry_points(group="airflow.plugins") if ep.value.startswith("shoal_airflow.")]:
        pytest.fail("Shoal is installed without its entry points (airflow.plugins, apache_airflow_provider): run "
                    "scripts/bootstrap.sh, which reinstalls the project when pyproject.toml changes", pytrace=False)
    clusters = {"source": sandbox.client_config("source"), "target": sandbox.client_config("target")}
    try:
        running = start_local_airflow(tmp_path_factory.mktemp("local-airflow"), clusters)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield running
    finally:
        stop_local_airflow(running)
        assert port_is_free(running.base_url), f"{running.base_url} still answers after the stop"
