"""The Shoal page in the Airflow UI (shoal_airflow/shoal_ui.py), served by the api-server app exactly as Airflow builds
it (``create_app()`` with the plugin from Shoal's ``airflow.plugins`` entry point, an empty plugins folder and the
simple auth manager), against a pipeline that a real exactly-once ``shoal copy`` wrote to the target sandbox cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER, ROLE = "shoal_viewer", "viewer"
HOLDER = "ui-test-worker"   # a member of the pipeline's daemon group (it holds both lanes)
OLD_HOLDER = "ui-old-daemon"  # a lease-based daemon of an older release, by a live lease on lane 0 (an upgrade)
FIRST, LATER = 20, 5  # records per partition copied, then records produced to partition 0 after the copy


@pytest.fixture(scope="module")
def api_app(airflow_db, tmp_path_factory):
    """Airflow's api-server app (``create_app``) with the entry-point plugins (no plugins folder: the page must come
    from the installed package) and a viewer-role user."""
    from airflow import plugins_manager, settings

    caches = (plugins_manager._get_plugins, plugins_manager.get_fastapi_plugins, plugins_manager._get_ui_plugins)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                  "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"{USER}:{ROLE}")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)  # 64 bytes: what HS512 asks for
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
                  str(tmp_path_factory.mktemp("auth") / "passwords.json"))
        mp.setattr(settings, "PLUGINS_FOLDER", str(tmp_path_factory.mktemp("empty-plugins-folder")))
        for cache in caches:
            cache.cache_clear()
        from airflow.api_fastapi.app import create_app, purge_cached_app

        try:
            yield create_app()
        finally:
            purge_cached_app()
            for cache in caches:
                cache.cache_clear()


@pytest.fixture
def client(api_app):
    """A fresh client per test: no cookie carries over."""
    from fastapi.testclient import TestClient

    return TestClient(api_app)


@pytest.fixture(scope="module")
def token(api_app):
    """A JWT from the api-server's own login endpoint, with the password the simple auth manager generated."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from fastapi.testclient import TestClient

    password = SimpleAuthManager.get_passwords()[USER]
    response = TestClient(api_app).post("/auth/token", json={"username": USER, "password": password})
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


@pytest.fixture(scope="module")
def pipeline(airflow_connections, sandbox, source_cluster, target_cluster):
    """A two-partition topic copied exactly once by ``shoal copy``, a member of the pipeline's daemon group holding
    both partitions (a GroupMembership, as a daemon joins), a live lease of an older daemon on lane 0, then more
    data on partition 0 (lag 5 there, 0 on partition 1); the ``shoal_pipelines`` Variable names it."""
    from mirror_core.daemon.membership import GroupMembership
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore
    from mirror_core.state.leases import Lease, LeaseStore, now_ms

    name = f"ui-{uuid.uuid4().hex[:8]}"
    topic = f"shoal-test.ui.{name}"
    source_cluster.create_topic(topic, partitions=2)
    for p in (0, 1):
        source_cluster.produce(topic, [(b"k", f"v{i}".encode()) for i in range(FIRST)], partition=p)
    result = subprocess.run(
        [sys.executable, "-m", "mirror_core.cli", "copy", "--source", "source", "--target", "target", "--topic",
         topic, "--target-topic", f"dr.{topic}", "--mode", "exactly-once", "--pipeline", name],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=os.environ.copy())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with WireClient.for_cluster(target_cluster.config) as wire:
        leases = LeaseStore(CheckpointStore(target_cluster.config, wire), target_cluster.config.confluent())
        leases.write(Lease(name, f"dr.{topic}-0", OLD_HOLDER, now_ms() + 600_000))
    source_cluster.produce(topic, [(b"k", b"late")] * LATER, partition=0)
    member = GroupMembership(source_cluster.config, name, HOLDER, protocol="consumer", revoke_timeout_s=5)
    member.subscribe([topic])
    member.start()
    spec = [{"pipeline": name, "source_conn_id": "shoal_source", "target_conn_id": "shoal_target",
             "topics": [topic]}]
    try:
        deadline = time.monotonic() + 60
        while len(member.assigned()) < 2:
            assert time.monotonic() < deadline, f"the group member got no assignment: {member.error}"
            time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AIRFLOW_VAR_SHOAL_PIPELINES", json.dumps(spec))
            yield {"name": name, "topic": topic}
    finally:
        member.close(5)


def test_plugin_registers_the_app_and_a_nav_entry(client, token):
    response = client.get("/api/v2/plugins", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    shoal = [p for p in response.json()["plugins"] if p["name"] == "shoal_ui"]
    assert shoal, [p["name"] for p in response.json()["plugins"]]
    assert shoal[0]["fastapi_apps"][0]["url_prefix"] == "/shoal"
    view = shoal[0]["external_views"][0]
    assert (view["name"], view["url_route"], view["destination"], view["nav_top_level"]) == (
        "Shoal", "shoal", "nav", True)


def test_page_shows_the_pipelines_lanes_lag_and_deadline_chart(client, token, pipeline):
    started = time.monotonic()
    response = client.get("/shoal/", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 30
    page, topic = response.text, pipeline["topic"]
    assert f"<h2>{pipeline['name']}</h2>" in page
    assert f"dr.{topic}-0" in page and f"dr.{topic}-1" in page
    assert HOLDER in page and "<svg" in page and "Retention margins" in page
    assert f"daemon group shoal.{pipeline['name']}.daemons: 1 member(s)" in page          # daemon health, from
    assert f"{OLD_HOLDER} (lease-based daemon of an older release): holds 1 lane(s)" in page  # the group + leases

    data = client.get("/shoal/pipelines.json", headers={"Authorization": f"Bearer {token}"}).json()
    assert data["error"] is None
    (view,) = [v for v in data["pipelines"] if v["spec"]["pipeline"] == pipeline["name"]]
    assert view["error"] is None, view["error"]
    lanes = {lane["partition"]: lane for lane in view["lanes"]}
    assert {p: (lanes[p]["lane"], lanes[p]["position"], lanes[p]["lag"]) for p in lanes} == {
        0: (f"dr.{topic}-0", FIRST, LATER), 1: (f"dr.{topic}-1", FIRST, 0)}
    assert lanes[0]["owner"] and lanes[0]["owner_epoch"] is not None
    assert (lanes[0]["holder"], lanes[1]["holder"]) == (f"{HOLDER},{OLD_HOLDER} (lease)", HOLDER)
    assert lanes[0]["held"] is True and lanes[1]["held"] is True
    assert {(s["partition"], s["position"]) for s in view["retention"]} == {(0, FIRST), (1, FIRST)}
    assert all(s["status"] == "SAFE" for s in view["retention"])


def test_the_browser_session_cookie_is_accepted(api_app, token, pipeline):
    """What the UI's iframe sends: Airflow's session cookie, no Authorization header."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from fastapi.testclient import TestClient

    response = TestClient(api_app, cookies={COOKIE_NAME_JWT_TOKEN: token}).get("/shoal/pipelines.json")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/shoal/", "/shoal/pipelines.json"])
def test_without_valid_credentials_the_page_is_refused(client, path):
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403


def test_a_halted_lane_shows_its_state_reason_and_offsets_on_the_page():
    """Unit level: a checkpoint carrying a persisted halt renders as a halted row with the reason, the offsets and
    the way out; a healthy lane renders as copying."""
    from mirror_core.model.lane_holders import LaneHolders
    from mirror_core.model.lane_status import PersistedLaneState
    from mirror_core.services.pipeline_view import lane_rows
    from mirror_core.state.checkpoint import Checkpoint
    from shoal_airflow.shoal_ui import PipelineSpec, PipelineView, render_pipeline

    halt = PersistedLaneState("halted", "batch_rejected", "cluster 'target' rejected the batch for dr.t-0 copied "
                              "from source offset 5: MESSAGE_SIZE_TOO_LARGE", 1_000, 0, 5)
    checkpoints = {("p", "t", p): Checkpoint("p", "t", p, 7, "dr.t", p, None, "daemon", 1,
                                             lane_state=halt if p == 0 else None) for p in (0, 1)}
    holders = LaneHolders({("t", 0): ["daemon-a"], ("t", 1): ["daemon-a"]}, {}, {}, 2_000)
    rows = lane_rows(checkpoints, holders, [("t", 0), ("t", 1)], {("t", 0): 20, ("t", 1): 7},
                     {("t", 0): 0, ("t", 1): 0}, "p")
    assert [(r.state, r.reason) for r in rows] == [("halted", "batch_rejected"), ("copying", "none")]
    page = render_pipeline(PipelineView(PipelineSpec("p", "src", "dst"), lanes=rows), now_ms=2_000)
    assert '<td class="halted">halted</td>' in page and '<td class="copying">copying</td>' in page
    assert "batch_rejected" in page and "MESSAGE_SIZE_TOO_LARGE" in page and "range end 5" in page
    assert "1 lane(s) halted" in page and "shoal lanes resume" in page
