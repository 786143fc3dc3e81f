"""Preflight rules: one test per finding, each checking the config named and the numbers an operator acts on."""

from __future__ import annotations

import pytest

from mirror_core.errors import MirrorError, PreflightError
from mirror_core.model.preflight_rules import (
    SHOAL_INTERNAL_PREFIX,
    TIMESTAMP_MARGIN_MS,
    UNBOUNDED_MS,
    DataFacts,
    Severity,
    TopicState,
    decide,
    is_internal_topic,
    plan_target_configs,
    target_topic_name,
)

DAY = 86_400_000
NOW = 1_800_000_000_000
# Effective configs of a fresh topic on Kafka 4.4 (DescribeConfigs values).
DEFAULTS = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY), "retention.bytes": "-1",
            "compression.type": "producer", "max.message.bytes": "1048588", "delete.retention.ms": str(DAY),
            "min.compaction.lag.ms": "0", "message.timestamp.before.max.ms": str(UNBOUNDED_MS),
            "message.timestamp.after.max.ms": "3600000", "message.timestamp.type": "CreateTime"}


def source(partitions: int = 3, **configs: str) -> TopicState:
    return TopicState("src", "orders", partitions, {**DEFAULTS, **_keys(configs)})


def target(partitions: int = 3, **configs: str) -> TopicState:
    return TopicState("dr", "dr.orders", partitions, {**DEFAULTS, **_keys(configs)})


def _keys(configs: dict) -> dict:
    """``max_message_bytes=`` → ``max.message.bytes``."""
    return {k.replace("_", "."): v for k, v in configs.items()}


def run(src: TopicState | None, tgt: TopicState | None, facts: DataFacts | None = None, **kw):
    return decide(src, tgt, facts or DataFacts(now_ms=NOW), source_cluster="src",
                  source_topic=kw.pop("topic", "orders"), target_cluster="dr",
                  target_topic=kw.pop("target_topic", "dr.orders"), **kw)


def only(report, key: str):
    found = [f for f in report.findings if f.key == key]
    assert len(found) == 1, report.findings
    return found[0]


def test_matching_target_has_no_findings():
    report = run(source(), target())
    assert report.ok and report.findings == () and report.partition_map == {0: 0, 1: 1, 2: 2}
    report.raise_if_refused()


def test_fewer_target_partitions_refused_with_how_many_to_add():
    f = only(run(source(6), target(4)), "partitions")
    assert f.severity is Severity.REFUSE and (f.source_value, f.target_value) == ("6", "4")
    assert "cluster 'dr' topic 'dr.orders'" in f.message and "add 2 partition(s)" in f.message


def test_more_target_partitions_is_only_information():
    f = only(run(source(2), target(4)), "partitions")
    assert f.severity is Severity.INFO


def test_smaller_max_message_bytes_refused_against_source_limit():
    f = only(run(source(), target(max_message_bytes="65536")), "max.message.bytes")
    assert f.severity is Severity.REFUSE
    assert "max.message.bytes is 65536" in f.message and "raise it by 983052 to at least 1048588" in f.message


def test_observed_batch_size_decides_and_source_limit_only_warns():
    facts = DataFacts(now_ms=NOW, max_batch_bytes=50_000)
    f = only(run(source(), target(max_message_bytes="65536"), facts), "max.message.bytes")
    assert f.severity is Severity.WARN and "below the source's 1048588" in f.message
    f = only(run(source(), target(max_message_bytes="40000"), facts), "max.message.bytes")
    assert f.severity is Severity.REFUSE and "largest batch observed" in f.message and "by 10000" in f.message


def test_coalesced_batches_need_the_target_to_take_their_size():
    facts = DataFacts(now_ms=NOW, max_batch_bytes=200, coalesce_bytes=65_536)
    f = only(run(source(max_message_bytes="1000"), target(max_message_bytes="40000"), facts), "max.message.bytes")
    assert f.severity is Severity.REFUSE and "small batches coalesced up to that size" in f.message
    assert "batches of up to 65536 bytes" in f.message and "by 25536" in f.message
    assert run(source(max_message_bytes="1000"), target(max_message_bytes="65536"), facts).ok
    configs, _ = plan_target_configs(source(max_message_bytes="1000"), facts)
    assert configs["max.message.bytes"] == "65536"   # a created target takes them


@pytest.mark.parametrize("src_codec,tgt_codec,warned", [
    ("zstd", "zstd", False), ("zstd", "producer", False), ("producer", "producer", False),
    ("zstd", "lz4", True), ("producer", "gzip", True), ("uncompressed", "zstd", True)])
def test_compression_mismatch_warns(src_codec, tgt_codec, warned):
    report = run(source(compression_type=src_codec), target(compression_type=tgt_codec))
    found = [f for f in report.findings if f.key == "compression.type"]
    assert bool(found) is warned and report.ok
    if warned:
        assert found[0].severity is Severity.WARN
        assert f"compression.type is {tgt_codec}" in found[0].message and "re-compress" in found[0].message


def test_log_append_time_target_refused():
    f = only(run(source(), target(message_timestamp_type="LogAppendTime")), "message.timestamp.type")
    assert f.severity is Severity.REFUSE and "set it to CreateTime" in f.message


def test_old_data_beyond_before_max_refused_with_numbers():
    facts = DataFacts(now_ms=NOW, oldest_timestamp_ms=NOW - 10 * DAY)
    f = only(run(source(), target(message_timestamp_before_max_ms=str(DAY), retention_ms="-1"), facts),
             "message.timestamp.before.max.ms")
    assert f.severity is Severity.REFUSE and (f.source_value, f.target_value) == (str(10 * DAY), str(DAY))
    assert "86400000 ms (1.0 d)" in f.message and "864000000 ms (10.0 d) old" in f.message
    assert f"to at least {10 * DAY + TIMESTAMP_MARGIN_MS}" in f.message


def test_before_max_with_little_headroom_warns():
    facts = DataFacts(now_ms=NOW, oldest_timestamp_ms=NOW - 10 * DAY)
    f = only(run(source(), target(message_timestamp_before_max_ms=str(10 * DAY + 3_600_000), retention_ms="-1"),
                 facts), "message.timestamp.before.max.ms")
    assert f.severity is Severity.WARN and "longer than 3600000 ms (1.0 h)" in f.message


def test_future_data_beyond_after_max_refused_with_numbers():
    facts = DataFacts(now_ms=NOW, newest_timestamp_ms=NOW + 2 * 3_600_000)
    f = only(run(source(), target(), facts), "message.timestamp.after.max.ms")
    assert f.severity is Severity.REFUSE
    assert "is 3600000 ms (1.0 h)" in f.message and "7200000 ms (2.0 h) in the future" in f.message
    assert "raise it by 3600000 ms (1.0 h) to at least 7200000" in f.message


def test_retention_shorter_than_data_age_warns_with_both_numbers():
    facts = DataFacts(now_ms=NOW, oldest_timestamp_ms=NOW - 10 * DAY)
    f = only(run(source(), target(), facts), "retention.ms")
    assert f.severity is Severity.WARN
    assert "retention.ms is 604800000 ms (7.0 d)" in f.message and "864000000 ms (10.0 d) old" in f.message
    assert "by 259200000 ms (3.0 d)" in f.message


def test_retention_does_not_apply_to_compact_only_or_infinite():
    facts = DataFacts(now_ms=NOW, oldest_timestamp_ms=NOW - 10 * DAY)
    for tgt in (target(cleanup_policy="compact"), target(retention_ms="-1")):
        assert not [f for f in run(source(cleanup_policy=tgt.configs["cleanup.policy"]), tgt, facts).findings
                    if f.key == "retention.ms"]


def test_cleanup_policy_difference_warns_and_order_does_not_matter():
    f = only(run(source(cleanup_policy="compact"), target(cleanup_policy="delete")), "cleanup.policy")
    assert f.severity is Severity.WARN and "set cleanup.policy=compact" in f.message
    assert run(source(cleanup_policy="compact,delete"), target(cleanup_policy="delete,compact")).findings == ()


def test_other_mirrored_config_difference_is_information():
    f = only(run(source(delete_retention_ms="1000"), target()), "delete.retention.ms")
    assert f.severity is Severity.INFO and "set delete.retention.ms=1000" in f.message


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state", "__share_group_state",
                                  "__anything", SHOAL_INTERNAL_PREFIX + ".checkpoints"])
def test_internal_topics(name):
    assert is_internal_topic(name)
    f = only(run(source(), target(), topic=name), "topic")
    assert f.severity is Severity.REFUSE and "allow_internal=True" in f.message and repr(name) in f.message
    assert only(run(source(), target(), topic=name, allow_internal=True), "topic").severity is Severity.INFO


def test_internal_refusal_is_decided_on_the_name_alone():
    report = run(None, None, topic="__consumer_offsets")
    assert [f.message for f in report.refusals if "does not exist" in f.message] == []


def test_normal_topic_is_not_internal():
    assert not is_internal_topic("orders") and not is_internal_topic("_schemas")


def test_kafka_state_log_is_never_a_target():
    f = only(run(source(), target(), target_topic="__consumer_offsets", allow_internal=True), "topic")
    assert f.severity is Severity.REFUSE and "another name" in f.message


def test_missing_source_refused():
    f = only(run(None, None), "topic")
    assert f.severity is Severity.REFUSE and "does not exist" in f.message and "'src'" in f.message


def test_missing_target_plans_source_configs_as_create_time():
    src = source(4, message_timestamp_type="LogAppendTime", compression_type="zstd", retention_ms="-1")
    report = run(src, None)
    assert report.ok and not report.created and report.partitions == 4
    assert report.create_config["message.timestamp.type"] == "CreateTime"
    assert report.create_config["compression.type"] == "zstd" and report.create_config["retention.ms"] == "-1"
    assert only(report, "message.timestamp.type").severity is Severity.INFO


def test_missing_target_bounds_are_widened_to_accept_the_data_never_narrowed():
    src = source(message_timestamp_before_max_ms=str(7 * DAY), max_message_bytes="1000")
    facts = DataFacts(now_ms=NOW, oldest_timestamp_ms=NOW - 10 * DAY, newest_timestamp_ms=NOW + 7_200_000,
                      max_batch_bytes=5000)
    config, notes = plan_target_configs(src, facts)
    assert int(config["message.timestamp.before.max.ms"]) == 10 * DAY + TIMESTAMP_MARGIN_MS
    assert config["message.timestamp.after.max.ms"] == "7200000" and config["max.message.bytes"] == "5000"
    assert {n.key for n in notes} == {"message.timestamp.before.max.ms", "message.timestamp.after.max.ms"}
    wide, _ = plan_target_configs(source(), facts)
    assert wide["message.timestamp.before.max.ms"] == str(UNBOUNDED_MS)


def test_refusal_means_no_creation_plan_and_error_lists_every_refusal():
    report = run(source(6), target(4, max_message_bytes="100", message_timestamp_type="LogAppendTime"))
    assert not report.ok and len(report.refusals) == 3 and report.create_config is None
    with pytest.raises(PreflightError) as info:
        report.raise_if_refused()
    err = info.value
    assert isinstance(err, MirrorError) and not err.retriable and err.refusals == report.refusals
    for key in ("(1)", "(2)", "(3)", "add 2 partition(s)", "max.message.bytes is 100", "CreateTime"):
        assert key in str(err)


def test_report_is_frozen():
    report = run(source(), target())
    with pytest.raises(AttributeError):
        report.created = True  # type: ignore[misc]


def test_target_topic_name_prefix_policy():
    assert target_topic_name("orders", "dr.") == "dr.orders" and target_topic_name("orders") == "orders"
