"""Preflight against real brokers: a missing target is created right; a refused copy writes nothing."""

from __future__ import annotations

import time

import pytest

from mirror_core.errors import PreflightError
from mirror_core.model.preflight_rules import Severity, target_topic_name
from mirror_core.services.preflight import observe_data, run_preflight

DAY = 86_400_000


def end_offsets(cluster, topic: str, *, settle_s: float = 10.0) -> dict[int, int]:
    """Each partition's end offset (a topic created a moment ago may answer NOT_LEADER_OR_FOLLOWER for a moment:
    ``ClusterAdmin.settled_offsets`` waits that out for up to ``settle_s``)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from mirror_core.kafka.admin import ClusterAdmin

    admin = ClusterAdmin(cluster.config, timeout_s=settle_s)
    partitions = admin.metadata(topic).topics[topic].partitions
    (answer,) = admin.settled_offsets([{TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}])
    return {tp.partition: info.offset for tp, info in answer.items()}


def findings(report, key: str):
    return [f for f in report.findings if f.key == key]


def test_missing_target_is_created_with_source_partitions_and_configs(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name("src"), 3, {
        "message.timestamp.type": "LogAppendTime", "cleanup.policy": "compact,delete", "retention.ms": "-1",
        "retention.bytes": "123456789", "compression.type": "lz4", "max.message.bytes": "2000000",
        "delete.retention.ms": "1000", "min.compaction.lag.ms": "5", "message.timestamp.after.max.ms": "7200000"})
    ten_days_ago = int(time.time() * 1000) - 10 * DAY  # a LogAppendTime topic replaces these with the append time
    source_cluster.produce(topic, [(b"k%d" % i, b"v", None, ten_days_ago) for i in range(20)])
    dr_topic = target_topic_name(topic, "dr.")

    report = run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=dr_topic)

    assert report.ok and report.created and report.partition_map == {0: 0, 1: 1, 2: 2}
    assert [f.severity for f in report.findings] == [Severity.INFO]  # LogAppendTime source → CreateTime target
    assert target_cluster.admin.list_topics()[dr_topic] == 3
    configs = target_cluster.admin.configs(dr_topic)
    assert configs["message.timestamp.type"] == "CreateTime"
    assert {k: configs[k] for k in ("cleanup.policy", "retention.ms", "retention.bytes", "compression.type",
                                    "max.message.bytes", "delete.retention.ms", "min.compaction.lag.ms",
                                    "message.timestamp.after.max.ms")} == {
        "cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "123456789",
        "compression.type": "lz4", "max.message.bytes": "2000000", "delete.retention.ms": "1000",
        "min.compaction.lag.ms": "5", "message.timestamp.after.max.ms": "7200000"}
    assert end_offsets(target_cluster, dr_topic) == {0: 0, 1: 0, 2: 0}

    again = run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=dr_topic)
    assert again.ok and not again.created and again.create_config is None


def test_smaller_max_message_bytes_refused_and_nothing_written(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 2)
    source_cluster.produce(topic, [(b"k", b"v" * 100)] * 5)
    target_cluster.create_topic(topic, 2, {"max.message.bytes": "65536"})
    before = target_cluster.admin.configs(topic)

    report = run_preflight(source_cluster.config, target_cluster.config, topic)

    (refusal,) = report.refusals
    assert refusal.key == "max.message.bytes" and not report.created
    assert f"cluster 'target' topic '{topic}'" in refusal.message and "raise it by 983052" in refusal.message
    with pytest.raises(PreflightError, match="max.message.bytes is 65536"):
        report.raise_if_refused()
    assert end_offsets(target_cluster, topic) == {0: 0, 1: 0}
    assert target_cluster.admin.configs(topic) == before


def test_observed_batch_size_lets_a_smaller_limit_pass_with_a_warning(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 1)
    target_cluster.create_topic(topic, 1, {"max.message.bytes": "65536"})
    report = run_preflight(source_cluster.config, target_cluster.config, topic, max_batch_bytes=4096)
    assert report.ok and [f.severity for f in findings(report, "max.message.bytes")] == [Severity.WARN]


def test_fewer_target_partitions_refused(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 4)
    target_cluster.create_topic(topic, 2)
    report = run_preflight(source_cluster.config, target_cluster.config, topic)
    assert [f.key for f in report.refusals] == ["partitions"]
    assert "add 2 partition(s) (--partitions 4)" in report.refusals[0].message
    assert target_cluster.admin.list_topics()[topic] == 2


def test_compression_mismatch_warns(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 1, {"compression.type": "zstd"})
    target_cluster.create_topic(topic, 1, {"compression.type": "gzip"})
    report = run_preflight(source_cluster.config, target_cluster.config, topic)
    (warning,) = findings(report, "compression.type")
    assert report.ok and warning.severity is Severity.WARN
    assert (warning.source_value, warning.target_value) == ("zstd", "gzip") and "byte-identical" in warning.message


def test_old_data_beyond_target_before_max_refused_with_numbers(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 2, {"retention.ms": "-1"})
    now = int(time.time() * 1000)
    source_cluster.produce(topic, [(b"k%d" % i, b"v", None, now - 10 * DAY + i) for i in range(10)])
    target_cluster.create_topic(topic, 2, {"message.timestamp.before.max.ms": str(DAY), "retention.ms": "-1"})

    facts = observe_data(source_cluster.config, topic, 2)
    assert facts.oldest_age_ms == pytest.approx(10 * DAY, abs=60_000)
    report = run_preflight(source_cluster.config, target_cluster.config, topic)

    (refusal,) = report.refusals
    assert refusal.key == "message.timestamp.before.max.ms" and refusal.target_value == str(DAY)
    assert "is 86400000 ms (1.0 d)" in refusal.message and "(10.0 d) old" in refusal.message
    assert end_offsets(target_cluster, topic) == {0: 0, 1: 0}


def test_old_data_into_a_new_target_widens_its_timestamp_bound(source_cluster, target_cluster,
                                                                          unique_name):
    topic = source_cluster.create_topic(unique_name(), 1, {"retention.ms": "-1",
                                                           "message.timestamp.before.max.ms": str(30 * DAY)})
    source_cluster.produce(topic, [(b"k", b"v", None, int(time.time() * 1000) - 29 * DAY - DAY // 2)])
    # 29.5 days old plus a day of headroom for the copy to run: the new target's bound exceeds the source's 30 days
    report = run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=unique_name("dr"))
    assert report.ok and report.created
    (widened,) = findings(report, "message.timestamp.before.max.ms")
    assert widened.severity is Severity.INFO and widened.source_value == str(30 * DAY)
    configs = target_cluster.admin.configs(report.target_topic)
    assert int(configs["message.timestamp.before.max.ms"]) == pytest.approx(30 * DAY + DAY // 2, abs=60_000)
    assert configs["retention.ms"] == "-1"


def test_internal_topic_refused_unless_named_explicitly(source_cluster, target_cluster, unique_name):
    dr_topic = unique_name("dr-offsets")
    report = run_preflight(source_cluster.config, target_cluster.config, "__consumer_offsets", target_topic=dr_topic)
    assert [f.key for f in report.refusals] == ["topic"] and "allow_internal=True" in report.refusals[0].message
    assert not target_cluster.admin.exists(dr_topic)

    allowed = run_preflight(source_cluster.config, target_cluster.config, "__consumer_offsets",
                            target_topic=dr_topic, allow_internal=True)
    assert allowed.ok and allowed.created
    assert target_cluster.admin.configs(dr_topic)["cleanup.policy"] == "compact"


def test_missing_source_topic_refused(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    report = run_preflight(source_cluster.config, target_cluster.config, topic)
    assert [f.key for f in report.refusals] == ["topic"] and "does not exist" in report.refusals[0].message
    assert not target_cluster.admin.exists(topic)


@pytest.mark.crossversion
def test_legacy_source_into_new_target(legacy_cluster, target_cluster, unique_name):
    topic = legacy_cluster.create_topic(unique_name(), 2, {"message.timestamp.type": "LogAppendTime"})
    legacy_cluster.produce(topic, [(b"k", b"v")] * 3)
    report = run_preflight(legacy_cluster.config, target_cluster.config, topic, target_topic=unique_name("dr"))
    assert report.ok and report.created
    configs = target_cluster.admin.configs(report.target_topic)
    assert configs["message.timestamp.type"] == "CreateTime"
    assert configs["message.timestamp.after.max.ms"] == str(2**63 - 1)  # 3.9's default, never narrowed


def test_observe_data_right_after_the_topic_is_created(source_cluster, unique_name):
    """A topic created a moment ago: the broker its leader is on answers ListOffsets NOT_LEADER_OR_FOLLOWER until it
    has applied the controller's record (librdkafka's admin ListOffsets does not retry that). Preflight right after
    ``shoal copy`` created a topic must wait that out, not refuse the copy as an unreachable cluster (seen in CI)."""
    for _ in range(5):
        topic = source_cluster.create_topic(unique_name(), 4)
        facts = observe_data(source_cluster.config, topic, 4)
        assert (facts.oldest_timestamp_ms, facts.newest_timestamp_ms) == (None, None)
