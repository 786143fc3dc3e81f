"""The backfill planner's pure rules: selection, naming, bound specs, validation messages, ordering and the plan's
JSON (the Spark job's input)."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from mirror_core.config.plan_request import BoundSpec, PlanRequest, parse_partition_offsets
from mirror_core.config.topic_selection import NamingPolicy, split_alternatives
from mirror_core.errors import ConfigError, DataLossError, MirrorError, PlanDataLossError
from mirror_core.model.plan import Plan, WorkUnit, render_plan_table
from mirror_core.model.planner import (
    CheckpointPosition,
    PartitionState,
    PlanInputs,
    order_units,
    plan_backfill,
    select_topics,
)

TOPICS = {"orders": 3, "orders.dlq": 1, "payments.eu": 2, "payments.us": 2, "audit": 1,
          "__consumer_offsets": 50, "__shoal_checkpoints": 8}


def request(include: str = "orders", **kw) -> PlanRequest:
    strings = {k: kw.pop(k) for k in ("naming", "start", "end", "exclude") if k in kw}
    return PlanRequest.parse(pipeline="p1", source_cluster="source", target_cluster="target", include=include,
                             **strings, **kw)


def state(topic: str = "orders", partition: int = 0, log_start: int = 0, last_stable: int = 100,
          log_end: int | None = None, size: int | None = 10_000, **kw) -> PartitionState:
    return PartitionState(topic, partition, log_start, last_stable, last_stable if log_end is None else log_end,
                          size_bytes=size, **kw)


def inputs_for(topics: dict[str, int], **per_partition) -> PlanInputs:
    """Every partition 0..100 (log start 0, LSO 100), overridden by ``per_partition[f"{topic}-{p}"]`` kwargs."""
    states = {}
    for topic, count in topics.items():
        for p in range(count):
            states[(topic, p)] = state(topic, p, **per_partition.get(f"{topic}-{p}", {}))
    return PlanInputs(topics=topics, partitions=states)


# -- selection -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, parts", [
    ("a,b", ["a", "b"]),
    (" a , b ,", ["a", "b"]),
    ("x{1,3},y", ["x{1,3}", "y"]),
    ("[a,b]c,d", ["[a,b]c", "d"]),
    ("(a|b,c),d", ["(a|b,c)", "d"]),
    (r"a\,b,c", [r"a\,b", "c"]),
])
def test_split_alternatives_on_commas_outside_groups(text, parts):
    assert split_alternatives(text) == parts


@pytest.mark.parametrize("include, exclude, selected", [
    ("orders", None, ["orders"]),                                   # whole-name match: not orders.dlq
    ("orders.*", None, ["orders", "orders.dlq"]),
    ("orders,payments\\..*", None, ["orders", "payments.eu", "payments.us"]),  # a comma means "or"
    ("orders|audit", None, ["audit", "orders"]),
    (".*", "payments.*,.*dlq", ["audit", "orders"]),               # exclude takes commas too
    (".*", None, ["audit", "orders", "orders.dlq", "payments.eu", "payments.us"]),  # internal topics excluded
    (".*,__consumer_offsets", None,
     ["__consumer_offsets", "audit", "orders", "orders.dlq", "payments.eu", "payments.us"]),  # ...unless named
])
def test_topic_selection(include, exclude, selected):
    req = request(include, exclude=exclude, naming="prefix:dr.")
    assert select_topics(req, TOPICS) == selected


def test_internal_topics_need_a_literal_name_not_a_pattern():
    with pytest.raises(ConfigError, match="selects no topic.*internal topics must be named"):
        select_topics(request("__.*", naming="prefix:dr."), TOPICS)


def test_named_topic_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"topic 'ordrs' \(named in include 'ordrs,audit'\) does not exist on "
                                          r"cluster 'source'"):
        select_topics(request("ordrs,audit"), TOPICS)


def test_selection_of_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"include 'nothing.*' excluding 'x' selects no topic on cluster 'source'"):
        select_topics(request("nothing.*", exclude="x"), TOPICS)


@pytest.mark.parametrize("include, exclude, bad", [("orders,pay[", None, "'pay['"), ("orders", "a(b", "'a(b'")])
def test_bad_regex_is_refused_naming_the_alternative(include, exclude, bad):
    with pytest.raises(ConfigError, match=rf"pattern .*{re.escape(bad)} is not a valid regular expression"):
        request(include, exclude=exclude)


# -- naming ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, target", [
    ("identity", "payments.eu"), ("prefix:dr.", "dr.payments.eu"), ("map:payments.eu=eu.payments", "eu.payments"),
])
def test_naming_policies(policy, target):
    naming = NamingPolicy.parse(policy)
    assert naming.target_for("payments.eu") == target
    assert NamingPolicy.parse(str(naming)) == naming


def test_map_without_an_entry_for_a_selected_topic_is_refused():
    with pytest.raises(ConfigError, match="topic 'payments.us' is selected but the naming map has no target"):
        select_topics(request("payments.*", naming="map:payments.eu=eu.payments"), TOPICS)


def test_two_sources_onto_one_target_are_refused():
    with pytest.raises(ConfigError, match="topics 'audit' and 'orders' would both be copied to target 'all'"):
        select_topics(request("orders,audit", naming="map:orders=all,audit=all"), TOPICS)


def test_identity_copy_of_a_kafka_state_log_is_refused():
    with pytest.raises(ConfigError, match="target '__consumer_offsets' is one of Kafka's own state logs"):
        select_topics(request("__consumer_offsets"), TOPICS)


def test_map_naming_an_unknown_source_topic_is_refused():
    with pytest.raises(ConfigError, match="naming map entry 'ordrs': topic does not exist"):
        select_topics(request("orders", naming="map:orders=o,ordrs=x"), TOPICS)


@pytest.mark.parametrize("text, message", [
    ("mirror", "is not identity, prefix:<prefix> or map"),
    ("prefix:", "naming prefix '' must be non-empty"),
    ("prefix:dr/", "naming prefix 'dr/'"),
    ("map:a", "naming map entry 'a' is not src=dst"),
    ("map:a=b,a=c", "naming map lists source topic 'a' twice"),
])
def test_bad_naming_specs(text, message):
    with pytest.raises(ConfigError, match=message):
        NamingPolicy.parse(text)


def test_invalid_target_name_is_refused():
    with pytest.raises(ConfigError, match="target name 'a b' is not a valid Kafka topic name"):
        select_topics(request("orders", naming="map:orders=a b"), TOPICS)


# -- bound specs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("earliest", BoundSpec("earliest")),
    ("LATEST", BoundSpec("latest")),
    ("checkpoint", BoundSpec("checkpoint")),
    ("2026-11-20T08:00:00Z", BoundSpec("timestamp", timestamp_ms=1_795_161_600_000)),
    ("orders:1=50, orders:0=7,a.b-c_d:12=0", BoundSpec("offsets", offsets=(("a.b-c_d", 12, 0), ("orders", 0, 7),
                                                                         ("orders", 1, 50)))),
])
def test_bound_spec_parsing(text, expected):
    spec = BoundSpec.parse(text)
    assert spec == expected
    assert BoundSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text, message", [
    ("42", "a bare offset is ambiguous across partitions; write topic:partition=offset"),
    ("yesterday", "is not earliest, latest, an offset or an ISO-8601 time"),
    ("orders=5", "start entry 'orders=5' is not topic:partition=offset"),
    ("orders:x=5", "start entry 'orders:x=5': partition and offset must be non-negative integers"),
    ("orders:0=-1", "partition and offset must be non-negative integers"),
    ("orders:0=1,orders:0=2", "start names orders-0 twice"),
])
def test_bad_bound_specs_name_the_entry(text, message):
    with pytest.raises(ConfigError, match=message):
        BoundSpec.parse(text, what="start")


def test_partition_offsets_syntax():
    assert parse_partition_offsets("t:0=5,t:2=9") == (("t", 0, 5), ("t", 2, 9))


@pytest.mark.parametrize("end", ["checkpoint", "earliest"])
def test_end_must_be_latest_a_time_or_offsets(end):
    with pytest.raises(ConfigError, match=f"end {end} is not allowed"):
        request(end=end)


def test_time_end_before_time_start_is_refused_up_front():
    with pytest.raises(ConfigError, match="end 2026-01-01T00:00:00Z is before start 2026-02-01T00:00:00Z"):
        request(start="2026-02-01T00:00:00Z", end="2026-01-01T00:00:00Z")


@pytest.mark.parametrize("kw, message", [
    ({"mode": "at-most-once"}, "mode 'at-most-once' is not one of"),
    ({"throttle_mb_s": 0}, "throttle 0 MB/s must be a positive number"),
    ({"throttle_mb_s": float("nan")}, "throttle nan MB/s"),
])
def test_request_options_are_validated(kw, message):
    with pytest.raises(ConfigError, match=message):
        request(**kw)


@pytest.mark.parametrize("start, message", [
    ("nosuch:0=1", "start nosuch:0: topic 'nosuch' does not exist on cluster 'source'"),
    ("audit:0=1", "start audit:0: topic 'audit' is not selected by include 'orders'"),
    ("orders:3=1", r"start orders:3: topic 'orders' on cluster 'source' has partitions 0..2"),
])
def test_offsets_for_unknown_or_unselected_partitions_are_refused(start, message):
    with pytest.raises(ConfigError, match=message):
        select_topics(request(start=start), TOPICS)


# -- resolution and validation ---------------------------------------------------------------------------------

def plan(req: PlanRequest, inputs: PlanInputs, **kw) -> Plan:
    return plan_backfill(req, inputs, created_ms=1_000, plan_id="test-plan", **kw)


def test_earliest_to_latest_covers_log_start_to_last_stable():
    inputs = inputs_for({"orders": 1}, **{"orders-0": {"log_start": 10, "last_stable": 90, "log_end": 95}})
    (unit,) = plan(request(), inputs).units
    assert (unit.start, unit.end, unit.start_from) == (10, 90, "earliest")
    assert (unit.unit_id, unit.target_topic, unit.target_partition, unit.lane) == ("orders-0", "orders", 0,
                                                                                  "orders-0")


def test_prefix_naming_reaches_the_units():
    (unit,) = plan(request(naming="prefix:dr."), inputs_for({"orders": 1})).units
    assert (unit.target_topic, unit.lane) == ("dr.orders", "dr.orders-0")


def test_times_resolve_to_the_first_offset_at_or_after_them_or_the_last_stable_offset():
    req = request(start="2026-01-01T00:00:00Z", end="2026-01-02T00:00:00Z")
    inputs = inputs_for({"orders": 3}, **{
        "orders-0": {"start_time_offset": 20, "end_time_offset": 70},
        "orders-1": {"start_time_offset": 20, "end_time_offset": None},   # nothing after the end time yet
        "orders-2": {"start_time_offset": None, "end_time_offset": None},  # nothing after the start time
    })
    result = plan(req, inputs)
    assert {u.unit_id: (u.start, u.end) for u in result.units} == {"orders-0": (20, 70), "orders-1": (20, 100)}
    assert [(e.topic, e.partition, e.offset) for e in result.empty] == [("orders", 2, 100)]


def test_explicit_offsets_must_cover_every_selected_partition():
    req = request(start="orders:0=5,orders:1=6")
    with pytest.raises(ConfigError, match=r"orders-2: start orders:0=5,orders:1=6 gives no offset for this "
                                          r"partition; list every selected partition \(orders:2=<offset>\)"):
        plan(req, inputs_for({"orders": 3}))


def test_end_before_start_names_partition_specs_and_offsets():
    req = request(start="orders:0=50", end="orders:0=40")
    with pytest.raises(ConfigError, match=r"cluster 'source' orders-0: end orders:0=40 = offset 40 is before "
                                          r"start orders:0=50 = offset 50"):
        plan(req, inputs_for({"orders": 1}))


def test_end_past_the_last_stable_offset_is_refused():
    req = request(end="orders:0=101")
    with pytest.raises(ConfigError, match="orders-0: end orders:0=101 = offset 101 is past the last stable offset "
                                          "100"):
        plan(req, inputs_for({"orders": 1}, **{"orders-0": {"log_end": 110}}))


def test_start_below_the_log_start_is_refused_without_accept_loss():
    req = request(start="orders:0=5")
    with pytest.raises(PlanDataLossError) as info:
        plan(req, inputs_for({"orders": 1}, **{"orders-0": {"log_start": 30}}))
    assert isinstance(info.value, ConfigError) and isinstance(info.value, DataLossError)
    assert info.value.lost_range == (5, 30)
    assert "orders-0: start orders:0=5 = offset 5 is below the log start 30" in str(info.value)
    assert "accept-loss" in str(info.value)


def test_accept_loss_moves_the_start_and_records_the_loss():
    req = request("orders", start="orders:0=5,orders:1=0", end="orders:0=100,orders:1=20", accept_loss=True)
    result = plan(req, inputs_for({"orders": 2}, **{"orders-0": {"log_start": 30}, "orders-1": {"log_start": 50}}))
    (unit,) = result.units
    assert (unit.unit_id, unit.start, unit.end, unit.start_from) == ("orders-0", 30, 100, "log start (accept-loss)")
    assert [x.to_dict() for x in result.losses] == [
        {"topic": "orders", "partition": 0, "lost_start": 5, "lost_end": 30},
        {"topic": "orders", "partition": 1, "lost_start": 0, "lost_end": 20},  # the whole range was deleted
    ]
    assert [(e.partition, e.offset) for e in result.empty] == [(1, 20)]


def test_start_past_the_log_end_is_refused():
    with pytest.raises(ConfigError, match="orders-0: start orders:0=500 = offset 500 is past the log end 100"):
        plan(request(start="orders:0=500"), inputs_for({"orders": 1}))


def test_checkpoint_start_uses_positions_and_starts_uncheckpointed_partitions_at_the_log_start():
    req = request(start="checkpoint", naming="prefix:dr.")
    inputs = inputs_for({"orders": 2}, **{"orders-0": {"checkpoint": CheckpointPosition(40, "dr.orders", 0),
                                                       "log_start": 3},
                                          "orders-1": {"log_start": 7}})
    result = plan(req, inputs)
    assert {u.unit_id: (u.start, u.start_from) for u in result.units} == {
        "orders-0": (40, "checkpoint"), "orders-1": (7, "earliest (no checkpoint)")}


def test_checkpoint_to_another_target_is_refused():
    req = request(start="checkpoint", naming="prefix:dr.")
    inputs = inputs_for({"orders": 1}, **{"orders-0": {"checkpoint": CheckpointPosition(40, "orders", 0)}})
    with pytest.raises(ConfigError, match="pipeline 'p1' checkpointed a copy to orders-0, but this plan targets "
                                          "dr.orders-0"):
        plan(req, inputs)


@pytest.mark.parametrize("start, log_start, refusal", [
    ("earliest", 60, "offsets \\[40, 60\\) were deleted before they were copied"),  # retention passed the checkpoint
    ("latest", 0, "start 100 is past the pipeline's checkpoint 40"),
    ("orders:0=70", 0, "offsets \\[40, 70\\) would never be copied"),
])
def test_a_start_past_the_checkpoint_is_refused_whatever_the_start_spec(start, log_start, refusal):
    inputs = inputs_for({"orders": 1}, **{"orders-0": {"checkpoint": CheckpointPosition(40, "dr.orders", 0),
                                                       "log_start": log_start}})
    with pytest.raises(MirrorError, match=refusal):
        plan(request(start=start, naming="prefix:dr."), inputs)


def test_accept_loss_records_the_skipped_range_past_the_checkpoint():
    inputs = inputs_for({"orders": 1}, **{"orders-0": {"checkpoint": CheckpointPosition(40, "dr.orders", 0),
                                                       "log_start": 60}})
    result = plan(request(start="earliest", naming="prefix:dr.", accept_loss=True), inputs)
    assert [(u.start, u.end) for u in result.units] == [(60, 100)]
    assert [(x.lost_start, x.lost_end) for x in result.losses] == [(40, 60)]


def test_empty_ranges_are_not_units_but_are_counted():
    result = plan(request("orders,audit", start="latest"), inputs_for({"orders": 3, "audit": 1}))
    assert result.units == ()
    assert result.summary()["empty"] == 4 and result.summary()["partitions"] == 4


def test_bytes_estimate_is_offsets_times_average_bytes_per_offset():
    inputs = inputs_for({"orders": 2}, **{"orders-0": {"log_start": 100, "last_stable": 300, "size": 20_000},
                                          "orders-1": {"size": None}})
    units = {u.unit_id: u for u in plan(request(start="orders:0=150,orders:1=0"), inputs).units}
    assert units["orders-0"].bytes_estimate == 150 * 100   # 20,000 bytes / 200 offsets
    assert units["orders-1"].bytes_estimate == 0             # size unknown


# -- ordering --------------------------------------------------------------------------------------------------

def test_units_run_earliest_deadline_first_then_larger_first():
    sizes = {"orders-0": {"size": 1_000}, "orders-1": {"size": 5_000}, "orders-2": {"size": 3_000},
             "audit-0": {"size": 9_000}, "payments.eu-0": {"size": 100}, "payments.eu-1": {"size": 200}}
    inputs = inputs_for({"orders": 3, "audit": 1, "payments.eu": 2}, **sizes)
    deadlines = {("orders", 2): 5_000, ("payments.eu", 0): 2_000, ("orders", 0): 9_000}
    seen = []

    def deadline_for(topic, partition, start):
        seen.append((topic, partition, start))
        return deadlines.get((topic, partition))

    result = plan(request("orders,audit,payments.eu"), inputs, deadline_for=deadline_for)
    assert [u.unit_id for u in result.units] == ["payments.eu-0", "orders-2", "orders-0",  # by deadline
                                                 "audit-0", "orders-1", "payments.eu-1"]  # then by size
    assert [u.deadline_ms for u in result.units[:3]] == [2_000, 5_000, 9_000]
    assert sorted(seen) == sorted((t, p, 0) for t, p in inputs.partitions)


def test_without_deadlines_larger_units_go_first():
    units = [WorkUnit("t", p, 0, 10, "t", p, bytes_estimate=b) for p, b in enumerate([5, 50, 5, 500])]
    assert [u.partition for u in order_units(units)] == [3, 1, 0, 2]


# -- the plan document -----------------------------------------------------------------------------------------

def sample_plan() -> Plan:
    inputs = inputs_for({"orders": 2, "audit": 1}, **{"orders-0": {"log_start": 30}, "audit-0": {"last_stable": 0}})
    req = request("orders,audit", naming="prefix:dr.", start="orders:0=10,orders:1=0,audit:0=0", accept_loss=True,
                  mode="at-least-once", throttle_mb_s=12.5, exact_bounds=True)
    return plan(req, inputs, deadline_for=lambda t, p, s: 7_000 if p == 1 else None)


def test_json_round_trip_and_schema():
    original = sample_plan()
    body = json.loads(original.to_json())
    assert set(body) >= {"version", "plan_id", "pipeline", "created_ms", "source_cluster", "target_cluster", "mode",
                         "exact_bounds", "throttle_mb_s", "accept_loss", "units", "losses"}
    assert body["version"] == 1 and body["mode"] == "at-least-once" and body["throttle_mb_s"] == 12.5
    assert (body["source_cluster"], body["target_cluster"]) == ("source", "target")
    assert body["units"][0] == {"unit_id": "orders-1", "topic": "orders", "partition": 1, "start": 0, "end": 100,
                                "target_topic": "dr.orders", "target_partition": 1, "lane": "dr.orders-1",
                                "bytes_estimate": 10_000, "deadline_ms": 7_000, "start_from": "offset"}
    assert body["losses"] == [{"topic": "orders", "partition": 0, "lost_start": 10, "lost_end": 30}]
    assert Plan.from_json(original.to_json()) == original
    assert Plan.from_dict(original.to_dict()).to_dict() == original.to_dict()


# A plan file as Shoal wrote it before the range type moved to mirror_core.model.ranges (no link_mb_s: older still)
PLAN_WRITTEN_BEFORE = """{
  "version": 1, "plan_id": "p.19700101T000001Z.abc123", "pipeline": "p", "created_ms": 1000,
  "source_cluster": "source", "target_cluster": "target", "mode": "exactly-once", "exact_bounds": false,
  "throttle_mb_s": null, "accept_loss": true,
  "units": [{"unit_id": "orders-1", "topic": "orders", "partition": 1, "start": 0, "end": 100,
             "target_topic": "dr.orders", "target_partition": 1, "lane": "dr.orders-1", "bytes_estimate": 10000,
             "deadline_ms": 7000, "start_from": "offset"},
            {"unit_id": "orders-0", "topic": "orders", "partition": 0, "start": 30, "end": 100,
             "target_topic": "dr.orders", "target_partition": 0, "lane": "dr.orders-0", "bytes_estimate": 7000,
             "deadline_ms": null}],
  "losses": [{"topic": "orders", "partition": 0, "lost_start": 10, "lost_end": 30}],
  "empty": [{"topic": "audit", "partition": 0, "offset": 5}],
  "request": {"include": "orders,audit", "exclude": null, "naming": "prefix:dr.", "start": "earliest",
              "end": "latest"},
  "summary": {"units": 2, "empty": 1, "partitions": 3, "offsets": 170, "bytes_estimate": 17000, "losses": 1,
              "lost_offsets": 20}
}
"""


def test_a_plan_file_written_before_still_loads():
    loaded = Plan.from_json(PLAN_WRITTEN_BEFORE)
    first, second = loaded.units
    assert (first.topic, first.partition, first.start, first.end, first.target_topic, first.target_partition) == \
        ("orders", 1, 0, 100, "dr.orders", 1)
    assert (first.lane, first.bytes_estimate, first.deadline_ms, first.start_from) == \
        ("dr.orders-1", 10_000, 7_000, "offset")
    assert (second.unit_id, second.start, second.deadline_ms, second.start_from) == ("orders-0", 30, None, "")
    assert loaded.link_mb_s is None and loaded.losses[0].lost_start == 10 and loaded.empty[0].offset == 5
    body = json.loads(loaded.to_json())
    assert body["units"][0] == json.loads(PLAN_WRITTEN_BEFORE)["units"][0]
    assert Plan.from_json(loaded.to_json()) == loaded


def _mutated(change) -> dict:
    body = sample_plan().to_dict()
    change(body)
    return body


@pytest.mark.parametrize("change, message", [
    (lambda b: b.update(bootstrap="x:9092"), "plan has unknown field 'bootstrap'"),
    (lambda b: b.pop("losses"), "plan lacks field 'losses'"),
    (lambda b: b.update(version=2), "plan version 2 is not supported"),
    (lambda b: b.update(mode="sometimes"), "mode 'sometimes' is not one of"),
    (lambda b: b.update(throttle_mb_s="fast"), "'throttle_mb_s' must be a number or null"),
    (lambda b: b["units"][0].update(lane="elsewhere-1"), "work unit 'elsewhere-1': lane should be 'dr.orders-1'"),
    (lambda b: b["units"][0].update(start="0"), "field 'start' must be int"),
    (lambda b: b["units"][0].update(end=0), r"range \[0, 0\) is empty"),
    (lambda b: b["units"].append(dict(b["units"][0])), "two work units share unit_id 'orders-1'"),
])
def test_from_dict_refuses_malformed_plans_by_field(change, message):
    with pytest.raises(ConfigError, match=message):
        Plan.from_dict(_mutated(change))


def test_plan_holds_cluster_names_only():
    text = sample_plan().to_json()
    assert "bootstrap" not in text and "sasl" not in text and "password" not in text


def test_dry_run_table_lists_units_in_order_and_the_losses():
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_plan_table(sample_plan()))
    text = out.getvalue()
    assert text.index("orders-1") < text.index("orders-0")
    assert "dr.orders-1" in text and "1970-01-01T00:00:07Z" in text
    assert "lost orders-0 [10, 30) (20 offsets, accept-loss)" in text
    assert "2 units" in text and "1 empty partition(s) skipped" in text


def test_accepted_losses_become_ledger_rows(tmp_path):
    from mirror_core.state.ledger import STATUS_LOST, loss_rows, read_ledger, write_ledger

    rows = loss_rows("r1", "p", [{"topic": "orders", "partition": 3, "lost_start": 0, "lost_end": 100}])
    write_ledger(tmp_path, "r1", rows)
    [row] = read_ledger(tmp_path, "r1")
    assert row.status == STATUS_LOST and (row.planned_start, row.planned_end) == (0, 100)
    assert "[0, 100)" in row.error and "accept-loss" in row.error
