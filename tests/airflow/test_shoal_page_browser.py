"""The Shoal page as an operator sees it at 3 a.m.: a real headless Chromium (Debian's, over the DevTools protocol)
logs in through Airflow's own login form on the README's local Airflow (the same processes as the REST test), opens
the Shoal page and reads what it shows for a pipeline with a halted lane and a backfill still running. The
screenshot is kept in ``.test-artifacts/`` of the checkout."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.lane_status import HALTED, PersistedLaneState
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore
from mirror_core.state.lane_control import persist_lane_state
from tests.browser_cdp import HeadlessChromium, chromium_binary
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".test-artifacts"
pytestmark = pytest.mark.timeout(600)


def _halt_a_lane(target_cluster, pipeline: str, topic: str) -> None:
    """Store a halt in the lane's checkpoint with the daemon's own code path (what `shoal lanes status` reads)."""
    halt = PersistedLaneState(HALTED, "batch_rejected", "cluster 'target' refused the batch at source offset 7: "
                              "RecordTooLargeException (max.message.bytes 1024)", int(time.time() * 1000), 7, None)
    with WireClient.for_cluster(target_cluster.config) as client:
        store = CheckpointStore(target_cluster.config, client)
        store.ensure_topic()
        initial = Checkpoint(pipeline=pipeline, topic=topic, partition=0, position=7, target_topic=f"dr.{topic}",
                             target_partition=0, target_next=None, owner="daemon", owner_epoch=1)
        persist_lane_state(store, client, pipeline, topic, 0, halt, transactional=False, initial=initial)


def _login(browser: HeadlessChromium, airflow) -> None:
    browser.open(airflow.base_url + "/")
    browser.wait_for("document.querySelector('input[name=username]')", 60, what="Airflow's login form")
    browser.type_into("input[name=username]", airflow.username)
    browser.type_into("input[name=password]", airflow.password)
    browser.click("button[type=submit]")
    browser.wait_for("!location.pathname.startsWith('/auth/login')", 60, what="the login to go through")


def test_the_shoal_page_shows_a_halted_lane_and_a_running_backfill_in_a_real_browser(
        local_airflow, source_cluster, target_cluster, unique_name, tmp_path):
    if chromium_binary() is None:
        unavailable("chromium is not installed (Debian package 'chromium'; scripts/test.sh installs it)")
    pipeline = f"ui-page-{uuid.uuid4().hex[:8]}"
    topic, halted_topic = unique_name("running"), unique_name("halted")
    source_cluster.create_topic(topic)
    source_cluster.create_topic(halted_topic)
    source_cluster.produce(halted_topic, [(b"k%d" % i, b"v") for i in range(20)])  # halted at 7: 13 to copy
    value = b"x" * 2000
    source_cluster.produce(topic, [(b"k%d" % i, value) for i in range(1500)])  # ~3 MB at 0.05 MB/s: a minute
    _halt_a_lane(target_cluster, pipeline, halted_topic)

    status, body = local_airflow.api("PATCH", "/api/v2/dags/shoal_backfill", {"is_paused": False})
    assert status == 200, body
    form = {"source_conn_id": "shoal_source", "target_conn_id": "shoal_target", "pipeline": pipeline,
            "include": re.escape(topic), "exclude": None, "naming": "prefix:dr.", "start": "earliest",
            "end": "latest", "mode": "exactly-once", "exact_bounds": False, "throttle_mb_s": 0.05,
            "dry_run": False, "accept_loss": False}
    status, run = local_airflow.api("POST", "/api/v2/dags/shoal_backfill/dagRuns", {"logical_date": None, "conf": form})
    assert status == 200, run
    run_path = f"/api/v2/dags/shoal_backfill/dagRuns/{run['dag_run_id']}"

    with HeadlessChromium(tmp_path / "chromium") as browser:
        _login(browser, local_airflow)
        browser.open(local_airflow.base_url + "/shoal/")
        deadline = time.monotonic() + 240
        while True:  # the page reads through a short cache: reload until the run shows as in flight
            text = browser.text()
            if pipeline in text and "RUNNING" in text and "halted" in text:
                break
            status, state = local_airflow.api("GET", run_path)
            assert state.get("state") in ("queued", "running"), \
                f"the backfill ended before the page showed it running: {state}\n{text[:3000]}"
            assert time.monotonic() < deadline, f"the page never showed the running backfill:\n{text[:4000]}"
            time.sleep(3)
            browser.open(local_airflow.base_url + "/shoal/")
        shot = browser.screenshot(ARTIFACTS / "shoal-page.png")
        print(f"screenshot: {shot}")

    section = text[text.index(pipeline):]
    assert "1 lane(s) halted" in section, section[:3000]
    assert "batch_rejected" in section and "at offset 7" in section and "shoal lanes resume" in section
    assert f"{halted_topic}-0\tSAFE" in section, "the halted lane's data is still on the source: SAFE, not lost"
    assert "RUNNING" in section and "Trigger a backfill" in section
    assert shot.stat().st_size > 10_000, "an empty screenshot"

    status, _ = local_airflow.api("PATCH", run_path, {"state": "failed"})  # not needed beyond this test
    assert status == 200
