"""The sandbox clusters are real, independent Kafka brokers: round trips, versions, security."""

from __future__ import annotations

import time

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka.probe import probe_cluster

# Recent timestamps: the sandbox checks retention every second, so week-old records would vanish mid-test.
NOW = int(time.time() * 1000)
RECORDS = [(f"k{i}".encode(), f"value-{i}".encode(), [("h", f"{i}".encode())], NOW - 60_000 + i)
           for i in range(50)]


def _round_trip(cluster, topic: str) -> None:
    cluster.create_topic(topic, partitions=1)
    assert cluster.produce(topic, RECORDS, **{"compression.type": "lz4"}) == len(RECORDS)
    got = cluster.read_all(topic)
    assert [r.content() for r in got] == [(k, v, tuple(h), ts) for k, v, h, ts in RECORDS]
    assert [r.offset for r in got] == list(range(len(RECORDS)))


def test_source_and_target_are_independent_clusters(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    _round_trip(source_cluster, topic)
    assert not target_cluster.admin.exists(topic), "a topic created on source must not exist on target"
    src, tgt = probe_cluster(source_cluster.config), probe_cluster(target_cluster.config)
    assert src.cluster_id and tgt.cluster_id and src.cluster_id != tgt.cluster_id
    assert src.brokers != tgt.brokers


def test_round_trip_on_target(target_cluster, unique_name):
    _round_trip(target_cluster, unique_name())


def test_api_versions_and_finalized_features(source_cluster, target_cluster, legacy_cluster):
    for cluster in (source_cluster, target_cluster):
        probe = probe_cluster(cluster.config)
        # Kafka 4.x dropped Fetch v0-v3 (KIP-896) and finalizes KIP-890 transactions.
        assert probe.api_versions["Fetch"][0] >= 4
        assert probe.api_versions["Fetch"][1] >= 18
        assert probe.api_versions["Produce"][1] >= 12
        assert probe.finalized_features["metadata.version"][1] > 21
        assert probe.finalized_features.get("transaction.version", (0, 0))[1] >= 2
    legacy = probe_cluster(legacy_cluster.config)
    assert legacy.finalized_features["metadata.version"] == (21, 21)  # 3.9-IV0
    assert "transaction.version" not in legacy.finalized_features
    assert legacy.api_versions["Fetch"] == (0, 17)
    assert legacy.api_versions["Produce"][1] == 11


@pytest.mark.crossversion
def test_round_trip_on_kafka_39(legacy_cluster, unique_name):
    _round_trip(legacy_cluster, unique_name())


@pytest.mark.security
def test_round_trip_through_sasl_ssl_scram(secure_source_cluster, source_cluster, unique_name):
    assert secure_source_cluster.config.settings["security.protocol"] == "SASL_SSL"
    topic = unique_name()
    _round_trip(secure_source_cluster, topic)
    # the same broker, seen through its PLAINTEXT listener
    assert source_cluster.admin.exists(topic)


@pytest.mark.security
def test_wrong_scram_password_fails_with_a_clear_message(secure_source_cluster):
    settings = dict(secure_source_cluster.config.settings, **{"sasl.password": "not-the-password"})
    with pytest.raises(ClusterUnavailableError) as info:
        probe_cluster(ClusterConfig("source-secure", settings), timeout_s=10)
    message = str(info.value)
    assert "source-secure" in message and "authentication failed" in message and "'shoal'" in message
    assert "not-the-password" not in message
    assert info.value.retriable is False
