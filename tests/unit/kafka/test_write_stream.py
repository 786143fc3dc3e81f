"""A write given a batch at a time (``BatchWriter.stream``, ``WriteStream``) against the same write given whole
(``BatchWriter.write``): the broker gets the same Produce requests, byte for byte and in the same order, and the
same base offsets come back; refusals mid-stream are resent in order when the stream is finished; a stream given
up (``settle``) leaves the writer's sequences where the broker's are, so the writer's next write lands right after.

The broker is the scripted cluster of ``test_writer_fast_route_faults`` (real sockets, Kafka's idempotence rules),
recording every Produce frame it receives (as in ``test_writer_one_partition``)."""

from __future__ import annotations

import contextlib
import time

import kafka.errors as Errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirror_core.codec.batch_codec import parse_batch
from mirror_core.errors import MirrorError, PartitionUnavailableError, WriteOrderError
from mirror_core.kafka import produce_pipeline
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch
from tests.unit.kafka import test_writer_fast_route_faults as faults
from tests.unit.kafka.test_kafka_wire_pure import make_batch

pytestmark = pytest.mark.timeout(120)

NOT_LEADER = Errors.NotLeaderForPartitionError.errno
_PARSE_PRODUCE = faults._parse_produce


@contextlib.contextmanager
def _target(script: list | None = None, topic: str = "t"):
    """(scripted broker, a BatchWriter on it) for partition ``topic``-0, closed afterwards."""
    tp = (topic, 0)
    cluster = faults.Cluster({tp: 1}, {tp: list(script or [])})
    client = faults.FastClient(cluster)
    try:
        yield cluster, BatchWriter(client, retry_timeout_s=10)
    finally:
        client.close()
        cluster.close()


def _batches(topic: str, counts: list[int], first_offset: int = 0) -> list[OutgoingBatch]:
    offset, batches = first_offset, []
    for count in counts:
        batches.append(OutgoingBatch(topic, 0, make_batch(offset, count), source_offset=offset))
        offset += count
    return batches


def _recorded(monkeypatch, *, streamed: bool, counts: list[int], script: list, max_inflight_bytes: int,
              loop: bool = True, topic: str = "t"):
    """Write one partition's batches (``counts`` records each) whole or streamed; returns the Produce frames the
    broker received, the base offsets and what the broker holds."""
    frames: list[bytes] = []

    def recording(frame):
        frames.append(bytes(frame))
        return _PARSE_PRODUCE(frame)

    monkeypatch.setattr(faults, "_parse_produce", recording)
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
    tp = (topic, 0)
    batches = _batches(topic, counts)
    cluster = faults.Cluster({tp: 1}, {tp: list(script)})
    client = faults.FastClient(cluster)
    try:
        writer = BatchWriter(client, retry_timeout_s=10, max_inflight_bytes=max_inflight_bytes)
        if streamed:
            stream = writer.stream()
            for batch in batches:
                stream.add(batch)
            results = stream.finish()
        else:
            results = writer.write(batches)
        return frames, results, list(cluster.log.get(tp, []))
    finally:
        client.close()
        cluster.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=24),
       refused_first=st.integers(0, 2),
       max_inflight_bytes=st.sampled_from([1, 200, 500, 8 * 1024 * 1024]),
       loop=st.booleans(),
       topic=st.sampled_from(["t", "a-topic.name_" + "x" * 120]))
def test_a_streamed_write_sends_the_whole_writes_requests_byte_for_byte(
        monkeypatch, counts, refused_first, max_inflight_bytes, loop, topic):
    script = [NOT_LEADER] * refused_first
    whole = _recorded(monkeypatch, streamed=False, counts=counts, script=script,
                      max_inflight_bytes=max_inflight_bytes, loop=loop, topic=topic)
    streamed = _recorded(monkeypatch, streamed=True, counts=counts, script=script,
                         max_inflight_bytes=max_inflight_bytes, loop=loop, topic=topic)
    assert streamed[0] == whole[0]                  # the same requests, byte for byte, in the same order
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    assert streamed[1] == whole[1] == offsets      # the same base offsets
    assert streamed[2] == whole[2] == list(range(sum(counts)))   # each record once, in order


def test_the_stream_sends_before_it_is_finished(monkeypatch):
    """The point of it: the broker has the first batches while the caller is still giving the rest (after the
    first acknowledgement, which the first batch waits for alone)."""
    frames: list[bytes] = []

    def recording(frame):
        frames.append(bytes(frame))
        return _PARSE_PRODUCE(frame)

    monkeypatch.setattr(faults, "_parse_produce", recording)
    tp = ("t", 0)
    with _target() as (cluster, writer):
        stream = writer.stream()
        for batch in _batches("t", [1] * 30):
            stream.add(batch)
            time.sleep(0.002)                                # the caller preparing the next batch
        deadline = time.monotonic() + 5
        while len(cluster.log.get(tp, [])) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(cluster.log.get(tp, [])) >= 5     # written before finish was called
        assert stream.finish() == list(range(30))


def test_refusals_mid_stream_are_resent_in_order_at_finish(monkeypatch):
    frames, results, log = _recorded(
        monkeypatch, streamed=True, counts=[1] * 40, max_inflight_bytes=8 << 20,
        script=[0, 0, NOT_LEADER, 0, 0, Errors.NotEnoughReplicasError.errno, 0, 0, 0, 0, 0, 0, NOT_LEADER])
    assert log == list(range(40)) and results == list(range(40))


def test_a_stream_halts_with_write_order_error_when_the_broker_lost_our_state(monkeypatch):
    with pytest.raises(WriteOrderError):
        _recorded(monkeypatch, streamed=True, counts=[1] * 12, script=[0, 0, "forget"], max_inflight_bytes=8 << 20)


@pytest.mark.parametrize("given_before_settle", [1, 3, 17])
def test_a_settled_stream_leaves_the_writer_where_the_broker_is(monkeypatch, given_before_settle):
    """The caller fails after giving some batches: settle takes the answers in flight and sends nothing more; the
    writer's next write (the copy retried from where it was acknowledged) lands right behind, each batch once."""
    tp = ("t", 0)
    with _target() as (cluster, writer):
        batches = _batches("t", [2] * 20)
        stream = writer.stream()
        for batch in batches[:given_before_settle]:
            stream.add(batch)
        stream.settle()
        landed = list(cluster.log.get(tp, []))                 # the offsets of the records written
        time.sleep(0.3)
        assert cluster.log.get(tp, []) == landed                # settle waited for every request in flight
        assert landed                                           # the last batch given was in flight at least
        written = len(landed) // 2                              # batches
        assert landed == list(range(2 * written))               # a prefix, in order
        assert writer._next_seq[tp] == 2 * written             # the writer's sequence is the broker's
        with pytest.raises(MirrorError):
            stream.add(batches[given_before_settle])             # a settled stream takes nothing more
        rest = _batches("t", [2] * (20 - written), first_offset=2 * written)
        assert writer.write(rest) == [2 * i for i in range(written, 20)]
        assert cluster.log[tp] == list(range(40))
        sequences = sorted({parse_batch(bytes(b.data)).base_sequence for b in rest})
        assert sequences[0] == 2 * written


def test_a_finished_stream_takes_nothing_more(monkeypatch):
    with _target() as (_, writer):
        stream = writer.stream()
        batches = _batches("t", [1, 1])
        stream.add(batches[0])
        assert stream.finish() == [0]
        with pytest.raises(MirrorError):
            stream.add(batches[1])
        with pytest.raises(MirrorError):
            stream.finish()
        stream.settle()                                         # nothing to do, never raises


def test_a_batch_that_cannot_be_written_leaves_the_stream_open_to_settle(monkeypatch):
    tp = ("t", 0)
    with _target() as (cluster, writer):
        stream = writer.stream()
        good = _batches("t", [1, 1, 1])
        for batch in good:
            stream.add(batch)
        bad = OutgoingBatch("t", 0, bytearray(make_batch(3, 1)[:30]), source_offset=3)
        with pytest.raises(ValueError):
            stream.add(bad)
        stream.settle()
        landed = list(cluster.log[tp])                          # the first alone until acknowledged, then more
        time.sleep(0.2)
        assert cluster.log[tp] == landed == list(range(len(landed))) and landed
        assert writer._next_seq[tp] == len(landed)


def test_a_stream_given_up_with_a_request_unanswered_renews_the_producer_before_the_next_write(monkeypatch):
    """The connection drops after the broker wrote a batch and before its answer: the writer cannot know its
    sequence any more (the broker is one batch ahead), so its next write takes a new producer id first — never a
    sequence the broker would answer as a duplicate of that batch (the next batch acknowledged, not written).
    (Found by review: the writer kept its old sequence, and a one-record batch after it was lost.)"""
    tp = ("t", 0)
    with _target([0, 0, 0, "reset"]) as (cluster, writer):
        stream = writer.stream()
        for i in range(4):
            stream.add(OutgoingBatch("t", 0, make_batch(i, 1), source_offset=i))
            time.sleep(0.05)                                # the answers come and are taken by the next add
        assert stream.settle() is None
        assert cluster.log[tp] == [0, 1, 2, 3]              # the fourth landed, its answer never came
        assert writer._sequences_unknown
        producer = writer.producer_id
        assert writer.write([OutgoingBatch("t", 0, make_batch(100, 1), source_offset=100)]) == [4]
        assert cluster.log[tp] == [0, 1, 2, 3, 100]         # written, not taken for a duplicate
        assert writer.producer_id != producer and not writer._sequences_unknown


def test_a_stream_settled_with_every_batch_acknowledged_keeps_the_producer(monkeypatch):
    tp = ("t", 0)
    with _target() as (cluster, writer):
        stream = writer.stream()
        stream.add(OutgoingBatch("t", 0, make_batch(0, 1), source_offset=0))
        assert stream.settle() is None
        assert cluster.log[tp] == [0] and not writer._sequences_unknown
        producer = writer.producer_id
        assert writer.write([OutgoingBatch("t", 0, make_batch(1, 1), source_offset=1)]) == [1]
        assert writer.producer_id == producer


@pytest.mark.parametrize("via", ["finish", "write"])
def test_a_write_given_up_after_an_unanswered_request_renews_the_producer_before_the_next(via):
    """The broker writes a batch, the connection drops before its answer, every resend is refused until the retry
    window ends: the write raises, and the writer's next write takes a new producer id first instead of a sequence
    the broker would take for a duplicate of that batch (then the next batch would be acknowledged and not
    written). (Found by the second review: the retry path gave up without marking the writer.)"""
    with _target([0, "reset"] + [NOT_LEADER] * 200) as (cluster, writer):
        writer.retry_timeout_s = 0.6
        batches = _batches("t", [1, 1])
        with pytest.raises(PartitionUnavailableError):
            if via == "finish":
                stream = writer.stream()
                for batch in batches:
                    stream.add(batch)
                stream.finish()
            else:
                writer.write(batches)
        cluster.script[("t", 0)] = []
        assert writer._sequences_unknown
        assert writer.write([OutgoingBatch("t", 0, make_batch(100, 1), source_offset=100)]) == [2]
        assert cluster.log[("t", 0)] == [0, 1, 100]


def test_a_transaction_holding_a_write_of_unknown_outcome_is_not_committed_nor_written_to():
    writer = BatchWriter(None, transactional_id="lane-x")
    writer.producer_id, writer.producer_epoch = 7, 0
    writer._in_txn, writer._sequences_unknown = True, True
    with pytest.raises(MirrorError, match="abort it instead of committing"):
        writer.commit_transaction()
    with pytest.raises(MirrorError, match="abort the transaction before writing again"):
        writer.write(_batches("t", [1]))
    with pytest.raises(MirrorError, match="abort the transaction before writing again"):
        writer.stream()
