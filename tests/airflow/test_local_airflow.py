"""The README's UI flow on real Airflow processes (``scripts/airflow.sh`` → ``shoal_airflow.local_airflow up``):
the four Shoal DAGs, the Shoal page and the main job's connections are served through the REST API, and
``shoal_backfill`` triggered with a form payload through the REST API copies a topic exactly."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGS = {"shoal_backfill", "shoal_catchup_handoff", "shoal_dr_rehearsal", "shoal_retention_guard"}
RUN_TIMEOUT_S = 240
pytestmark = pytest.mark.timeout(600)


def wait_for(what: str, probe, timeout_s: float, airflow):
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout_s:.0f} s\n{airflow.logs_tail()}", pytrace=False)
        time.sleep(2)


def test_the_ui_serves_the_four_dags_the_shoal_page_and_the_connections(local_airflow):
    def listed():
        status, body = local_airflow.api("GET", "/api/v2/dags?tags=shoal&limit=100")
        assert status == 200, body
        return {d["dag_id"] for d in body["dags"]} >= DAGS and body

    body = wait_for("the four Shoal DAGs in /api/v2/dags", listed, 120, local_airflow)
    assert {d["dag_id"] for d in body["dags"]} == DAGS

    status, errors = local_airflow.api("GET", "/api/v2/importErrors")
    assert status == 200 and errors["total_entries"] == 0, errors

    status, plugins = local_airflow.api("GET", "/api/v2/plugins")
    (shoal,) = [p for p in plugins["plugins"] if p["name"] == "shoal_ui"]
    assert "shoal_airflow.shoal_ui:ShoalUIPlugin" in shoal["source"]  # loaded through the entry point
    assert [v["url_route"] for v in shoal["external_views"]] == ["shoal"]
    status, plugin_errors = local_airflow.api("GET", "/api/v2/plugins/importErrors")
    assert status == 200 and plugin_errors["total_entries"] == 0, plugin_errors  # e.g. the page registered twice
    status, page = local_airflow.get_text("/shoal/")
    assert status == 200 and "<h1>Shoal</h1>" in page, page[:2000]

    status, providers = local_airflow.api("GET", "/api/v2/providers")
    assert "shoal" in {p["package_name"] for p in providers["providers"]}

    status, conns = local_airflow.api("GET", "/api/v2/connections?limit=100")
    by_id = {c["connection_id"]: c for c in conns["connections"]}
    assert {k: by_id[k]["conn_type"] for k in ("shoal_source", "shoal_target", "shoal_spark")} == {
        "shoal_source": "kafka", "shoal_target": "kafka", "shoal_spark": "spark"}
    assert by_id["shoal_spark"]["host"] == "local[2]"


def test_backfill_triggered_through_the_rest_api_with_the_form_copies_exactly(
        local_airflow, source_cluster, target_cluster, unique_name):
    topic = unique_name("ui-flow")
    source_cluster.create_topic(topic, partitions=2)
    records = [(f"k{i}".encode(), f"order-{i}".encode(), [("h", str(i % 3).encode())]) for i in range(60)]
    source_cluster.produce(topic, records)

    status, body = local_airflow.api("PATCH", "/api/v2/dags/shoal_backfill", {"is_paused": False})
    assert status == 200, body
    form = {"source_conn_id": "shoal_source", "target_conn_id": "shoal_target",
            "pipeline": f"ui-flow-{uuid.uuid4().hex[:8]}", "include": re.escape(topic), "exclude": None,
            "naming": "prefix:dr.", "start": "earliest", "end": "latest", "mode": "exactly-once",
            "exact_bounds": False, "throttle_mb_s": None, "dry_run": False, "accept_loss": False}
    status, run = local_airflow.api("POST", "/api/v2/dags/shoal_backfill/dagRuns",
                                    {"logical_date": None, "conf": form})
    assert status == 200, run
    run_path = f"/api/v2/dags/shoal_backfill/dagRuns/{run['dag_run_id']}"

    def finished():
        status, body = local_airflow.api("GET", run_path)
        assert status == 200, body
        return body["state"] in ("success", "failed") and body

    final = wait_for(f"DAG run {run['dag_run_id']} finished", finished, RUN_TIMEOUT_S, local_airflow)
    status, tis = local_airflow.api("GET", f"{run_path}/taskInstances")
    states = {t["task_id"]: t["state"] for t in tis["task_instances"]}
    assert final["state"] == "success", (states, local_airflow.logs_tail())
    assert set(states.values()) == {"success"}, states

    source = source_cluster.read_all(topic)
    target = target_cluster.read_all(f"dr.{topic}")
    assert len(source) == len(records)
    assert [(r.partition, r.offset, r.content()) for r in target] == \
        [(r.partition, r.offset, r.content()) for r in source]


def test_the_generated_airflow_cfg_points_airflow_at_this_checkouts_dags(tmp_path):
    """The bug this replaces: Airflow's own generated airflow.cfg said ``<home>/dags``, so a UI started on the main
    job's home showed no Shoal DAG. Airflow itself reads the file here; secrets survive a rewrite."""
    import configparser
    import os
    import subprocess
    import sys

    from shoal_airflow.local_airflow import LocalAirflowConfig, airflow_env, write_config

    cfg = LocalAirflowConfig(home=tmp_path / "home")
    path = write_config(cfg)
    assert path.stat().st_mode & 0o777 == 0o600 and cfg.home.stat().st_mode & 0o777 == 0o700
    first = configparser.ConfigParser(interpolation=None)
    first.read(path)
    result = subprocess.run([sys.executable, "-m", "airflow", "config", "get-value", "core", "dags_folder"],
                            env=airflow_env(cfg.home, {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": "/elsewhere"}),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(ROOT / "dags")
    write_config(cfg)
    again = configparser.ConfigParser(interpolation=None)
    again.read(path)
    for section, key in (("api_auth", "jwt_secret"), ("core", "fernet_key"), ("api", "secret_key")):
        assert again.get(section, key) == first.get(section, key) != ""
