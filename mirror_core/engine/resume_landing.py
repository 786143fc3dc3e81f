"""The landing rule of a lane's copies: each copy's first batch must land where the lane's checkpoint says the target
ends, and anything else in between is judged (:class:`ResumeLanding`); and the reader of committed records the rule
and a lane takeover use to look at what lies on the target (:func:`committed_records`).

Invariant: a budget overrun (:data:`TOO_MANY`) never reads as "no records".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.batch_codec import PreparedBatch
from mirror_core.codec.batch_deep import decode_record_tail, read_records
from mirror_core.errors import (
    DataLossError,
    ForeignWriteError,
    MirrorError,
    OwnTransactionUndecidedError,
    PartitionUnavailableError,
    TargetNotEmptyError,
)
from mirror_core.kafka.active_producers import active_producers
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.retries import partition_request_with_retries
from mirror_core.kafka.wire_client import WireClient

if TYPE_CHECKING:
    from mirror_core.engine.lane_session import LaneSession

log = logging.getLogger(__name__)

# How long the own-transaction look retries DescribeProducers through leader moves and transient errors: right after
# a target restart the first leader asked may answer NOT_LEADER_OR_FOLLOWER. Past it the look cannot tell and says so
# as a retriable PartitionUnavailableError (the lane reopens later), never as a halt that needs an operator. Short:
# the lane's transaction is open meanwhile and its worker holds the daemon's round
OWN_TRANSACTION_LOOK_S = 8.0


class ResumeLanding:
    """The landing rule for a copy's first batch: it must land where the lane's checkpoint says the target ends.

    ``[checkpoint.target_next, landing)`` may hold aborted data and transaction markers (an exactly-once commit
    writes one marker right after its data, and an at-least-once open fences the lane with one abort marker, so
    the next copy lands one further on: ``own_marker``), never a committed record — except in at-least-once
    mode, where a crash between the data's acknowledgement and the checkpoint leaves partial copies of the
    source from the checkpoint on, at most one commit window of distinct records: those are reported as
    duplicates. Anything else (a foreign writer, a foreign transaction left open in between, a truncated or
    recreated target) raises :class:`ForeignWriteError` naming both offsets. Checked once per copy, so every
    daemon round checks it; the common case (landing exactly where expected) costs nothing, and the check never
    waits on a transaction: the target's last stable offset is looked up first.
    """

    def __init__(self, session: LaneSession):
        self.session = session

    def before_first_write(self, prepared: PreparedBatch) -> None:
        session = self.session
        if session.checkpoint is None and not session.exactly_once:
            session.write_first_checkpoint(prepared.source_first_offset)

    def first_landing(self, prepared: PreparedBatch, base: int) -> None:
        session = self.session
        checkpoint = session.checkpoint
        if checkpoint is None or checkpoint.target_next is None:
            # nothing of ours on the target yet, and nothing of anyone else's may be (a halt's resume that accepts
            # what is there stores the target's end as target_next: state/lane_control.resume_lane)
            refuse_unclaimed_target(session, prepared.source_first_offset, base)
            return
        expected = checkpoint.target_next
        own_marker = 1 if session.exactly_once or session.fence_marker_pending else 0
        session.fence_marker_pending = False
        if base == expected or base == expected + own_marker:
            return
        target, topic, partition = session.owner.target, session.target_topic, session.target_partition
        where = (target.cluster_name, topic, partition, expected, base)
        if base < expected:
            raise ForeignWriteError(*where, "the target partition ends before the checkpoint (truncated or "
                                            "recreated target topic)")
        # exactly-once, our own transaction starts at ``base``; anything open below it is another producer's,
        # or the lane's own earlier one not yet decided (own_open_transaction)
        stable = list_offsets(target, topic, partition, "last_stable")
        while stable < base:
            # exactly-once only: an at-least-once first batch is already written outside any transaction, and a
            # retry would write it again; an at-least-once lane's own fences are empty aborted transactions anyway
            own = own_open_transaction(session, stable) if session.exactly_once else None
            if own is not None:  # ours, not yet decided: the checkpoint read may predate it (never halt on it)
                raise OwnTransactionUndecidedError(target.cluster_name, topic, partition, stable, *own)
            # the look may have taken a while (leader moves retried): a transaction decided meanwhile shows no
            # producer as open there any more; judge the partition as it is now instead of halting on the past
            now = list_offsets(target, topic, partition, "last_stable") if session.exactly_once else stable
            if now == stable:
                raise ForeignWriteError(*where, f"another producer's transaction is open at offset {stable}")
            stable = now
        lo = max(expected, list_offsets(target, topic, partition, "earliest"))
        if lo >= base:
            return  # retention already removed what lay in between: nothing of it can be read any more
        window = session.owner.policy.commit_bytes
        found = committed_records(target, topic, partition, lo, base, limit=1 if session.exactly_once else None,
                                   max_bytes=2 * window)
        if found is not TOO_MANY and not found:
            return  # aborted transactions and markers only
        if session.exactly_once:
            raise ForeignWriteError(*where, "committed records from another writer lie in between")
        if found is TOO_MANY or lo > expected:
            detail = "more than one commit window of records" if found is TOO_MANY else "records whose start " \
                     "retention removed"
            raise ForeignWriteError(*where, f"{detail} lie in between, more than an at-least-once restart leaves")
        copied = self._source_copies(checkpoint.position, found, window)
        if copied is TOO_MANY or not restarted_copies(found, copied):
            raise ForeignWriteError(*where, f"{len(found)} committed record(s) in between are not the source's "
                                            f"records from offset {checkpoint.position}")
        session.duplicates_reported += len(found)
        session.checkpoint_now = True
        log.warning("cluster %r %s-%d: at-least-once resume found %d record(s) at [%d, %d) equal to the source's "
                    "from offset %d: a crash between write and checkpoint duplicated them", target.cluster_name,
                    topic, partition, len(found), expected, base, checkpoint.position)


    def _source_copies(self, position: int, found: list[tuple], window: int) -> list[tuple] | TooMany:
        """The source's records from ``position`` as a crashed run wrote them: with the timestamps this lane's copy
        writes (``--producer-timestamps``: a LogAppendTime source's create times), or, when ``found`` is not that,
        with the other choice: the crashed run may have been a ``shoal copy`` with the other setting than the daemon
        or backfill resuming now. Either way the records must be the source's, key, value, headers and all."""
        session = self.session
        preserve = session.owner.options.preserve_log_append_time
        copied: list[tuple] | TooMany = TOO_MANY
        for log_append_time_to_max in (preserve, not preserve):
            copied = committed_records(session.owner.source, session.topic, session.partition, position, None,
                                       limit=len(found), max_bytes=2 * window,
                                       log_append_time_to_max=log_append_time_to_max)
            if copied is not TOO_MANY and restarted_copies(found, copied):
                return copied
        return copied


def own_open_transaction(session: LaneSession, open_at: int) -> tuple[int, int] | None:
    """(producer id, epoch) of the transaction open at ``open_at`` on the lane's target partition when it is the
    lane's own — its writer's producer id at an older epoch — else None, also when that cannot be told for good (an
    old broker, an error retrying cannot cure): the caller then treats it as another producer's. Leader moves and
    transient errors are retried with fresh metadata; still failing after ``OWN_TRANSACTION_LOOK_S`` they raise
    :class:`PartitionUnavailableError` (retriable: not knowing yet is no reason to halt)."""
    writer, target = session.writer, session.owner.target
    if writer.producer_id < 0:
        return None
    topic, partition = session.target_topic, session.target_partition
    try:
        producers = partition_request_with_retries(
            target, topic, partition, "DescribeProducers", lambda: active_producers(target, topic, partition),
            retry_timeout_s=OWN_TRANSACTION_LOOK_S)
    except PartitionUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - cannot tell: the caller's conservative answer stands
        log.info("cluster %r %s-%d: DescribeProducers failed (%s); the transaction open at %d is taken as another "
                 "producer's", target.cluster_name, session.target_topic, session.target_partition, exc, open_at)
        return None
    return next(((p.producer_id, p.producer_epoch) for p in producers
                 if p.producer_id == writer.producer_id and p.open_transaction_at == open_at
                 and p.producer_epoch < writer.producer_epoch), None)


def refuse_unclaimed_target(session: LaneSession, position: int, end: int) -> None:
    """The first write of a lane with nothing of its own on the target (no checkpoint, or one saying nothing was
    written): its target partition must hold no committed record below ``end``, and no transaction open below it
    (ours are decided by then: InitProducerId ended them; an exactly-once copy's own, from ``end`` on, is the one
    allowed). Aborted data and markers are fine (an aborted first attempt, an at-least-once fence). Else
    :class:`TargetNotEmptyError`, nothing committed. A log start moved by the target's retention during the read
    is looked up again. One or two ListOffsets and at most one short read, once per lane."""
    target, topic, partition = session.owner.target, session.target_topic, session.target_partition
    for _attempt in range(3):
        log_start = list_offsets(target, topic, partition, "earliest")
        if log_start >= end:
            return
        stable = list_offsets(target, topic, partition, "last_stable")
        try:
            found = committed_records(target, topic, partition, log_start, end, limit=1, max_bytes=1 << 20)
        except DataLossError:  # retention (or delete-records) moved the target's log start under the read
            continue
        if stable >= end and found is not TOO_MANY and not found:
            return
        raise TargetNotEmptyError(target.cluster_name, topic, partition, session.owner.pipeline, session.topic,
                                  session.partition, position, log_start, end, session.owner.store.topic,
                                  open_transaction_at=None if found else stable)
    raise MirrorError(f"cluster {target.cluster_name!r} {topic}-{partition}: its log start kept moving while the "
                      "lane looked for records already there; retrying")  # unnamed: retried


def restarted_copies(found: list[tuple], source: list[tuple]) -> bool:
    """Whether ``found`` is one or more partial copies of ``source`` each starting at its beginning (every crashed
    at-least-once run after the checkpoint started there)."""
    j = 0
    for record in found:
        if j < len(source) and record == source[j]:
            j += 1
        elif source and record == source[0]:
            j = 1
        else:
            return False
    return True


class TooMany:
    """The type of :data:`TOO_MANY`. Truthy and not a list: a budget overrun must never read as "no records"
    (an empty list did once, and a record larger than the budget let a backfill take over a lane the daemon had
    written to, and let the landing rule pass foreign records); callers test ``is TOO_MANY`` first."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "TOO_MANY"


TOO_MANY = TooMany()  # sentinel: committed_records read past its byte budget


def committed_records(client: WireClient, topic: str, partition: int, start: int, end: int | None, *,
                       limit: int | None = None, max_bytes: int,
                       log_append_time_to_max: bool = True) -> list[tuple] | TooMany:
    """(timestamp, key, value, headers) of the committed records in ``[start, end)`` (or the first ``limit``
    from ``start``), as a READ_COMMITTED consumer sees them; never past the last stable offset (it does not
    wait for open transactions) and never more than ``max_bytes`` of keys and values (then :data:`TOO_MANY`).
    ``log_append_time_to_max=False``: a LogAppendTime batch's records with their create times, as a copy with
    ``preserve_log_append_time=False`` writes them."""
    out: list[tuple] = []
    size = 0
    fetcher = RawBatchFetcher(client, topic, partition, start, end, isolation=IsolationLevel.READ_COMMITTED,
                              max_bytes=1024 * 1024)
    while not fetcher.done and (limit is None or len(out) < limit):
        fetched = fetcher.fetch()
        for view in fetched.batches:
            for record in read_records(view, log_append_time_to_max=log_append_time_to_max):
                if limit is not None and len(out) >= limit:
                    return out
                if record.offset >= start and (end is None or record.offset < end):
                    key, value, headers = decode_record_tail(record.tail)
                    size += len(key or b"") + len(value or b"")
                    if size > max_bytes:
                        return TOO_MANY
                    out.append((record.timestamp, key, value, headers))
        if fetcher.position >= fetched.last_stable_offset:
            break  # the rest is not decided (or not there): READ_COMMITTED readers stop here too
    return out

