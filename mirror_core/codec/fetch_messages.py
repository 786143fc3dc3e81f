"""FetchRequest v4-v18 and FetchResponse v4-v18, hand-encoded (pure bytes; v12+ flexible with LastFetchedEpoch, v13+
topic ids), for any number of topics and partitions and with a fetch session's fields (KIP-227, v7+).

Why by hand (``docs/performance.md``): kafka-python receives a 4 MiB Fetch response in 4 KiB pieces and copies it
three times; here the connection receives a frame into one ``bytearray`` and :func:`decode_fetch_response` hands out
each partition's records field as a ``memoryview`` into that frame (no copy).

Invariants: :func:`encode_fetch_request` is byte-identical to kafka-python's encoding of the same request (no
cluster id); :func:`decode_fetch_response` gives the fields of kafka-python's FetchResponse under the same names, reads
a partition's DivergingEpoch tagged field and skips the other tags by their size (tested,
``tests/unit/kafka/test_wire_fastpath.py``).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from mirror_core.codec.kafka_primitives import I8, I32, I64, Reader, array_len, encode_string, request_header

API_FETCH = 1
FETCH_VERSIONS = (4, 18)
FETCH_FLEXIBLE = 12
FETCH_TOPIC_IDS = 13

_ABORTED = struct.Struct(">qq")


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
        body += I32.pack(replica_id)
    body += struct.pack(">iii", max_wait_ms, min_bytes, max_bytes)
    body += I8.pack(isolation_level)
    if version >= 7:
        body += struct.pack(">ii", session_id, session_epoch)
    body += array_len(len(topics), flexible)
    for spec in topics:
        body += _topic_head(version, flexible, spec.topic, spec.topic_id, len(spec.partitions), "topic")
        for part in spec.partitions:
            body += I32.pack(part.partition)
            if version >= 9:
                body += I32.pack(part.current_leader_epoch)
            body += I64.pack(part.fetch_offset)
            if version >= 12:
                body += I32.pack(part.last_fetched_epoch)
            if version >= 5:
                body += I64.pack(part.log_start_offset)
            body += I32.pack(part.partition_max_bytes)
            if flexible:
                body += b"\x00"                  # partition's tagged fields
        if flexible:
            body += b"\x00"                      # topic's tagged fields
    if version >= 7:
        body += array_len(len(forgotten), flexible)
        for gone in forgotten:
            body += _topic_head(version, flexible, gone.topic, gone.topic_id, len(gone.partitions), "forgotten topic")
            for index in gone.partitions:
                body += I32.pack(index)
            if flexible:
                body += b"\x00"                  # forgotten topic's tagged fields
    if version >= 11:
        body += encode_string(rack_id, flexible)
    if flexible:
        body += b"\x00"
    return request_header(API_FETCH, version, correlation_id, client_id, flexible, len(body)) + bytes(body)


def _topic_head(version: int, flexible: bool, topic: str, topic_id: uuid.UUID | None, partitions: int,
                what: str) -> bytes:
    """A request topic's reference (its name up to v12, its id from v13) and its partition array's length."""
    if version >= FETCH_TOPIC_IDS:
        if topic_id is None:
            raise ValueError(f"FetchRequest v{version} needs a topic id ({what} {topic!r})")
        head = topic_id.bytes
    else:
        head = encode_string(topic, flexible)
    return head + array_len(partitions, flexible)


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


class FetchResponseData(NamedTuple):
    """The fields of kafka-python's FetchResponse the fetcher reads, same names."""

    throttle_time_ms: int
    error_code: int
    session_id: int
    responses: list[FetchTopicResponse]
    API_VERSION: int


def decode_fetch_response(version: int, frame: memoryview) -> FetchResponseData:
    """FetchResponse v4-v18 from a frame that starts after the response header; ``records`` are views."""
    flexible = version >= FETCH_FLEXIBLE
    r = Reader(frame)
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
    return FetchResponseData(throttle, error_code, session_id, topics, version)


FETCH_TAG_DIVERGING_EPOCH = 0
_EPOCH_END_OFFSET = struct.Struct(">iq")   # DivergingEpoch: epoch, end offset (then the struct's own tags)


def _partition_tags(r: Reader) -> EpochEndOffset | None:
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
