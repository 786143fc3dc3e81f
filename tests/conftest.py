"""Test harness: the real Kafka sandbox, started (or reused) once per session.

Markers come from the folder: ``tests/unit`` → ``unit``, ``tests/integration`` → ``integration``,
``tests/spark`` and ``tests/airflow`` → ``spark``/``airflow`` plus ``integration``.
When ``CI=true`` a missing JVM, Maven or broker is a failure, never a skip; on a laptop without Java the
integration tests skip with the reason. Clusters this session started are stopped at the end unless
``SHOAL_KEEP_SANDBOX=1`` (handy while iterating); clusters that were already running are left running.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.dev.sandbox import sandbox_from_environ
from mirror_core.errors import SandboxError
from tests.kafka_helpers import KafkaTestCluster

CI = os.environ.get("CI", "").lower() == "true"
ROOT = Path(__file__).resolve().parent.parent


FOLDER_MARKERS = {"unit": ("unit",), "integration": ("integration",), "spark": ("spark", "integration"),
                  "airflow": ("airflow", "integration"), "faults": ("faults", "integration")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] == "tests":
            for marker in FOLDER_MARKERS.get(parts[1], ()):
                item.add_marker(getattr(pytest.mark, marker))


def unavailable(reason: str):
    """Fail under CI, skip elsewhere: a missing prerequisite must never pass silently in CI."""
    if CI:
        pytest.fail(f"CI=true and a prerequisite is missing: {reason}", pytrace=False)
    pytest.skip(reason)


class _SessionSandbox:
    def __init__(self):
        self.sandbox = sandbox_from_environ(os.environ)
        self.started: set[str] = set()
        self.keep = os.environ.get("SHOAL_KEEP_SANDBOX") == "1"

    def ensure(self, *names: str):
        missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
        if missing:
            unavailable(f"{' and '.join(missing)} not on PATH; the Kafka sandbox needs a JDK 17+ and Maven")
        was_running = {s.name for s in self.sandbox.status(names) if s.running}
        try:
            self.sandbox.up(names)
        except SandboxError as exc:
            pytest.fail(f"the Kafka sandbox did not start:\n{exc}", pytrace=False)
        self.started |= set(names) - was_running
        return self.sandbox

    def close(self):
        if self.started and not self.keep:
            self.sandbox.down(sorted(self.started))


@pytest.fixture(scope="session")
def session_sandbox():
    holder = _SessionSandbox()
    yield holder
    holder.close()


@pytest.fixture(scope="session")
def sandbox(session_sandbox):
    """The sandbox with ``source`` and ``target`` running."""
    return session_sandbox.ensure("source", "target")


def _cluster(sandbox, name: str, *, secure: bool = False) -> KafkaTestCluster:
    label = f"{name}-secure" if secure else name
    return KafkaTestCluster(ClusterConfig(label, sandbox.client_config(name, secure=secure)))


@pytest.fixture(scope="session")
def source_cluster(sandbox) -> KafkaTestCluster:
    return _cluster(sandbox, "source")


@pytest.fixture(scope="session")
def target_cluster(sandbox) -> KafkaTestCluster:
    return _cluster(sandbox, "target")


@pytest.fixture(scope="session")
def secure_source_cluster(sandbox) -> KafkaTestCluster:
    """``source`` through its SASL_SSL/SCRAM listener (user ``shoal``, CA from the sandbox)."""
    return _cluster(sandbox, "source", secure=True)


@pytest.fixture
def legacy_cluster(session_sandbox) -> KafkaTestCluster:
    """The Kafka 3.9 cluster (ensured per test: a test may have stopped it through the CLI)."""
    sb = session_sandbox.ensure("legacy")
    return _cluster(sb, "legacy")


@pytest.fixture
def unique_name(request):
    """A topic-name factory: ``shoal-test.<test>.<random>``, so tests never share topics."""
    base = request.node.name.replace("[", ".").replace("]", "").replace("/", ".")[:60]

    def make(suffix: str = "") -> str:
        return f"shoal-test.{base}{('.' + suffix) if suffix else ''}.{uuid.uuid4().hex[:8]}"

    return make
