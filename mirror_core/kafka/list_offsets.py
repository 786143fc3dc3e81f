"""ListOffsets for many partitions at once: one request per leader, a failed partition retried alone through
:func:`mirror_core.kafka.fetcher.list_offsets`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel, ListOffsetsRequest, OffsetSpec

from mirror_core.kafka.fetcher import list_offsets
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_LOOKUPS = {
    "earliest": (OffsetSpec.EARLIEST, IsolationLevel.READ_UNCOMMITTED),
    "latest": (OffsetSpec.LATEST, IsolationLevel.READ_UNCOMMITTED),
    "last_stable": (OffsetSpec.LATEST, IsolationLevel.READ_COMMITTED),
}


def lookup_offsets(client: WireClient, partitions: Iterable[TopicPartition],
                   which: str | int) -> dict[TopicPartition, int | None]:
    """ListOffsets for many partitions: ``which`` as in :func:`mirror_core.kafka.fetcher.list_offsets` (a timestamp
    answers None when no record is at or after it). One request per leader; failures retried one by one."""
    if isinstance(which, str):
        timestamp, isolation = _LOOKUPS[which]
    else:
        timestamp, isolation = int(which), IsolationLevel.READ_UNCOMMITTED
    by_leader: dict[int, list[tuple[TopicPartition, int]]] = {}
    retry: list[TopicPartition] = []
    for tp in partitions:
        try:
            leader, epoch = client.leader_for(*tp)
        except Errors.KafkaError:
            retry.append(tp)
            continue
        by_leader.setdefault(leader, []).append((tp, epoch))
    found: dict[TopicPartition, int | None] = {}
    for leader, items in by_leader.items():
        for tp, offset in _list_offsets_on(client, leader, items, int(timestamp), isolation).items():
            if offset is None or (offset == -1 and isinstance(which, str)):
                retry.append(tp)
            else:
                found[tp] = None if offset == -1 else offset
    for tp in retry:
        found[tp] = list_offsets(client, *tp, which)
    return found


def _list_offsets_on(client: WireClient, leader: int, items: list[tuple[TopicPartition, int]], timestamp: int,
                     isolation: IsolationLevel) -> dict[TopicPartition, int | None]:
    """One ListOffsets to ``leader``; a partition's value is None when it answered an error (or nothing)."""
    Topic = ListOffsetsRequest.ListOffsetsTopic
    grouped: dict[str, list] = {}
    for (topic, partition), epoch in items:
        grouped.setdefault(topic, []).append(Topic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=epoch, timestamp=timestamp))
    request = ListOffsetsRequest(
        replica_id=-1, isolation_level=int(isolation), timeout_ms=client.request_timeout_ms,
        topics=[Topic(name=t, partitions=ps) for t, ps in grouped.items()],
        min_version=max(1, ListOffsetsRequest.min_version_for_isolation_level(isolation)))
    out: dict[TopicPartition, int | None] = {tp: None for tp, _ in items}
    try:
        response = client.send(leader, request)
    except Errors.KafkaError as exc:
        log.debug("ListOffsets to broker %s failed (%s); retrying partition by partition", leader, exc)
        return out
    for t in response.topics:
        for p in t.partitions:
            if (t.name, p.partition_index) in out and p.error_code == 0:
                out[(t.name, p.partition_index)] = p.offset
    return out
