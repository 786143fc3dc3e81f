"""docker-compose.yaml is valid Compose, and the facts that make the stack run hold in the rendered project.

Validation and rendering use `docker compose config` when the docker client has its compose plugin; otherwise
`tools/composecheck`, a few lines of Go over compose-go, the library `docker compose config` itself uses (this
machine has a docker client but neither an engine nor the plugin). The facts are checked on the rendered project
(anchors merged, variables interpolated), the way Docker will see it, against what the code expects: the
connection ids the DAGs default to, the pyspark version of the lock, the Kafka version of the sandbox.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import pytest

from mirror_core.config.pipeline_file import load_pipeline_config
from mirror_core.dev.sandbox.spec import DEFAULT_KAFKA_VERSION
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
ONE_SHOT = ("airflow-init",)


def _compose_validator(*, render: bool = False) -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose", "-f", str(COMPOSE), "config", *(["--format", "json"] if render else ["--quiet"])]
    if shutil.which("go"):
        return ["go", "run", ".", *(["-json"] if render else []), str(COMPOSE)]
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


# -- the rendered project ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def project() -> dict:
    """The project as Docker sees it; variables interpolated from their defaults, not from this shell."""
    cmd = _compose_validator(render=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_AIRFLOW", "COMPOSE_", "AIRFLOW"))}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=480, cwd=ROOT / "tools" / "composecheck",
                            env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _env(svc: dict) -> dict[str, str]:
    return {k: v for k, v in (svc.get("environment") or {}).items() if v is not None}


def _mounts(svc: dict) -> dict[str, tuple[str, str]]:
    """container path -> (type, source) of every volume and bind mount."""
    return {m["target"]: (m["type"], m.get("source", "")) for m in svc.get("volumes") or ()}


def _named_volume_at(project: dict, svc: dict, path: str) -> str:
    kind, source = _mounts(svc).get(path, (None, None))
    assert kind == "volume" and source in project["volumes"], f"no named volume at {path}: {_mounts(svc)}"
    return source


def _conn(env: dict[str, str], conn_id: str) -> dict:
    key = f"AIRFLOW_CONN_{conn_id.upper()}"
    assert key in env, f"connection {conn_id!r} ({key}) is not defined"
    return json.loads(env[key])


def test_two_independent_kraft_clusters_keep_their_data_on_the_volume(project):
    services = project["services"]
    kafka = {n: s for n, s in services.items() if s.get("image", "").startswith("apache/kafka:")}
    assert set(kafka) == {"kafka-source", "kafka-target"}
    assert {s["environment"]["CLUSTER_ID"] for s in kafka.values()} == {"c2hvYWwtc291cmNlLTAwMQ",
                                                                        "c2hvYWwtdGFyZ2V0LTAwMQ"}
    for name, svc in kafka.items():
        env = _env(svc)
        assert svc["image"] == f"apache/kafka:{DEFAULT_KAFKA_VERSION}", "compose and the sandbox run one version"
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller" and env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        # the image creates /var/lib/kafka/data owned by its user (appuser); a named volume there inherits that
        assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
        _named_volume_at(project, svc, env["KAFKA_LOG_DIRS"])
        assert f"INTERNAL://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_spark_master_workers_and_driver_run_the_pyspark_of_the_lock(project):
    services = project["services"]
    lock = (ROOT / "requirements.lock").read_text()
    assert re.search(r"^pyspark==\d+\.\d+\.\d+$", lock, re.MULTILINE), "the lock pins pyspark"
    assert "requirements.lock" in DOCKERFILE.read_text()
    drivers = [*AIRFLOW_SERVICES, "spark-master", "spark-worker"]
    images = {services[n]["image"] for n in drivers}
    assert images == {"shoal:local"}, images
    for name in drivers:
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile", name
    assert not [n for n, s in services.items() if "spark" in s.get("image", "") and s["image"] != "shoal:local"], \
        "no separately versioned Spark image"
    master, worker = services["spark-master"], services["spark-worker"]
    assert master["command"][:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    port = master["command"][master["command"].index("--port") + 1]
    assert worker["command"][:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    assert worker["command"][-1] == f"spark://spark-master:{port}"
    work_dir = _env(worker)["SPARK_WORKER_DIR"]
    _named_volume_at(project, worker, work_dir)
    assert re.search(rf"mkdir -p [^\n]*{re.escape(work_dir)}", DOCKERFILE.read_text()) and \
        re.search(rf"chown -R shoal\S* [^\n]*{re.escape(work_dir)}", DOCKERFILE.read_text()), \
        "the image creates the worker dir owned by its user, so the volume is writable"


def test_airflow_components_share_config_logs_and_the_execution_api(project):
    services = project["services"]
    envs = {n: _env(services[n]) for n in (*AIRFLOW_SERVICES, *ONE_SHOT)}
    config = {e["AIRFLOW_CONFIG"] for e in envs.values()}
    assert len(config) == 1, config
    config_dir = str(PurePosixPath(config.pop()).parent)
    assert len({_named_volume_at(project, services[n], config_dir) for n in envs}) == 1
    home = {e["AIRFLOW_HOME"] for e in envs.values()}
    assert len(home) == 1
    logs = f"{home.pop()}/logs"
    assert len({_named_volume_at(project, services[n], logs) for n in envs}) == 1, "one logs volume for all"
    secrets = {e.get("AIRFLOW__API_AUTH__JWT_SECRET") for e in envs.values()}
    assert len(secrets) == 1, "a JWT secret set per service must be the same everywhere"
    init = " ".join(services["airflow-init"]["command"])
    assert "airflow config list" in init and "airflow db migrate" in init  # writes the shared airflow.cfg
    for name in AIRFLOW_SERVICES:
        dep = services[name]["depends_on"]
        assert dep["airflow-init"]["condition"] == "service_completed_successfully", name
    api = urlparse({e["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] for e in envs.values()}.pop())
    assert api.hostname == "airflow-api-server" and api.path == "/execution/"
    assert services[api.hostname]["command"] == ["airflow", "api-server"]
    assert api.port in {p["target"] for p in services[api.hostname]["ports"]}
    assert all(e["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor" for e in envs.values())
    assert "postgresql" in envs["airflow-scheduler"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


def test_an_admin_user_can_log_in(project):
    services = project["services"]
    env = _env(services["airflow-api-server"])
    users = dict(u.split(":") for u in env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(","))
    init_env = _env(services["airflow-init"])
    assert users.get(init_env["_AIRFLOW_WWW_USER_USERNAME"]) == "admin"
    assert init_env["_AIRFLOW_WWW_USER_PASSWORD"], "the init sets the admin's password"
    passwords = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert init_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == passwords
    assert str(PurePosixPath(passwords).parent) in _mounts(services["airflow-api-server"])
    header = COMPOSE.read_text().split("\nname:")[0]
    assert f"log in as {init_env['_AIRFLOW_WWW_USER_USERNAME']} / {init_env['_AIRFLOW_WWW_USER_PASSWORD']}" in header


def test_every_service_has_a_healthcheck_and_a_restart_policy(project):
    for name, svc in project["services"].items():
        if name in ONE_SHOT:
            assert svc.get("restart") in (None, "no"), name
            continue
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert svc.get("restart") in ("always", "unless-stopped"), f"{name} is not restarted"


def _default_conn_ids() -> dict[str, str]:
    """conn id -> type, from the code: ``*_conn_id`` Param defaults are Kafka connections, a ``conn_id=`` keyword
    (the Spark operator's) a Spark one. Scans dags/ and the Airflow package."""
    package = next(p for p in (ROOT / "shoal_airflow", ROOT / "plugins") if p.is_dir())
    found: dict[str, str] = {}
    for path in [*sorted((ROOT / "dags").glob("*.py")), *sorted(package.glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and str(key.value).endswith("_conn_id") and \
                            isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Param" and \
                            value.args and isinstance(value.args[0], ast.Constant):
                        found[value.args[0].value] = "kafka"
            elif isinstance(node, ast.keyword) and node.arg == "conn_id" and isinstance(node.value, ast.Constant):
                found[node.value.value] = "spark"
    return found


def test_the_connections_the_dags_use_by_default_are_defined(project):
    services = project["services"]
    defaults = _default_conn_ids()
    assert {"shoal_source", "shoal_target", "shoal_spark"} <= set(defaults), defaults
    kafka_listeners = {f"{n}:9092" for n, s in services.items() if s.get("image", "").startswith("apache/kafka:")}
    master = services["spark-master"]["command"]
    master_url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    for name in AIRFLOW_SERVICES:
        env = _env(services[name])
        for conn_id, kind in defaults.items():
            conn = _conn(env, conn_id)
            assert conn["conn_type"] == kind, (name, conn_id, conn)
            if kind == "kafka":
                assert conn["extra"]["bootstrap.servers"] in kafka_listeners, (name, conn_id, conn)
            else:  # the provider's reading of a spark connection: host (a URL) plus port
                assert f"{conn['host']}:{conn['port']}" == master_url, (name, conn_id, conn)
        for pipeline in json.loads(env["AIRFLOW_VAR_SHOAL_PIPELINES"]):
            for key in ("source_conn_id", "target_conn_id"):
                assert _conn(env, pipeline[key])["conn_type"] == "kafka", (name, pipeline)
    assert not any(k.startswith("AIRFLOW_CONN_") for n, s in services.items() if n not in (*AIRFLOW_SERVICES,
                                                                                             *ONE_SHOT)
                   for k in _env(s))


def test_the_ledger_and_plans_live_on_a_volume_every_airflow_container_sees(project):
    services = project["services"]
    work = {_env(services[n])["AIRFLOW_VAR_SHOAL_WORK_DIR"] for n in AIRFLOW_SERVICES}
    assert len(work) == 1
    work_dir = work.pop()
    volumes = {_named_volume_at(project, services[n], work_dir) for n in AIRFLOW_SERVICES}
    assert len(volumes) == 1, "the api-server (UI) sees what the task containers wrote"
    assert re.search(rf"chown -R shoal\S* [^\n]*{re.escape(work_dir)}", DOCKERFILE.read_text())


def test_the_daemon_serves_metrics_on_all_interfaces_with_a_healthcheck(project):
    daemon = project["services"]["shoal-daemon"]
    assert daemon["command"][:3] == ["shoal", "mirror", "run"] and daemon["stop_signal"] == "SIGTERM"
    config_path = PurePosixPath(daemon["command"][daemon["command"].index("--config") + 1])
    kind, source = _mounts(daemon)[str(config_path.parent)]
    assert kind == "bind"
    config = load_pipeline_config(Path(source) / config_path.name)
    assert config.metrics_host == "0.0.0.0"
    assert config.metrics_port in {p["target"] for p in daemon["ports"]}
    assert f"localhost:{config.metrics_port}/healthz" in " ".join(daemon["healthcheck"]["test"])
    assert daemon["restart"] in ("always", "unless-stopped")
    assert config.source.bootstrap == "kafka-source:9092" and config.target.bootstrap == "kafka-target:9092"


def test_the_image_installs_shoal_as_a_package_not_a_mounted_plugins_folder(project):
    text = DOCKERFILE.read_text()
    assert re.search(r"uv pip install [^\n]*--no-deps -r [^\n]*requirements\.lock", text)
    assert re.search(r"uv pip install [^\n]*/tmp/shoal-src\s", text), "the project is pip-installed"
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    find = re.search(r"\[tool\.setuptools\.packages\.find\]\s*include\s*=\s*\[([^\]]*)\]",
                     (ROOT / "pyproject.toml").read_text())
    shipped = re.findall(r'"([A-Za-z_]+)\*?"', find.group(1))
    assert "mirror_core" in shipped
    for package in [*shipped, "dags", "pyproject.toml", "README.md"]:
        assert package not in ignored, f".dockerignore keeps {package} out of the image build"
    for name, svc in project["services"].items():
        env = _env(svc)
        assert "AIRFLOW__CORE__PLUGINS_FOLDER" not in env, f"{name}: the UI plugin comes from the entry point"
        assert not any("plugins" in target for target in _mounts(svc)), name
