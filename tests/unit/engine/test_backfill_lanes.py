"""How the backfill driver runs a lane (mirror_core.engine.backfill.drive_lane) and sizes its fetches for the link
(mirror_core.services.backfill_link): pure, no Spark, no brokers."""

from __future__ import annotations

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.engine.backfill import LaneJob, drive_lane, lane_copy_options, lane_jobs, unsized_fetch_bytes
from mirror_core.engine.copier import CopyOptions
from mirror_core.model.copy_capacity import estimate_copy_throughput
from mirror_core.model.plan import Plan
from mirror_core.services.backfill_link import MAX_ROUND_BYTES, size_lanes_for_link
from mirror_core.state.ledger import STATUS_FAILED, STATUS_OK, LedgerRow

MiB = 1024 * 1024
UNITS = tuple({"unit_id": f"t-0#{i}", "lane": "dr.t-0", "topic": "t", "partition": 0, "start": i * 100,
               "end": (i + 1) * 100, "target_topic": "dr.t", "target_partition": 0} for i in range(3))
CLUSTERS = {"src": {"bootstrap.servers": "a:1"}, "dst": {"bootstrap.servers": "b:1"}}


def job(**changes) -> LaneJob:
    base = dict(run_id="r", pipeline="p", mode="exactly-once", exact_bounds=False, throttle_bytes_per_s=None,
                source=ClusterConfig("src", CLUSTERS["src"]), target=ClusterConfig("dst", CLUSTERS["dst"]), units=UNITS)
    return LaneJob(**{**base, **changes})


def ok_row(one: LaneJob) -> list[LedgerRow]:
    unit = one.units[0]
    return [LedgerRow(run_id=one.run_id, unit_id=unit["unit_id"], pipeline=one.pipeline, source_topic="t",
                      source_partition=0, target_topic="dr.t", target_partition=0, planned_start=unit["start"],
                      planned_end=unit["end"], source_start=unit["start"], source_end=unit["end"], target_start=0,
                      target_end=100, records=100, batches=1, bytes=1000, deep_batches=0, records_digest="d",
                      duration_s=0.1, status=STATUS_OK, error=None)]


class JobFailed(Exception):
    pass


def spark_like(outcomes: dict[str, str]):
    """run_unit: one job per unit; 'ok', 'java' (the Spark job failed) or 'gone' (the driver's JVM is gone)."""
    seen: list[tuple[str, ...]] = []

    def run_unit(one: LaneJob) -> list[LedgerRow]:
        seen.append(tuple(u["unit_id"] for u in one.units))
        outcome = outcomes.get(one.units[0]["unit_id"], "ok")
        if outcome == "java":
            raise JobFailed("task retries exhausted")
        if outcome == "gone":
            raise ConnectionRefusedError("gateway")
        return ok_row(one)
    return run_unit, seen


def classify(exc: BaseException) -> str | None:
    return f"the unit's Spark job failed: {exc}" if isinstance(exc, JobFailed) else None


def test_each_unit_is_its_own_job_and_its_row_is_recorded_as_it_ends():
    run_unit, seen = spark_like({})
    recorded: list[str] = []

    def record(row):
        recorded.append(row.unit_id)
        # the row of a unit is recorded before the next unit's job starts
        assert len(seen) == len(recorded)

    rows = drive_lane(job(), run_unit, record, job_failure=classify)
    assert seen == [("t-0#0",), ("t-0#1",), ("t-0#2",)]
    assert recorded == ["t-0#0", "t-0#1", "t-0#2"] and [r.status for r in rows] == [STATUS_OK] * 3


def test_a_failing_unit_leaves_earlier_units_ok_and_later_ones_not_attempted():
    run_unit, seen = spark_like({"t-0#1": "java"})
    recorded: list[LedgerRow] = []
    rows = drive_lane(job(), run_unit, recorded.append, job_failure=classify)
    assert [(r.unit_id, r.status) for r in rows] == [("t-0#0", STATUS_OK), ("t-0#1", STATUS_FAILED),
                                                     ("t-0#2", STATUS_FAILED)]
    assert rows[0].records == 100 and rows[0].error is None, "the unit that ended keeps its outcome"
    assert "task retries exhausted" in rows[1].error
    assert rows[2].error == "not attempted: unit t-0#1 of the same lane failed before it"
    assert seen == [("t-0#0",), ("t-0#1",)], "nothing runs after a failed unit (the lane's order)"
    assert recorded == rows


def test_a_lost_driver_propagates_without_inventing_rows():
    run_unit, _ = spark_like({"t-0#1": "gone"})
    recorded: list[LedgerRow] = []
    with pytest.raises(ConnectionRefusedError):
        drive_lane(job(), run_unit, recorded.append, job_failure=classify)
    assert [r.unit_id for r in recorded] == ["t-0#0"], "only the unit that really ended has a row"


# -- sizing for the link -------------------------------------------------------------------------------------------

def test_one_lane_at_200ms_20mbs_gets_a_fetch_for_80_percent_of_the_link():
    sizing = size_lanes_for_link(link_bytes_per_s=20e6, rtt_s=0.2, lanes_at_once=1, unsized_fetch_bytes=4 * MiB)
    assert sizing.fetch_bytes == 16_000_000 and sizing.sized
    assert estimate_copy_throughput(20e6, 0.2, sizing.fetch_bytes) == pytest.approx(16e6)   # 80 % of the link
    assert estimate_copy_throughput(20e6, 0.2, 4 * MiB) < 0.52 * 20e6, "what the unsized lane reached"
    assert "16.0 MB per lane" in sizing.describe() and "200 ms" in sizing.describe()


def test_lanes_at_once_share_the_window_and_memory_bounds_it():
    two = size_lanes_for_link(link_bytes_per_s=20e6, rtt_s=0.2, lanes_at_once=2, unsized_fetch_bytes=4 * MiB)
    assert two.fetch_bytes == 8_000_000
    huge = size_lanes_for_link(link_bytes_per_s=1e9, rtt_s=0.2, lanes_at_once=4, unsized_fetch_bytes=4 * MiB)
    assert huge.fetch_bytes == MAX_ROUND_BYTES // 4, "the lanes' fetches share the round bound"


def test_a_near_source_or_an_unmeasured_one_keeps_the_unsized_fetch():
    near = size_lanes_for_link(link_bytes_per_s=20e6, rtt_s=0.001, lanes_at_once=1, unsized_fetch_bytes=4 * MiB)
    assert near.fetch_bytes == 4 * MiB and not near.sized
    unknown = size_lanes_for_link(link_bytes_per_s=20e6, rtt_s=None, lanes_at_once=1, unsized_fetch_bytes=4 * MiB)
    assert unknown.fetch_bytes == 4 * MiB and "no source round trip" in unknown.describe()


def test_a_throttled_lane_is_sized_for_its_share_not_the_link():
    throttle = 2e6   # 2 MB/s per lane: unsized fetches of 1/8 s (250 kB)
    sizing = size_lanes_for_link(link_bytes_per_s=20e6, rtt_s=0.2, lanes_at_once=2,
                                 unsized_fetch_bytes=unsized_fetch_bytes(throttle),
                                 throttle_bytes_per_s_per_lane=throttle)
    assert unsized_fetch_bytes(throttle) == 250_000
    assert sizing.fetch_bytes == 1_600_000   # 4 × 2 MB/s × 0.2 s: its share of the throttle, at 80 %


def test_the_lane_runs_with_the_sized_fetch_and_overlap_on():
    sized = lane_copy_options(job(fetch_max_bytes=16_000_000))
    assert sized.fetch_max_bytes == 16_000_000 and sized.overlap
    assert sized.budget_bytes >= 2 * 16_000_000, "room for one fetch in flight while the previous one is written"
    assert lane_copy_options(job()).fetch_max_bytes == CopyOptions.fetch_max_bytes
    assert lane_copy_options(job(fetch_max_bytes=1)).fetch_max_bytes == CopyOptions.fetch_max_bytes, "never smaller"


def test_lane_jobs_carry_the_drivers_size_to_every_lane():
    plan = {"source_cluster": "src", "target_cluster": "dst", "pipeline": "p", "mode": "exactly-once",
            "exact_bounds": False, "throttle_mb_s": None,
            "units": [dict(UNITS[0], lane=f"dr.t-{i}", unit_id=f"t-{i}", partition=i) for i in range(3)]}
    jobs = lane_jobs(plan, CLUSTERS, "r", parallelism=2, fetch_max_bytes=8_000_000)
    assert [j.fetch_max_bytes for j in jobs] == [8_000_000] * 3
    assert [j.fetch_max_bytes for j in lane_jobs(plan, CLUSTERS, "r", parallelism=2)] == [None] * 3


def test_a_plan_records_the_link_rate_and_old_plans_still_load():
    body = {"version": 1, "plan_id": "x", "pipeline": "p", "created_ms": 0, "source_cluster": "src",
            "target_cluster": "dst", "mode": "exactly-once", "exact_bounds": False, "throttle_mb_s": None,
            "accept_loss": False, "units": [], "losses": []}
    assert Plan.from_dict(body).link_mb_s is None
    plan = Plan.from_dict({**body, "link_mb_s": 20})
    assert plan.link_mb_s == 20.0 and Plan.from_dict(plan.to_dict()).link_mb_s == 20.0
    from mirror_core.errors import ConfigError
    with pytest.raises(ConfigError, match="link_mb_s"):
        Plan.from_dict({**body, "link_mb_s": -1})


def test_a_plan_that_coalesces_small_batches_gives_every_lane_that_size_and_old_plans_do_not():
    from mirror_core.config.plan_request import PlanRequest
    from mirror_core.errors import ConfigError

    body = {"version": 1, "plan_id": "x", "pipeline": "p", "created_ms": 0, "source_cluster": "src",
            "target_cluster": "dst", "mode": "exactly-once", "exact_bounds": False, "throttle_mb_s": None,
            "accept_loss": False, "losses": [],
            "units": [dict(UNITS[0], lane="dr.t-0", unit_id="t-0", bytes_estimate=0, deadline_ms=None)]}
    assert Plan.from_dict(body).coalesce_bytes == 0                      # written before coalescing existed
    plan = Plan.from_dict({**body, "coalesce_bytes": 65536})
    assert Plan.from_dict(plan.to_dict()).coalesce_bytes == 65536
    jobs = lane_jobs(plan.to_dict(), CLUSTERS, "r", parallelism=1)
    assert [lane_copy_options(j).coalesce_bytes for j in jobs] == [65536]
    assert [lane_copy_options(j).coalesce_bytes for j in lane_jobs(body, CLUSTERS, "r", parallelism=1)] == [0]
    for bad in (100, -1, True, "64k"):
        with pytest.raises(ConfigError, match="coalesce_bytes must be 0 .off. or between 1024"):
            Plan.from_dict({**body, "coalesce_bytes": bad})
    with pytest.raises(ConfigError, match="coalesce_small_batches must be 0 .off. or between 1024 and 1048576"):
        PlanRequest.parse(pipeline="p", source_cluster="s", target_cluster="t", include="x", coalesce_bytes=10)


def test_the_spark_driver_refuses_a_hand_edited_plan_before_touching_any_topic(tmp_path):
    """Second review: the driver checked only the plan's version, so a hand-edited coalesce_bytes of 100 created
    target topics in preflight and then failed every task; "70000" was read as a number."""
    import json
    from types import SimpleNamespace

    from mirror_core.errors import ConfigError
    from spark_apps.backfill_job import load_inputs

    body = {"version": 1, "plan_id": "x", "pipeline": "p", "created_ms": 0, "source_cluster": "src",
            "target_cluster": "dst", "mode": "exactly-once", "exact_bounds": False, "throttle_mb_s": None,
            "accept_loss": False, "losses": [],
            "units": [dict(UNITS[0], lane="dr.t-0", unit_id="t-0", bytes_estimate=0, deadline_ms=None)]}
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text(json.dumps(CLUSTERS))
    args = SimpleNamespace(plan=json.dumps({**body, "coalesce_bytes": 65536}), clusters=str(clusters))
    plan, _ = load_inputs(args)
    assert plan["coalesce_bytes"] == 65536
    for bad in (100, "70000", 65536.5):
        with pytest.raises(ConfigError, match="coalesce_bytes"):
            load_inputs(SimpleNamespace(plan=json.dumps({**body, "coalesce_bytes": bad}), clusters=str(clusters)))
