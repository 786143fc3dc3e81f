"""Raw batch copy against real brokers: RawBatchFetcher reads the source, BatchWriter writes the target, and a
stock confluent-kafka read_committed consumer must see the same records on both sides."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.codec.batch_codec import BatchView
from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.errors import BatchRejectedError, ClusterUnavailableError, DataLossError, ProducerFencedError
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch

pytestmark = pytest.mark.integration


@pytest.fixture
def source(source_cluster):
    with WireClient.for_cluster(source_cluster.config) as client:
        yield client


@pytest.fixture
def target(target_cluster):
    with WireClient.for_cluster(target_cluster.config) as client:
        yield client


def _transactional_producer(cluster, **conf) -> Producer:
    producer = Producer(cluster.config.confluent(**{"transactional.id": f"shoal-test-{uuid.uuid4().hex[:8]}",
                                                    **conf}))
    producer.init_transactions(30)
    return producer


def _transaction(producer: Producer, topic: str, records, *, commit: bool, partition: int = 0) -> None:
    producer.begin_transaction()
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _fill_source(cluster, topic: str, partition: int, tag: str) -> set[bytes]:
    """Plain, compressed, committed-transaction and aborted-transaction records; returns the aborted values."""
    an_hour_ago = int(time.time() * 1000) - 3_600_000     # explicit, but young enough for retention
    cluster.produce(topic, [(b"k%d" % i, b"%s-plain-%d" % (tag.encode(), i), [("h", b"%d" % i)],
                             an_hour_ago + i) for i in range(30)], partition=partition, **{"linger.ms": 5})
    cluster.produce(topic, [(None, b"%s-lz4-%d" % (tag.encode(), i), None, None) for i in range(200)],
                    partition=partition, **{"compression.type": "lz4", "linger.ms": 20})
    txn = _transactional_producer(cluster)
    aborted = [(b"a%d" % i, b"%s-aborted-%d" % (tag.encode(), i), [("x", None)]) for i in range(5)]
    _transaction(txn, topic, [(b"c%d" % i, b"%s-committed-%d" % (tag.encode(), i), [("t", b"1")])
                              for i in range(5)], commit=True, partition=partition)
    _transaction(txn, topic, aborted, commit=False, partition=partition)
    cluster.produce(topic, [(b"z", b"%s-after" % tag.encode(), None, None)], partition=partition)
    _transaction(txn, topic, [(b"c", b"%s-committed-last" % tag.encode(), None)], commit=True,
                 partition=partition)
    txn.flush(10)
    return {value for _, value, _ in aborted}


def _outgoing(topic: str, partition: int, view: BatchView) -> OutgoingBatch:
    """The target-ready copy of a fetched batch (these sources hold only batches that are copied, none skipped)."""
    prepared = prepare_for_target(view)
    assert prepared is not None
    return OutgoingBatch(topic, partition, prepared.data, source_offset=view.base_offset)


def _copy(source: WireClient, target: WireClient, topic: str, partitions: int, *, max_bytes: int) -> dict:
    """Fetch every partition to its last stable offset, then write all batches in one multi-partition call."""
    outgoing, fetched = [], {}
    for partition in range(partitions):
        start = list_offsets(source, topic, partition, "earliest")
        end = list_offsets(source, topic, partition, "last_stable")
        batches = list(RawBatchFetcher(source, topic, partition, start, end, max_bytes=max_bytes))
        fetched[partition] = batches
        outgoing += [_outgoing(topic, partition, b) for b in batches]
    writer = BatchWriter(target)
    offsets = writer.write(outgoing)
    return {"fetched": fetched, "offsets": offsets, "outgoing": outgoing}


def test_committed_records_reach_the_target_identical_and_in_order(source_cluster, target_cluster, source, target,
                                                                   unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic, partitions=2)
    target_cluster.create_topic(topic, partitions=2)
    aborted = _fill_source(source_cluster, topic, 0, "p0") | _fill_source(source_cluster, topic, 1, "p1")

    copied = _copy(source, target, topic, 2, max_bytes=2048)     # small fetches: truncated tails every time

    expected = source_cluster.read_all(topic)
    actual = target_cluster.read_all(topic)
    assert len(expected) == 2 * (30 + 200 + 5 + 1 + 1)
    for partition in (0, 1):
        want = [r.content() for r in expected if r.partition == partition]
        got = [r.content() for r in actual if r.partition == partition]
        assert got == want
    assert not aborted & {r.value for r in actual}
    # Batches are copied whole, so target offsets advance by each batch's record count.
    for partition in (0, 1):
        offs = [o for o, b in zip(copied["offsets"], copied["outgoing"], strict=True) if b.partition == partition]
        counts = [b.records_count for b in copied["fetched"][partition]]
        assert offs == [sum(counts[:i]) for i in range(len(counts))]
    assert all(not b.control for batches in copied["fetched"].values() for b in batches)


def test_fetch_starting_inside_a_batch_yields_that_batch_once(source_cluster, source, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(None, b"v%d" % i) for i in range(50)], **{"linger.ms": 50,
                                                                             "batch.num.messages": 50})
    fetcher = RawBatchFetcher(source, topic, 0, 25, 50)
    batches = list(fetcher)
    assert batches[0].base_offset <= 25 < batches[0].next_offset
    assert [b.base_offset for b in batches] == sorted({b.base_offset for b in batches})
    assert fetcher.position >= 50


def test_deleted_source_data_halts_with_the_lost_range(source_cluster, source, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(None, b"v%d" % i) for i in range(10)])
    admin = AdminClient(source_cluster.config.confluent())
    result = admin.delete_records([TopicPartition(topic, 0, 6)])
    for future in result.values():
        future.result(30)

    with pytest.raises(DataLossError) as info:
        list(RawBatchFetcher(source, topic, 0, 0, 10))
    assert info.value.lost_range == (0, 6)
    assert (info.value.cluster, info.value.topic, info.value.partition) == (source_cluster.name, topic, 0)


def test_last_stable_offset_stops_before_an_open_transaction(source_cluster, source, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(None, b"before%d" % i) for i in range(3)])
    producer = _transactional_producer(source_cluster)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    try:
        assert list_offsets(source, topic, 0, "last_stable") == 3
        assert list_offsets(source, topic, 0, "latest") == 4
        assert list_offsets(source, topic, 0, "earliest") == 0
        result = RawBatchFetcher(source, topic, 0, 0).fetch()
        assert result.last_stable_offset == 3 and result.next_offset == 3
    finally:
        producer.abort_transaction(30)


def test_target_rejection_names_partition_and_source_offset(source_cluster, target_cluster, source, target,
                                                            unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    target_cluster.create_topic(topic, config={"max.message.bytes": "1024"})
    source_cluster.produce(topic, [(None, b"x" * 4000)])
    batch = next(iter(RawBatchFetcher(source, topic, 0, 0, 1)))

    with pytest.raises(BatchRejectedError) as info:
        BatchWriter(target).write([_outgoing(topic, 0, batch)])
    assert (info.value.topic, info.value.partition, info.value.source_offset) == (topic, 0, 0)
    assert "MESSAGE_SIZE_TOO_LARGE" in str(info.value) and "'target'" in str(info.value)


def test_transactional_writer_commits_aborts_and_is_fenced(source_cluster, target_cluster, source, target,
                                                          unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    target_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(4)], **{"linger.ms": 0})
    batches = list(RawBatchFetcher(source, topic, 0, 0, 4))
    out = [_outgoing(topic, 0, b) for b in batches]
    txn_id = f"shoal.test.{uuid.uuid4().hex[:8]}"

    writer = BatchWriter(target, transactional_id=txn_id)
    writer.begin_transaction()
    writer.write(out[:1])
    writer.abort_transaction()
    writer.begin_transaction()
    writer.write(out)
    writer.commit_transaction()
    assert [r.value for r in target_cluster.read_all(topic)] == [b"v%d" % i for i in range(4)]

    successor = BatchWriter(target, transactional_id=txn_id)
    successor.init_producer_id()
    writer.begin_transaction()
    with pytest.raises(ProducerFencedError):
        writer.write(out)


@pytest.mark.security
def test_sasl_ssl_reads_and_a_wrong_password_fails_fast(secure_source_cluster, source_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(None, b"secret-data")])
    settings = dict(secure_source_cluster.config.settings)
    with WireClient(secure_source_cluster.name, settings) as client:
        assert [b.records_count for b in RawBatchFetcher(client, topic, 0, 0, 1)] == [1]

    settings["sasl.password"] = "not-the-password-0451"
    with pytest.raises(ClusterUnavailableError) as info:
        WireClient(secure_source_cluster.name, settings, bootstrap_timeout_ms=15_000)
    assert not info.value.retriable
    assert secure_source_cluster.name in str(info.value) and "authentication" in str(info.value)
    assert "not-the-password-0451" not in str(info.value)


def test_unreachable_bootstrap_is_a_retriable_cluster_error():
    with pytest.raises(ClusterUnavailableError) as info:
        WireClient("nowhere", {"bootstrap.servers": "127.0.0.1:1"}, bootstrap_timeout_ms=1500)
    assert info.value.retriable and "'nowhere'" in str(info.value)


@pytest.mark.crossversion
def test_copy_from_a_kafka_39_source(legacy_cluster, target_cluster, target, unique_name):
    topic = unique_name()
    legacy_cluster.create_topic(topic)
    target_cluster.create_topic(topic)
    aborted = _fill_source(legacy_cluster, topic, 0, "legacy")
    with WireClient.for_cluster(legacy_cluster.config) as legacy:
        _copy(legacy, target, topic, 1, max_bytes=4096)
    expected = [r.content() for r in legacy_cluster.read_all(topic)]
    assert [r.content() for r in target_cluster.read_all(topic)] == expected
    assert len(expected) == 237 and not aborted & {c[1] for c in expected}


@pytest.mark.parametrize("cluster", ["source_cluster", "secure_source_cluster"])
def test_a_client_starts_on_one_connection_to_its_bootstrap_broker(cluster, request):
    """The first contact (a refused login fails fast) used to be closed and the bootstrap to connect again: two TCP,
    TLS and SASL set-ups before the first Metadata, ~1.2 s more over a 200 ms link with SASL_SSL. Now the bootstrap
    asks over the first contact's connection; the client then talks to the brokers by id, as before."""
    from kafka.net.manager import KafkaConnectionManager

    built = []
    original = KafkaConnectionManager._build_transport

    async def counted(self, node, timeout_at=None):
        built.append(node.node_id)
        return await original(self, node, timeout_at=timeout_at)

    config = request.getfixturevalue(cluster).config
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KafkaConnectionManager, "_build_transport", counted)
        with WireClient.for_cluster(config) as client:
            assert [str(n) for n in built] == ["bootstrap-0"], built
            assert client.topic_metadata("__consumer_offsets", refresh=True).partitions   # by node id from here
            assert len(built) == 2 and not str(built[1]).startswith("bootstrap"), built


def test_fast_connections_made_ahead_are_the_ones_used_and_closed_with_the_client(source_cluster, unique_name):
    """``shoal copy`` starts its leaders' fast connections while it resolves ranges and runs preflight (a set-up
    costs ~1 s over a 200 ms link with SASL_SSL): the copy then reads through exactly those, a set-up that failed
    is made again where the connection is first used, and one never used is closed with the client."""
    topic = source_cluster.create_topic(unique_name(), 1)
    source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(5)])
    with WireClient.for_cluster(source_cluster.config) as client:
        leader = client.topic_metadata(topic, refresh=True).partitions[0].leader
        client.prepare_fast_connections([leader])
        prepared = client._preparing[(leader, 0)].result(timeout=30)
        fetched = RawBatchFetcher(client, topic, 0, 0, 5)
        while not fetched.done:
            fetched.fetch()
        assert client.fast_connection(leader) is prepared and not prepared.closed

    with WireClient.for_cluster(source_cluster.config) as client:
        failing = client._new_fast_connection

        def refused_once(node_id, broker, timeout_s):
            client._new_fast_connection = failing   # the next set-up (where it is used) is the real one
            raise ConnectionRefusedError("refused while made ahead")

        client._new_fast_connection = refused_once
        client.prepare_fast_connections([leader])
        conn = client.fast_connection(leader)
        assert conn is not None and not conn.closed

    with WireClient.for_cluster(source_cluster.config) as client:
        attempts = []

        def refused_for_good(node_id, broker, timeout_s):
            attempts.append(node_id)
            raise ClusterUnavailableError("source", "b:1", "authentication failed", retriable=False)

        client._new_fast_connection = refused_for_good
        client.prepare_fast_connections([leader])
        with pytest.raises(ClusterUnavailableError, match="authentication failed"):
            client.fast_connection(leader)
        assert attempts == [leader]   # a refused login is not tried again where the connection is used

    with WireClient.for_cluster(source_cluster.config) as client:
        client.prepare_fast_connections([leader])
        unused = client._preparing[(leader, 0)].result(timeout=30)
    assert unused.closed
