"""Every topic of a cluster and its partition count, from one Metadata request decoded only that far.

Why (issue #18, ``docs/performance.md``): the daemon's rescan (every ``rescan_interval_s``) and the planner ask for
every topic's partition count. kafka-python decodes the whole MetadataResponse — an object per partition with its
replica, ISR and offline lists — which at ~2,900 source partitions cost ~13 ms of the daemon's main thread per rescan,
half of what an idle 2,000-lane daemon spent there. Here the answer is walked by length: per topic its error code,
name and the length of its partition array; per partition the fixed fields and the three broker-id arrays are
skipped by their lengths, nothing is built.

MetadataResponse v1-v13 (field order; ``c`` = compact and tagged from v9, flexible):

    throttle_time_ms i32 (v3+)
    brokers [node_id i32, host string, port i32, rack string? (v1+), tags (v9+)]
    cluster_id string? (v2+) · controller_id i32 (v1+)
    topics [error_code i16, name string (nullable v12+), topic_id uuid (v10+), is_internal bool (v1+),
            partitions [error_code i16, partition_index i32, leader_id i32, leader_epoch i32 (v7+),
                        replica_nodes [i32], isr_nodes [i32], offline_replicas [i32] (v5+), tags (v9+)],
            topic_authorized_operations i32 (v8+), tags (v9+)]
    cluster_authorized_operations i32 (v8-v10) · error_code i16 (v13+) · tags (v9+)

The request is kafka-python's own encoding (small, once per rescan); it travels on the client's own connection for
metadata (:meth:`mirror_core.kafka.wire_client.WireClient.metadata_connection`: never queued behind a long-polling
Fetch), or through kafka-python with its full decoder when the client has no fast path (a proxy, ``fast_path=False``).
Tested against kafka-python's encoder and decoder for generated answers of every version
(``tests/unit/kafka/test_topic_counts.py``). Transport failures are kafka-python's retriable errors, as for any request,
so a rescan that cannot reach the source still counts as the source unreachable
(:mod:`mirror_core.kafka.source_reachability`).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import kafka.errors as Errors
from kafka.protocol.metadata import MetadataRequest

API_METADATA = 3
METADATA_VERSIONS = (1, 13)   # v0 asks for every topic with an empty list, not null: not spoken here
METADATA_FLEXIBLE = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_FIXED = {False: 10, True: 14}   # error i16, index i32, leader i32 (+ leader epoch i32 from v7)


class TopicCounts(NamedTuple):
    """A decoded answer: topic name → partition count, for the topics answered without an error; topic name →
    error code for the named topics answered with one (being created, leader not available on an older broker,
    not authorized): such a topic exists as far as the answer tells, its partition count is unknown."""

    throttle_time_ms: int
    error_code: int          # the answer's own error (v13+; 0 before)
    counts: dict[str, int]
    errors: dict[str, int]


def metadata_request(topics: list[str] | None = None) -> MetadataRequest:
    """The request for ``topics`` (None: every topic), never creating one."""
    return MetadataRequest(topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t)
                                                               for t in topics],
                           allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)


def decode_topic_counts(version: int, frame: memoryview) -> TopicCounts:
    """MetadataResponse ``version`` (v1-v13) from a frame that starts after the response header; raises
    ``ValueError``/``IndexError``/``struct.error`` on a frame that does not parse."""
    if not METADATA_VERSIONS[0] <= version <= METADATA_VERSIONS[1]:
        raise ValueError(f"MetadataResponse v{version} is not decoded here")
    flexible = version >= METADATA_FLEXIBLE
    buf = frame
    end = len(buf)
    pos = 0

    def uvarint() -> int:
        nonlocal pos
        byte = buf[pos]
        pos += 1
        if byte < 0x80:
            return byte
        value, shift = byte & 0x7F, 7
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def count() -> int:  # an array's length (-1: null)
        nonlocal pos
        if flexible:
            return uvarint() - 1
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
        return n

    def skip_string() -> None:
        nonlocal pos
        if flexible:
            n = uvarint() - 1
        else:
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
        if n > 0:
            pos += n
            if pos > end:
                raise ValueError("string runs past the frame")

    def skip_tags() -> None:
        nonlocal pos
        if not flexible:
            return
        for _ in range(uvarint()):
            uvarint()
            size = uvarint()
            pos += size
        if pos > end:
            raise ValueError("tagged fields run past the frame")

    throttle = 0
    if version >= 3:
        (throttle,) = _I32.unpack_from(buf, pos)
        pos += 4
    for _ in range(max(count(), 0)):               # brokers
        pos += 4                                   # node_id
        skip_string()                              # host
        pos += 4                                   # port
        skip_string()                              # rack (v1+)
        skip_tags()
    if version >= 2:
        skip_string()                              # cluster_id
    pos += 4                                       # controller_id (v1+)
    counts: dict[str, int] = {}
    errors: dict[str, int] = {}
    fixed = _PARTITION_FIXED[version >= 7]
    arrays = 3 if version >= 5 else 2              # replicas, isr (, offline)
    for _ in range(max(count(), 0)):               # topics
        (error,) = _I16.unpack_from(buf, pos)
        pos += 2
        if flexible:
            n = uvarint() - 1
        else:
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
        name = None
        if n >= 0:
            if pos + n > end:
                raise ValueError("topic name runs past the frame")
            name = str(buf[pos:pos + n], "utf-8")
            pos += n
        if version >= 10:
            pos += 16                              # topic_id
        pos += 1                                   # is_internal (v1+)
        partitions = count()
        for _ in range(max(partitions, 0)):
            pos += fixed
            for _ in range(arrays):
                if flexible:
                    byte = buf[pos]                # the usual one-byte compact length
                    if byte < 0x80:
                        pos += 1
                        ids = byte - 1
                    else:
                        ids = uvarint() - 1
                else:
                    (ids,) = _I32.unpack_from(buf, pos)
                    pos += 4
                if ids > 0:
                    pos += 4 * ids
            if flexible:
                if buf[pos] == 0:                  # the usual empty tag buffer
                    pos += 1
                else:
                    skip_tags()
            if pos > end:
                raise ValueError("partitions run past the frame")
        if version >= 8:
            pos += 4                               # topic_authorized_operations
        skip_tags()
        if name is not None:
            if error:
                errors[name] = error
            else:
                counts[name] = max(partitions, 0)
    if 8 <= version <= 10:
        pos += 4                                   # cluster_authorized_operations
    error = 0
    if version >= 13:
        (error,) = _I16.unpack_from(buf, pos)
        pos += 2
    skip_tags()
    if pos > end:
        raise ValueError("MetadataResponse runs past the frame")
    return TopicCounts(throttle, error, counts, errors)


def list_topic_counts(client) -> dict[str, int]:
    """Every topic on ``client``'s cluster (internal ones included) → partition count; topics answered with an
    error (being created, say) are left out. Raises kafka-python's errors on transport trouble (retriable ones
    marked), like :meth:`~mirror_core.kafka.wire_client.WireClient.send`."""
    return topic_answers(client).counts


def topic_answers(client) -> TopicCounts:
    """:func:`list_topic_counts` with the topics answered with an error beside (``errors``): a topic in error is
    not a deleted one (only ``UNKNOWN_TOPIC_OR_PARTITION`` says that), so a caller that acts on a topic's absence
    (the daemon's group subscription) needs them. Raises as :func:`list_topic_counts`."""
    conn, fresh = client.metadata_connection()
    if conn is None:
        response = client.send(None, metadata_request())
        error = getattr(response, "error_code", 0)   # v13+
        if error:
            raise Errors.for_code(error)(f"cluster {client.cluster_name!r}: Metadata answered error {error}")
        return TopicCounts(getattr(response, "throttle_time_ms", 0), 0,
                           {t.name: len(t.partitions) for t in response.topics if not t.error_code},
                           {t.name: t.error_code for t in response.topics if t.error_code and t.name is not None})
    try:
        return _ask(conn)
    except (Errors.KafkaConnectionError, Errors.RequestTimedOutError):
        if fresh:
            raise
    # a reused connection the broker may have closed while idle (connections.max.idle.ms, longer than many
    # rescan intervals): asked once more on a new one, whose failure is the answer
    conn, _ = client.metadata_connection()
    return _ask(conn)


def _ask(conn) -> TopicCounts:
    version = conn.version(API_METADATA, *METADATA_VERSIONS)
    future = conn.send_encoded(metadata_request(), version, lambda frame: decode_topic_counts(version, frame),
                               flexible_response=version >= METADATA_FLEXIBLE)
    conn.wait(future)
    if future.failed():
        raise future.exception
    answer = future.value
    if answer.error_code:
        raise Errors.for_code(answer.error_code)(f"{conn!r}: Metadata answered error {answer.error_code}")
    return answer
