"""Hand-encoded Produce / Fetch on a socket of our own: the data plane's hot path without kafka-python's event loop.

Why (``docs/performance.md``): one partition takes one batch per Produce request, so the shallow copy pays a
request encode, a response decode and several event-loop turns per batch. In kafka-python 3 that is ~0.3 ms of CPU
per request (generic schema encoder for the header, per-request tasks, timers and coroutines in its selector), and
a 4 MiB Fetch response is received in 4 KiB ``recv`` calls and copied three times (joined chunks, frame buffer,
``bytes`` of the records field). Here a request is a list of buffers handed to one ``sendmsg`` (the record batches
are not copied), a response frame is received with ``recv_into`` into one ``bytearray`` (small answers through a
64 KiB receive buffer, so size field and body, and often the next pipelined answers, come in one call), and a Fetch
response's records field is a ``memoryview`` into that frame.

What is hand-encoded, and tested byte-identical against kafka-python's own encoder and decoder
(``tests/unit/kafka/test_wire_fastpath.py``): request header v1/v2, ProduceRequest v3-v11 (v9+ flexible),
ProduceResponse
v3-v11, FetchRequest v4-v18 (v12+ flexible with LastFetchedEpoch, v13+ topic ids) with any number of topics and
partitions, FetchResponse v4-v18 (its partitions' DivergingEpoch tagged field read, other tags skipped), ApiVersions
v0, SaslHandshake v1, SaslAuthenticate v1-v2.

Scope: :class:`FastConnection` speaks PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL (PLAIN, SCRAM-SHA-256/512):
TLS through ``ssl.SSLObject`` and memory BIOs, so a request stays a list of buffers up to the encryption
(:mod:`mirror_core.kafka.wire_channel`), SASL by hand-encoded SaslHandshake v1 / SaslAuthenticate v1-v2 with the
exchanges of :mod:`mirror_core.codec.sasl`, and KIP-368 re-authentication between requests.
:meth:`mirror_core.kafka.wire_client.WireClient.fast_connection` hands one out per broker (``WireClient(...,
fast_path=False)`` turns it off; clusters reached through a proxy stay on kafka-python; those three mechanisms are
the only ones Shoal's cluster settings accept). Failures come back as kafka-python's retriable errors
(``KafkaConnectionError``, ``RequestTimedOutError``) on the request's future, so callers retry as before; a failed
connection is closed and every request in flight on it fails with it (a new one is made on the next use). A
refused certificate or login is :class:`~mirror_core.errors.ClusterUnavailableError` (not retriable), raised where
the connection is made or re-authenticated.

Invariants: requests on one connection are answered in send order (Kafka processes a connection's requests one at
a time), so responses are matched to the oldest request in flight and a correlation-id mismatch closes the
connection; a future is resolved exactly once; a broker's throttle time delays the next send on that connection;
a request sent with ``defer=True`` is in ``_in_flight`` at once but its bytes wait in ``_unsent`` until
:meth:`FastConnection.flush`, the next undeferred send (which sends them first) or the next read, so the send
order is the queue order and no read ever waits for an answer to a request not yet sent.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import os
import random
import socket
import ssl
import struct
import termios
import time
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple

import kafka.errors as Errors
from kafka.future import Future

from mirror_core.codec.sasl import SaslExchangeError, new_exchange
from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka import request_trace
from mirror_core.kafka.wire_channel import FastSecurity, HandshakeRefused, PlainChannel, TlsChannel

API_PRODUCE = 0
API_FETCH = 1
API_SASL_HANDSHAKE = 17
API_VERSIONS = 18
API_SASL_AUTHENTICATE = 36
PRODUCE_VERSIONS = (3, 11)     # v12+ means "transaction version 2", v13+ topic ids only: not spoken here
FETCH_VERSIONS = (4, 18)
PRODUCE_FLEXIBLE = 9
FETCH_FLEXIBLE = 12
FETCH_TOPIC_IDS = 13
SASL_HANDSHAKE_VERSION = 1       # v1: the exchange itself travels in SaslAuthenticate requests
SASL_AUTHENTICATE_VERSIONS = (1, 2)   # v1+ answers with session_lifetime_ms (KIP-368); v2 is flexible
SASL_AUTHENTICATE_FLEXIBLE = 2

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I32N = struct.Struct("=i")  # native order (ioctl results)
_HEADER = struct.Struct(">ihhi")            # frame size, api key, api version, correlation id
_PRODUCE_BODY = struct.Struct(">hi")        # acks, timeout ms
_PARTITION_INDEX = struct.Struct(">i")
_FETCH_PART_RESPONSE = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start (v5+)
_ABORTED = struct.Struct(">qq")
_API_RANGE = struct.Struct(">hhh")
_MAX_FRAME = 100_000_000
_RECV_BUFFER = 64 * 1024           # FastConnection's receive buffer: answers up to this size are read through it
_DEFER_MAX_PARTS = 256             # deferred request buffers per connection before a send goes out anyway (IOV_MAX)


# -- primitives -----------------------------------------------------------------------------------------------

def uvarint(value: int) -> bytes:
    """Unsigned varint (Kafka's compact lengths and tag counts)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: str | None, compact: bool) -> bytes:
    if value is None:
        return b"\x00" if compact else b"\xff\xff"
    raw = value.encode("utf-8")
    return (uvarint(len(raw) + 1) if compact else _I16.pack(len(raw))) + raw


def _array_len(count: int, compact: bool) -> bytes:
    return uvarint(count + 1) if compact else _I32.pack(count)


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool,
                   body_size: int) -> bytes:
    """Frame size + request header (v1, or v2 with an empty tag buffer); ``body_size`` counts what follows."""
    client = _string(client_id, compact=False)          # the header's client id is never compact
    tags = b"\x00" if flexible else b""
    size = 8 + len(client) + len(tags) + body_size
    return _HEADER.pack(size, api_key, version, correlation_id) + client + tags


class _Reader:
    """Sequential reads from a response frame (a memoryview); ``pos`` is the next byte."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def i8(self) -> int:
        value = _I8.unpack_from(self.buf, self.pos)[0]
        self.pos += 1
        return value

    def i16(self) -> int:
        value = _I16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return value

    def i32(self) -> int:
        value = _I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def i64(self) -> int:
        value = _I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def uvarint(self) -> int:
        buf, pos = self.buf, self.pos
        value = shift = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def length(self, compact: bool, wide: bool = False) -> int:
        """A string/bytes/array length; -1 means null."""
        if compact:
            return self.uvarint() - 1
        return self.i32() if wide else self.i16()

    def string(self, compact: bool) -> str | None:
        n = self.length(compact)
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("string runs past the frame")
        value = str(self.buf[self.pos:end], "utf-8")
        self.pos = end
        return value

    def array(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.i32()

    def bytes_view(self, compact: bool) -> memoryview | None:
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("bytes run past the frame")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def uuid(self) -> uuid.UUID:
        value = uuid.UUID(bytes=bytes(self.buf[self.pos:self.pos + 16]))
        self.pos += 16
        return value

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()                       # tag
            size = self.uvarint()                # (not `pos += uvarint()`: that adds to the pos before it)
            self.pos += size
        if self.pos > len(self.buf):
            raise ValueError("tagged fields run past the frame")


# -- Produce ----------------------------------------------------------------------------------------------------

ProduceTopicData = tuple[str, Sequence[tuple[int, object]]]   # (topic, [(partition, batch buffer), ...])


def encode_produce_request(version: int, correlation_id: int, client_id: str | None, *,
                           transactional_id: str | None, acks: int, timeout_ms: int,
                           topic_data: Sequence[ProduceTopicData]) -> list:
    """A framed ProduceRequest (v3-v11) as a list of buffers whose concatenation is exactly what
    ``ProduceRequest(...).with_header(...).encode(framed=True, header=True)`` produces; the batch buffers are
    included as given (not copied).

    The common request of a one-partition copy (one topic, one partition, a non-empty batch) takes
    :func:`_encode_one_partition`, which reuses the bytes that do not change from request to request; both give the
    same bytes (tested with hypothesis against kafka-python and against each other)."""
    if not PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1]:
        raise ValueError(f"ProduceRequest v{version} is not hand-encoded")
    if len(topic_data) == 1:
        topic, partitions = topic_data[0]
        if len(partitions) == 1:
            index, records = partitions[0]
            if records is not None:
                n = memoryview(records).nbytes
                if n:
                    return _encode_one_partition(version, correlation_id, client_id, transactional_id, acks,
                                                 timeout_ms, topic, index, records, n)
    return _encode_produce_general(version, correlation_id, client_id, transactional_id=transactional_id,
                                   acks=acks, timeout_ms=timeout_ms, topic_data=topic_data)


# (version, client id, transactional id, acks, timeout ms, topic) -> (header tail, body prefix, request tail,
# flexible): the bytes of a one-partition ProduceRequest that do not depend on the correlation id, the partition
# or the batch. Bounded: cleared when it grows past _TEMPLATES_MAX (a copy uses a handful of keys).
_PRODUCE_TEMPLATES: dict[tuple, tuple[bytes, bytes, bytes, bool]] = {}
_TEMPLATES_MAX = 256
_PARTITION_AND_SIZE = struct.Struct(">ii")


def _produce_template(version: int, client_id: str | None, transactional_id: str | None, acks: int,
                      timeout_ms: int, topic: str) -> tuple[bytes, bytes, bytes, bool]:
    key = (version, client_id, transactional_id, acks, timeout_ms, topic)
    template = _PRODUCE_TEMPLATES.get(key)
    if template is None:
        flexible = version >= PRODUCE_FLEXIBLE
        header_tail = _string(client_id, compact=False) + (b"\x00" if flexible else b"")
        body = (_string(transactional_id, flexible) + _PRODUCE_BODY.pack(acks, timeout_ms)
                + _array_len(1, flexible) + _string(topic, flexible) + _array_len(1, flexible))
        tail = b"\x00\x00\x00" if flexible else b""   # partition, topic and request tagged fields
        template = (header_tail, body, tail, flexible)
        if len(_PRODUCE_TEMPLATES) >= _TEMPLATES_MAX:
            _PRODUCE_TEMPLATES.clear()
        _PRODUCE_TEMPLATES[key] = template
    return template


def _encode_one_partition(version: int, correlation_id: int, client_id: str | None, transactional_id: str | None,
                          acks: int, timeout_ms: int, topic: str, index: int, records, n: int) -> list:
    """:func:`encode_produce_request` of one topic with one partition and a non-empty ``records`` of ``n`` bytes:
    ``[header + fixed fields + partition + size, records, tail]`` (no tail part below v9, where it is empty)."""
    header_tail, body, tail, flexible = _produce_template(version, client_id, transactional_id, acks, timeout_ms,
                                                          topic)
    partition = (_PARTITION_INDEX.pack(index) + uvarint(n + 1)) if flexible else _PARTITION_AND_SIZE.pack(index, n)
    size = 8 + len(header_tail) + len(body) + len(partition) + n + len(tail)
    head = _HEADER.pack(size, API_PRODUCE, version, correlation_id) + header_tail + body + partition
    return [head, records, tail] if tail else [head, records]


def _encode_produce_general(version: int, correlation_id: int, client_id: str | None, *,
                            transactional_id: str | None, acks: int, timeout_ms: int,
                            topic_data: Sequence[ProduceTopicData]) -> list:
    """:func:`encode_produce_request` for any number of topics and partitions (and empty or null records)."""
    flexible = version >= PRODUCE_FLEXIBLE
    parts: list = [b""]
    chunk = bytearray(_string(transactional_id, flexible))
    chunk += _PRODUCE_BODY.pack(acks, timeout_ms)
    chunk += _array_len(len(topic_data), flexible)
    size = 0
    for topic, partitions in topic_data:
        chunk += _string(topic, flexible)
        chunk += _array_len(len(partitions), flexible)
        for index, records in partitions:
            chunk += _PARTITION_INDEX.pack(index)
            if records is None:
                chunk += b"\x00" if flexible else b"\xff\xff\xff\xff"
                n = 0
            else:
                n = memoryview(records).nbytes
                chunk += uvarint(n + 1) if flexible else _I32.pack(n)
            if n:
                parts.append(bytes(chunk))
                parts.append(records)
                size += len(chunk) + n
                chunk = bytearray()
            if flexible:
                chunk += b"\x00"                 # partition's tagged fields
        if flexible:
            chunk += b"\x00"                     # topic's tagged fields
    if flexible:
        chunk += b"\x00"                         # request's tagged fields
    parts.append(bytes(chunk))
    size += len(chunk)
    parts[0] = request_header(API_PRODUCE, version, correlation_id, client_id, flexible, size)
    return parts


class ProducePartitionResponse(NamedTuple):
    index: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    error_message: str | None


class ProduceTopicResponse(NamedTuple):
    name: str
    partition_responses: list[ProducePartitionResponse]


class ProduceResult(NamedTuple):
    """The fields of kafka-python's ProduceResponse the writer reads, same names."""

    responses: list[ProduceTopicResponse]
    throttle_time_ms: int
    API_VERSION: int


_ONE_PARTITION_FIELDS = struct.Struct(">ihqqq")     # index, error, base offset, log append time, log start
_ONE_PARTITION_TAIL = b"\x01\x00\x00\x00"         # no record errors, null message, no partition / topic tags


def decode_produce_response(version: int, frame: memoryview) -> ProduceResult:
    """ProduceResponse v3-v11 from a frame that starts after the correlation id (and, v9+, the header's tags).

    The common answer of a one-partition request (v9+: one topic named in < 127 bytes, one partition, no record
    errors, no message, no tagged fields) takes :func:`_decode_one_partition`; anything else, or anything it does not
    recognise byte for byte, the general decoder below. Both give the same result (tested)."""
    if version >= PRODUCE_FLEXIBLE:
        result = _decode_one_partition(version, frame)
        if result is not None:
            return result
    return _decode_produce_general(version, frame)


# version -> decoder of that version's answers (FastConnection.produce: no closure made per request)
_PRODUCE_DECODERS = {version: functools.partial(decode_produce_response, version)
                     for version in range(PRODUCE_VERSIONS[0], PRODUCE_VERSIONS[1] + 1)}


def _decode_one_partition(version: int, frame: memoryview) -> ProduceResult | None:
    """A flexible (v9+) ProduceResponse of exactly one topic and one partition with no record errors, a null
    message and empty tag buffers, or None when the frame is anything else (the general decoder then reads it)."""
    length = len(frame)
    if length < 42 or frame[0] != 2:                  # compact array of one topic
        return None
    name_size = frame[1] - 1                          # compact string, one-byte length (0 would be null)
    pos = 2 + name_size
    if not 0 <= name_size < 0x7F or length != pos + 40 or frame[pos] != 2 or frame[pos + 39] != 0 \
            or frame[pos + 31:pos + 35] != _ONE_PARTITION_TAIL:
        return None
    name = str(frame[2:pos], "utf-8")
    index, error_code, base_offset, append_time, log_start = _ONE_PARTITION_FIELDS.unpack_from(frame, pos + 1)
    (throttle,) = _I32.unpack_from(frame, pos + 35)
    partition = ProducePartitionResponse(index, error_code, base_offset, append_time, log_start, None)
    return ProduceResult([ProduceTopicResponse(name, [partition])], throttle, version)


def _decode_produce_general(version: int, frame: memoryview) -> ProduceResult:
    """:func:`decode_produce_response` for any ProduceResponse v3-v11."""
    flexible = version >= PRODUCE_FLEXIBLE
    r = _Reader(frame)
    topics = []
    for _ in range(r.array(flexible)):
        name = r.string(flexible)
        parts = []
        for _ in range(r.array(flexible)):
            index, error_code, base_offset = r.i32(), r.i16(), r.i64()
            log_append_time = r.i64()
            log_start = r.i64() if version >= 5 else -1
            message = None
            if version >= 8:
                for _ in range(r.array(flexible)):
                    r.i32()
                    r.string(flexible)
                    if flexible:
                        r.skip_tags()
                message = r.string(flexible)
            if flexible:
                r.skip_tags()
            parts.append(ProducePartitionResponse(index, error_code, base_offset, log_append_time, log_start,
                                                  message))
        if flexible:
            r.skip_tags()
        topics.append(ProduceTopicResponse(name, parts))
    throttle = r.i32()
    if flexible:
        r.skip_tags()
    return ProduceResult(topics, throttle, version)


# -- Fetch ------------------------------------------------------------------------------------------------------

class FetchPartitionSpec(NamedTuple):
    """One partition of a FetchRequest."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    partition_max_bytes: int
    last_fetched_epoch: int = -1
    log_start_offset: int = -1


class FetchTopicSpec(NamedTuple):
    """One topic of a FetchRequest: by name up to v12, by topic id from v13."""

    topic: str
    topic_id: uuid.UUID | None
    partitions: Sequence[FetchPartitionSpec]


class ForgottenTopic(NamedTuple):
    """One topic of a FetchRequest's ForgottenTopicsData (v7+, fetch sessions): partitions leaving the session,
    by topic name up to v12, by topic id from v13."""

    topic: str
    topic_id: uuid.UUID | None
    partitions: Sequence[int]


def encode_fetch_request(version: int, correlation_id: int, client_id: str | None, *, max_wait_ms: int,
                         min_bytes: int, max_bytes: int, isolation_level: int, topics: Sequence[FetchTopicSpec],
                         replica_id: int = -1, session_id: int = 0, session_epoch: int = -1,
                         forgotten: Sequence[ForgottenTopic] = (), rack_id: str = "") -> bytes:
    """A framed FetchRequest (v4-v18) for any number of topics and partitions, byte-identical to kafka-python's
    encoding of the same request (no cluster id): the fetcher's one-partition request and the daemon's
    one-request-per-broker fetch (:mod:`mirror_core.kafka.broker_fetch`) both go through here. ``session_id`` /
    ``session_epoch`` / ``forgotten`` are a fetch session's (:mod:`mirror_core.kafka.fetch_session`; v7+, below that
    they are not on the wire and the request is sessionless)."""
    if not FETCH_VERSIONS[0] <= version <= FETCH_VERSIONS[1]:
        raise ValueError(f"FetchRequest v{version} is not hand-encoded")
    flexible = version >= FETCH_FLEXIBLE
    body = bytearray()
    if version <= 14:
        body += _I32.pack(replica_id)
    body += struct.pack(">iii", max_wait_ms, min_bytes, max_bytes)
    body += _I8.pack(isolation_level)
    if version >= 7:
        body += struct.pack(">ii", session_id, session_epoch)
    body += _array_len(len(topics), flexible)
    for spec in topics:
        if version >= FETCH_TOPIC_IDS:
            if spec.topic_id is None:
                raise ValueError(f"FetchRequest v{version} needs a topic id (topic {spec.topic!r})")
            body += spec.topic_id.bytes
        else:
            body += _string(spec.topic, flexible)
        body += _array_len(len(spec.partitions), flexible)
        for part in spec.partitions:
            body += _I32.pack(part.partition)
            if version >= 9:
                body += _I32.pack(part.current_leader_epoch)
            body += _I64.pack(part.fetch_offset)
            if version >= 12:
                body += _I32.pack(part.last_fetched_epoch)
            if version >= 5:
                body += _I64.pack(part.log_start_offset)
            body += _I32.pack(part.partition_max_bytes)
            if flexible:
                body += b"\x00"                  # partition's tagged fields
        if flexible:
            body += b"\x00"                      # topic's tagged fields
    if version >= 7:
        body += _array_len(len(forgotten), flexible)
        for gone in forgotten:
            if version >= FETCH_TOPIC_IDS:
                if gone.topic_id is None:
                    raise ValueError(f"FetchRequest v{version} needs a topic id (forgotten topic {gone.topic!r})")
                body += gone.topic_id.bytes
            else:
                body += _string(gone.topic, flexible)
            body += _array_len(len(gone.partitions), flexible)
            for index in gone.partitions:
                body += _I32.pack(index)
            if flexible:
                body += b"\x00"                  # forgotten topic's tagged fields
    if version >= 11:
        body += _string(rack_id, flexible)
    if flexible:
        body += b"\x00"
    return request_header(API_FETCH, version, correlation_id, client_id, flexible, len(body)) + bytes(body)


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int


class EpochEndOffset(NamedTuple):
    """A FetchResponse partition's DivergingEpoch (v12+, tagged field 0): the largest epoch up to the request's
    LastFetchedEpoch the leader has, and its end offset; the leader's log differs from ours from there on."""

    epoch: int
    end_offset: int


class FetchPartitionData(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: list[AbortedTxn] | None
    preferred_read_replica: int
    records: memoryview | None     # a view into the response frame: no copy
    diverging_epoch: EpochEndOffset | None = None   # None: the field was absent (no divergence)


class FetchTopicResponse(NamedTuple):
    topic: str | None
    topic_id: uuid.UUID | None
    partitions: list[FetchPartitionData]


class FetchResult(NamedTuple):
    """The fields of kafka-python's FetchResponse the fetcher reads, same names."""

    throttle_time_ms: int
    error_code: int
    session_id: int
    responses: list[FetchTopicResponse]
    API_VERSION: int


def decode_fetch_response(version: int, frame: memoryview) -> FetchResult:
    """FetchResponse v4-v18 from a frame that starts after the response header; ``records`` are views."""
    flexible = version >= FETCH_FLEXIBLE
    r = _Reader(frame)
    throttle = r.i32()
    error_code, session_id = (r.i16(), r.i32()) if version >= 7 else (0, 0)
    topics = []
    for _ in range(r.array(flexible)):
        if version >= FETCH_TOPIC_IDS:
            name, topic_id = None, r.uuid()
        else:
            name, topic_id = r.string(flexible), None
        parts = []
        for _ in range(r.array(flexible)):
            index, error, high_watermark = r.i32(), r.i16(), r.i64()
            last_stable = r.i64()
            log_start = r.i64() if version >= 5 else -1
            count = r.array(flexible)
            aborted = None
            if count >= 0:
                aborted = []
                for _ in range(count):
                    aborted.append(AbortedTxn(*_ABORTED.unpack_from(r.buf, r.pos)))
                    r.pos += 16
                    if flexible:
                        r.skip_tags()
            preferred = r.i32() if version >= 11 else -1
            records = r.bytes_view(flexible)
            diverging = _partition_tags(r) if flexible else None
            parts.append(FetchPartitionData(index, error, high_watermark, last_stable, log_start, aborted,
                                            preferred, records, diverging))
        if flexible:
            r.skip_tags()
        topics.append(FetchTopicResponse(name, topic_id, parts))
    if flexible:
        r.skip_tags()
    return FetchResult(throttle, error_code, session_id, topics, version)


FETCH_TAG_DIVERGING_EPOCH = 0
_EPOCH_END_OFFSET = struct.Struct(">iq")   # DivergingEpoch: epoch, end offset (then the struct's own tags)


def _partition_tags(r: _Reader) -> EpochEndOffset | None:
    """A FetchResponse partition's tagged fields: DivergingEpoch (tag 0) is read, the others (CurrentLeader,
    SnapshotId, unknown ones) skipped by their size."""
    diverging = None
    for _ in range(r.uvarint()):
        tag = r.uvarint()
        size = r.uvarint()
        end = r.pos + size
        if end > len(r.buf):
            raise ValueError("tagged fields run past the frame")
        if tag == FETCH_TAG_DIVERGING_EPOCH:
            if size < _EPOCH_END_OFFSET.size:
                raise ValueError(f"DivergingEpoch of {size} bytes")
            diverging = EpochEndOffset(*_EPOCH_END_OFFSET.unpack_from(r.buf, r.pos))
        r.pos = end
    return diverging


# -- SASL -------------------------------------------------------------------------------------------------------

def encode_sasl_handshake_request(correlation_id: int, client_id: str | None, mechanism: str) -> bytes:
    """A framed SaslHandshakeRequest v1 (header v1, the mechanism name)."""
    body = _string(mechanism, compact=False)
    return request_header(API_SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, correlation_id, client_id, False,
                          len(body)) + body


class SaslHandshakeResult(NamedTuple):
    error_code: int
    mechanisms: list[str]


def decode_sasl_handshake_response(frame: memoryview) -> SaslHandshakeResult:
    r = _Reader(frame)
    error_code = r.i16()
    return SaslHandshakeResult(error_code, [r.string(False) for _ in range(max(r.array(False), 0))])


def encode_sasl_authenticate_request(version: int, correlation_id: int, client_id: str | None,
                                     auth_bytes: bytes) -> list:
    """A framed SaslAuthenticateRequest v1 or v2 as a list of buffers (the auth bytes are not copied into the
    header: they hold a credential, and nothing here keeps them longer than the send)."""
    if not SASL_AUTHENTICATE_VERSIONS[0] <= version <= SASL_AUTHENTICATE_VERSIONS[1]:
        raise ValueError(f"SaslAuthenticateRequest v{version} is not hand-encoded")
    flexible = version >= SASL_AUTHENTICATE_FLEXIBLE
    length = uvarint(len(auth_bytes) + 1) if flexible else _I32.pack(len(auth_bytes))
    tail = b"\x00" if flexible else b""
    header = request_header(API_SASL_AUTHENTICATE, version, correlation_id, client_id, flexible,
                            len(length) + len(auth_bytes) + len(tail))
    return [header + length, auth_bytes, tail]


class SaslAuthenticateResult(NamedTuple):
    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int


def decode_sasl_authenticate_response(version: int, frame: memoryview) -> SaslAuthenticateResult:
    flexible = version >= SASL_AUTHENTICATE_FLEXIBLE
    r = _Reader(frame)
    error_code = r.i16()
    message = r.string(flexible)
    auth = r.bytes_view(flexible)
    lifetime = r.i64()
    if flexible:
        r.skip_tags()
    return SaslAuthenticateResult(error_code, message, b"" if auth is None else bytes(auth), lifetime)


# -- the connection ---------------------------------------------------------------------------------------------

class _FastFuture(Future):
    __slots__ = ("conn",)


class FastConnection:
    """One socket to one broker, PLAINTEXT or TLS, SASL-authenticated or not: pipelined Produce and Fetch requests,
    answered in order.

    Single-threaded and blocking: :meth:`send` writes a whole request, :meth:`wait` reads responses in order until
    the given future is resolved. See the module docstring for the invariants.

    Security (``security``, a :class:`~mirror_core.kafka.wire_channel.FastSecurity`): TLS wraps the socket before the
    first request (:class:`~mirror_core.kafka.wire_channel.TlsChannel`, hostname verified against ``host``); SASL runs
    after ApiVersions: SaslHandshake v1, then SaslAuthenticate v1/v2 rounds of the mechanism's exchange
    (:mod:`mirror_core.codec.sasl`). KIP-368: when the broker grants a session lifetime, the connection re-authenticates
    between requests once 85-95 % of it has passed (the Java client's jitter): :meth:`send` first lets the requests
    in flight finish (their futures resolve), then runs the exchange again on the same connection. A refused
    certificate or login raises :class:`~mirror_core.errors.ClusterUnavailableError` (not retriable) naming
    ``cluster_name``, the broker, and for SASL the mechanism and user.
    """

    def __init__(self, host: str, port: int, *, client_id: str | None = "shoal", node_id: int | None = None,
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 30.0,
                 security: FastSecurity | None = None, cluster_name: str | None = None,
                 reauthenticate: bool = True):
        self.node_id = node_id
        self.address = (host, port)
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.security = security or FastSecurity()
        self.cluster_name = cluster_name
        self.reauthenticate = reauthenticate     # False only to show what a broker does without it (tests)
        self._correlation_id = 0
        # (correlation id, future, decoder, flexible response header, timeout in s) per request, in send order
        self._in_flight: collections.deque = collections.deque()
        # request buffers sent with ``defer=True`` and not yet handed to the kernel (their requests are already in
        # ``_in_flight``): they leave together with the next :meth:`flush`, the next undeferred send, or before any
        # read, so nothing ever waits for the answer to a request still held here
        self._unsent: list = []
        self._unsent_timeout_s = request_timeout_s
        self._versions: dict[tuple[int, int, int], int] = {}   # (api key, low, high) -> version, see version()
        self._throttled_until = 0.0
        self._rbuf = bytearray(_RECV_BUFFER)      # received, not yet framed bytes: _rbuf[_rstart:_rend]
        self._rview = memoryview(self._rbuf)
        self._rstart = self._rend = 0
        self._reauth_at: float | None = None     # monotonic time of the next re-authentication (KIP-368)
        self._salted: dict = {}                  # SCRAM's PBKDF2 result, reused by re-authentications
        self.authentications = 0
        self.session_lifetime_ms = 0
        self.bytes_sent = 0                      # request bytes handed to the channel (before TLS), all requests
        self.bytes_received = 0                  # response frames read, size fields included
        self.closed = False
        try:
            self._sock = socket.create_connection(self.address, timeout=connect_timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._timeout_s = self._sock.gettimeout()
        except OSError as exc:
            self.closed = True
            raise Errors.KafkaConnectionError(f"connecting to {host}:{port}: {exc}") from None
        self._channel = PlainChannel(self._sock)
        try:
            if self.security.tls:
                channel = TlsChannel(self._sock, self.security.ssl_context, host)
                try:
                    channel.handshake(f"{host}:{port}")
                except (OSError, ssl.SSLError) as exc:
                    raise Errors.KafkaConnectionError(f"{self!r}: TLS handshake: {exc}") from None
                self._channel = channel
            self.api_versions = self._handshake()
            if self.security.sasl:
                self._authenticate()
        except HandshakeRefused as exc:
            self.close()
            raise self._refused(exc) from None
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"FastConnection(node={self.node_id}, {self.address[0]}:{self.address[1]})"

    @property
    def tls_version(self) -> str | None:
        """The negotiated TLS version ("TLSv1.3"), None on a plain connection."""
        return self._channel.version if isinstance(self._channel, TlsChannel) else None

    # -- versions --------------------------------------------------------------------------------------------

    def _handshake(self) -> dict[int, tuple[int, int]]:
        future = self.send([request_header(API_VERSIONS, 0, self._next_correlation_id(), self.client_id, False, 0)],
                           _decode_api_versions, flexible_response=False, correlation_id=self._correlation_id)
        self.wait(future)
        if future.failed():
            raise future.exception
        return future.value

    def version(self, api_key: int, low: int, high: int) -> int:
        """The highest version of ``api_key`` in [low, high] this broker supports (remembered per question: the
        broker's versions are fixed for the connection's life)."""
        known = self._versions.get((api_key, low, high))
        if known is not None:
            return known
        broker = self.api_versions.get(api_key)
        if broker is None or broker[0] > high or broker[1] < low:
            raise Errors.IncompatibleBrokerVersion(
                f"broker {self.address} supports api {api_key} at {broker}, we need {low}-{high}")
        self._versions[(api_key, low, high)] = version = min(high, broker[1])
        return version

    def _next_correlation_id(self) -> int:
        self._correlation_id = (self._correlation_id + 1) % 2**31
        return self._correlation_id

    # -- SASL ------------------------------------------------------------------------------------------------

    def _authenticate(self, *, again: bool = False) -> None:
        """SaslHandshake v1 + SaslAuthenticate rounds; raises :class:`HandshakeRefused` on a refused login and
        kafka-python's retriable errors on transport trouble. Only called with nothing in flight. On a first
        login a connection the broker closes mid-exchange counts as refused (brokers often close before their
        error response is out); on a re-authentication (``again``) it is a transport failure, retried on a new
        connection that logs in afresh."""
        sec = self.security
        who = f"SASL {sec.sasl_mechanism} login as {sec.sasl_username!r}"
        correlation_id = self._next_correlation_id()
        handshake = self._round_trip(
            [encode_sasl_handshake_request(correlation_id, self.client_id, sec.sasl_mechanism)],
            decode_sasl_handshake_response, False, correlation_id, who, again)
        if handshake.error_code:
            enabled = ", ".join(handshake.mechanisms) or "none"
            raise HandshakeRefused("sasl", self._where(), f"{who} refused: the broker does not enable "
                                   f"{sec.sasl_mechanism} on this listener (enabled: {enabled})")
        version = self.version(API_SASL_AUTHENTICATE, *SASL_AUTHENTICATE_VERSIONS)
        exchange = new_exchange(sec.sasl_mechanism, sec.sasl_username, sec.sasl_password,
                                salted_cache=self._salted)
        started = time.monotonic()
        message: bytes | None = exchange.first()
        while message is not None:
            correlation_id = self._next_correlation_id()
            answer = self._round_trip(
                encode_sasl_authenticate_request(version, correlation_id, self.client_id, message),
                lambda frame, v=version: decode_sasl_authenticate_response(v, frame),
                version >= SASL_AUTHENTICATE_FLEXIBLE, correlation_id, who, again)
            if answer.error_code:
                error = Errors.for_code(answer.error_code).__name__
                raise HandshakeRefused("sasl", self._where(), f"{who} refused ({error}: "
                                       f"{answer.error_message or 'no message'}); check sasl.mechanism, "
                                       "sasl.username and sasl.password")
            try:
                message = exchange.respond(answer.auth_bytes)
            except SaslExchangeError as exc:
                raise HandshakeRefused("sasl", self._where(), f"{who} failed: {exc}") from None
        self.session_lifetime_ms = max(answer.session_lifetime_ms, 0)
        self.authentications += 1
        self._reauth_at = (started + self.session_lifetime_ms / 1000 * random.uniform(0.85, 0.95)
                           if self.session_lifetime_ms and self.reauthenticate else None)

    def _round_trip(self, parts, decoder, flexible: bool, correlation_id: int, who: str, again: bool):
        future = self.send(parts, decoder, flexible_response=flexible, correlation_id=correlation_id)
        self.wait(future)
        if future.failed():
            if isinstance(future.exception, Errors.KafkaConnectionError) and not again:
                raise HandshakeRefused("sasl", self._where(), f"{who}: the broker closed the connection during "
                                       "authentication (refused login?); check sasl.mechanism, sasl.username "
                                       "and sasl.password") from None
            raise future.exception
        return future.value

    def _reauthenticate(self) -> None:
        """KIP-368, between requests: drain what is in flight, then authenticate again on this connection."""
        while self._in_flight and not self.closed:
            self._read_one()
        if self.closed:
            return
        try:
            self._authenticate(again=True)
        except HandshakeRefused as exc:
            self._fail(Errors.KafkaConnectionError(f"{self!r}: re-authentication refused"))
            raise self._refused(exc) from None

    def _where(self) -> str:
        return f"broker {self.address[0]}:{self.address[1]}"

    def _refused(self, exc: HandshakeRefused) -> ClusterUnavailableError:
        return ClusterUnavailableError(self.cluster_name or "?", f"{self.address[0]}:{self.address[1]}",
                                       exc.reason, retriable=False)

    # -- requests --------------------------------------------------------------------------------------------

    def produce(self, *, transactional_id: str | None, acks: int, timeout_ms: int,
                topic_data: Sequence[ProduceTopicData], max_version: int = PRODUCE_VERSIONS[1],
                request_timeout_ms: int | None = None, defer: bool = False) -> Future:
        """Send a ProduceRequest; the future's value is a :class:`ProduceResult`. ``defer``: see :meth:`send`."""
        self._maybe_reauthenticate()
        version = self.version(API_PRODUCE, PRODUCE_VERSIONS[0], min(max_version, PRODUCE_VERSIONS[1]))
        correlation_id = self._next_correlation_id()
        parts = encode_produce_request(version, correlation_id, self.client_id, transactional_id=transactional_id,
                                       acks=acks, timeout_ms=timeout_ms, topic_data=topic_data)
        return self.send(parts, _PRODUCE_DECODERS[version], flexible_response=version >= PRODUCE_FLEXIBLE,
                         correlation_id=correlation_id, timeout_ms=request_timeout_ms,
                         nbytes=4 + _I32.unpack_from(parts[0], 0)[0], defer=defer)

    def fetch_async(self, *, min_version: int, max_version: int, request_timeout_ms: int | None = None,
                    **fields) -> Future:
        """Send a FetchRequest (see :func:`encode_fetch_request` for ``fields``); the future's value is a
        :class:`FetchResult` once :meth:`wait` read it, or a kafka-python error on transport failure."""
        self._maybe_reauthenticate()
        version = self.version(API_FETCH, max(min_version, FETCH_VERSIONS[0]), min(max_version, FETCH_VERSIONS[1]))
        correlation_id = self._next_correlation_id()
        data = encode_fetch_request(version, correlation_id, self.client_id, **fields)
        return self.send([data], lambda frame: decode_fetch_response(version, frame),
                         flexible_response=version >= FETCH_FLEXIBLE, correlation_id=correlation_id,
                         timeout_ms=request_timeout_ms)

    def fetch(self, **kwargs) -> FetchResult:
        """One FetchRequest round trip (arguments as :meth:`fetch_async`); raises on transport failure like
        ``WireClient.send`` (kafka-python errors)."""
        future = self.fetch_async(**kwargs)
        self.wait(future)
        if future.failed():
            raise future.exception
        return future.value

    def send_encoded(self, request, version: int, decoder: Callable[[memoryview], object], *,
                     flexible_response: bool) -> Future:
        """Send a request kafka-python encodes (a small, rare one: a rescan's Metadata) at ``version``; ``decoder``
        reads the answer after its header, as for our own requests. Resolved in :meth:`wait`."""
        self._maybe_reauthenticate()
        correlation_id = self._next_correlation_id()
        request.API_VERSION = version
        request.with_header(correlation_id=correlation_id, client_id=self.client_id)
        return self.send([bytes(request.encode(framed=True, header=True))], decoder,
                         flexible_response=flexible_response, correlation_id=correlation_id)

    def _maybe_reauthenticate(self) -> None:
        if self._reauth_at is not None and not self.closed and time.monotonic() >= self._reauth_at:
            self._reauthenticate()

    def send(self, parts, decoder: Callable[[memoryview], object], *, flexible_response: bool,
             correlation_id: int, timeout_ms: int | None = None, nbytes: int | None = None,
             defer: bool = False) -> Future:
        """Write one framed request (a list of buffers) and queue its decoder; the future resolves in :meth:`wait`.
        ``nbytes``: the request's size if the caller knows it (else the parts are measured). ``defer``: keep the
        buffers until :meth:`flush` (or the next undeferred send, or the next read), so several requests queued
        between two waits leave in one ``sendmsg``; the caller must keep them unchanged until then."""
        future = _FastFuture()
        future.conn = self
        if self.closed:
            return future.failure(Errors.KafkaConnectionError(f"{self!r} is closed"))
        if self._throttled_until:
            delay = self._throttled_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._throttled_until = 0.0
        timeout_s = self.request_timeout_s if timeout_ms is None else timeout_ms / 1000
        if nbytes is None:
            nbytes = sum(memoryview(part).nbytes for part in parts)
        if defer and len(self._unsent) + len(parts) <= _DEFER_MAX_PARTS:
            self._unsent += parts
            self._unsent_timeout_s = timeout_s   # the socket timeout their write will run under (see flush)
        else:
            if self._unsent:   # the deferred requests leave first: the broker answers in send order
                self.flush()
                if self.closed:
                    return future.failure(Errors.KafkaConnectionError(f"{self!r} is closed"))
            try:
                self._set_timeout(timeout_s)
                self._channel.send(parts)
            except (OSError, ssl.SSLError) as exc:
                self._fail(_transport_error(exc, self))
                return future.failure(_transport_error(exc, self))
            if request_trace.ACTIVE is not None:
                request_trace.ACTIVE.writes.append((time.perf_counter(), id(self), 1))
        self.bytes_sent += nbytes
        self._in_flight.append((correlation_id, future, decoder, flexible_response, timeout_s))
        if request_trace.ACTIVE is not None:
            self._trace_send(parts, correlation_id, nbytes)
        return future

    def _trace_send(self, parts, correlation_id: int, nbytes: int | None) -> None:
        api_key = _HEADER.unpack_from(parts[0], 0)[1] if len(parts[0]) >= _HEADER.size else -1
        size = sum(memoryview(part).nbytes for part in parts) if nbytes is None else nbytes
        request_trace.ACTIVE.sends.append((time.perf_counter(), id(self), api_key, correlation_id, size,
                                           len(self._in_flight)))

    def flush(self) -> None:
        """Hand the deferred requests to the kernel (one ``sendmsg``); on failure the connection fails and every
        request in flight on it with it."""
        if not self._unsent:
            return
        parts, self._unsent = self._unsent, []
        try:
            self._set_timeout(self._unsent_timeout_s)
            self._channel.send(parts)
        except (OSError, ssl.SSLError) as exc:
            self._fail(_transport_error(exc, self))
            return
        if request_trace.ACTIVE is not None:
            request_trace.ACTIVE.writes.append((time.perf_counter(), id(self), -1))

    def answered(self, future: Future) -> bool:
        """Whether ``future`` is resolved, after reading (never waiting for) the answers that already arrived:
        those whole in the receive buffer and, on a plain socket, what the kernel holds already."""
        if future.is_done:
            return True
        if self._unsent or not self._in_flight or self.closed:
            return False
        asked = not (self._timeout_s and isinstance(self._channel, PlainChannel))  # TLS: only what _rbuf holds
        while self._in_flight:
            if not self._frame_buffered():
                if asked:
                    return False
                self._read_ready()   # one non-blocking read, only when the buffer has no whole answer
                asked = True
                continue
            self._read_one()
            if future.is_done:
                return True
        return False

    def _frame_buffered(self) -> bool:
        have = self._rend - self._rstart
        return have >= 4 and have >= 4 + _I32.unpack_from(self._rbuf, self._rstart)[0]

    def _read_ready(self) -> None:
        """Move what the kernel holds for us into ``_rbuf`` without waiting. The socket has a timeout, so its
        descriptor is non-blocking (CPython's timeout mode) and ``readv`` returns at once; a closed or failed socket
        is left for the next blocking read to report."""
        if self._rstart and self._rend - self._rstart < 4096:   # room at the end: move the unread bytes forward
            have = self._rend - self._rstart
            self._rview[:have] = self._rview[self._rstart:self._rend]
            self._rstart, self._rend = 0, have
        if self._rend >= _RECV_BUFFER:
            return
        with contextlib.suppress(OSError):   # BlockingIOError: nothing yet
            self._rend += os.readv(self._sock.fileno(), [self._rview[self._rend:]])

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet (a new request's answer comes after all of theirs)."""
        return len(self._in_flight)

    def wait(self, future: Future, *, timeout_s: float | None = None) -> None:
        """Read responses in order until ``future`` is resolved (it fails if the connection does). ``timeout_s``:
        at most that long in all, each request's own timeout notwithstanding; past it the connection fails (its
        unread answers would otherwise wait ahead of the next request's), and ``future`` with it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not future.is_done:
            if not self._in_flight:
                future.failure(Errors.KafkaConnectionError(f"{self!r}: no answer pending for this request"))
                return
            self._read_one(deadline)

    def _read_one(self, deadline: float | None = None) -> None:
        """Read the oldest request's response. Its timeout runs from now, when we start waiting for it, not from
        when it was sent: a request sent ahead (a prefetch while the caller writes, or one queued behind another's
        long poll) is not failed for our own delay in reading; the clock measures only the broker's silence."""
        if self._unsent:
            self.flush()
            if self.closed:
                return
        correlation_id, future, decoder, flexible, timeout_s = self._in_flight[0]
        if deadline is not None:
            timeout_s = min(timeout_s, deadline - time.monotonic())
            if timeout_s <= 0:
                self._fail(Errors.RequestTimedOutError(f"{self!r}: no answer in time"))
                return
        trace = request_trace.ACTIVE
        if trace is not None:
            began, ready = time.perf_counter(), self._answer_ready()
        try:
            self._set_timeout(timeout_s)
            frame = self._receive_frame()
            if trace is not None:
                trace.answers.append((began, time.perf_counter(), id(self), correlation_id, ready))
        except (OSError, ssl.SSLError, Errors.KafkaError) as exc:
            self._fail(_transport_error(exc, self))
            return
        self._in_flight.popleft()
        view = memoryview(frame)
        (received,) = _I32.unpack_from(view, 0)
        if received != correlation_id:
            error = Errors.KafkaConnectionError(f"{self!r}: correlation id {received}, expected {correlation_id}")
            future.failure(error)
            self._fail(error)
            return
        try:
            if not flexible:
                pos = 4
            elif len(view) > 4 and view[4] == 0:        # the usual empty tag buffer of a v1 response header
                pos = 5
            else:
                reader = _Reader(view, 4)
                reader.skip_tags()
                pos = reader.pos
            value = decoder(view[pos:])
        except (ValueError, IndexError, struct.error) as exc:
            error = Errors.KafkaProtocolError(f"{self!r}: undecodable response: {exc}")
            future.failure(error)
            self._fail(error)
            return
        throttle = getattr(value, "throttle_time_ms", 0)
        if throttle:
            self._throttled_until = time.monotonic() + throttle / 1000
        future.success(value)

    def _answer_ready(self) -> bool:
        """(Tracing only) whether bytes of the next answer are buffered or in the socket already."""
        if self._rend > self._rstart:
            return True
        try:  # the socket has a timeout, so recv(MSG_PEEK) would wait for the bytes: ask the kernel instead
            return _I32N.unpack(fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
        except OSError:
            return True

    def _set_timeout(self, timeout_s: float) -> None:
        """``settimeout`` only when the value changes: each call is an ``ioctl`` in CPython, and nearly every
        request of a copy uses the same timeout (only this class sets the socket's timeout after connecting)."""
        if timeout_s != self._timeout_s:
            self._sock.settimeout(timeout_s)
            self._timeout_s = timeout_s

    def _receive_frame(self) -> bytearray:
        """The next response frame (without its size field) as a new ``bytearray`` the caller owns.

        Reads go through ``_rbuf`` (``_RECV_BUFFER`` bytes): one ``recv_into`` usually brings a small answer's size
        field and body together, and often the next answers of the pipeline too, which stay in ``_rbuf`` between
        ``_rstart`` and ``_rend`` for the next call. A frame that fits in ``_rbuf`` is copied out of it; a larger one
        (a Fetch answer) gets its own ``bytearray``: what ``_rbuf`` holds of it is copied in, the rest is received
        straight into it. Never reads more than the socket has ready, so nothing waits for bytes no request asked
        for."""
        self._buffered(4)
        (size,) = _I32.unpack_from(self._rbuf, self._rstart)
        if not 4 <= size <= _MAX_FRAME:
            raise Errors.KafkaProtocolError(f"invalid frame length {size}")
        self._rstart += 4
        if size <= _RECV_BUFFER:
            self._buffered(size)
            start = self._rstart
            frame = self._rbuf[start:start + size]
            self._rstart = start + size
        else:
            frame = bytearray(size)
            have = self._rend - self._rstart
            frame[:have] = self._rview[self._rstart:self._rend]
            self._rstart = self._rend = 0
            self._recv_exact(memoryview(frame)[have:])
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        self.bytes_received += 4 + size
        return frame

    def _buffered(self, need: int) -> None:
        """Receive until ``_rbuf`` holds at least ``need`` (<= ``_RECV_BUFFER``) unread bytes from ``_rstart``."""
        if self._rend - self._rstart >= need:
            return
        if self._rstart + need > _RECV_BUFFER:            # move the unread bytes to the front to make room
            have = self._rend - self._rstart
            self._rview[:have] = self._rview[self._rstart:self._rend]
            self._rstart, self._rend = 0, have
        recv_into, view = self._channel.recv_into, self._rview
        try:
            while self._rend - self._rstart < need:
                self._rend += recv_into(view[self._rend:])
        except ConnectionResetError as exc:
            raise Errors.KafkaConnectionError(f"{self!r}: {exc}") from None

    def _recv_exact(self, view: memoryview) -> None:
        recv_into, got, total = self._channel.recv_into, 0, len(view)
        try:
            while got < total:
                got += recv_into(view[got:])
        except ConnectionResetError as exc:
            raise Errors.KafkaConnectionError(f"{self!r}: {exc}") from None

    def _fail(self, error: BaseException) -> None:
        in_flight, self._in_flight = self._in_flight, collections.deque()
        self.close()
        for entry in in_flight:
            if not entry[1].is_done:
                entry[1].failure(error)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._reauth_at = None
            self._rstart = self._rend = 0            # unread bytes of a closed connection answer nothing
            self._unsent = []
            with contextlib.suppress(OSError):
                self._sock.close()
        while self._in_flight:
            future = self._in_flight.popleft()[1]
            if not future.is_done:
                future.failure(Errors.KafkaConnectionError(f"{self!r} closed"))


def _transport_error(exc: BaseException, conn: FastConnection) -> Errors.KafkaError:
    if isinstance(exc, Errors.KafkaError):
        return exc
    if isinstance(exc, TimeoutError):
        return Errors.RequestTimedOutError(f"{conn!r}: no answer in time")
    return Errors.KafkaConnectionError(f"{conn!r}: {exc}")


def _decode_api_versions(frame: memoryview) -> dict[int, tuple[int, int]]:
    r = _Reader(frame)
    error = r.i16()
    count = r.i32()
    versions = {}
    for _ in range(max(count, 0)):
        key, low, high = _API_RANGE.unpack_from(r.buf, r.pos)
        r.pos += 6
        versions[key] = (low, high)
    if error:
        raise Errors.for_code(error)()
    return versions
