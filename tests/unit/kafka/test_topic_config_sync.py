"""Topic config sync, the pure part: which changes bring a target in line with its source, and which never happen."""

from __future__ import annotations

import pytest

from mirror_core.errors import MirrorError, TopicConfigSyncError
from mirror_core.kafka.topic_config_sync import (
    SYNCED_CONFIGS,
    ConfigChange,
    ConfigOp,
    ConfigValue,
    TopicConfigs,
    plan_config_sync,
)
from mirror_core.model.preflight_rules import (
    MIRRORED_CONFIGS,
    UNBOUNDED_MS,
    WIDENED_CONFIGS,
    DataFacts,
    TopicState,
    plan_target_configs,
)

DAY = 86_400_000
# Effective configs of a fresh topic on Kafka 4.4 (DescribeConfigs values), none of them overrides.
DEFAULTS = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY), "retention.bytes": "-1",
            "compression.type": "producer", "max.message.bytes": "1048588", "delete.retention.ms": str(DAY),
            "min.compaction.lag.ms": "0", "max.compaction.lag.ms": str(UNBOUNDED_MS),
            "min.cleanable.dirty.ratio": "0.5", "segment.ms": str(7 * DAY),
            "message.timestamp.before.max.ms": str(UNBOUNDED_MS), "message.timestamp.after.max.ms": "3600000",
            "message.timestamp.type": "CreateTime", "segment.bytes": "1073741824", "min.insync.replicas": "1",
            "unclean.leader.election.enable": "false"}


def source(**overrides: str) -> TopicConfigs:
    """A source topic: broker defaults plus ``overrides`` (``retention_ms=`` → ``retention.ms``) set on the topic."""
    values = _keys(overrides)
    return TopicConfigs.of("src", "orders", {**DEFAULTS, **values}, overrides=values)


def created_target(src: TopicConfigs, **changed: str) -> TopicConfigs:
    """The target as preflight creates it from ``src`` (every planned config an override whose broker default is
    the 4.4 default), then ``changed`` by someone."""
    planned, _ = plan_target_configs(TopicState(src.cluster, src.topic, 1, src.values), DataFacts(now_ms=0))
    values = {**DEFAULTS, **planned, **_keys(changed)}
    overrides = set(planned) | set(_keys(changed))
    return TopicConfigs.of("dr", "dr.orders", values, overrides=overrides, fallbacks=DEFAULTS)


def _keys(configs: dict) -> dict:
    return {k.replace("_", "."): v for k, v in configs.items()}


def by_key(changes: list[ConfigChange]) -> dict[str, ConfigChange]:
    assert len({c.key for c in changes}) == len(changes)
    return {c.key: c for c in changes}


def test_target_created_by_preflight_is_already_in_sync():
    for src in (source(), source(retention_ms="3600000", cleanup_policy="compact,delete", compression_type="zstd",
                                 message_timestamp_type="LogAppendTime", max_message_bytes="2000000")):
        assert plan_config_sync(src, created_target(src)) == []


def test_equal_effective_values_need_nothing_whoever_set_them():
    # target holds no overrides at all, source sets values equal to the target's defaults
    src = source(retention_ms=str(7 * DAY), cleanup_policy="delete")
    assert plan_config_sync(src, TopicConfigs.of("dr", "dr.orders", DEFAULTS)) == []


def test_source_override_added_is_set_on_the_target():
    before = source()
    target = created_target(before)
    changes = plan_config_sync(source(retention_ms="3600000", cleanup_policy="compact"), target)
    assert by_key(changes) == {
        "retention.ms": ConfigChange("retention.ms", str(7 * DAY), "3600000", ConfigOp.SET),
        "cleanup.policy": ConfigChange("cleanup.policy", "delete", "compact", ConfigOp.SET)}


def test_source_override_changed_is_set_even_when_it_lowers_retention():
    target = created_target(source(retention_ms=str(30 * DAY), retention_bytes="10000000000"))
    changes = plan_config_sync(source(retention_ms="3600000", retention_bytes="1000"), target)
    assert {(c.key, c.new_value, c.op) for c in changes} == {("retention.ms", "3600000", ConfigOp.SET),
                                                            ("retention.bytes", "1000", ConfigOp.SET)}


@pytest.mark.parametrize("key, value", [("delete.retention.ms", "1000"), ("min.compaction.lag.ms", "5000"),
                                        ("max.compaction.lag.ms", str(DAY)), ("min.cleanable.dirty.ratio", "0.1"),
                                        ("compression.type", "zstd"),
                                        ("retention.bytes", "123456")])
def test_every_exactly_mirrored_config_follows_the_source(key, value):
    changes = plan_config_sync(source(**{key.replace(".", "_"): value}), created_target(source()))
    assert [(c.key, c.new_value, c.op) for c in changes] == [(key, value, ConfigOp.SET)]


def test_source_override_removed_deletes_the_target_override_when_its_default_matches():
    target = created_target(source(cleanup_policy="compact", delete_retention_ms="1000"))
    changes = plan_config_sync(source(), target)
    assert by_key(changes) == {
        "cleanup.policy": ConfigChange("cleanup.policy", "compact", "delete", ConfigOp.DELETE),
        "delete.retention.ms": ConfigChange("delete.retention.ms", "1000", str(DAY), ConfigOp.DELETE)}


def test_source_override_removed_sets_the_source_default_when_the_target_default_differs_or_is_unknown():
    src = source()
    values = {**DEFAULTS, "retention.ms": "3600000", "delete.retention.ms": "1000"}
    target = TopicConfigs.of("dr", "dr.orders", values, overrides={"retention.ms", "delete.retention.ms"},
                             fallbacks={"delete.retention.ms": "60000"})  # retention.ms: broker did not say
    assert by_key(plan_config_sync(src, target)) == {
        "retention.ms": ConfigChange("retention.ms", "3600000", str(7 * DAY), ConfigOp.SET),
        "delete.retention.ms": ConfigChange("delete.retention.ms", "1000", str(DAY), ConfigOp.SET)}


def test_source_override_equal_to_the_target_default_is_set_not_deleted():
    # the source explicitly says 7 days: pin it on the target rather than trusting the target's default
    target = created_target(source(retention_ms="3600000"))
    (change,) = plan_config_sync(source(retention_ms=str(7 * DAY)), target)
    assert change == ConfigChange("retention.ms", "3600000", str(7 * DAY), ConfigOp.SET)


def test_target_never_becomes_log_append_time():
    src = source(message_timestamp_type="LogAppendTime")
    assert plan_config_sync(src, created_target(src)) == []  # source LogAppendTime: target stays CreateTime
    changed = created_target(src, message_timestamp_type="LogAppendTime")  # an operator flipped the target
    assert plan_config_sync(src, changed) == [
        ConfigChange("message.timestamp.type", "LogAppendTime", "CreateTime", ConfigOp.SET)]
    # even when the target's broker default is LogAppendTime, the mirror pins CreateTime (never a DELETE)
    target = TopicConfigs.of("dr", "dr.orders", {**DEFAULTS, "message.timestamp.type": "LogAppendTime"},
                             overrides={"message.timestamp.type"}, fallbacks={"message.timestamp.type": "CreateTime"})
    (change,) = plan_config_sync(source(), target)
    assert change.op is ConfigOp.SET and change.new_value == "CreateTime"


@pytest.mark.parametrize("key", WIDENED_CONFIGS)
def test_widened_bounds_follow_the_source_up_never_down(key):
    low, high = "1000000", "5000000"
    target = created_target(source(**{key.replace(".", "_"): high}))
    assert plan_config_sync(source(**{key.replace(".", "_"): low}), target) == []  # lowering: kept
    target = created_target(source(**{key.replace(".", "_"): low}))
    assert plan_config_sync(source(**{key.replace(".", "_"): high}), target) == [
        ConfigChange(key, low, high, ConfigOp.SET)]


def test_widened_bound_is_raised_when_the_source_default_is_higher():
    target = created_target(source(message_timestamp_before_max_ms=str(DAY)))
    (change,) = plan_config_sync(source(), target)
    assert change == ConfigChange("message.timestamp.before.max.ms", str(DAY), str(UNBOUNDED_MS), ConfigOp.SET)


def test_observed_batch_size_raises_max_message_bytes_like_creation_does():
    target = created_target(source())
    (change,) = plan_config_sync(source(), target, facts=DataFacts(now_ms=0, max_batch_bytes=3_000_000))
    assert change == ConfigChange("max.message.bytes", "1048588", "3000000", ConfigOp.SET)


def test_configs_that_are_not_mirrored_are_ignored():
    src = source(min_insync_replicas="2", unclean_leader_election_enable="true", segment_bytes="1048576",
                 segment_ms="60000",
                 message_timestamp_type="LogAppendTime", **{"follower.replication.throttled.replicas": "*"})
    assert plan_config_sync(src, created_target(source())) == []
    assert not {"min.insync.replicas", "segment.bytes", "segment.ms", "unclean.leader.election.enable"} \
        & set(SYNCED_CONFIGS)


def test_config_unknown_to_either_broker_is_skipped():
    src = source(retention_ms="1000", message_timestamp_after_max_ms="7200000")
    old_target = {k: v for k, v in DEFAULTS.items() if not k.startswith("message.timestamp.")}
    changes = plan_config_sync(src, TopicConfigs.of("dr", "dr.orders", old_target))
    assert [c.key for c in changes] == ["retention.ms"]
    old_source = TopicConfigs.of("src", "orders", {"retention.ms": "1000"}, overrides={"retention.ms"})
    assert [c.key for c in plan_config_sync(old_source, created_target(source()))] == ["retention.ms"]


def test_equivalent_spellings_are_not_changes():
    target = created_target(source(cleanup_policy="compact,delete", min_cleanable_dirty_ratio="0.5"))
    assert plan_config_sync(source(cleanup_policy="delete,compact", min_cleanable_dirty_ratio="0.50"), target) == []


def test_excluded_configs_are_left_alone():
    changes = plan_config_sync(source(retention_ms="1000", delete_retention_ms="60000"), created_target(source()),
                               exclude={"retention.ms"})
    assert [c.key for c in changes] == ["delete.retention.ms"]


def test_synced_configs_are_the_ones_preflight_creates_with():
    src = source(message_timestamp_type="LogAppendTime")
    planned, _ = plan_target_configs(TopicState("src", "orders", 1, src.values), DataFacts(now_ms=0))
    assert set(SYNCED_CONFIGS) == set(planned) == set(MIRRORED_CONFIGS) | {"message.timestamp.type"}
    for key in ("retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes", "delete.retention.ms",
                "min.compaction.lag.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio",
                "message.timestamp.before.max.ms", "message.timestamp.after.max.ms", "compression.type"):
        assert key in MIRRORED_CONFIGS


def test_creation_only_adjusts_configs_that_sync_treats_as_raise_only_or_pinned():
    """Guards drift: if plan_target_configs starts adjusting another config, sync must learn about it."""
    src = source(message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=str(DAY),
                 message_timestamp_after_max_ms="1000", max_message_bytes="1000")
    facts = DataFacts(now_ms=100 * DAY, oldest_timestamp_ms=0, newest_timestamp_ms=200 * DAY, max_batch_bytes=10**7)
    planned, _ = plan_target_configs(TopicState("src", "orders", 1, src.values), facts)
    adjusted = {k for k, v in planned.items() if src.values.get(k) != v}
    assert adjusted == set(WIDENED_CONFIGS) | {"message.timestamp.type"}
    # and a target created with those widened values is in sync with the same facts, and without them
    target = TopicConfigs.of("dr", "dr.orders", {**DEFAULTS, **planned}, overrides=set(planned), fallbacks=DEFAULTS)
    assert plan_config_sync(src, target, facts=facts) == [] and plan_config_sync(src, target) == []


def test_config_change_reads_well_in_logs():
    assert str(ConfigChange("retention.ms", "604800000", "3600000")) == "retention.ms: 604800000 -> 3600000"
    assert str(ConfigChange("cleanup.policy", "compact", "delete", ConfigOp.DELETE)) == \
        "cleanup.policy: compact -> delete (override removed, broker default)"
    change = ConfigChange("segment.ms", "1", "2")
    with pytest.raises(AttributeError):
        change.key = "x"  # type: ignore[misc]


def test_topic_configs_knows_overrides_and_values():
    configs = TopicConfigs("c", "t", {"a": ConfigValue("1", True, "2"), "b": ConfigValue("3"),
                                      "c": ConfigValue(None)})
    assert configs.values == {"a": "1", "b": "3"} and configs.overrides == frozenset({"a"})
    assert TopicConfigs.of("c", "t", {"a": "1"}, fallbacks={"a": "9"}).entries["a"] == ConfigValue("1")


def test_sync_error_names_cluster_and_topic():
    err = TopicConfigSyncError("target", "dr.orders", "could not apply x", retriable=True)
    assert isinstance(err, MirrorError) and err.retriable
    assert str(err) == "topic config sync: cluster 'target' topic 'dr.orders': could not apply x"
    assert not TopicConfigSyncError("a", "b", "c").retriable
