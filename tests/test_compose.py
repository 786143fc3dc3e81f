"""docker-compose.yaml is valid Compose.

Checked with `docker compose config` when the docker client has its compose plugin; otherwise with
`tools/composecheck`, a few lines of Go over compose-go, the library `docker compose config` itself uses
(this machine has a docker client but neither an engine nor the plugin).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"


def test_compose_file_declares_two_independent_kafka_clusters():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    kafka = {name: svc for name, svc in services.items() if "apache/kafka" in str(svc.get("image", ""))}
    assert {"kafka-source", "kafka-target"} <= set(kafka)
    ids = {svc["environment"]["CLUSTER_ID"] for svc in kafka.values()}
    assert len(ids) == len(kafka), "each cluster needs its own cluster id"
    for svc in kafka.values():
        assert svc["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert svc["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_compose_file_runs_spark_airflow_and_the_daemon():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"spark-master", "spark-worker", "postgres", "airflow-api-server", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "shoal-daemon"} <= set(services)
    daemon = services["shoal-daemon"]
    assert daemon["command"][:3] == ["shoal", "mirror", "run"] and daemon["stop_signal"] == "SIGTERM"
    env = services["airflow-scheduler"]["environment"]
    assert "postgresql" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert '"conn_type": "kafka"' in env["AIRFLOW_CONN_KAFKA_SOURCE"]
    assert (ROOT / "docker" / "Dockerfile").is_file() and (ROOT / "docker" / "config" / "pipeline.yaml").is_file()


def _compose_validator() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"]
    if shutil.which("go"):
        return ["go", "run", ".", str(COMPOSE)]
    unavailable("neither `docker compose` nor Go (for tools/composecheck) is available to validate the file")
    raise AssertionError("unreachable")


def test_compose_config_accepts_the_file():
    cmd = _compose_validator()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=480, cwd=ROOT / "tools" / "composecheck")
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}{result.stderr}"


def test_validator_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text("services:\n  kafka-source:\n    image: apache/kafka:4.4.0\n    ports: 19092\n")
    cmd = [broken if part == str(COMPOSE) else part for part in _compose_validator()]
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=480,
                            cwd=ROOT / "tools" / "composecheck")
    assert result.returncode != 0
