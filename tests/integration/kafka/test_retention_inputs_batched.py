"""Retention inputs gathered in batches (issue #18: the daemon's retention watch cost ~4 CPU-s per assessment at
2,000 idle lanes, four to five round trips per partition). Against the real source broker: the batched log
starts, log ends and newest timestamps equal what the per-partition look-ups answer; the log-start probe is kept
between assessments and sent again only when the log start moved."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.kafka.list_offsets import list_offsets, newest_timestamp
from mirror_core.kafka.retention_inputs import OldestTimestamps, gather_inputs
from mirror_core.kafka.wire_client import WireClient


@pytest.mark.timeout(90)
def test_batched_inputs_match_per_partition_lookups_and_the_oldest_probe_is_kept(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 3)
    base_ts = int(time.time() * 1000) - 60_000  # recent: retention must not touch these records
    for p in range(3):  # partition 2 stays empty; 0 and 1 get records with distinct timestamps
        if p < 2:
            source_cluster.produce(topic, [(b"k", b"v" * 100, None, base_ts + 1000 * p + i) for i in range(5 + p)],
                                   partition=p)
    cluster = source_cluster.config
    parts = {topic: [0, 1, 2]}
    positions = {(topic, 0): 2, (topic, 1): 6, (topic, 2): 0}
    oldest = OldestTimestamps()

    first = {(s.topic, s.partition): s for s in gather_inputs(cluster, parts, positions, oldest=oldest).snapshots}
    with WireClient.for_cluster(cluster) as client:
        for p in range(3):
            s = first[(topic, p)]
            assert (s.log_start, s.log_end) == (list_offsets(client, topic, p, "earliest"),
                                                list_offsets(client, topic, p, "latest")), s
            assert s.newest_ts == (newest_timestamp(client, topic, p) if s.log_end > s.log_start else None), s
    assert (first[(topic, 0)].log_end, first[(topic, 1)].log_end, first[(topic, 2)].log_end) == (5, 6, 0)
    assert first[(topic, 0)].newest_ts == base_ts + 4 and first[(topic, 1)].newest_ts == base_ts + 1005
    assert oldest.probes == 2  # the two partitions with data

    second = {(s.topic, s.partition): s for s in gather_inputs(cluster, parts, positions, oldest=oldest).snapshots}
    assert oldest.probes == 2  # nothing moved: no log-start probe sent again
    assert second[(topic, 0)].ingest_bytes_per_s > 0 and second[(topic, 1)].ingest_bytes_per_s > 0

    admin = AdminClient(cluster.confluent())
    for future in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
        future.result(30)
    third = {(s.topic, s.partition): s for s in gather_inputs(cluster, parts, positions, oldest=oldest).snapshots}
    assert third[(topic, 0)].log_start == 3
    assert oldest.probes == 3  # partition 0's log start moved: probed again, partition 1 still kept

    # the topic deleted and created again under its name: log start 0 again, other data — nothing kept is used
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.time() + 30
    while topic in admin.list_topics(timeout=10).topics and time.time() < deadline:
        time.sleep(0.2)
    source_cluster.create_topic(topic, 3)
    fresh_ts = int(time.time() * 1000) - 1000
    for p in range(2):
        source_cluster.produce(topic, [(b"k", b"w" * 100, None, fresh_ts + i) for i in range(4)], partition=p)
    deadline = time.time() + 30
    while True:  # the new topic's leaders known to a fresh client
        try:
            gather_inputs(cluster, parts, positions)
            break
        except Exception:  # noqa: BLE001 - not there yet
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    before = oldest.probes
    gather_inputs(cluster, parts, {}, oldest=oldest)
    assert oldest.probes == before + 2, "the recreated topic's log starts were not probed again"


@pytest.mark.timeout(60)
def test_prune_floors_from_batched_log_starts_match_per_partition_lookups(source_cluster, unique_name):
    from mirror_core.kafka.prune_inputs import gather_prune_floors

    topic = source_cluster.create_topic(unique_name(), 3)
    for p in range(2):
        source_cluster.produce(topic, [(b"k", b"v" * 50) for _ in range(6)], partition=p)
    cluster = source_cluster.config
    admin = AdminClient(cluster.confluent())
    for future in admin.delete_records([TopicPartition(topic, 1, 4)]).values():
        future.result(30)
    with WireClient.for_cluster(cluster) as client:
        floors = gather_prune_floors(cluster, client, [(topic, 0), (topic, 1), (topic, 2)])
        expected = {(topic, p): list_offsets(client, topic, p, "earliest") for p in range(3)}
    assert floors == expected == {(topic, 0): 0, (topic, 1): 4, (topic, 2): 0}  # no group holds these partitions
