"""``shoal copy --from/--to`` resolved for all partitions together (``resolve_ranges``) against a real broker: every
kind of position, every refusal naming the cluster, topic, partition and offsets, and the number of ListOffsets
requests — one per spec, not four per partition (over a 200 ms link that was 3.3 s before the first byte)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.config.positions import PositionSpec
from mirror_core.errors import ConfigError, DataLossError
from mirror_core.kafka.resolve_positions import resolve_range, resolve_ranges
from mirror_core.kafka.wire_client import WireClient
from tests.kafka_helpers import count_requests

BASE_MS = (int(time.time()) - 3600) * 1000   # an hour ago: well inside retention (older data would be deleted)
EARLIEST, LATEST = PositionSpec("earliest"), PositionSpec("latest")


def _topic(cluster, name: str) -> str:
    """4 partitions; partition p holds 10 + p records, record i stamped BASE_MS + i seconds."""
    cluster.create_topic(name, partitions=4)
    for p in range(4):
        cluster.produce(name, [(b"k", b"v%d" % i, None, BASE_MS + i * 1000) for i in range(10 + p)], partition=p)
    return name


def test_every_position_kind_resolves_for_all_partitions_in_one_request_per_spec(source_cluster, unique_name):
    topic = _topic(source_cluster, unique_name())
    with WireClient.for_cluster(source_cluster.config) as client:
        client.leader_for(topic, 0)   # metadata known before counting
        sent = count_requests(client)
        assert resolve_ranges(client, topic, [0, 1, 2, 3], EARLIEST, LATEST) == {p: (0, 10 + p) for p in range(4)}
        assert sent.count("ListOffsetsRequest") == 2, sent   # log start and LSO, each one request to the leader
        sent.clear()
        by_time = resolve_ranges(client, topic, [0, 1, 2, 3], PositionSpec("timestamp", BASE_MS + 4500),
                                 PositionSpec("timestamp", BASE_MS + 60_000))
        assert by_time == {p: (5, 10 + p) for p in range(4)}   # first record at/after the time; past the newest: LSO
        assert sent.count("ListOffsetsRequest") == 5, sent   # the LSO before the times, two times, log start, LSO
        assert resolve_ranges(client, topic, [1, 3], PositionSpec("offset", 2), PositionSpec("offset", 7)) == {
            1: (2, 7), 3: (2, 7)}
        assert resolve_range(client, topic, 2, EARLIEST, PositionSpec("offset", 3)) == (0, 3)


def test_refusals_name_the_cluster_topic_partition_and_offsets(source_cluster, unique_name):
    topic = _topic(source_cluster, unique_name())
    admin = AdminClient(source_cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 2, 4)]).values():
        future.result(30)
    with WireClient.for_cluster(source_cluster.config) as client:
        with pytest.raises(ConfigError, match=rf"cluster 'source' {topic}-0: end 11 = offset 11 is past the last "
                                              r"stable offset 10"):
            resolve_ranges(client, topic, [0, 1], EARLIEST, PositionSpec("offset", 11))
        with pytest.raises(ConfigError, match=rf"{topic}-1: end 3 = offset 3 is before start 5 = offset 5"):
            resolve_ranges(client, topic, [1], PositionSpec("offset", 5), PositionSpec("offset", 3))
        with pytest.raises(DataLossError) as lost:
            resolve_ranges(client, topic, [0, 1, 2, 3], PositionSpec("offset", 1), LATEST)
        assert (lost.value.cluster, lost.value.topic, lost.value.partition, lost.value.expected_offset,
                lost.value.log_start_offset) == ("source", topic, 2, 1, 4)
        assert resolve_ranges(client, topic, [0, 1, 2, 3], PositionSpec("offset", 1), LATEST, accept_loss=True) == {
            0: (1, 10), 1: (1, 11), 2: (4, 12), 3: (1, 13)}
        assert resolve_ranges(client, topic, [2], EARLIEST, LATEST) == {2: (4, 12)}
