"""ListOffsets, the one place Shoal builds and sends it: one partition with retries (:func:`list_offsets`), many
partitions with one request per leader (:func:`lookup_offsets`), and the newest record timestamp
(:func:`newest_timestamp`, :func:`newest_timestamps`: the MAX_TIMESTAMP spec, Kafka 3.0+).

``which`` names what is asked: ``"earliest"`` (log start), ``"latest"`` (high watermark), ``"last_stable"`` (LSO,
what a READ_COMMITTED copy may read up to, asked with isolation READ_COMMITTED), or a timestamp in ms (the first
offset with a timestamp at or after it; None when no record is). A batched look-up never answers with less than
the single one would: a partition its leader's request left out or refused (leader moved, transient error) is
asked again on its own, with the single look-up's retries and its errors naming cluster, topic and partition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel, ListOffsetsRequest, OffsetSpec

from mirror_core.kafka.retries import partition_request_with_retries
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_WHICH = {
    "earliest": (OffsetSpec.EARLIEST, IsolationLevel.READ_UNCOMMITTED),
    "latest": (OffsetSpec.LATEST, IsolationLevel.READ_UNCOMMITTED),
    "last_stable": (OffsetSpec.LATEST, IsolationLevel.READ_COMMITTED),
}
_MAX_TIMESTAMP_VERSION = 7  # the first ListOffsets version that knows MAX_TIMESTAMP


def _spec(which: str | int) -> tuple[int, IsolationLevel]:
    """(timestamp field, isolation) of the request that answers ``which``."""
    if isinstance(which, str):
        if which not in _WHICH:
            raise ValueError(f"which must be one of {sorted(_WHICH)} or a timestamp, got {which!r}")
        timestamp, isolation = _WHICH[which]
        return int(timestamp), isolation
    if which < 0:
        raise ValueError(f"timestamp must be >= 0, got {which}")
    return int(which), IsolationLevel.READ_UNCOMMITTED


def _request(client: WireClient, items: Sequence[tuple[TopicPartition, int]], timestamp: int,
             isolation: IsolationLevel) -> ListOffsetsRequest:
    """The ListOffsetsRequest for ``items`` ((topic, partition), leader epoch), topics in first-seen order."""
    Topic = ListOffsetsRequest.ListOffsetsTopic
    grouped: dict[str, list] = {}
    for (topic, partition), epoch in items:
        grouped.setdefault(topic, []).append(Topic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=epoch, timestamp=timestamp))
    min_version = _MAX_TIMESTAMP_VERSION if timestamp == int(OffsetSpec.MAX_TIMESTAMP) else \
        max(1, ListOffsetsRequest.min_version_for_isolation_level(isolation))
    return ListOffsetsRequest(
        replica_id=-1, isolation_level=int(isolation), timeout_ms=client.request_timeout_ms,
        topics=[Topic(name=t, partitions=ps) for t, ps in grouped.items()], min_version=min_version)


def _ask_leaders(client: WireClient, partitions: Iterable[TopicPartition], timestamp: int,
                 isolation: IsolationLevel) -> tuple[dict[TopicPartition, object], list[TopicPartition]]:
    """One ListOffsets per leader for ``partitions``: (the answers without an error code, by partition; the
    partitions left unanswered — leader unknown, request failed, error code or left out — in order)."""
    by_leader: dict[int, list[tuple[TopicPartition, int]]] = {}
    unanswered: list[TopicPartition] = []
    for tp in partitions:
        try:
            leader, epoch = client.leader_for(*tp)
        except Errors.KafkaError:
            unanswered.append(tp)
            continue
        by_leader.setdefault(leader, []).append((tp, epoch))
    answered: dict[TopicPartition, object] = {}
    for leader, items in by_leader.items():
        try:
            response = client.send(leader, _request(client, items, timestamp, isolation))
        except Errors.KafkaError as exc:
            log.debug("ListOffsets to broker %s failed (%s); retrying partition by partition", leader, exc)
            unanswered.extend(tp for tp, _ in items)
            continue
        got = {(t.name, p.partition_index): p for t in response.topics for p in t.partitions if not p.error_code}
        for tp, _ in items:
            if tp in got:
                answered[tp] = got[tp]
            else:
                unanswered.append(tp)
    return answered, unanswered


def list_offsets(client: WireClient, topic: str, partition: int, which: str | int, *,
                 retry_timeout_s: float = 60.0) -> int | None:
    """Offset lookup on the partition leader (``which``: see the module docstring), retried after leader moves and
    transient errors until ``retry_timeout_s`` (then :class:`~mirror_core.errors.PartitionUnavailableError`; a
    non-retriable error at once as :class:`~mirror_core.errors.FetchError`)."""
    timestamp, isolation = _spec(which)

    def attempt() -> int | None:
        leader, epoch = client.leader_for(topic, partition)
        response = client.send(leader, _request(client, [((topic, partition), epoch)], timestamp, isolation))
        data = response.topics[0].partitions[0]
        error = Errors.for_code(data.error_code)
        if error is not Errors.NoError:
            raise error()
        if data.offset == -1 and isinstance(which, str):
            raise Errors.OffsetNotAvailableError()
        return None if data.offset == -1 else data.offset

    return partition_request_with_retries(client, topic, partition, f"ListOffsets({which})", attempt,
                                          retry_timeout_s=retry_timeout_s)


def lookup_offsets(client: WireClient, partitions: Iterable[TopicPartition],
                   which: str | int) -> dict[TopicPartition, int | None]:
    """ListOffsets for many partitions: ``which`` as in :func:`list_offsets` (a timestamp answers None when no
    record is at or after it). One request per leader; failures retried one by one."""
    timestamp, isolation = _spec(which)
    answered, retry = _ask_leaders(client, partitions, timestamp, isolation)
    found: dict[TopicPartition, int | None] = {}
    for tp, data in answered.items():
        if data.offset == -1 and isinstance(which, str):
            retry.append(tp)
        else:
            found[tp] = None if data.offset == -1 else data.offset
    for tp in retry:
        found[tp] = list_offsets(client, *tp, which)
    return found


def _timestamp_of(data) -> int | None:
    return None if data.timestamp is None or data.timestamp < 0 else int(data.timestamp)


def newest_timestamp(client: WireClient, topic: str, partition: int) -> int | None:
    """The largest record timestamp in the partition (ListOffsets MAX_TIMESTAMP, Kafka 3.0+); None if unknown."""
    try:
        leader, epoch = client.leader_for(topic, partition)
        request = _request(client, [((topic, partition), epoch)], int(OffsetSpec.MAX_TIMESTAMP),
                           IsolationLevel.READ_UNCOMMITTED)
        data = client.send(leader, request).topics[0].partitions[0]
    except Errors.KafkaError:
        return None
    return None if data.error_code else _timestamp_of(data)


def newest_timestamps(client: WireClient, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
    """:func:`newest_timestamp` of many partitions: one ListOffsets (MAX_TIMESTAMP) per leader; a partition the
    batched answer left out or refused is asked on its own."""
    answered, alone = _ask_leaders(client, partitions, int(OffsetSpec.MAX_TIMESTAMP), IsolationLevel.READ_UNCOMMITTED)
    found = {tp: _timestamp_of(data) for tp, data in answered.items()}
    for tp in alone:
        found[tp] = newest_timestamp(client, *tp)
    return found
