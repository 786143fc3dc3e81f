"""Consumer-group sync decisions: what is committed on the target, what is skipped, and the reason an operator sees."""

from __future__ import annotations

import argparse
import re

import pytest

from mirror_core.cli.groups_command import add_parser, compile_group_pattern, result_to_dict
from mirror_core.errors import ConfigError
from mirror_core.model.group_translation import (
    CommittedOffset,
    SyncStatus,
    TargetGroup,
    plan_group_sync,
    select_groups,
    translation_refusal,
)
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.services.group_sync import GroupSyncResult
from mirror_core.state.checkpoint import Checkpoint

# Source orders-0: records 0-9 → target 0-9, commit marker at 10, records 11-20 → target 11-20 (the mirror's own
# marker took target 10), aborted data 21-25 and its marker 26, records 27-29 → target 22-24; copy position 30,
# target next 25. Map pruned to start at 0.
MAP0 = OffsetMap(30, 25, [OffsetRun(0, 10, 0), OffsetRun(11, 21, 11), OffsetRun(27, 30, 22)], start=0)


def _cp(partition: int, offset_map: OffsetMap | None, *, position: int | None = None, topic: str = "orders",
        target_topic: str = "dr.orders") -> Checkpoint:
    pos = offset_map.position if offset_map is not None else position
    return Checkpoint(pipeline="p", topic=topic, partition=partition, position=pos, target_topic=target_topic,
                      target_partition=partition, target_next=None if offset_map is None else offset_map.target_next,
                      owner="copy", owner_epoch=0, offset_map=offset_map, updated_ms=0)


CHECKPOINTS = {("orders", 0): _cp(0, MAP0),
               ("orders", 1): _cp(1, OffsetMap(50, 40, [OffsetRun(20, 50, 10)], start=20)),
               ("orders", 2): _cp(2, None, position=0)}


def _plan(offsets: dict, targets: dict | None = None, checkpoints=None):
    source = {g: {tp: CommittedOffset(o) if isinstance(o, int) else o for tp, o in parts.items()}
              for g, parts in offsets.items()}
    return plan_group_sync(source, CHECKPOINTS if checkpoints is None else checkpoints, targets or {})


@pytest.mark.parametrize(("source_offset", "target_offset", "what"), [
    (0, 0, "the first record"),
    (5, 5, "part-way through the first run"),
    (10, 11, "a commit marker: the next copied record"),
    (15, 15, "part-way through the second run"),
    (21, 22, "aborted data: the record after the abort marker"),
    (26, 22, "the abort marker itself"),
    (29, 24, "the last copied record"),
    (30, 25, "caught up: the target's next offset"),
])
def test_translatable_offsets_are_committed_exactly(source_offset, target_offset, what):
    plan = _plan({"billing": {("orders", 0): source_offset}})
    (d,) = plan.decisions
    assert (d.status, d.target_offset, d.reason) == (SyncStatus.COMMIT, target_offset, None), what
    assert (d.target_topic, d.target_partition) == ("dr.orders", 0)
    assert plan.commits() == {"billing": [d]} and plan.complete


@pytest.mark.parametrize(("partition", "source_offset", "reason"), [
    (0, 31, "not copied yet: the copy is at 30"),
    (1, 19, "before the offset map, which starts at 20 (where the copy began)"),
    (2, 0, "nothing copied yet (copy position 0)"),
    (3, 7, "partition not copied by this pipeline"),
])
def test_untranslatable_offsets_are_reported_with_the_reason_and_never_committed(partition, source_offset, reason):
    plan = _plan({"billing": {("orders", partition): source_offset}})
    (d,) = plan.decisions
    assert (d.status, d.target_offset, d.reason) == (SyncStatus.NOT_TRANSLATABLE, None, reason)
    assert plan.commits() == {} and not plan.complete


def test_one_untranslatable_partition_does_not_hold_back_the_others():
    plan = _plan({"billing": {("orders", 0): 12, ("orders", 1): 60}})
    assert [(d.partition, d.status, d.target_offset) for d in plan.decisions] == [
        (0, SyncStatus.COMMIT, 12), (1, SyncStatus.NOT_TRANSLATABLE, None)]
    assert [d.partition for d in plan.commits()["billing"]] == [0]


@pytest.mark.parametrize("target", [
    TargetGroup("STABLE", 2),
    TargetGroup("PREPARING_REBALANCING", 1),
    TargetGroup("COMPLETING_REBALANCING", 0),
    TargetGroup("UNKNOWN", 0),  # a state we cannot vouch for is not idle
    TargetGroup("EMPTY", 1),  # members win over a stale state
])
def test_a_group_active_on_the_target_is_skipped_whole(target):
    plan = _plan({"billing": {("orders", 0): 5, ("orders", 1): 60}}, {"billing": target})
    assert {d.status for d in plan.decisions} == {SyncStatus.GROUP_ACTIVE}
    assert all(d.reason.startswith("group active on the target (state ") for d in plan.decisions)
    assert plan.commits() == {}
    assert plan.decisions[0].target_offset == 5, "the translation is still shown"


@pytest.mark.parametrize("target", [TargetGroup("EMPTY", 0), TargetGroup("DEAD", 0), TargetGroup("empty", 0)])
def test_idle_or_unknown_to_the_target_groups_are_committed(target):
    plan = _plan({"billing": {("orders", 0): 5}}, {"billing": target})
    assert plan.decisions[0].status is SyncStatus.COMMIT


def test_a_group_missing_on_the_target_counts_as_dead():
    assert TargetGroup().active is False
    assert _plan({"billing": {("orders", 0): 5}}, {}).decisions[0].status is SyncStatus.COMMIT


def test_a_target_group_already_there_or_past_the_translation_is_not_rewound():
    targets = {"a": TargetGroup("EMPTY", 0, {("dr.orders", 0): 11}),
               "b": TargetGroup("EMPTY", 0, {("dr.orders", 0): 20}),
               "c": TargetGroup("EMPTY", 0, {("dr.orders", 0): 3})}
    plan = _plan({g: {("orders", 0): 10} for g in "abc"}, targets)
    by_group = {d.group: d for d in plan.decisions}
    assert by_group["a"].status is SyncStatus.IN_SYNC and by_group["a"].reason == "the target group is already at 11"
    assert by_group["b"].status is SyncStatus.TARGET_AHEAD and "not rewound" in by_group["b"].reason
    assert by_group["c"].status is SyncStatus.COMMIT, "behind the translation: moved forward"
    assert list(plan.commits()) == ["c"]
    assert not plan.complete, "a group ahead on the target is left behind"
    assert _plan({"a": {("orders", 0): 10}}, {"a": targets["a"]}).complete, "in sync counts as settled"


def test_offsets_on_topics_the_pipeline_does_not_mirror_are_listed_apart_and_no_commit_is_ignored():
    plan = _plan({"billing": {("orders", 0): 5, ("payments", 0): 9, ("audit", 3): 1, ("orders", 1): -1}})
    assert [(d.topic, d.partition) for d in plan.decisions] == [("orders", 0)]
    assert plan.unmirrored == {"billing": ("audit", "payments")}


def test_metadata_travels_with_the_commit_and_rows_are_sorted():
    plan = _plan({"z": {("orders", 1): 30}, "a": {("orders", 0): CommittedOffset(3, "consumer-7")}})
    assert [(d.group, d.partition) for d in plan.decisions] == [("a", 0), ("z", 1)]
    assert plan.decisions[0].metadata == "consumer-7"
    assert plan.decisions[1].target_offset == 20


def test_translation_refusal_matches_the_map():
    for s in range(-1, 40):
        refused = translation_refusal(CHECKPOINTS[("orders", 0)], s) is not None
        assert refused == (MAP0.translate(s) is None), s


def test_group_selection_matches_the_whole_id():
    ids = ["billing", "billing-eu", "analytics", "xbilling"]
    assert select_groups(ids, re.compile("billing")) == ["billing"]
    assert select_groups(ids, re.compile("billing.*")) == ["billing", "billing-eu"]
    assert select_groups(ids, re.compile(".*")) == sorted(ids)
    with pytest.raises(ConfigError, match=r"--groups '\(' is not a valid regular expression"):
        compile_group_pattern("(")


def test_cli_arguments_and_json_shape():
    parser = argparse.ArgumentParser(prog="shoal")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["groups", "sync", "--source", "source", "--target", "target", "--pipeline", "p",
                              "--groups", "bill.*", "--dry-run"])
    assert (args.command, args.action, args.groups, args.dry_run, args.strict) == ("groups", "sync", "bill.*",
                                                                                    True, False)
    plan = _plan({"billing": {("orders", 0): 10, ("orders", 1): 60}})
    doc = result_to_dict(GroupSyncResult(plan, (), {}, dry_run=True))
    assert [(p["partition"], p["target_offset"], p["status"], p["committed"]) for p in doc["partitions"]] == [
        (0, 11, "commit", False), (1, None, "not translatable", False)]


def test_kafka_errors_read_as_one_line():
    from confluent_kafka import KafkaError, KafkaException

    from mirror_core.kafka.admin import describe_kafka_error

    err = KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
    assert describe_kafka_error(err).startswith("UNKNOWN_MEMBER_ID: ")
    assert describe_kafka_error(KafkaException(err)) == describe_kafka_error(err)
    assert describe_kafka_error(TimeoutError()) == "TimeoutError"



def test_an_offset_leading_into_an_accepted_loss_is_refused_with_the_lost_range():
    from mirror_core.model.group_translation import translation_refusal

    cp = Checkpoint(pipeline="p", topic="t", partition=0, position=40, target_topic="dr.t", target_partition=0,
                    target_next=20, owner="copy", owner_epoch=0, updated_ms=0, lost_ranges=((10, 30),),
                    offset_map=OffsetMap(40, 20, [OffsetRun(0, 10, 0), OffsetRun(30, 40, 10)]))
    assert translation_refusal(cp, 5) is None
    assert "[10, 30)" in translation_refusal(cp, 10)
    assert "lost" in translation_refusal(cp, 29)
    assert translation_refusal(cp, 30) is None
