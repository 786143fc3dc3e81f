"""Preflight's "oldest data" read through the copy's own wire client (``first_record_timestamps``: one Fetch per
leader) against a real broker: for every shape it answers what preflight's consumer answers — a start inside a
batch, timestamps going backwards, a compressed batch, an aborted transaction's record (read uncommitted), a
partition holding only a marker from its start, LogAppendTime, a start deleted by retention since it was chosen."""

from __future__ import annotations

import time

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.kafka.first_records import first_record_timestamps
from mirror_core.kafka.wire_client import WireClient
from mirror_core.services.preflight import _first_timestamps, observe_data

NOW = int(time.time() * 1000)


def _consumer_reads(cluster, topic: str, starts: dict[int, int]) -> dict[int, int | None]:
    """What preflight's consumer finds, partition by partition (None: nothing from the start on)."""
    out = {}
    for p, start in starts.items():
        found = _first_timestamps(cluster.config, topic, {p: start}, timeout_s=30)
        out[p] = found[0] if found else None
    return out


def test_first_records_match_the_consumer_for_every_shape(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 4)
    # p0: one batch, timestamps going backwards; p1: lz4; p2: an aborted transaction, then its marker only;
    # p3: a record, then three deleted by delete_records from under a start chosen before
    producer = Producer(source_cluster.config.confluent(**{"linger.ms": 50, "enable.idempotence": True}))
    for i, ts in enumerate([NOW - 5000, NOW - 9000, NOW - 1000, NOW - 7000]):
        producer.produce(topic, value=b"p0-%d" % i, partition=0, timestamp=ts)
    producer.flush(10)
    lz4 = Producer(source_cluster.config.confluent(**{"linger.ms": 50, "compression.type": "lz4"}))
    for i in range(50):
        lz4.produce(topic, value=b"x" * 200, partition=1, timestamp=NOW - 60_000 + i)
    lz4.flush(10)
    txn = Producer(source_cluster.config.confluent(**{"transactional.id": f"{topic}.txn"}))
    txn.init_transactions(10)
    txn.begin_transaction()
    txn.produce(topic, value=b"aborted", partition=2, timestamp=NOW - 3000)
    txn.flush(10)
    txn.abort_transaction(10)
    for i in range(5):
        producer.produce(topic, value=b"p3-%d" % i, partition=3, timestamp=NOW - 20_000 + i)
        producer.flush(10)
    admin = AdminClient(source_cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 3, 3)]).values():
        future.result(10)

    starts = {0: 2, 1: 0, 2: 0, 3: 1}
    with WireClient.for_cluster(source_cluster.config) as client:
        ours = first_record_timestamps(client, topic, starts, timeout_s=30)
        assert ours == {0: NOW - 1000, 1: NOW - 60_000, 2: NOW - 3000, 3: NOW - 20_000 + 3}
        assert ours == _consumer_reads(source_cluster, topic, starts)
        only_marker = first_record_timestamps(client, topic, {2: 1}, timeout_s=30)   # offset 1: the abort marker
        assert only_marker == {2: None} == _consumer_reads(source_cluster, topic, {2: 1})

        facts = observe_data(source_cluster.config, topic, 4, start_offsets={0: 2}, client=client)
        by_consumer = observe_data(source_cluster.config, topic, 4, start_offsets={0: 2})
        assert (facts.oldest_timestamp_ms, facts.newest_timestamp_ms) == (
            by_consumer.oldest_timestamp_ms, by_consumer.newest_timestamp_ms)
        assert facts.oldest_timestamp_ms == NOW - 60_000


def test_log_append_time_is_the_brokers(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 1, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    source_cluster.produce(topic, [(b"k", b"v%d" % i, None, NOW - 86_400_000) for i in range(3)], partition=0)
    with WireClient.for_cluster(source_cluster.config) as client:
        ours = first_record_timestamps(client, topic, {0: 1}, timeout_s=30)
    assert ours == _consumer_reads(source_cluster, topic, {0: 1})
    assert ours[0] >= before - 1000   # the broker's append time, not the producer's day-old stamp


def test_batches_larger_than_a_share_still_take_one_round_trip(source_cluster, unique_name, monkeypatch):
    """First batches of ~200 kB on every partition: a Fetch returns a batch over its limits only for the first
    partition of its answer (KIP-74), so one request for all partitions took a round trip per partition (seen over
    the 200 ms link: four rounds for four partitions). Each partition is now asked alone, all in flight together:
    one round, every partition answered."""
    import os

    import mirror_core.kafka.first_records as first_records

    topic = source_cluster.create_topic(unique_name(), 4)
    producer = Producer(source_cluster.config.confluent(**{"linger.ms": 200, "batch.size": 1_000_000,
                                                          "compression.type": "none"}))
    for p in range(4):
        for i in range(200):
            producer.produce(topic, value=os.urandom(1000), partition=p, timestamp=NOW - 10_000 * (p + 1) + i)
    producer.flush(10)
    sent = []
    real = first_records.send_round

    def counting(client, fetchers, **kwargs):
        sent.append([f.partition for f in fetchers])
        return real(client, fetchers, **kwargs)

    monkeypatch.setattr(first_records, "send_round", counting)
    with WireClient.for_cluster(source_cluster.config) as client:
        found = first_record_timestamps(client, topic, dict.fromkeys(range(4), 0), timeout_s=30)
    assert found == {p: NOW - 10_000 * (p + 1) for p in range(4)}
    assert sorted(sent) == [[0], [1], [2], [3]], sent   # one request per partition, one round
