"""Source log truncation check: does the source still hold the log a copy position was read from?

A copy position ``p`` with its epoch ``e`` (the leader epoch of the last source batch below ``p``, see
:class:`~mirror_core.state.checkpoint.Checkpoint`) is still valid when the source leader's log has epoch ``e`` ending at
or after ``p``. OffsetsForLeaderEpoch (API 23) asks the leader for the largest epoch up to ``e`` it knows and where
that epoch ends (the start of the next one, or its log end). An end offset below ``p`` means the log was truncated
below the position (unclean leader election, a replaced broker) and may have regrown with other records; an
answer without any epoch means no offset below ``p`` is the same record any more. Both raise
:class:`~mirror_core.errors.SourceTruncatedError` naming the diverged range. This is the check the Java consumer
runs after a leader change (``SubscriptionState.maybeValidatePositionForCurrentLeader``); a running fetch gets the
same answer from Fetch's DivergingEpoch (:mod:`mirror_core.kafka.fetcher`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

import kafka.errors as Errors
from kafka.protocol.consumer import OffsetForLeaderEpochRequest

from mirror_core.errors import SourceTruncatedError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.retries import partition_request_with_retries
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEnd(NamedTuple):
    """The leader's answer: the largest epoch up to the one asked for, and where it ends (-1/-1: none known)."""

    epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.epoch == UNDEFINED_EPOCH or self.end_offset == UNDEFINED_EPOCH_OFFSET


def epoch_end_offset(client: WireClient, topic: str, partition: int, epoch: int, *,
                     retry_timeout_s: float = 60.0) -> EpochEnd:
    """Ask the partition leader where ``epoch`` ends on its log (retrying leader moves and transient errors)."""
    return partition_request_with_retries(client, topic, partition, f"OffsetsForLeaderEpoch({epoch})",
                                          lambda: _epoch_end_once(client, topic, partition, epoch),
                                          retry_timeout_s=retry_timeout_s)


def _epoch_end_once(client: WireClient, topic: str, partition: int, epoch: int) -> EpochEnd:
    leader, current_epoch = client.leader_for(topic, partition)
    Topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    request = OffsetForLeaderEpochRequest(
        replica_id=-1,  # a consumer (v3+): the leader answers from its log, not a follower's view
        topics=[Topic(topic=topic, partitions=[Topic.OffsetForLeaderPartition(
            partition=partition, current_leader_epoch=current_epoch, leader_epoch=epoch)])],
        min_version=3)
    response = client.send(leader, request)
    data = response.topics[0].partitions[0]
    error = Errors.for_code(data.error_code)
    if error is not Errors.NoError:
        raise error()
    return EpochEnd(data.leader_epoch, data.end_offset)


def epoch_ends_many(client: WireClient, asks: Iterable[tuple[str, int, int]], *, timeout_s: float | None = None
                    ) -> dict[tuple[str, int, int], EpochEnd]:
    """Where each ``(topic, partition, epoch)`` ends on its leader's log, asked with one OffsetsForLeaderEpoch per
    leader (a daemon opening 2,000 lanes: a few requests, not 2,000). Best effort, for
    :func:`validate_position`'s ``answer``: a partition whose leader is not known now, that answers an error
    (a leader moved, a fenced leader epoch) or whose leader's request fails is left out — its lane asks on its
    own, with retries, as without this. Only answers of the current leader (``current_leader_epoch`` sent) are
    kept, so each is what :func:`epoch_end_offset` would have been told at this moment. ``timeout_s``: all the
    requests together end within it (a leader that has not answered by then: its partitions are left out), for a
    caller that must not wait a whole request timeout per silent leader (the daemon's main thread)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    Topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    by_leader: dict[int, dict[str, list]] = {}
    asked: dict[tuple[str, int], int] = {}  # (topic, partition) → the epoch asked: once per partition and request
    for topic, partition, epoch in asks:
        if (topic, partition) in asked:
            continue  # a second epoch of the same partition: left out (one answer per partition per request)
        if deadline is not None and time.monotonic() >= deadline:
            break  # leaders looked up one by one (a metadata request each when not cached): the rest ask alone
        try:
            leader, current_epoch = client.leader_for(topic, partition)
        except Errors.KafkaError:
            continue
        asked[(topic, partition)] = epoch
        by_leader.setdefault(leader, {}).setdefault(topic, []).append(Topic.OffsetForLeaderPartition(
            partition=partition, current_leader_epoch=current_epoch, leader_epoch=epoch))
    found: dict[tuple[str, int, int], EpochEnd] = {}
    for leader, topics in by_leader.items():
        request = OffsetForLeaderEpochRequest(
            replica_id=-1, topics=[Topic(topic=topic, partitions=parts) for topic, parts in topics.items()],
            min_version=3)
        timeout_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
        if timeout_ms is not None and timeout_ms <= 0:
            log.debug("cluster %r: no time left for the batched OffsetsForLeaderEpoch to broker %s; its lanes ask "
                      "alone", client.cluster_name, leader)
            continue
        try:
            response = client.send(leader, request, timeout_ms=timeout_ms)
        except Errors.KafkaError as exc:
            log.debug("cluster %r: batched OffsetsForLeaderEpoch to broker %s failed (%s); its lanes ask alone",
                      client.cluster_name, leader, type(exc).__name__)
            continue
        for t in response.topics:
            for data in t.partitions:
                epoch = asked.get((t.topic, data.partition))
                if epoch is not None and data.error_code == 0:
                    found[(t.topic, data.partition, epoch)] = EpochEnd(data.leader_epoch, data.end_offset)
    return found


def check_truncation(cluster: str, topic: str, partition: int, position: int, position_epoch: int,
                     answer: EpochEnd) -> None:
    """Raise :class:`SourceTruncatedError` when ``answer`` (for ``position_epoch``) shows the source log no longer
    holds what lies below ``position`` (pure: the decision, for :func:`validate_position` and tests)."""
    if answer.undefined:
        raise SourceTruncatedError(cluster, topic, partition, None, position, position_epoch)
    if answer.end_offset < position:
        raise SourceTruncatedError(cluster, topic, partition, answer.end_offset, position, position_epoch,
                                   answer.epoch)


def validate_position(client: WireClient, topic: str, partition: int, position: int,
                      position_epoch: int | None, *, log_start: int | None = None,
                      retry_timeout_s: float = 60.0, answer: EpochEnd | None = None) -> bool:
    """Check a resumed position against the source leader before the first fetch from it (see the module
    docstring). Returns False when it cannot be checked (no epoch known: a v2 checkpoint, legacy batches; or
    nothing below the position is left in the source log), True when the source still holds the log below it.

    ``log_start``: the source's log start offset, if the caller knows it (else it is looked up when needed): an
    undefined answer at a position where the log starts is retention at work (the epoch's batches were all
    deleted), not a truncation. ``answer``: the leader's answer for ``position_epoch``, asked just before
    (:func:`epoch_ends_many`), instead of asking here."""
    if position_epoch is None or position_epoch < 0:
        log.info("cluster %r %s-%d: no leader epoch is known for position %d (an older checkpoint, or legacy "
                 "batches); the source log cannot be checked for truncation below it",
                 client.cluster_name, topic, partition, position)
        return False
    if answer is None:
        answer = epoch_end_offset(client, topic, partition, position_epoch, retry_timeout_s=retry_timeout_s)
    if answer.undefined and log_start is None:
        log_start = list_offsets(client, topic, partition, "earliest")
    if answer.undefined and log_start >= position:
        log.info("cluster %r %s-%d: nothing below position %d is left in the source log; its epoch %d cannot be "
                 "checked", client.cluster_name, topic, partition, position, position_epoch)
        return False
    check_truncation(client.cluster_name, topic, partition, position, position_epoch, answer)
    return True
