"""One Fetch request per source broker for many partitions (the daemon's fetch round), on real brokers."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.codec.batch_deep import decode_record_tail, read_records
from mirror_core.errors import DataLossError, TopicRecreatedError
from mirror_core.kafka.broker_fetch import RoundStats, fetch_round
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient


@pytest.fixture(params=["fast", "kafka-python"])
def source_client(request, source_cluster):
    """Both request routes: the hand-encoded one (PLAINTEXT) and kafka-python's (what SSL/SASL clusters use)."""
    with WireClient.for_cluster(source_cluster.config, fast_path=request.param == "fast") as client:
        yield client


def values(result) -> list[bytes]:
    return [decode_record_tail(r.tail)[1] for view in result.batches for r in read_records(view)]


def test_one_request_carries_every_partition_and_positions_advance(source_cluster, source_client, unique_name):
    a, b = unique_name("a"), unique_name("b")
    source_cluster.create_topic(a, partitions=3)
    source_cluster.create_topic(b, partitions=2)
    expected = {}
    for topic, partitions in ((a, 3), (b, 2)):
        for p in range(partitions):
            records = [(b"k", f"{topic}-{p}-{i}".encode()) for i in range(20 + p)]
            source_cluster.produce(topic, records, partition=p)
            expected[(topic, p)] = [value for _, value in records]
    fetchers = [RawBatchFetcher(source_client, t, p, 0, None, max_bytes=1 << 20, max_wait_ms=100)
                for t, p in sorted(expected)]
    stats = RoundStats()
    outcomes = fetch_round(source_client, fetchers, max_bytes=8 << 20, max_wait_ms=100, stats=stats)
    assert (stats.rounds, stats.requests, stats.partitions) == (1, 1, 5)  # the sandbox source is one broker
    for fetcher, outcome in zip(fetchers, outcomes, strict=True):
        assert outcome.error is None, outcome.error
        want = expected[(fetcher.topic, fetcher.partition)]
        assert values(outcome.result) == want
        assert fetcher.position == outcome.result.next_offset == len(want)
        assert outcome.result.last_stable_offset == len(want)
    # a second round from the new positions: nothing new, positions stay
    again = fetch_round(source_client, fetchers, max_bytes=8 << 20, max_wait_ms=50, rotation=1, stats=stats)
    assert all(o.error is None and not o.result.batches for o in again)
    assert [f.position for f in fetchers] == [len(expected[(f.topic, f.partition)]) for f in fetchers]
    assert stats.requests == 2


def test_one_partitions_error_stays_with_it(source_cluster, source_client, unique_name):
    """Data deleted before it was read halts that partition (DataLossError with the exact range); a recreated
    topic is reported as such; the other partitions in the same request are served normally."""
    topic, gone = unique_name("ok"), unique_name("gone")
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.create_topic(gone)
    for p in range(2):
        source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(10)], partition=p)
    source_cluster.produce(gone, [(b"k", b"v%d" % i) for i in range(30)], **{"linger.ms": 0, "batch.size": 200})
    admin = AdminClient(source_cluster.config.confluent())
    admin.delete_records([TopicPartition(gone, 0, 12)])[TopicPartition(gone, 0, 12)].result(10)
    fetchers = [RawBatchFetcher(source_client, topic, 0, 0, None), RawBatchFetcher(source_client, gone, 0, 5, None),
                RawBatchFetcher(source_client, topic, 1, 4, None)]
    outcomes = fetch_round(source_client, fetchers, max_bytes=8 << 20, max_wait_ms=100)
    assert isinstance(outcomes[1].error, DataLossError)
    assert outcomes[1].error.lost_range == (5, 12) and fetchers[1].position == 5
    assert len(values(outcomes[0].result)) == 10 and fetchers[0].position == 10
    # from offset 4: the batch holding it comes whole (the copier decides about straddling batches)
    assert outcomes[2].result.batches[0].base_offset <= 4 and values(outcomes[2].result)[-1] == b"v9"
    assert fetchers[2].position == 10

    source_cluster.admin.recreate(gone, 1)
    outcomes = fetch_round(source_client, fetchers[1:], max_bytes=8 << 20, max_wait_ms=100)
    for _ in range(5):  # the old leader entry may answer once with a retriable error before the id is checked
        if not outcomes[0].retriable:
            break
        outcomes = fetch_round(source_client, fetchers[1:], max_bytes=8 << 20, max_wait_ms=100)
    assert isinstance(outcomes[0].error, TopicRecreatedError), outcomes[0].error
    assert outcomes[1].error is None
