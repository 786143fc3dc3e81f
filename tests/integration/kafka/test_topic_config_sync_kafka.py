"""Topic config sync against real brokers: source config changes reach the preflight-created target, and only those
that the mirror copies; the mirror's own choices (CreateTime, widened bounds) survive."""

from __future__ import annotations

import time

import pytest

from mirror_core.errors import TopicConfigSyncError
from mirror_core.kafka.topic_config_sync import ConfigOp, sync_many_topic_configs, sync_topic_configs
from mirror_core.services.preflight import run_preflight

DAY = 86_400_000


def alter(cluster, topic: str, set_: dict[str, str] | None = None, delete: tuple[str, ...] = ()) -> None:
    """Change ``topic``'s configs with a stock AdminClient (not Shoal's code) and wait until the broker serves them."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in (set_ or {}).items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = AdminClient(cluster.config.confluent())  # kept alive until the future resolves
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    wait_until(lambda: all(described(cluster, topic)[k][0] == v for k, v in (set_ or {}).items())
               and not any(described(cluster, topic)[k][1] for k in delete), f"{cluster.name}/{topic} altered")


def described(cluster, topic: str) -> dict[str, tuple[str, bool]]:
    """config → (value, is a topic override), straight from DescribeConfigs."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(cluster.config.confluent())
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {k: (e.value, int(getattr(e.source, "value", e.source)) == 1) for k, e in entries.items()}


def wait_until(condition, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def sync_settled(source_cluster, target_cluster, topic: str, target_topic: str):
    """Sync once, then wait until the target serves what was applied (metadata reaches brokers after the
    controller), so the next describe sees it."""
    changes = sync_topic_configs(source_cluster.config, target_cluster.config, topic, target_topic)
    wait_until(lambda: all(described(target_cluster, target_topic)[c.key] == (c.new_value, c.op is ConfigOp.SET)
                           for c in changes), f"{target_cluster.name}/{target_topic} altered")
    return changes


@pytest.fixture
def mirrored(source_cluster, target_cluster, unique_name):
    """A source topic with overrides, and its target created by preflight."""
    topic = source_cluster.create_topic(unique_name("src"), 2, {
        "retention.ms": "3600000", "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.3",
        "max.message.bytes": "2000000", "message.timestamp.type": "LogAppendTime"})
    source_cluster.produce(topic, [(b"k%d" % i, b"v") for i in range(10)])  # data, and leaders elected
    target_topic = "dr." + topic
    report = run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic)
    assert report.ok and report.created
    return topic, target_topic


def test_target_created_by_preflight_is_in_sync(source_cluster, target_cluster, mirrored):
    topic, target_topic = mirrored
    assert sync_topic_configs(source_cluster.config, target_cluster.config, topic, target_topic) == []
    assert described(target_cluster, target_topic)["message.timestamp.type"][0] == "CreateTime"


def test_source_changes_reach_the_target_and_a_second_sync_does_nothing(source_cluster, target_cluster, mirrored):
    topic, target_topic = mirrored
    alter(source_cluster, topic, {"retention.ms": "7200000", "delete.retention.ms": "1000", "segment.ms": "60000",
                                  "max.message.bytes": "3000000", "min.insync.replicas": "1"},
          delete=("cleanup.policy", "min.cleanable.dirty.ratio"))

    changes = sync_settled(source_cluster, target_cluster, topic, target_topic)

    assert {(c.key, c.old_value, c.new_value, c.op) for c in changes} == {
        ("retention.ms", "3600000", "7200000", ConfigOp.SET),
        ("delete.retention.ms", str(DAY), "1000", ConfigOp.SET),
        ("max.message.bytes", "2000000", "3000000", ConfigOp.SET),
        ("cleanup.policy", "compact", "delete", ConfigOp.DELETE),
        ("min.cleanable.dirty.ratio", "0.3", "0.5", ConfigOp.DELETE)}
    after = described(target_cluster, target_topic)
    assert {k: after[k] for k in ("retention.ms", "delete.retention.ms", "max.message.bytes")} == {
        "retention.ms": ("7200000", True), "delete.retention.ms": ("1000", True),
        "max.message.bytes": ("3000000", True)}
    # the source dropped these overrides: the target's are gone too, back to its broker default
    assert after["cleanup.policy"] == ("delete", False) and after["min.cleanable.dirty.ratio"] == ("0.5", False)
    assert after["message.timestamp.type"][0] == "CreateTime"  # the source is LogAppendTime; never synced back
    assert after["min.insync.replicas"][0] == "1" and after["segment.ms"] == (str(7 * DAY), False)  # not mirrored

    assert sync_topic_configs(source_cluster.config, target_cluster.config, topic, target_topic) == []


def test_removed_source_retention_override_returns_the_target_to_the_default(source_cluster, target_cluster,
                                                                             mirrored):
    topic, target_topic = mirrored
    alter(source_cluster, topic, delete=("retention.ms",))
    source_default = described(source_cluster, topic)["retention.ms"]
    assert source_default == (str(7 * DAY), False)

    (change,) = sync_settled(source_cluster, target_cluster, topic, target_topic)

    assert (change.key, change.old_value, change.new_value) == ("retention.ms", "3600000", str(7 * DAY))
    assert described(target_cluster, target_topic)["retention.ms"][0] == str(7 * DAY)
    assert sync_topic_configs(source_cluster.config, target_cluster.config, topic, target_topic) == []


def test_lowered_source_limits_never_lower_the_target(source_cluster, target_cluster, mirrored):
    topic, target_topic = mirrored
    alter(source_cluster, topic, {"max.message.bytes": "100000", "message.timestamp.before.max.ms": str(DAY)})
    assert sync_topic_configs(source_cluster.config, target_cluster.config, topic, target_topic) == []
    after = described(target_cluster, target_topic)
    assert after["max.message.bytes"][0] == "2000000"
    assert int(after["message.timestamp.before.max.ms"][0]) > DAY


def test_target_flipped_to_log_append_time_is_put_back_to_create_time(source_cluster, target_cluster, mirrored):
    topic, target_topic = mirrored
    alter(target_cluster, target_topic, {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1"})

    changes = sync_settled(source_cluster, target_cluster, topic, target_topic)

    assert sorted(map(str, changes)) == ["message.timestamp.type: LogAppendTime -> CreateTime",
                                         "retention.ms: -1 -> 3600000"]
    after = described(target_cluster, target_topic)
    assert after["message.timestamp.type"][0] == "CreateTime" and after["retention.ms"][0] == "3600000"


def test_missing_topics_and_rejected_changes_raise_naming_cluster_and_topic(source_cluster, target_cluster,
                                                                            unique_name):
    topic = source_cluster.create_topic(unique_name("src"), 1, {"retention.ms": "3600000"})
    with pytest.raises(TopicConfigSyncError, match=f"cluster 'target' topic 'dr.{topic}'.*run preflight"):
        sync_topic_configs(source_cluster.config, target_cluster.config, topic, "dr." + topic)
    with pytest.raises(TopicConfigSyncError, match=f"cluster 'source' topic '{topic}.missing'.*does not exist"):
        sync_topic_configs(source_cluster.config, target_cluster.config, topic + ".missing", "dr." + topic)

    # a target whose broker refuses the value: the source's 4.x "max.compaction.lag.ms" below the target topic's
    # min.compaction.lag.ms is invalid there (Kafka validates max >= min on the target topic)
    target_cluster.create_topic("dr." + topic, 1, {"min.compaction.lag.ms": "600000"})
    alter(source_cluster, topic, {"max.compaction.lag.ms": "300000"})
    with pytest.raises(TopicConfigSyncError) as info:
        sync_topic_configs(source_cluster.config, target_cluster.config, topic, "dr." + topic,
                           exclude=("min.compaction.lag.ms",))
    assert f"cluster 'target' topic 'dr.{topic}'" in str(info.value) and "max.compaction.lag.ms" in str(info.value)
    assert not info.value.retriable
    assert described(target_cluster, "dr." + topic)["retention.ms"][0] != "3600000"  # all or nothing



@pytest.mark.timeout(120)
def test_batched_sync_answers_each_topic_alone(source_cluster, target_cluster, unique_name):
    """The rescan's batched sync (one DescribeConfigs per cluster for all topics): a topic missing on either side
    is named alone, the other topics of the same request are synced."""
    mirrored = []
    for name in ("a", "b"):
        topic = source_cluster.create_topic(unique_name(name), 1, {"retention.ms": "3600000"})
        report = run_preflight(source_cluster.config, target_cluster.config, topic, target_topic="dr." + topic)
        assert report.ok and report.created
        mirrored.append(topic)
    a, b = mirrored
    no_target = source_cluster.create_topic(unique_name("no-target"), 1)
    no_source = unique_name("no-source")
    alter(source_cluster, b, {"retention.ms": "7200000"})
    pairs = [(no_source, "dr." + no_source), (no_target, "dr." + no_target), (a, "dr." + a), (b, "dr." + b)]
    results = sync_many_topic_configs(source_cluster.config, target_cluster.config, pairs)
    assert results[a] == []
    assert [(c.key, c.new_value) for c in results[b]] == [("retention.ms", "7200000")]
    wait_until(lambda: described(target_cluster, "dr." + b)["retention.ms"][0] == "7200000", "dr.b synced")
    for topic, says in ((no_source, f"cluster 'source' topic '{no_source}'"),
                        (no_target, f"cluster 'target' topic 'dr.{no_target}'")):
        assert isinstance(results[topic], TopicConfigSyncError), results[topic]
        assert says in str(results[topic]) and "does not exist" in str(results[topic])
