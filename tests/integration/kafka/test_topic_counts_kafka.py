"""The rescan's Metadata decoder and its connection against real brokers (issue #18 review): every Metadata version
the Kafka 4.x source and the Kafka 3.9 legacy broker speak reads, frame for frame, what kafka-python's full decoder
reads; the metadata connection dying between two rescans is replaced, and a topic created or grown meanwhile is
seen by the next call."""

from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka.protocol.metadata import MetadataResponse

from mirror_core.kafka import topic_counts as tc
from mirror_core.kafka.wire_client import WireClient


def _every_version_decodes_like_kafka_python(cluster) -> list[int]:
    spoken = []
    with WireClient.for_cluster(cluster.config) as client:
        conn, _ = client.metadata_connection()
        top = min(conn.api_versions[tc.API_METADATA][1], tc.METADATA_VERSIONS[1])
        for version in range(tc.METADATA_VERSIONS[0], top + 1):
            full = {}

            def decode(frame, version=version, full=full):
                answer = MetadataResponse.decode(bytes(frame), version=version)
                full["counts"] = {t.name: len(t.partitions) for t in answer.topics if not t.error_code}
                full["errors"] = {t.name: t.error_code for t in answer.topics if t.error_code}
                return tc.decode_topic_counts(version, frame)

            future = conn.send_encoded(tc.metadata_request(), version, decode,
                                       flexible_response=version >= tc.METADATA_FLEXIBLE)
            conn.wait(future)
            assert not future.failed(), (version, future.exception)
            assert (future.value.counts, future.value.errors) == (full["counts"], full["errors"]), version
            assert future.value.counts, version                     # the sandbox always has topics
            spoken.append(version)
    return spoken


@pytest.mark.timeout(60)
def test_every_metadata_version_of_a_kafka_4_broker(source_cluster):
    assert _every_version_decodes_like_kafka_python(source_cluster) == list(range(1, 14))


@pytest.mark.crossversion
@pytest.mark.timeout(60)
def test_every_metadata_version_of_a_kafka_39_broker(legacy_cluster):
    assert _every_version_decodes_like_kafka_python(legacy_cluster) == list(range(1, 13))


@pytest.mark.timeout(60)
def test_a_metadata_connection_that_died_between_rescans_is_replaced(source_cluster, unique_name):
    topic = unique_name()
    admin = AdminClient(source_cluster.config.confluent())
    with WireClient.for_cluster(source_cluster.config) as client:
        assert topic not in tc.list_topic_counts(client)
        dead, _ = client.metadata_connection()
        dead._sock.shutdown(socket.SHUT_RDWR)                       # gone while idle, the client not told
        source_cluster.create_topic(topic, 2)
        deadline = time.monotonic() + 15
        while (counts := tc.list_topic_counts(client)).get(topic) != 2:
            assert time.monotonic() < deadline, counts.get(topic)
            time.sleep(0.1)
        assert client.metadata_connection()[0] is not dead
        admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=30)
        while (counts := tc.list_topic_counts(client)).get(topic) != 5:
            assert time.monotonic() < deadline, counts.get(topic)
            time.sleep(0.1)
