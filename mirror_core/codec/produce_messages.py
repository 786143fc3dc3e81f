"""ProduceRequest v3-v11 and ProduceResponse v3-v11, hand-encoded (pure bytes; v9+ flexible).

Why by hand (``docs/performance.md``): one partition takes one batch per Produce request, so the shallow copy pays a
request encode and a response decode per batch; kafka-python's generic schema encoder costs ~0.3 ms of CPU a
request. Here a request is a list of buffers for one ``sendmsg`` (the record batches are not copied), and the
common one-partition request and answer take a fast path of their own.

Invariants: :func:`encode_produce_request` gives exactly the bytes of kafka-python's
``ProduceRequest(...).with_header(...).encode(framed=True, header=True)``, and :func:`decode_produce_response` the
fields of its ProduceResponse under the same names; the one-partition fast paths give the same bytes and results as
the general encoder and decoder (all tested with hypothesis, ``tests/unit/kafka/test_wire_fastpath.py``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import NamedTuple

from mirror_core.codec.kafka_primitives import HEADER, I32, Reader, array_len, encode_string, request_header, uvarint

API_PRODUCE = 0
PRODUCE_VERSIONS = (3, 11)     # v12+ means "transaction version 2", v13+ topic ids only: not spoken here
PRODUCE_FLEXIBLE = 9

_PRODUCE_BODY = struct.Struct(">hi")        # acks, timeout ms
_PARTITION_INDEX = struct.Struct(">i")


ProduceTopicData = tuple[str, Sequence[tuple[int, object]]]   # (topic, [(partition, batch buffer), ...])


def encode_produce_request(version: int, correlation_id: int, client_id: str | None, *,
                           transactional_id: str | None, acks: int, timeout_ms: int,
                           topic_data: Sequence[ProduceTopicData]) -> list:
    """A framed ProduceRequest (v3-v11) as a list of buffers whose concatenation is exactly what
    ``ProduceRequest(...).with_header(...).encode(framed=True, header=True)`` produces; the batch buffers are
    included as given (not copied).

    The common request of a one-partition copy (one topic, one partition, a non-empty batch) takes
    :func:`encode_one_partition_request`, which reuses the bytes that do not change from request to request; both
    give the same bytes (tested with hypothesis against kafka-python and against each other)."""
    if not PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1]:
        raise ValueError(f"ProduceRequest v{version} is not hand-encoded")
    if len(topic_data) == 1:
        topic, partitions = topic_data[0]
        if len(partitions) == 1:
            index, records = partitions[0]
            if records is not None:
                n = memoryview(records).nbytes
                if n:
                    return encode_one_partition_request(version, correlation_id, client_id, transactional_id, acks,
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
        header_tail = encode_string(client_id, compact=False) + (b"\x00" if flexible else b"")
        body = (encode_string(transactional_id, flexible) + _PRODUCE_BODY.pack(acks, timeout_ms)
                + array_len(1, flexible) + encode_string(topic, flexible) + array_len(1, flexible))
        tail = b"\x00\x00\x00" if flexible else b""   # partition, topic and request tagged fields
        template = (header_tail, body, tail, flexible)
        if len(_PRODUCE_TEMPLATES) >= _TEMPLATES_MAX:
            _PRODUCE_TEMPLATES.clear()
        _PRODUCE_TEMPLATES[key] = template
    return template


def encode_one_partition_request(version: int, correlation_id: int, client_id: str | None,
                                 transactional_id: str | None, acks: int, timeout_ms: int, topic: str, index: int,
                                 records, n: int) -> list:
    """:func:`encode_produce_request` of one topic with one partition and a non-empty ``records`` of ``n`` bytes:
    ``[header + fixed fields + partition + size, records, tail]`` (no tail part below v9, where it is empty)."""
    header_tail, body, tail, flexible = _produce_template(version, client_id, transactional_id, acks, timeout_ms,
                                                          topic)
    partition = (_PARTITION_INDEX.pack(index) + uvarint(n + 1)) if flexible else _PARTITION_AND_SIZE.pack(index, n)
    size = 8 + len(header_tail) + len(body) + len(partition) + n + len(tail)
    head = HEADER.pack(size, API_PRODUCE, version, correlation_id) + header_tail + body + partition
    return [head, records, tail] if tail else [head, records]


def _encode_produce_general(version: int, correlation_id: int, client_id: str | None, *,
                            transactional_id: str | None, acks: int, timeout_ms: int,
                            topic_data: Sequence[ProduceTopicData]) -> list:
    """:func:`encode_produce_request` for any number of topics and partitions (and empty or null records)."""
    flexible = version >= PRODUCE_FLEXIBLE
    parts: list = [b""]
    chunk = bytearray(encode_string(transactional_id, flexible))
    chunk += _PRODUCE_BODY.pack(acks, timeout_ms)
    chunk += array_len(len(topic_data), flexible)
    size = 0
    for topic, partitions in topic_data:
        chunk += encode_string(topic, flexible)
        chunk += array_len(len(partitions), flexible)
        for index, records in partitions:
            chunk += _PARTITION_INDEX.pack(index)
            if records is None:
                chunk += b"\x00" if flexible else b"\xff\xff\xff\xff"
                n = 0
            else:
                n = memoryview(records).nbytes
                chunk += uvarint(n + 1) if flexible else I32.pack(n)
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
PRODUCE_DECODERS = {version: functools.partial(decode_produce_response, version)
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
    (throttle,) = I32.unpack_from(frame, pos + 35)
    partition = ProducePartitionResponse(index, error_code, base_offset, append_time, log_start, None)
    return ProduceResult([ProduceTopicResponse(name, [partition])], throttle, version)


def _decode_produce_general(version: int, frame: memoryview) -> ProduceResult:
    """:func:`decode_produce_response` for any ProduceResponse v3-v11."""
    flexible = version >= PRODUCE_FLEXIBLE
    r = Reader(frame)
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
