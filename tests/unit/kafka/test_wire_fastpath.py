"""The hand-encoded hot path (mirror_core.codec.*_messages, sent by mirror_core.kafka.fast_connection) is
byte-identical to kafka-python's own encoding.

Requests: for many generated inputs and every version we speak, the concatenated buffers equal kafka-python's
``encode(framed=True, header=True)`` of the same request (for Fetch: the very request RawBatchFetcher builds).
Responses: kafka-python encodes a generated response (tagged fields included), our decoder reads the same values.
Plus the connection's in-order matching, partial sends and failure handling against a local socket pair.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from mirror_core.codec.fetch_messages import (
    FetchPartitionSpec,
    FetchTopicSpec,
    decode_fetch_response,
    encode_fetch_request,
)
from mirror_core.codec.kafka_primitives import API_VERSIONS, Reader
from mirror_core.codec.produce_messages import (
    _PRODUCE_TEMPLATES,
    _TEMPLATES_MAX,
    API_PRODUCE,
    _decode_one_partition,
    _decode_produce_general,
    _encode_produce_general,
    decode_produce_response,
    encode_produce_request,
)
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.fetch_requests import diverging_epoch, kafka_python_fetch_request
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.response_frames import RECV_BUFFER

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
ascii_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=30)
i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
records = st.one_of(st.binary(min_size=0, max_size=300), st.binary(min_size=0, max_size=40).map(bytearray))
topic_data = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 2**31 - 1), records), min_size=1,
                                                max_size=4, unique_by=lambda p: p[0])),
                      min_size=1, max_size=3, unique_by=lambda t: t[0])


def _kafka_python_request(request, version: int, correlation_id: int, client_id: str | None) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(framed=True, header=True))


# -- Produce ----------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 11), correlation_id=st.integers(0, 2**31 - 1),
       client_id=st.one_of(st.none(), names), transactional_id=st.one_of(st.none(), names),
       acks=st.sampled_from([-1, 0, 1]), timeout_ms=i32, data=topic_data)
def test_produce_request_is_byte_identical(version, correlation_id, client_id, transactional_id, acks, timeout_ms,
                                           data):
    Topic = ProduceRequest.TopicProduceData
    theirs = ProduceRequest(
        transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
        topic_data=[Topic(name=t, partition_data=[Topic.PartitionProduceData(index=i, records=r) for i, r in ps])
                    for t, ps in data])
    ours = encode_produce_request(version, correlation_id, client_id, transactional_id=transactional_id,
                                  acks=acks, timeout_ms=timeout_ms, topic_data=data)
    assert b"".join(bytes(part) for part in ours) == _kafka_python_request(theirs, version, correlation_id, client_id)


def test_produce_request_passes_batch_buffers_without_copying():
    batch = bytearray(b"x" * 1000)
    parts = encode_produce_request(11, 1, "shoal", transactional_id=None, acks=-1, timeout_ms=1000,
                                   topic_data=[("t", [(0, batch)])])
    assert any(part is batch for part in parts)


def test_produce_request_refuses_versions_it_does_not_speak():
    with pytest.raises(ValueError):
        encode_produce_request(12, 1, "c", transactional_id=None, acks=-1, timeout_ms=1, topic_data=[])


_produce_partitions = st.lists(st.fixed_dictionaries({
    "index": st.integers(0, 2**31 - 1), "error_code": i16, "base_offset": i64, "log_append_time_ms": i64,
    "log_start_offset": i64, "error_message": st.one_of(st.none(), names),
    "record_errors": st.lists(st.tuples(i32, st.one_of(st.none(), names)), max_size=2),
    "leader": st.one_of(st.none(), st.tuples(i32, i32))}), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 11), throttle=i32,
       topics=st.lists(st.tuples(names, _produce_partitions), min_size=0, max_size=3),
       endpoints=st.lists(st.tuples(i32, ascii_names, i32), max_size=2))
def test_produce_response_decodes_like_kafka_python(version, throttle, topics, endpoints):
    R = ProduceResponse.TopicProduceResponse
    P = R.PartitionProduceResponse

    def partition(d):
        kwargs = {k: d[k] for k in ("index", "error_code", "base_offset", "log_append_time_ms", "log_start_offset",
                                    "error_message")}
        kwargs["record_errors"] = [P.BatchIndexAndErrorMessage(batch_index=b, batch_index_error_message=m)
                                   for b, m in d["record_errors"]]
        if d["leader"] is not None:
            kwargs["current_leader"] = P.LeaderIdAndEpoch(leader_id=d["leader"][0], leader_epoch=d["leader"][1])
        return P(**kwargs)

    response = ProduceResponse(
        responses=[R(name=n, partition_responses=[partition(d) for d in ps]) for n, ps in topics],
        throttle_time_ms=throttle,
        node_endpoints=[ProduceResponse.NodeEndpoint(node_id=i, host=h, port=p, rack=None) for i, h, p in endpoints])
    encoded = bytes(response.encode(version=version))
    expected = ProduceResponse.decode(encoded, version=version)
    ours = decode_produce_response(version, memoryview(encoded))
    assert ours.throttle_time_ms == expected.throttle_time_ms
    assert [t.name for t in ours.responses] == [t.name for t in expected.responses]
    for mine, theirs in zip(ours.responses, expected.responses, strict=True):
        assert [tuple(p) for p in mine.partition_responses] == [
            (p.index, p.error_code, p.base_offset, p.log_append_time_ms,
             p.log_start_offset if version >= 5 else -1, p.error_message if version >= 8 else None)
            for p in theirs.partition_responses]


# -- Fetch ------------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(version=st.integers(4, 18), correlation_id=st.integers(0, 2**31 - 1), client_id=st.one_of(st.none(), names),
       topic=names, topic_id=st.uuids(), partition=st.integers(0, 2**31 - 1), position=st.integers(0, 2**62),
       max_bytes=st.integers(1, 2**31 - 1), max_wait_ms=st.integers(0, 2**31 - 1), epoch=i32,
       isolation=st.sampled_from([0, 1]), last_epoch=st.one_of(st.none(), st.integers(-1, 2**31 - 1)))
def test_fetch_request_is_byte_identical_to_the_fetchers(version, correlation_id, client_id, topic, topic_id,
                                                          partition, position, max_bytes, max_wait_ms, epoch,
                                                          isolation, last_epoch):
    fetcher = RawBatchFetcher(None, topic, partition, position, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                              isolation=isolation, last_epoch=last_epoch)
    fetcher._topic_id = topic_id if version >= 13 else None
    theirs = _kafka_python_request(fetcher._request(epoch), version, correlation_id, client_id)
    ours = encode_fetch_request(version, correlation_id, client_id, max_wait_ms=max_wait_ms, min_bytes=1,
                                max_bytes=max_bytes, isolation_level=isolation,
                                topics=[FetchTopicSpec(topic, fetcher._topic_id, [fetcher.spec(epoch)])])
    assert ours == theirs


_multi_topics = st.lists(st.tuples(names, st.uuids(), st.lists(st.builds(
    FetchPartitionSpec, partition=st.integers(0, 2**31 - 1), current_leader_epoch=i32,
    fetch_offset=st.integers(0, 2**62), partition_max_bytes=st.integers(1, 2**31 - 1), last_fetched_epoch=i32,
    log_start_offset=i64), min_size=1, max_size=4)),
    min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(version=st.integers(4, 18), correlation_id=st.integers(0, 2**31 - 1), client_id=st.one_of(st.none(), names),
       topics=_multi_topics, max_bytes=st.integers(1, 2**31 - 1), max_wait_ms=st.integers(0, 2**31 - 1),
       isolation=st.sampled_from([0, 1]))
def test_multi_partition_fetch_request_is_byte_identical(version, correlation_id, client_id, topics, max_bytes,
                                                         max_wait_ms, isolation):
    """The daemon's one-request-per-broker fetch: many topics, many partitions each."""
    specs = [FetchTopicSpec(name, topic_id if version >= 13 else None, parts) for name, topic_id, parts in topics]
    request = kafka_python_fetch_request(specs, max_wait_ms=max_wait_ms, max_bytes=max_bytes, isolation=isolation)
    theirs = _kafka_python_request(request, version, correlation_id, client_id)
    ours = encode_fetch_request(version, correlation_id, client_id, max_wait_ms=max_wait_ms, min_bytes=1,
                                max_bytes=max_bytes, isolation_level=isolation, topics=specs)
    assert ours == theirs


def test_fetch_request_by_topic_id_refuses_a_topic_without_one():
    with pytest.raises(ValueError, match="needs a topic id"):
        encode_fetch_request(13, 1, "c", max_wait_ms=1, min_bytes=1, max_bytes=1, isolation_level=1,
                             topics=[FetchTopicSpec("t", None, [FetchPartitionSpec(0, -1, 0, 1)])])


_fetch_partitions = st.lists(st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1), "error_code": i16, "high_watermark": i64,
    "last_stable_offset": i64, "log_start_offset": i64,
    "aborted_transactions": st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=3)),
    "preferred_read_replica": i32, "records": st.one_of(st.none(), st.binary(max_size=500)),
    "diverging": st.one_of(st.none(), st.tuples(i32, i64))}), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(4, 18), throttle=i32, error_code=i16, session_id=i32,
       topics=st.lists(st.tuples(names, st.uuids(), _fetch_partitions), max_size=2),
       endpoints=st.lists(st.tuples(i32, ascii_names, i32), max_size=2))
def test_fetch_response_decodes_like_kafka_python(version, throttle, error_code, session_id, topics, endpoints):
    T = FetchResponse.FetchableTopicResponse
    P = T.PartitionData

    def partition(d):
        kwargs = {k: d[k] for k in ("partition_index", "error_code", "high_watermark", "last_stable_offset",
                                    "log_start_offset", "preferred_read_replica", "records")}
        kwargs["aborted_transactions"] = None if d["aborted_transactions"] is None else [
            P.AbortedTransaction(producer_id=p, first_offset=f) for p, f in d["aborted_transactions"]]
        if d["diverging"] is not None:
            kwargs["diverging_epoch"] = P.EpochEndOffset(epoch=d["diverging"][0], end_offset=d["diverging"][1])
        return P(**kwargs)

    response = FetchResponse(
        throttle_time_ms=throttle, error_code=error_code, session_id=session_id,
        responses=[T(topic=n, topic_id=tid, partitions=[partition(d) for d in ps]) for n, tid, ps in topics],
        node_endpoints=[FetchResponse.NodeEndpoint(node_id=i, host=h, port=p, rack=None) for i, h, p in endpoints])
    encoded = bytes(response.encode(version=version))
    expected = FetchResponse.decode(encoded, version=version)
    ours = decode_fetch_response(version, memoryview(encoded))
    assert (ours.throttle_time_ms, ours.error_code, ours.session_id) == (
        expected.throttle_time_ms, expected.error_code if version >= 7 else 0,
        expected.session_id if version >= 7 else 0)
    assert len(ours.responses) == len(expected.responses)
    for mine, theirs in zip(ours.responses, expected.responses, strict=True):
        if version >= 13:
            assert mine.topic_id == theirs.topic_id
        else:
            assert mine.topic == theirs.topic
        for a, b in zip(mine.partitions, theirs.partitions, strict=True):
            assert (a.partition_index, a.error_code, a.high_watermark, a.last_stable_offset) == (
                b.partition_index, b.error_code, b.high_watermark, b.last_stable_offset)
            assert a.log_start_offset == (b.log_start_offset if version >= 5 else -1)
            assert a.preferred_read_replica == (b.preferred_read_replica if version >= 11 else -1)
            assert (None if a.aborted_transactions is None else [tuple(t) for t in a.aborted_transactions]) == (
                None if b.aborted_transactions is None else
                [(t.producer_id, t.first_offset) for t in b.aborted_transactions])
            assert (None if a.records is None else bytes(a.records)) == (
                None if b.records is None else bytes(b.records))
            theirs_diverging = None if b.diverging_epoch is None else (b.diverging_epoch.epoch,
                                                                       b.diverging_epoch.end_offset)
            assert (None if a.diverging_epoch is None else tuple(a.diverging_epoch)) == theirs_diverging
            assert diverging_epoch(a) == diverging_epoch(b)


def test_fetch_records_are_a_view_into_the_frame():
    P = FetchResponse.FetchableTopicResponse.PartitionData
    response = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        FetchResponse.FetchableTopicResponse(topic="t", partitions=[P(partition_index=0, records=b"abc" * 10)])])
    frame = bytearray(response.encode(version=12))
    records = decode_fetch_response(12, memoryview(frame)).responses[0].partitions[0].records
    assert records.obj is frame and bytes(records) == b"abc" * 10


# -- the connection against a scripted broker on a socket pair ------------------------------------------------

class _Broker(threading.Thread):
    """Answers ApiVersions, then each Produce request with a ProduceResponse v11 (base offset = request count)."""

    def __init__(self, listener: socket.socket, *, swap_correlation: bool = False, close_after: int | None = None,
                 gate: threading.Event | None = None):
        super().__init__(daemon=True)
        self.listener = listener
        self.swap_correlation = swap_correlation
        self.close_after = close_after
        self.gate = gate  # when given, Produce requests are answered only once it is set
        self.requests: list[bytes] = []

    def run(self):
        conn, _ = self.listener.accept()
        with conn:
            while True:
                head = _recv(conn, 4)
                if head is None:
                    return
                frame = _recv(conn, struct.unpack(">i", head)[0])
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if api_key == API_VERSIONS:
                    body = struct.pack(">hi", 0, 2) + struct.pack(">hhh", 0, 3, 11) + struct.pack(">hhh", 1, 4, 17)
                    conn.sendall(struct.pack(">ii", len(body) + 4, correlation_id) + body)
                    continue
                self.requests.append(head + frame)
                if self.close_after is not None and len(self.requests) > self.close_after:
                    return
                if self.gate is not None:
                    self.gate.wait(10)
                R = ProduceResponse.TopicProduceResponse
                body = bytes(ProduceResponse(responses=[R(name="t", partition_responses=[
                    R.PartitionProduceResponse(index=0, error_code=0, base_offset=len(self.requests))])],
                    throttle_time_ms=0).encode(version=version))
                cid = correlation_id + 1 if self.swap_correlation else correlation_id
                conn.sendall(struct.pack(">ii", len(body) + 5, cid) + b"\x00" + body)


def _recv(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@pytest.fixture
def listener():
    sock = socket.create_server(("127.0.0.1", 0))
    yield sock
    sock.close()


def _produce(conn, batch=b"batch"):
    return conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[("t", [(0, bytearray(batch))])])


def test_connection_pipelines_requests_and_answers_them_in_order(listener):
    broker = _Broker(listener)
    broker.start()
    conn = FastConnection(*listener.getsockname(), client_id="shoal", request_timeout_s=5)
    assert conn.version(API_PRODUCE, 3, 11) == 11
    futures = [_produce(conn, b"x" * size) for size in (10, 200_000, 1)]
    conn.wait(futures[2])                      # waiting for the last resolves the ones before it
    assert [f.value.responses[0].partition_responses[0].base_offset for f in futures] == [1, 2, 3]
    Topic = ProduceRequest.TopicProduceData
    expected = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        Topic(name="t", partition_data=[Topic.PartitionProduceData(index=0, records=b"x" * 200_000)])])
    assert broker.requests[1] == _kafka_python_request(expected, 11, 3, "shoal")
    conn.close()


def test_connection_failure_fails_every_request_in_flight_with_a_retriable_error(listener):
    broker = _Broker(listener, close_after=1)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    first, second = _produce(conn), _produce(conn)
    conn.wait(second)
    assert first.succeeded()
    assert second.failed() and isinstance(second.exception, Errors.KafkaConnectionError)
    assert second.exception.retriable and conn.closed
    assert _produce(conn).failed()             # a closed connection fails at once; the client makes a new one


def test_connection_closes_on_a_correlation_id_mismatch(listener):
    _Broker(listener, swap_correlation=True).start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    future = _produce(conn)
    conn.wait(future)
    assert future.failed() and conn.closed


def test_connection_times_out_as_a_retriable_error(listener):
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    with pytest.raises(Errors.RequestTimedOutError):
        FastConnection(*listener.getsockname(), request_timeout_s=0.2)   # nobody answers ApiVersions


def test_unreachable_broker_is_a_retriable_connection_error():
    sock = socket.create_server(("127.0.0.1", 0))
    address = sock.getsockname()
    sock.close()
    with pytest.raises(Errors.KafkaConnectionError) as info:
        FastConnection(*address, connect_timeout_s=1)
    assert info.value.retriable


def _base_offsets(futures):
    return [f.value.responses[0].partition_responses[0].base_offset for f in futures]


@pytest.mark.timeout(30)
def test_deferred_requests_stay_until_flushed_then_leave_in_order(listener):
    """Requests sent with defer=True reach the broker only at flush(); answers keep the send order."""
    broker = _Broker(listener)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    futures = [conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, defer=True,
                            topic_data=[("t", [(0, bytearray(b"x" * n))])]) for n in (1, 2, 3)]
    time.sleep(0.2)
    assert broker.requests == [] and not any(f.is_done for f in futures)
    conn.flush()
    conn.wait(futures[-1])
    assert _base_offsets(futures) == [1, 2, 3]
    assert [len(r) for r in broker.requests] == sorted(len(r) for r in broker.requests)   # sent in order
    conn.close()


@pytest.mark.timeout(30)
def test_deferred_requests_leave_before_a_wait_or_an_undeferred_request(listener):
    """Nothing waits for an answer to a request still held back: a wait sends the deferred requests first, and
    so does a request sent without defer (behind them, in order); a long queue of deferred requests goes out
    before the iovec limit is reached."""
    broker = _Broker(listener)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    first = [conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, defer=True,
                          topic_data=[("t", [(0, bytearray(b"a"))])]) for _ in range(2)]
    conn.wait(first[0])                                           # no flush(): the wait sends them
    many = [conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, defer=True,
                         topic_data=[("t", [(0, bytearray(b"b"))])]) for _ in range(300)]
    last = _produce(conn)                                         # undeferred: after the deferred ones
    conn.wait(last)
    assert _base_offsets(first + many + [last]) == list(range(1, 304))
    conn.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transactional_id", [None, "shoal-lane-7"])
def test_produce_one_sends_the_bytes_of_a_deferred_produce(listener, transactional_id):
    """The one-partition write's request (produce_one) is produce(defer=True)'s, byte for byte and in order: the
    same correlation ids, held until a flush or a wait, past the iovec limit (where it falls back to produce), with
    batches given as bytearrays and as views into a larger frame; answers resolve its futures in order."""
    sizes = [1, 70, 3, 1200] * 80                               # 320 requests: past the 256-buffer deferral limit
    frames = [bytearray(b"\xee" * 5 + bytes([i % 251]) * n + b"\xee" * 2) for i, n in enumerate(sizes)]
    batches = [memoryview(f)[5:5 + n] if i % 2 else bytearray(f[5:5 + n])
               for i, (f, n) in enumerate(zip(frames, sizes, strict=True))]

    def requests(send):
        broker = _Broker(listener)
        broker.start()
        conn = FastConnection(*listener.getsockname(), client_id="shoal", request_timeout_s=5)
        conn.version(API_PRODUCE, 3, 11)
        futures = [send(conn, batch) for batch in batches[:3]]
        time.sleep(0.1)
        assert broker.requests == [] and not any(f.is_done for f in futures)   # held, as deferred requests are
        futures += [send(conn, batch) for batch in batches[3:]]
        conn.wait(futures[-1])
        assert _base_offsets(futures) == list(range(1, len(batches) + 1))
        conn.close()
        broker.join(5)
        return broker.requests

    general = requests(lambda conn, batch: conn.produce(
        transactional_id=transactional_id, acks=-1, timeout_ms=1000, topic_data=[("t", [(0, batch)])],
        max_version=11, request_timeout_ms=6000, defer=True))
    one = requests(lambda conn, batch: conn.produce_one(
        transactional_id=transactional_id, acks=-1, timeout_ms=1000, topic="t", partition=0, records=batch,
        max_version=11, request_timeout_ms=6000))
    assert len(one) == len(batches) and one == general


@pytest.mark.timeout(30)
def test_answered_takes_arrived_answers_without_waiting(listener):
    """answered() is True once a request's answer is in (reading it and the ones before it), and False at once,
    without blocking, while the broker has not answered."""
    gate = threading.Event()
    broker = _Broker(listener, gate=gate)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    futures = [_produce(conn) for _ in range(3)]
    started = time.monotonic()
    assert not conn.answered(futures[0])
    assert time.monotonic() - started < 0.5                       # did not wait for the broker
    gate.set()
    deadline = time.monotonic() + 5
    while not conn.answered(futures[2]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(f.is_done for f in futures) and _base_offsets(futures) == [1, 2, 3]
    conn.close()


def test_uuid_round_trip_of_the_reader():
    value = uuid.uuid4()
    assert Reader(memoryview(value.bytes)).uuid() == value


# -- one-partition fast paths (issue 14: per-request CPU of one-record batches) ----------------------------------

one_batch = st.one_of(st.binary(min_size=1, max_size=300), st.binary(min_size=1, max_size=40).map(bytearray),
                      st.binary(min_size=1, max_size=40).map(memoryview))


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 11), correlation_id=st.integers(0, 2**31 - 1),
       client_id=st.one_of(st.none(), names), transactional_id=st.one_of(st.none(), names),
       acks=st.sampled_from([-1, 0, 1]), timeout_ms=i32, topic=st.one_of(names, st.text(min_size=100, max_size=200)),
       index=st.integers(0, 2**31 - 1), batch=one_batch)
def test_one_partition_produce_request_is_byte_identical_to_the_general_encoder_and_kafka_python(
        version, correlation_id, client_id, transactional_id, acks, timeout_ms, topic, index, batch):
    kwargs = {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms,
              "topic_data": [(topic, [(index, batch)])]}
    fast = encode_produce_request(version, correlation_id, client_id, **kwargs)
    again = encode_produce_request(version, correlation_id, client_id, **kwargs)     # from the template cache
    general = _encode_produce_general(version, correlation_id, client_id, **kwargs)
    assert any(part is batch for part in fast)                  # the batch is passed, not copied
    joined = b"".join(bytes(part) for part in fast)
    assert joined == b"".join(bytes(part) for part in again) == b"".join(bytes(part) for part in general)
    Topic = ProduceRequest.TopicProduceData
    theirs = ProduceRequest(transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=index, records=bytes(batch))])])
    assert joined == _kafka_python_request(theirs, version, correlation_id, client_id)


def test_produce_template_cache_stays_bounded():
    _PRODUCE_TEMPLATES.clear()
    for i in range(_TEMPLATES_MAX + 10):
        encode_produce_request(11, 1, "c", transactional_id=None, acks=-1, timeout_ms=1,
                               topic_data=[(f"t{i}", [(0, b"x")])])
    assert len(_PRODUCE_TEMPLATES) <= _TEMPLATES_MAX


_one_partition = st.fixed_dictionaries({
    "index": st.integers(0, 2**31 - 1), "error_code": i16, "base_offset": i64, "log_append_time_ms": i64,
    "log_start_offset": i64,
    # mostly the usual answer (no record errors, no message, no leader), sometimes not: the fast path must decline
    "error_message": st.one_of(st.none(), st.none(), st.none(), names),
    "record_errors": st.one_of(st.just([]), st.just([]), st.lists(st.tuples(i32, st.one_of(st.none(), names)),
                                                                  min_size=1, max_size=2)),
    "leader": st.one_of(st.none(), st.none(), st.tuples(i32, i32))})


@settings(max_examples=400, deadline=None)
@given(version=st.integers(9, 11), throttle=i32, name=st.one_of(names, st.text(min_size=120, max_size=200)),
       partition=_one_partition, endpoints=st.one_of(st.just([]), st.just([]),
                                                     st.lists(st.tuples(i32, ascii_names, i32), max_size=2)),
       trailing=st.sampled_from([b"", b"", b"", b"\x00"]))
def test_one_partition_produce_response_decodes_like_the_general_decoder(version, throttle, name, partition,
                                                                         endpoints, trailing):
    R = ProduceResponse.TopicProduceResponse
    P = R.PartitionProduceResponse
    kwargs = {k: partition[k] for k in ("index", "error_code", "base_offset", "log_append_time_ms",
                                        "log_start_offset", "error_message")}
    kwargs["record_errors"] = [P.BatchIndexAndErrorMessage(batch_index=b, batch_index_error_message=m)
                               for b, m in partition["record_errors"]]
    if partition["leader"] is not None:
        kwargs["current_leader"] = P.LeaderIdAndEpoch(leader_id=partition["leader"][0],
                                                      leader_epoch=partition["leader"][1])
    response = ProduceResponse(
        responses=[R(name=name, partition_responses=[P(**kwargs)])], throttle_time_ms=throttle,
        node_endpoints=[ProduceResponse.NodeEndpoint(node_id=i, host=h, port=p, rack=None) for i, h, p in endpoints])
    frame = memoryview(bytes(response.encode(version=version)) + trailing)
    usual = (not partition["record_errors"] and partition["error_message"] is None
             and (version < 10 or partition["leader"] is None and not endpoints)   # v10+ tagged fields
             and not trailing
             and len(name.encode("utf-8")) < 127)
    fast = _decode_one_partition(version, frame)
    assert (fast is not None) == usual                          # it takes the usual answer and declines the rest
    assert decode_produce_response(version, frame) == _decode_produce_general(version, frame)
    if usual:
        assert fast == _decode_produce_general(version, frame)


def test_receive_buffer_splits_coalesced_small_answers_and_a_large_one_straddling_it(listener):
    """Several answers in one TCP segment, one split at every byte, and a frame larger than the receive buffer
    that starts inside it: each future gets exactly its own answer."""
    def answer(cid: int, body: bytes) -> bytes:
        return struct.pack(">ii", len(body) + 4, cid) + body

    small = [bytes([i]) * (i + 1) for i in range(6)]
    large = bytes(range(256)) * (RECV_BUFFER // 256 * 3 + 7)
    accepted = []

    def broker():
        conn, _ = listener.accept()
        accepted.append(conn)
        frame = _recv(conn, struct.unpack(">i", _recv(conn, 4))[0])              # ApiVersions
        body = struct.pack(">hi", 0, 1) + struct.pack(">hhh", 0, 3, 11)
        conn.sendall(answer(struct.unpack_from(">i", frame, 4)[0], body))
        wire = b"".join(answer(10 + i, b) for i, b in enumerate(small[:3]))        # three in one write
        wire += answer(13, large) + answer(14, small[3])                           # large one after small ones
        conn.sendall(wire[:7])
        for i in range(7, 40):                                                    # byte by byte for a while
            conn.sendall(wire[i:i + 1])
        conn.sendall(wire[40:])
        conn.sendall(answer(15, small[4])[:3])
        conn.sendall(answer(15, small[4])[3:] + answer(16, small[5]))

    thread = threading.Thread(target=broker, daemon=True)
    thread.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    bodies = small[:3] + [large] + small[3:]
    futures = [conn.send([b""], lambda frame: bytes(frame), flexible_response=False, correlation_id=10 + i)
               for i in range(len(bodies))]
    conn.wait(futures[-1])
    assert [f.value for f in futures] == bodies
    assert conn.bytes_received == sum(8 + len(b) for b in bodies) + 4 + 4 + 2 + 4 + 6
    conn.close()
    thread.join(5)
