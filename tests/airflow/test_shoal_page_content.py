"""What the Shoal page shows an operator (shoal_airflow/shoal_ui.py), at the rendering level: lane states with reasons,
lag in offsets/bytes/time, daemon health, the backfill ledger with a run in flight and links to the DAG runs, DR
rehearsals with RTO/RPO; pipelines found in the configuration the DAGs and the daemon already have; a slow cluster
that cannot hang the page. (The page through real Airflow processes in a browser: test_shoal_page_browser.py.)"""

from __future__ import annotations

import html
import threading
import time
from types import SimpleNamespace

import pytest

from mirror_core.services.read_cache import ReadCache

NOW = 1_800_000_000_000


def _rows():
    from mirror_core.model.lane_status import PersistedLaneState
    from mirror_core.services.pipeline_view import LaneRow

    halt = PersistedLaneState("halted", "data_loss", "offsets [5, 9) were deleted before they were copied",
                              NOW - 60_000, 5, 9)
    return [
        LaneRow("dr.t-0", "t", 0, 5, 20, 15, "dr.t", 0, 5, "daemon", 2, "worker-a", True, NOW - 60_000,
                state=halt.state, reason=halt.reason, state_detail=halt.message, state_range=(5, 9),
                lag_bytes=1_500_000, lag_s=7200.0),
        LaneRow("dr.t-1", "t", 1, 100, 400, 300, "dr.t", 1, 100, "daemon", 2, None, False,
                NOW - 900_000, state="stalled",
                state_detail="no daemon holds the lane (no member of the daemon group has it, no live lease); 300 "
                             "offsets behind, last checkpoint 900s ago",
                lag_bytes=30_000_000, lag_s=950.0),
    ]


def test_the_page_shows_states_lag_daemon_ledger_links_and_rehearsals():
    from mirror_core.services.rehearsal import RehearsalRecord
    from shoal_airflow.shoal_ui import PipelineSpec, PipelineView, render_page, run_links

    run = {"run_id": "manual__2026-11-23T01_00_00_00_00", "in_flight": True, "exit_code": None,
           "started_ms": NOW - 120_000, "ended_ms": None, "units": 2, "finished": 1, "records": 1234, "failed": []}
    view = PipelineView(PipelineSpec("orders-dr", "src", "dst", origin="shoal_backfill runs"), lanes=_rows(),
                        daemon=["daemon group shoal.orders-dr.daemons: 1 member(s), protocol consumer, state stable",
                                "worker-a (/10.0.0.5): holds 1 partition(s)"], runs=[run])
    rehearsal = RehearsalRecord("manual__2026-11-22T03_00_00_00_00", "r", "rehearsal", "src", "dst", "scratch.", "t",
                                2, 60, NOW - 100_000, NOW - 40_000, 60.0, 0, 1.5, True)
    links = run_links([SimpleNamespace(dag_id="shoal_backfill", run_id="manual__2026-11-23T01:00:00+00:00"),
                       SimpleNamespace(dag_id="shoal_dr_rehearsal", run_id="manual__2026-11-22T03:00:00+00:00")])
    page = render_page([view], now_ms=NOW, links=links, rehearsals=[rehearsal])

    assert '<td class="halted">halted</td>' in page and "data_loss" in page and "range end 9" in page
    assert '<td class="stalled">stalled</td>' in page and "no member of the daemon group has it" in page
    assert "1 lane(s) halted" in page and "1 lane(s) stalled" in page
    assert "1.50 MB" in page and "30.00 MB" in page and "2h 00m" in page          # lag in bytes and time
    assert "worker-a (/10.0.0.5): holds 1 partition(s)" in page                 # daemon health
    assert "<td>worker-a</td>" in page                                          # held by
    assert '<td class="running">RUNNING</td>' in page and "1 of 2" in page and "so far" in page
    assert 'href="../dags/shoal_backfill/runs/manual__2026-11-23T01%3A00%3A00%2B00%3A00"' in page
    assert 'href="../dags/shoal_dr_rehearsal/runs/manual__2026-11-22T03%3A00%3A00%2B00%3A00"' in page
    assert "Trigger a backfill" in page and html.escape('"pipeline": "orders-dr"') in page
    assert "DR rehearsals" in page and "1m 00s" in page and "verified" in page   # RTO 60 s


def test_pipelines_come_from_the_daemon_files_and_the_dag_runs(tmp_path):
    from shoal_airflow.shoal_ui import pipelines_from_files, pipelines_from_runs

    (tmp_path / "orders.yaml").write_text(
        "pipeline: orders-dr\nsource: {bootstrap.servers: 'a:1'}\ntarget: {bootstrap.servers: 'b:1'}\n"
        "include: orders\nstall_after_s: 60\nretention: {at_risk_below: 15m}\n")
    [from_file] = pipelines_from_files(str(tmp_path / "*.yaml"))
    assert (from_file.pipeline, from_file.origin) == ("orders-dr", "pipeline file")
    assert from_file.policy.at_risk_below_s == 900 and from_file.stall_after_s == 60
    source, target = from_file.clusters()
    assert source.settings["bootstrap.servers"] == "a:1" and target.settings["bootstrap.servers"] == "b:1"

    runs = [SimpleNamespace(dag_id="shoal_backfill", conf={"pipeline": "p1", "source_conn_id": "s1"}),
            SimpleNamespace(dag_id="shoal_retention_guard", conf={}),
            SimpleNamespace(dag_id="shoal_dr_rehearsal", conf={"pipeline": "scratch"})]
    found = [(s.pipeline, s.source_conn_id, s.target_conn_id) for s in pipelines_from_runs(runs)]
    assert found == [("p1", "s1", "shoal_target"), ("mirror", "shoal_source", "shoal_target")]


@pytest.mark.timeout(30)
def test_a_slow_cluster_cannot_hang_the_page():
    from shoal_airflow.shoal_ui import PipelineSpec, PipelineView, cached_views

    release, calls = threading.Event(), []

    def slow_read(spec):
        calls.append(spec.pipeline)
        release.wait(10)
        return PipelineView(spec, copy_throughput=f"reading {len(calls)}")

    spec = PipelineSpec("slow", "src", "dst")
    cache = ReadCache(ttl_s=0.2, deadline_s=0.3)
    started = time.monotonic()
    [first] = cached_views([spec], read=slow_read, cache=cache)
    assert time.monotonic() - started < 2 and "still reading" in first.stale
    [again] = cached_views([spec], read=slow_read, cache=cache)
    assert "still reading" in again.stale and calls == ["slow"]                 # one reading at a time
    release.set()
    time.sleep(0.1)
    [done] = cached_views([spec], read=slow_read, cache=cache)
    assert done.stale is None and done.copy_throughput == "reading 1"
    release.clear()
    time.sleep(0.3)                                                            # past the TTL: read again, slowly
    [old] = cached_views([spec], read=slow_read, cache=cache)
    assert old.copy_throughput == "reading 1" and "showing the reading from" in old.stale
    release.set()


def test_a_retrying_lane_is_shown_from_its_holders_health_record():
    """``retrying`` lives in the daemon's memory; the holder writes it into the lane's health record when the lane
    starts failing, and the page reads it there (with the attempt count, since when, and who reported it) while the
    record is live; the holder comes from the daemon group."""
    from mirror_core.model.lane_holders import LaneHolders
    from mirror_core.services.pipeline_view import lane_rows
    from mirror_core.state.checkpoint import Checkpoint
    from mirror_core.state.lane_health_records import HealthRecord

    cp = Checkpoint(pipeline="p", topic="t", partition=0, position=10, target_topic="dr.t", target_partition=0,
                    target_next=10, owner="daemon", owner_epoch=1, updated_ms=NOW - 5_000)
    record = HealthRecord("dr.t-0", "worker-a", "retrying", "unavailable", "cluster 'target': NOT_ENOUGH_REPLICAS",
                          4, NOW - 30_000, NOW - 1_000, NOW + 60_000)
    group = {("t", 0): ["worker-a"]}
    (row,) = lane_rows({("p", "t", 0): cp}, LaneHolders(group, {}, {"dr.t-0": record}, NOW), [("t", 0)],
                       {("t", 0): 50}, {("t", 0): 0}, "p")
    assert (row.state, row.reason, row.holder, row.held) == ("retrying", "unavailable", "worker-a", True)
    assert "NOT_ENOUGH_REPLICAS" in row.state_detail and "attempt 4" in row.state_detail
    (copying,) = lane_rows({("p", "t", 0): cp}, LaneHolders(group, {}, {}, NOW), [("t", 0)], {("t", 0): 50},
                           {("t", 0): 0}, "p")
    assert copying.state == "copying"
    (expired,) = lane_rows({("p", "t", 0): cp}, LaneHolders(group, {}, {"dr.t-0": record}, NOW + 60_000),
                           [("t", 0)], {("t", 0): 50}, {("t", 0): 0}, "p")
    assert expired.state == "copying", "a record its holder stopped renewing is not taken"


def test_an_unreadable_daemon_group_is_shown_as_such_not_as_no_daemon():
    from mirror_core.model.lane_holders import daemon_health
    from mirror_core.services.pipeline_view import LaneRow
    from shoal_airflow.shoal_ui import PipelineSpec, PipelineView, render_page

    row = LaneRow("dr.t-0", "t", 0, 5, 20, 15, "dr.t", 0, 5, "daemon", 2, None, None, NOW - 10_000)
    daemon = daemon_health(None, "cluster 'source': could not describe the daemon group 'shoal.p.daemons'", {}, NOW)
    page = render_page([PipelineView(PipelineSpec("p", "src", "dst"), lanes=[row], daemon=daemon)], now_ms=NOW,
                       links={}, rehearsals=[])
    assert "daemon group not readable" in page and "could not describe" in page
    assert "daemon group not readable)" in page  # the held-by cell
    assert "no daemon" not in page
