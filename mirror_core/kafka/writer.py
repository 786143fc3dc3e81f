"""Produce raw record batches to the target as an idempotent (later: transactional) producer.

The batches arrive ready for the target (:func:`mirror_core.codec.batch_codec.prepare_for_target` has fixed offsets,
attributes and timestamps); the writer only owns the producer fields. Each batch gets our producerId /
producerEpoch, the partition's next sequence number and the transactional bit (set only inside our transaction),
stamped into the batch's own buffer with the CRC resealed
(:func:`mirror_core.codec.batch_codec.stamp_producer_in_place`).

A batch is stamped once per producer identity and sequence, and every retry resends the identical bytes, so the
broker's idempotence check turns a retry of a batch that did land into a duplicate acknowledgement, not a second copy.

Produce requests are pipelined: up to ``MAX_IN_FLIGHT`` (5, the most for which Kafka's idempotence keeps order)
per broker, with sequences assigned in send order. Answers are taken in send order; when a batch fails, the
partition's later batches in flight are resent after it with their original bytes (the broker rejects those it did
not write as out of sequence and acknowledges those it did as duplicates), so a partition's order never changes.
That holds only where the broker has our producer state: a partition with no state for a producer id accepts that
producer's first batch whatever its sequence (Kafka's ``ProducerAppendInfo.checkSequence``), so with several in flight
a batch behind a refused first one (a new topic's partition answering NOT_LEADER_OR_FOLLOWER until its leader is
ready) would land first. So until the broker acknowledged a batch of the current producer id and epoch on a
partition, that partition has one batch in flight; and should a later batch still land ahead of a refused one (the
broker dropped our state, e.g. when retention deleted all our batches), the writer halts with
:class:`~mirror_core.errors.WriteOrderError` rather than re-initialise and write the refused batch after it.
One copy path runs one partition, so one Produce round trip per batch was the limit without this (see
``docs/performance.md``). A Produce request (v3+) carries one batch per partition (Kafka's
``ProduceRequest.validateRecords``), and a broker handles one request per connection at a time, so a single
partition of one-record batches stays bound by the broker's time per request; several partitions share requests:
one writer's partitions always, several writers' (lanes') outside transactions through :func:`write_together`.

Transactions use the classic protocol kafka-python speaks: InitProducerId(transactional_id) on the transaction
coordinator, AddPartitionsToTxn before the first write to a partition, EndTxn; Produce is capped at v11 and the
transaction requests at v3/v4 so a Kafka 4 broker never takes us for a "transaction version 2" client.

Bounds inside a transaction: the coordinator aborts a transaction older than ``transaction_timeout_ms`` and bumps
the producer epoch, which the writer's next request meets as INVALID_PRODUCER_EPOCH / PRODUCER_FENCED — the same
answers a newer writer of the transactional.id causes. So inside a transaction the writer stops retrying a write
once ``TRANSACTION_RETRY_SHARE`` of the timeout has passed since the transaction began (a retriable error: the
caller aborts and resumes from its checkpoint), and EndTxn never retries past the timeout. When a fencing-shaped
answer comes anyway, the writer tells the two apart (:meth:`BatchWriter._fenced_or_timed_out`): InitProducerId
with its own producer id and epoch succeeds only when no other writer initialised the id since, which is how
:class:`TransactionTimedOutError` (retriable) and :class:`ProducerFencedError` (stop) stay true.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.admin.transactions import DescribeTransactionsRequest
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
)

from mirror_core.codec.batch_codec import LOG_OVERHEAD, V2_HEADER, parse_batch
from mirror_core.codec.batch_prepare import stamp_producer_in_place
from mirror_core.config.commit_policy import TRANSACTION_RETRY_SHARE
from mirror_core.errors import (
    AmbiguousWriteError,
    BatchRejectedError,
    CoordinatorUnavailableError,
    CorruptBatchError,
    MirrorError,
    PartitionUnavailableError,
    ProducerFencedError,
    TransactionsUnavailableError,
    TransactionTimedOutError,
    TransactionTimeoutRefusedError,
    WriteOrderError,
)
from mirror_core.kafka.wire_client import Backoff, WireClient, is_retriable

log = logging.getLogger(__name__)

_MAX_SEQUENCE = 2**31 - 1
PRODUCE_MAX_VERSION = 11
# Produce requests in flight per broker connection (so per partition too): the broker keeps the idempotence
# state of the last 5 batches per producer and partition, and kafka-python pauses a connection at 5 in flight.
MAX_IN_FLIGHT = 5
# After waiting for an answer, the pipeline takes the answers that already arrived before sending again, but only
# while more than this many requests stay in flight (work queued at the broker while the answers are handled)
KEEP_QUEUED = 3
# A write of one writer to one partition takes _Pipeline._run_one_partition (same requests, less Python per
# request); False sends every write through the general turns (tests compare the two)
ONE_PARTITION_LOOP = True
# The target refuses these for good: resending the same bytes cannot help.
_REJECTIONS = (
    Errors.MessageSizeTooLargeError, Errors.CorruptRecordError, Errors.InvalidRecordError,
    Errors.InvalidTimestampError, Errors.TopicAuthorizationFailedError, Errors.RecordListTooLargeError,
    Errors.InvalidTopicError, Errors.UnsupportedForMessageFormatError, Errors.InvalidRequiredAcksError,
    Errors.ClusterAuthorizationFailedError, Errors.TransactionalIdAuthorizationFailedError,
    Errors.UnsupportedCompressionTypeError, Errors.PolicyViolationError,
)
# a transaction coordinator's "not me (any more)": the cached coordinator is forgotten and looked up again
_COORDINATOR_MOVED = frozenset({Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError})
_FENCED = (Errors.InvalidProducerEpochError, Errors.ProducerFencedError, Errors.TransactionCoordinatorFencedError,
           Errors.InvalidProducerIdMappingError, Errors.InvalidTxnStateError)
_STATE_LOST = (Errors.OutOfOrderSequenceNumberError, Errors.UnknownProducerIdError)
# InitProducerId answers meaning "this cluster will not let us be a transactional producer" (not: "try again").
_NO_TRANSACTIONS = (Errors.TransactionalIdAuthorizationFailedError, Errors.UnsupportedVersionError,
                    Errors.ClusterAuthorizationFailedError)


def next_sequence(sequence: int, records: int) -> int:
    """Kafka's sequence arithmetic: wraps to 0 after 2^31 - 1."""
    return (sequence + records) % (_MAX_SEQUENCE + 1)


@dataclass(frozen=True)
class OutgoingBatch:
    """One v2 batch for a target partition, ready apart from its producer fields.

    The writer owns ``data`` and stamps it in place on every write; the caller must not share the buffer.
    Handed anything but a ``bytearray`` or a writable byte ``memoryview`` (the copier's batches re-stamped in
    their Fetch frame), the batch copies it once.
    """

    topic: str
    partition: int
    data: bytearray | memoryview
    source_offset: int  # source base offset, named in errors

    def __post_init__(self):
        data = self.data
        if not isinstance(data, bytearray) and not (
                isinstance(data, memoryview) and not data.readonly and data.format == "B" and data.ndim == 1
                and data.c_contiguous):
            object.__setattr__(self, "data", bytearray(data))

    @property
    def records_count(self) -> int:
        return parse_batch(self.data).records_count


class _Pending:
    __slots__ = ("index", "batch", "records", "stamped_for", "ambiguous", "landed_at")

    def __init__(self, index: int, batch: OutgoingBatch, records: int):
        self.index = index
        self.batch = batch
        self.records = records
        self.stamped_for: tuple[int, int, int, bool] | None = None  # (producer id, epoch, sequence, transactional)
        self.ambiguous = False
        self.landed_at = -1  # target offset of a write the broker acknowledged behind a failed batch


class BatchWriter:
    """Writes raw batches to target partitions with broker-enforced idempotence.

    Invariants: per partition at most ``MAX_IN_FLIGHT`` batches are in flight and batches land in the order given;
    a batch's bytes never change between retries within one producer epoch; ``_next_seq[tp]`` is the sequence of
    the next unacknowledged batch and moves only when the broker acknowledged one; a non-retriable rejection stops
    the write with the partition and source offset named. Pipelined but single-threaded: :meth:`write` returns
    when every batch is acknowledged; batches are stamped in their own buffers, and the encoded requests in
    flight stay under ``max_inflight_bytes``.
    """

    def __init__(self, client: WireClient, *, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000, acks: int = -1, timeout_ms: int = 30_000,
                 max_request_bytes: int = 16 * 1024 * 1024, max_inflight_bytes: int = 8 * 1024 * 1024,
                 retry_timeout_s: float = 120.0):
        if acks != -1:
            raise ValueError("idempotent writes need acks=all (-1)")
        self.client = client
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.acks = acks
        self.timeout_ms = timeout_ms
        self.max_request_bytes = max_request_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self.retry_timeout_s = retry_timeout_s
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_seq: dict[tuple[str, int], int] = collections.defaultdict(int)
        # partitions where the broker acknowledged a batch of the current producer id and epoch (so it holds our
        # producer state and enforces our sequences there); see _Pipeline._fill
        self._acknowledged: set[tuple[str, int]] = set()
        self._in_txn = False
        self._txn_started = 0.0  # monotonic time of begin_transaction
        self._txn_partitions: set[tuple[str, int]] = set()
        # outside transactions, writes may go through a SharedProduce (mirror_core.kafka.shared_produce): several lanes'
        # writes in the same Produce requests
        self.shared = None
        # partitions the open transaction will write (announced by the caller): added with the next
        # AddPartitionsToTxn, so a lane's data and checkpoint partitions cost one request, not two
        self._txn_expected: set[tuple[str, int]] = set()
        # the transaction coordinator's node, found once and kept until it answers "not me" or cannot be reached
        self._coordinator: int | None = None

    @property
    def _who(self) -> str:
        return f"transactional.id {self.transactional_id!r}" if self.transactional_id else \
            f"producer id {self.producer_id}"

    # -- producer identity -----------------------------------------------------------------------------------

    def init_producer_id(self, *, keep: bool = False, give_up_after_s: float | None = None) -> tuple[int, int]:
        """Get (or, for a transactional id, take over and fence) a producer id and epoch; resets sequences.

        ``keep``: a transactional writer re-initialising after an error sends its current producer id and epoch,
        so the coordinator refuses (PRODUCER_FENCED) instead of fencing a newer writer of the id."""
        known = keep and self.transactional_id is not None and self.producer_id >= 0
        request = InitProducerIdRequest(transactional_id=self.transactional_id,
                                        transaction_timeout_ms=self.transaction_timeout_ms,
                                        producer_id=self.producer_id if known else -1,
                                        producer_epoch=self.producer_epoch if known else -1, max_version=4)
        response = self._coordinator_call(request, "InitProducerId", give_up_after_s=give_up_after_s)
        self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
        self._next_seq.clear()
        self._acknowledged.clear()
        self._in_txn = False
        self._txn_partitions.clear()
        self._txn_expected.clear()
        log.info("writer on %r: %s has epoch %d", self.client.cluster_name, self._who, self.producer_epoch)
        return self.producer_id, self.producer_epoch

    def _retry_window_s(self, share: float = TRANSACTION_RETRY_SHARE) -> float:
        """How long a retry loop may run from now: ``retry_timeout_s``, and inside a transaction never past
        ``share`` of the transaction timeout since the transaction began."""
        if not self._in_txn:
            return self.retry_timeout_s
        left = self._txn_started + self.transaction_timeout_ms / 1000 * share - time.monotonic()
        return max(0.0, min(self.retry_timeout_s, left))

    @property
    def produce_timeout_ms(self) -> int:
        """How long the broker may wait for acknowledgements of one Produce: ``timeout_ms``, inside a transaction
        no longer than what is left of its retry window (at least 1 s), so one slow request cannot outlive it."""
        if not self._in_txn:
            return self.timeout_ms
        return int(min(self.timeout_ms, max(1.0, self._retry_window_s()) * 1000))

    def _coordinator_call(self, request, what: str, *, give_up_after_s: float | None = None):
        """Send to the transaction coordinator (any broker for idempotent-only InitProducerId), retrying for
        ``give_up_after_s`` (default: :meth:`_retry_window_s`). The coordinator is looked up once and kept (a
        lane's commit makes several calls, each a round trip saved); any retriable error forgets it, so a moved
        coordinator (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, a lost connection) is looked up again."""
        backoff = Backoff(give_up_after=self._retry_window_s() if give_up_after_s is None else give_up_after_s)
        while True:
            try:
                if self.transactional_id is not None and self._coordinator is None:
                    self._coordinator = self.client.find_coordinator(self.transactional_id,
                                                                     CoordinatorType.TRANSACTION)
                response = self.client.send(self._coordinator, request)
                error = Errors.for_code(response.error_code)
                if error is not Errors.NoError:
                    raise error()
                return response
            except Errors.KafkaError as exc:
                if isinstance(exc, _FENCED):
                    raise ProducerFencedError(self.client.cluster_name, self._who, type(exc).__name__) from None
                if isinstance(exc, _NO_TRANSACTIONS) and self.transactional_id is not None \
                        and isinstance(request, InitProducerIdRequest):
                    raise TransactionsUnavailableError(self.client.cluster_name, self._who,
                                                       type(exc).__name__) from None
                if isinstance(exc, Errors.InvalidTransactionTimeoutError):
                    raise TransactionTimeoutRefusedError(self.client.cluster_name, self._who,
                                                         self.transaction_timeout_ms) from None
                if not is_retriable(type(exc)):
                    raise MirrorError(f"{what} for {self._who} on cluster {self.client.cluster_name!r} failed: "
                                      f"{type(exc).__name__}") from None
                self._coordinator = None
                if not backoff.wait():
                    if isinstance(exc, Errors.ConcurrentTransactionsError):
                        raise MirrorError(f"{what} for {self._who} on cluster {self.client.cluster_name!r}: the id's "
                                          "previous transaction is still being completed (its markers are not "
                                          f"written yet) ({type(exc).__name__})") from None
                    raise CoordinatorUnavailableError(self.client.cluster_name, self._who, what, type(exc).__name__,
                                                      backoff.elapsed) from None

    def _fenced_or_timed_out(self, fenced: ProducerFencedError) -> MirrorError:
        """What a fencing-shaped answer (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, INVALID_TXN_STATE) really means.

        A newer writer's InitProducerId and the coordinator's own abort of a timed-out transaction both bump the
        epoch. InitProducerId with our producer id and epoch tells them apart without harming a newer writer: the
        coordinator answers PRODUCER_FENCED when another writer initialised the id since us, and otherwise gives
        us the epoch it bumped (Kafka 4). A transaction younger than its timeout cannot have timed out, so only an
        older one is asked about at all. Older coordinators (Kafka 3) refuse that after a timeout too; then their
        transaction state decides: one bump past our epoch, by an abort, on our producer id, is the coordinator's
        timeout abort — a newer writer's InitProducerId ends two past an ongoing transaction of ours (the fence,
        then its own epoch; only the moment between the two looks like a timeout, and reopening then just fences
        back, the broker keeping one writer at a time).
        """
        if self.transactional_id is None or self.producer_id < 0:
            return fenced
        had_transaction = self._in_txn and bool(self._txn_partitions)
        young = time.monotonic() - self._txn_started < self.transaction_timeout_ms / 1000
        if not had_transaction or young:  # the coordinator bumps an epoch on its own only to abort an open
            return fenced                 # transaction older than its timeout (it counts from AddPartitionsToTxn)
        mine = (self.producer_id, self.producer_epoch)
        self._in_txn = False  # whatever the answer, that transaction is over
        self._txn_partitions.clear()
        try:  # the coordinator may still be writing its abort markers: CONCURRENT_TRANSACTIONS, retried
            self.init_producer_id(keep=True, give_up_after_s=min(self.retry_timeout_s,
                                                                 self.transaction_timeout_ms / 1000))
        except ProducerFencedError:
            if not self._aborted_by_coordinator(*mine):
                return fenced
        except MirrorError as exc:
            log.warning("writer on %r: %s: could not tell a fencing from a transaction timeout: %s",
                        self.client.cluster_name, self._who, exc)
            return fenced
        return TransactionTimedOutError(self.client.cluster_name, self._who, fenced.error,
                                        self.transaction_timeout_ms)

    def _aborted_by_coordinator(self, producer_id: int, epoch: int) -> bool:
        """Whether the coordinator's state is its own abort of our transaction (see :meth:`_fenced_or_timed_out`)."""
        try:
            state = self._transaction_state()
        except Errors.KafkaError as exc:
            log.info("DescribeTransactions for %s failed: %s", self._who, type(exc).__name__)
            return False
        return (state.producer_id == producer_id and state.producer_epoch == epoch + 1
                and state.transaction_state in ("PrepareAbort", "CompleteAbort"))

    def _transaction_state(self):
        """The coordinator's DescribeTransactions entry for our transactional.id (read-only: fences nobody)."""
        response = self.client.send(
            self.client.find_coordinator(self.transactional_id, CoordinatorType.TRANSACTION),
            DescribeTransactionsRequest(transactional_ids=[self.transactional_id]))
        state = response.transaction_states[0]
        error = Errors.for_code(state.error_code)
        if error is not Errors.NoError:
            raise error()
        return state

    def fence_partitions(self, tps: Sequence[tuple[str, int]]) -> None:
        """Make the leaders of ``tps`` refuse every older epoch of our transactional.id from now on, even its
        non-transactional writes: an empty transaction over them, aborted, leaves an abort marker of our producer
        id and epoch in each (one offset), and a partition rejects writes of an epoch older than the newest it has
        seen (INVALID_PRODUCER_EPOCH). Returns once the coordinator wrote the markers."""
        self.begin_transaction()
        self._add_partitions(list(tps))
        self.abort_transaction()
        backoff = Backoff(initial=0.02, cap=0.5, give_up_after=self.retry_timeout_s)
        while True:
            try:
                state = self._transaction_state().transaction_state
                if state != "PrepareAbort":
                    return
            except Errors.KafkaError as exc:
                if not is_retriable(type(exc)):  # no DescribeTransactions (Kafka < 3.0): markers follow in ms
                    return
                state = type(exc).__name__
            if not backoff.wait():
                raise MirrorError(f"fencing partitions for {self._who} on cluster {self.client.cluster_name!r}: "
                                  f"the abort markers were not written ({state})")

    # -- transactions (classic protocol) ---------------------------------------------------------------------

    def begin_transaction(self) -> None:
        if self.transactional_id is None:
            raise MirrorError("begin_transaction needs a transactional_id")
        if self.producer_id < 0:
            self.init_producer_id()
        self._in_txn = True
        self._txn_started = time.monotonic()
        self._txn_partitions.clear()
        self._txn_expected.clear()

    def expect_partitions(self, tps: Sequence[tuple[str, int]]) -> None:
        """The open transaction will write ``tps`` too: they go with the next AddPartitionsToTxn (one request for a
        lane's data and checkpoint partitions). Announce only partitions the transaction surely writes: one added
        and not written still gets the transaction's marker."""
        if not self._in_txn:
            raise MirrorError("expect_partitions needs an open transaction")
        self._txn_expected.update(tps)

    @property
    def in_transaction(self) -> bool:
        """A transaction was begun and not yet committed or aborted."""
        return self._in_txn

    def commit_transaction(self) -> None:
        try:
            self._end_transaction(committed=True)
        except ProducerFencedError as exc:
            raise self._fenced_or_timed_out(exc) from None

    def abort_transaction(self, *, give_up_after_s: float | None = None) -> None:
        """Abort the open transaction; ``give_up_after_s`` bounds the retries (default ``retry_timeout_s``)."""
        self._end_transaction(committed=False, give_up_after_s=give_up_after_s)

    def _end_transaction(self, committed: bool, give_up_after_s: float | None = None) -> None:
        if not self._in_txn:
            raise MirrorError("no transaction is open")
        if self._txn_partitions:
            self._coordinator_call(EndTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, committed=committed, max_version=3), "EndTxn",
                give_up_after_s=self._retry_window_s(share=1.0) if give_up_after_s is None else give_up_after_s)
        self._in_txn = False
        self._txn_partitions.clear()
        self._txn_expected.clear()

    def _add_partitions(self, tps: list[tuple[str, int]]) -> None:
        if not set(tps) - self._txn_partitions:
            return
        new = sorted((set(tps) | self._txn_expected) - self._txn_partitions)
        if not new:
            return
        by_topic = collections.defaultdict(list)
        for topic, partition in new:
            by_topic[topic].append(partition)
        Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        request = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.producer_epoch,
            v3_and_below_topics=[Topic(name=t, partitions=ps) for t, ps in by_topic.items()], max_version=3)
        backoff = Backoff(give_up_after=self._retry_window_s())
        while True:
            response = self._coordinator_call(request, "AddPartitionsToTxn")  # v0-3: no top-level error
            errors = {Errors.for_code(p.partition_error_code)
                      for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}
            errors.discard(Errors.NoError)
            if not errors:
                self._txn_partitions.update(new)
                self._txn_expected.difference_update(new)
                return
            fenced = [e for e in errors if e in _FENCED]
            fatal = [e for e in errors if not is_retriable(e) and e is not Errors.OperationNotAttemptedError]
            if fenced:
                raise ProducerFencedError(self.client.cluster_name, self._who, fenced[0].__name__)
            if fatal:
                raise MirrorError(f"AddPartitionsToTxn for {self._who} failed: {fatal[0].__name__}")
            if errors & _COORDINATOR_MOVED:  # v0-3 say it per partition, never at the top (_coordinator_call's
                self._coordinator = None     # own check): look the coordinator up again before the retry
            if not backoff.wait():
                raise MirrorError(f"AddPartitionsToTxn for {self._who}: still {sorted(e.__name__ for e in errors)}")

    # -- writing ---------------------------------------------------------------------------------------------

    def write(self, batches: Sequence[OutgoingBatch]) -> list[int]:
        """Write ``batches`` (in order per partition) and return the base offset the target gave each one.

        Batches of different partitions share Produce requests (one batch per partition per request) and up to
        ``MAX_IN_FLIGHT`` requests per broker are in flight at once; a base offset of -1 means the broker
        reported the batch as an already-written duplicate without its offset.
        """
        if self.shared is not None and not self._in_txn:
            return self.shared.write(self, batches)
        counts = [_check_ready(batch) for batch in batches]   # each batch parsed once
        if self.producer_id < 0:
            self.init_producer_id()
        results: list[int] = [-1] * len(batches)
        try:
            if self._in_txn:
                self._add_partitions([(b.topic, b.partition) for b in batches])
            if batches:
                _Pipeline([(self, batches, results, counts)]).run()
        except ProducerFencedError as exc:
            raise self._fenced_or_timed_out(exc) from None
        return results

    def prepare_write(self, batches: Sequence[OutgoingBatch]) -> list[int]:
        """Before a shared write (:func:`write_together`): each batch's record count (ValueError naming a batch
        that cannot be written as it is), and a producer id."""
        counts = [_check_ready(batch) for batch in batches]
        if self.producer_id < 0:
            self.init_producer_id()
        return counts

    def _stamp(self, p: _Pending, sequence: int) -> None:
        stamp = (self.producer_id, self.producer_epoch, sequence, self._in_txn)
        if p.stamped_for != stamp:
            stamp_producer_in_place(p.batch.data, producer_id=stamp[0], producer_epoch=stamp[1],
                                    base_sequence=stamp[2], transactional=stamp[3])
            p.stamped_for = stamp
            p.ambiguous = False
            p.landed_at = -1

    def _produce_request(self, items: dict[tuple[str, int], _Pending]) -> ProduceRequest:
        Topic = ProduceRequest.TopicProduceData
        by_topic = collections.defaultdict(list)
        for (topic, partition), p in items.items():
            records = p.batch.data if isinstance(p.batch.data, bytearray) else bytes(p.batch.data)
            by_topic[topic].append(Topic.PartitionProduceData(index=partition, records=records))
        return ProduceRequest(
            transactional_id=self.transactional_id if self._in_txn else None, acks=self.acks,
            timeout_ms=self.produce_timeout_ms,
            topic_data=[Topic(name=t, partition_data=ps) for t, ps in by_topic.items()],
            min_version=3, max_version=PRODUCE_MAX_VERSION)

    def _outcome(self, node: int, items: dict[tuple[str, int], _Pending], future,
                 owners: dict[tuple[str, int], BatchWriter] | None = None) -> dict[tuple[str, int], tuple]:
        """{tp: (error type, base offset)} for the partitions a finished request got an answer for (``owners``:
        the writer of each partition's batch when several writers share the request; default this one)."""
        owners = owners or {}
        if future.failed():
            exc = future.exception
            if not isinstance(exc, Errors.KafkaError):
                raise exc
            for tp, p in items.items():
                owners.get(tp, self)._raise_if_final(p, type(exc), None)
                p.ambiguous = True
            for topic in {tp[0] for tp in items}:
                self.client.invalidate(topic)
            log.info("produce to node %s on %r: %s; retrying", node, self.client.cluster_name, type(exc).__name__)
            return {}
        outcome = {}
        for topic_response in future.value.responses:
            for part in topic_response.partition_responses:
                tp = (topic_response.name, part.index)
                if tp not in items:
                    continue
                if not part.error_code:  # NO_ERROR, never final: the common answer, taken without the checks
                    outcome[tp] = (Errors.NoError, part.base_offset)
                    continue
                error = Errors.for_code(part.error_code)
                owners.get(tp, self)._raise_if_final(items[tp], error, part.error_message)
                outcome[tp] = (error, part.base_offset)
        return outcome

    def _raise_if_final(self, p: _Pending, error: type, detail: str | None) -> None:
        batch = p.batch
        if issubclass(error, _FENCED):
            raise ProducerFencedError(self.client.cluster_name, self._who, error.__name__)
        if issubclass(error, _REJECTIONS) or not (
                is_retriable(error) or error in _STATE_LOST
                or error in (Errors.NoError, Errors.DuplicateSequenceNumberError)):
            raise BatchRejectedError(self.client.cluster_name, batch.topic, batch.partition, batch.source_offset,
                                     _error_name(error), detail)

    def _on_state_lost(self, p: _Pending, error: type) -> None:
        batch = p.batch
        if p.ambiguous or self._in_txn:
            raise AmbiguousWriteError(self.client.cluster_name, batch.topic, batch.partition, batch.source_offset,
                                      _error_name(error))
        log.warning("target %r %s-%s: %s; re-initialising the producer id", self.client.cluster_name,
                    batch.topic, batch.partition, _error_name(error))


@dataclass
class ProduceStats:
    """Produce requests sent and batches they carried (counted by a shared write; tests and benchmarks)."""

    requests: int = 0
    batches: int = 0


def write_together(writes: Sequence[tuple[BatchWriter, Sequence[OutgoingBatch], Sequence[int]]], *,
                   stats: ProduceStats | None = None) -> list[list[int]]:
    """Write several writers' batches (each writer's in order) in shared Produce requests: ``(writer, batches,
    counts from prepare_write)`` each; returns each writer's base offsets as :meth:`BatchWriter.write` does.

    Only outside transactions (DESIGN §3.4: one request carries one transactional producer): the writers' own
    producer ids and sequences stamp their batches, and one request carries at most one batch per partition, so a
    request may mix lanes of at-least-once and ``none`` copies. The writers must share one target client."""
    results = [[-1] * len(batches) for _, batches, _ in writes]
    jobs = [(writer, batches, out, counts)
            for (writer, batches, counts), out in zip(writes, results, strict=True) if batches]
    for writer, *_ in jobs:
        if writer._in_txn:
            raise MirrorError(f"{writer._who}: writes inside a transaction cannot share Produce requests")
        if writer.client is not jobs[0][0].client:
            raise MirrorError("writers sharing Produce requests must share one target client")
    if jobs:
        _Pipeline(jobs, stats).run()
    return results


class _Request:
    __slots__ = ("node", "items", "keys", "size", "future")

    def __init__(self, node: int, items: dict[tuple[str, int], _Pending], keys: list, size: int, future):
        self.node = node
        self.items = items  # {tp: batch}: one batch per partition per request (the broker's rule)
        self.keys = keys    # the pipeline key (writer slot, tp) of each item, in the order of ``items``
        self.size = size
        self.future = future


class _Pipeline:
    """One write of one or several writers' batches: keeps up to ``MAX_IN_FLIGHT`` Produce requests in flight per
    broker. Several writers (lanes) share requests only outside transactions (:func:`write_together`); their
    batches are queued per (writer, partition), a request carries at most one batch per partition whoever writes it.

    Invariants: per partition the batches in flight are the leading ones of ``unacked[key]``, sent in order, and
    only the first ``sent[key]`` of them; at most one until the broker acknowledged a batch of the current producer
    id and epoch on the partition (before that it may hold no state for us and accept any sequence); a batch's
    sequence is ``_next_seq[tp]`` plus the records of the unacked batches before it, so a resend carries the same
    sequence and identical bytes (same producer epoch);
    acknowledgements are taken in send order and a partition's batches behind a failed one are resent after it,
    whatever their own answer was (the broker dedupes those that landed), so order on the target is the given
    order; a failure stops new sends until every request in flight has been answered, then retries after a
    backoff (or re-initialises the producer id of the writer whose state the broker lost); unacknowledged request
    bytes stay under ``max_inflight_bytes`` (one request may exceed it alone).

    Turns (:meth:`run`): :meth:`_fill` queues the requests the limits allow and :meth:`_Transport.flush` hands them
    to the sockets before anything waits (one ``sendmsg`` per connection per turn); then the oldest answer is
    waited for, and the answers already received are taken while more than ``KEEP_QUEUED`` requests stay in
    flight. Only the timing of sends changes: which batches a request carries, their order and every limit above
    are decided exactly as with one send per answer. ``leaders`` caches each partition's leader for a healthy
    stretch only (cleared by any failed batch and before every retry). A write of one writer to one partition on a
    fast connection runs these turns in :meth:`_run_one_partition` (the same decisions on the same state, without
    the per-request maps), until a failure hands it back to them.
    """

    def __init__(self, jobs: Sequence[tuple[BatchWriter, Sequence[OutgoingBatch], list[int], Sequence[int]]],
                 stats: ProduceStats | None = None):
        self.stats = stats
        self.writers = [job[0] for job in jobs]
        self.writer = writer = self.writers[0]  # sends the requests: its client, acks and transaction
        self.results = [job[2] for job in jobs]
        self.max_request_bytes = min(w.max_request_bytes for w in self.writers)
        self.max_inflight_bytes = max(w.max_inflight_bytes for w in self.writers)
        # key: (writer slot, tp)
        self.unacked: dict[tuple, collections.deque[_Pending]] = collections.defaultdict(collections.deque)
        for slot, (_, batches, _, counts) in enumerate(jobs):
            for index, batch in enumerate(batches):
                self.unacked[(slot, (batch.topic, batch.partition))].append(_Pending(index, batch, counts[index]))
        self.sent: dict[tuple, int] = dict.fromkeys(self.unacked, 0)
        self.send_seq: dict[tuple, int] = {}
        self.inflight: collections.deque[_Request] = collections.deque()
        self.node_load: dict[int, int] = collections.defaultdict(int)
        self.inflight_bytes = 0
        self.failed: dict[tuple, tuple[_Pending, type | None]] = {}  # first failure per (writer, partition)
        self.draining = False
        self.last_error = "no leader"
        self.backoff = Backoff(give_up_after=writer._retry_window_s())
        self.transport = _Transport(writer.client)
        # (writer slot, tp) -> leader node, looked up once per healthy stretch: forgotten whenever a request fails
        # (a moved leader answers NOT_LEADER_OR_FOLLOWER, which fails it) and before every retry, so a retry
        # always asks the client's metadata afresh, as each send did before
        self.leaders: dict[tuple, int] = {}

    def run(self) -> None:
        # Per turn: send what the limits allow (the requests queued in one turn leave together, one sendmsg per
        # connection), wait for the oldest answer, then take the answers that have already arrived as long as
        # more than KEEP_QUEUED requests stay in flight: the refill then goes out in one sendmsg, and the broker
        # (one request per connection at a time) still has queued work while this process handles the answers.
        inflight, transport = self.inflight, self.transport
        single = len(self.writers) == 1
        try:
            while self.unacked:
                if not self.draining:
                    if single and ONE_PARTITION_LOOP and len(self.unacked) == 1 and self._run_one_partition():
                        continue
                    self._fill()
                    transport.flush()
                if inflight:
                    self._complete(inflight.popleft())
                    while len(inflight) > KEEP_QUEUED and transport.answered(inflight[0].future):
                        self._complete(inflight.popleft())
                else:
                    self._retry()
        except BaseException:
            self._abandon()
            raise

    def _run_one_partition(self) -> bool:
        """The turns of :meth:`run` for a write of one writer to one partition on a fast connection, without the
        general per-request passes (:meth:`_fill`'s maps, :meth:`_send`'s and :class:`_Transport`'s regrouping,
        :meth:`_complete`'s outcome dict): on one partition each request carries exactly the partition's next
        batch, so a turn sends while the same limits as :meth:`_fill` allow (the first-acknowledgement rule,
        ``MAX_IN_FLIGHT``, ``max_inflight_bytes``), stamps each batch with the same sequence, flushes, waits for
        the oldest answer and takes the arrived ones while more than ``KEEP_QUEUED`` stay in flight. The
        requests are the general path's, byte for byte and in the same order (tested); the state kept is the
        general path's too (``unacked``, ``sent``, ``send_seq``, ``inflight``, ``node_load``,
        ``inflight_bytes``), so any answer other than a clean acknowledgement of the batch is handed to
        :meth:`_complete` as it is, and once a failure is noted (``draining``) the general turns take over.

        Returns False (nothing done) when the write is not on this shape: the partition's leader not yet looked
        up (the general :meth:`_fill` looks it up), no fast connection to it, or a failure being drained."""
        if self.failed or self.draining:
            return False
        (key, queue), = self.unacked.items()
        node = self.leaders.get(key)
        if node is None:
            return False
        conn = self.transport.fast_connection(node)
        if conn is None:
            return False
        tp = key[1]
        topic, partition = tp
        writer = self.writer
        acknowledged, next_seq = writer._acknowledged, writer._next_seq
        sent, send_seq, inflight, node_load, stats = self.sent, self.send_seq, self.inflight, self.node_load, \
            self.stats
        max_inflight_bytes, produce = self.max_inflight_bytes, conn.produce
        while True:
            count = sent[key]
            load = node_load[node]
            while count < len(queue) and load < MAX_IN_FLIGHT and (not count or tp in acknowledged):
                p = queue[count]
                data = p.batch.data
                size = len(data)
                if inflight and self.inflight_bytes + size > max_inflight_bytes:
                    break
                sequence = next_seq[tp] if not count else send_seq[key]
                writer._stamp(p, sequence)
                send_seq[key] = next_sequence(sequence, p.records)
                count += 1
                sent[key] = count
                timeout_ms = writer.produce_timeout_ms
                try:
                    future = produce(transactional_id=writer.transactional_id if writer._in_txn else None,
                                     acks=writer.acks, timeout_ms=timeout_ms,
                                     topic_data=[(topic, [(partition, data)])], max_version=PRODUCE_MAX_VERSION,
                                     request_timeout_ms=timeout_ms + 5_000, defer=True)
                except Errors.KafkaError as exc:
                    future = Future().failure(exc)
                inflight.append(_Request(node, {tp: p}, [key], size, future))
                load += 1
                node_load[node] = load
                self.inflight_bytes += size
                if stats is not None:
                    stats.requests += 1
                    stats.batches += 1
            conn.flush()
            if not inflight:
                return False
            self._take_one_partition(inflight.popleft(), key, tp)
            while len(inflight) > KEEP_QUEUED and conn.answered(inflight[0].future):
                self._take_one_partition(inflight.popleft(), key, tp)
            if self.draining or key not in self.unacked:
                return True

    def _take_one_partition(self, request: _Request, key: tuple, tp: tuple[str, int]) -> None:
        """:meth:`_complete` for a request of :meth:`_run_one_partition`: a clean acknowledgement of its batch is
        taken directly; anything else (a failed request, an error code, an answer of another shape, and every
        answer once a batch failed: those behind it are resent whatever they say) goes to :meth:`_complete`
        unchanged."""
        future = request.future
        conn = getattr(future, "conn", None)
        if conn is not None:
            conn.wait(future)
            if not future.failed() and not self.failed:   # behind a failed batch: _complete's rule decides
                responses = future.value.responses
                if len(responses) == 1 and responses[0].name == tp[0]:
                    parts = responses[0].partition_responses
                    if len(parts) == 1 and parts[0].index == tp[1] and not parts[0].error_code:
                        self.node_load[request.node] -= 1
                        self.inflight_bytes -= request.size
                        self._acknowledge(key, request.items[tp], parts[0].base_offset)
                        return
        self._complete(request)

    # -- sending ---------------------------------------------------------------------------------------------

    def _fill(self) -> None:
        """Send requests, one batch per partition each, until a limit is hit or nothing is left to send."""
        sent, node_load, leaders = self.sent, self.node_load, self.leaders
        while True:
            groups: dict[int, dict[tuple[str, int], _Pending]] = {}
            keys: dict[int, list] = {}
            sizes: dict[int, int] = {}
            total = 0  # bytes of this pass's requests
            for key, queue in self.unacked.items():
                count = sent[key]
                if count >= len(queue):
                    continue
                slot, tp = key
                if count and tp not in self.writers[slot]._acknowledged:
                    continue  # the broker may have no state for our producer id here: see the class docstring
                node = leaders.get(key)
                if node is None:
                    node = self._leader(key)
                    if node is None:
                        continue
                if node_load[node] >= MAX_IN_FLIGHT:
                    continue
                group = groups.get(node)
                if group is not None and tp in group:
                    continue
                pending = queue[count]
                size = len(pending.batch.data)
                if group and sizes[node] + size > self.max_request_bytes:
                    continue
                if (self.inflight or total) and self.inflight_bytes + total + size > self.max_inflight_bytes:
                    continue
                if group is None:
                    group = groups[node] = {}
                    keys[node], sizes[node] = [], 0
                group[tp] = pending
                keys[node].append(key)
                sizes[node] += size
                total += size
            if not groups:
                return
            for node, items in groups.items():
                self._send(node, items, keys[node], sizes[node])

    def _leader(self, key: tuple) -> int | None:
        """The partition's leader, remembered in ``leaders`` until a batch fails or a retry begins (then cleared)."""
        slot, tp = key
        try:
            node = self.leaders[key] = self.writer.client.leader_for(*tp)[0]
            return node
        except Errors.KafkaError as exc:
            queue = self.unacked[key]
            self.writers[slot]._raise_if_final(queue[self.sent[key]], type(exc), None)
            self.writer.client.invalidate(tp[0])
            self.last_error = type(exc).__name__
            return None

    def _send(self, node: int, items: dict[tuple[str, int], _Pending], keys: list, size: int) -> None:
        for key, p in zip(keys, items.values(), strict=True):
            writer = self.writers[key[0]]
            if self.sent[key] == 0:
                self.send_seq[key] = writer._next_seq[key[1]]
            writer._stamp(p, self.send_seq[key])
            self.send_seq[key] = next_sequence(self.send_seq[key], p.records)
            self.sent[key] += 1
        timeout_ms = self.writer.produce_timeout_ms
        future = self.transport.send(node, self.writer, items, timeout_ms + 5_000, timeout_ms)
        self.inflight.append(_Request(node, items, keys, size, future))
        if self.stats is not None:
            self.stats.requests += 1
            self.stats.batches += len(items)
        self.node_load[node] += 1
        self.inflight_bytes += size

    # -- answers ---------------------------------------------------------------------------------------------

    def _complete(self, request: _Request) -> None:
        """Take the answer of the oldest request in flight: acknowledge in order, or note the first failure."""
        self.transport.wait(request.future)
        self.node_load[request.node] -= 1
        self.inflight_bytes -= request.size
        if len(request.keys) == 1 and len(self.writers) == 1:
            owners = None  # the one writer: _outcome's default
        else:
            owners = {key[1]: self.writers[key[0]] for key in request.keys}
        outcome = self.writer._outcome(request.node, request.items, request.future, owners)
        if not outcome and request.future.failed():  # the connection failed: say so if the retries run out
            exc = request.future.exception
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        failed = self.failed
        for key, (tp, p) in zip(request.keys, request.items.items(), strict=True):
            error, base_offset = outcome.get(tp, (None, -1))
            if failed and key in failed:      # behind a failed batch: resent after it, whatever its answer
                if error is Errors.NoError and base_offset >= 0 and p.landed_at < 0:
                    p.landed_at = base_offset  # written (or a duplicate of a write) while an earlier one was not
                continue
            if error is Errors.NoError or error is Errors.DuplicateSequenceNumberError:
                self._acknowledge(key, p, base_offset)
            else:
                failed[key] = (p, error)
                self.draining = True
                self.leaders.clear()
                if error is not None:
                    self.last_error = error.__name__
                    if error not in _STATE_LOST:
                        self.writer.client.invalidate(tp[0])

    def _acknowledge(self, key: tuple, p: _Pending, base_offset: int) -> None:
        slot, tp = key
        queue = self.unacked[key]
        if queue[0] is not p:                 # cannot happen while answers come in send order
            raise MirrorError(f"{tp[0]}-{tp[1]}: acknowledgement out of order at source offset "
                              f"{p.batch.source_offset}")
        queue.popleft()
        self.sent[key] -= 1
        self.results[slot][p.index] = base_offset
        writer = self.writers[slot]
        writer._next_seq[tp] = next_sequence(writer._next_seq[tp], p.records)
        writer._acknowledged.add(tp)
        if not queue:
            del self.unacked[key], self.sent[key]
        self.backoff.reset()

    def _retry(self) -> None:
        """Nothing in flight and batches left: every unacked batch is resent, after a backoff or a new producer id."""
        for key in self.sent:
            self.sent[key] = 0
        self.leaders.clear()
        lost = [(key, p, error) for key, (p, error) in self.failed.items() if error in _STATE_LOST]
        self.failed.clear()
        self.draining = False
        if lost:
            renew = []
            for key, p, error in lost:
                writer = self.writers[key[0]]
                writer._on_state_lost(p, error)
                self._refuse_if_order_broken(key, p, error)
                if writer not in renew:
                    renew.append(writer)
            for writer in renew:
                self._refuse_if_renewal_ambiguous(writer, {key for key, _, _ in lost}, lost[0][2])
            for key, p, error in lost:
                self._refuse_if_landing_unknown(key, p, error)
            for writer in renew:
                writer.init_producer_id(keep=True)
        elif not self.backoff.wait():
            p = next(iter(self.unacked.values()))[0]
            raise PartitionUnavailableError(self.writer.client.cluster_name, p.batch.topic, p.batch.partition,
                                            f"write failed: {self.last_error}", offset=p.batch.source_offset)

    def _refuse_if_renewal_ambiguous(self, writer: BatchWriter, lost: set[tuple], error: type) -> None:
        """``writer`` is about to take a new producer id because partitions ``lost`` lost our state. Its
        unacknowledged batches of its OTHER partitions are then resent under the new id too, which the broker cannot
        dedupe against the old one: so should any of them have been sent without an answer (it may have landed) or
        landed behind a refused batch, halt instead of writing it twice. (Only a writer of several partitions in one
        write meets this; a lost partition's own batches are checked by :meth:`BatchWriter._on_state_lost` and
        :meth:`_refuse_if_order_broken` and :meth:`_refuse_if_landing_unknown`.)"""
        for key, queue in self.unacked.items():
            if key in lost or self.writers[key[0]] is not writer or not queue:
                continue
            for p in queue:
                if p.ambiguous:
                    raise AmbiguousWriteError(writer.client.cluster_name, p.batch.topic, p.batch.partition,
                                              p.batch.source_offset,
                                              f"{_error_name(error)} re-initialises the producer id")
            self._refuse_if_order_broken(key, queue[0], error)

    def _refuse_if_order_broken(self, key: tuple, head: _Pending, error: type) -> None:
        """The broker refuses ``head`` (the partition's first unacknowledged batch) as out of sequence; if a batch
        behind it was acknowledged meanwhile, that one is on the target and ``head`` is not: a new producer id would
        write ``head`` after it and it twice. Halt instead, naming both."""
        tp = key[1]
        for p in self.unacked.get(key, ()):
            if p is not head and p.landed_at >= 0:
                raise WriteOrderError(self.writer.client.cluster_name, tp[0], tp[1], head.batch.source_offset,
                                      p.batch.source_offset, p.landed_at, _error_name(error))

    def _refuse_if_landing_unknown(self, key: tuple, head: _Pending, error: type) -> None:
        """As :meth:`_refuse_if_order_broken` for a batch behind ``head`` sent under this producer id whose answer
        never came (``ambiguous``): a broker without our state takes it as a first batch, so it may be on the target
        ahead of ``head`` without our hearing of it, and a new producer id would write ``head`` after it and it
        twice. Halt, naming it (checked last: a proven landing or another partition's doubt is named first)."""
        tp = key[1]
        for p in self.unacked.get(key, ()):
            if p is not head and p.ambiguous:
                raise AmbiguousWriteError(self.writer.client.cluster_name, tp[0], tp[1], p.batch.source_offset,
                                          f"{_error_name(error)} for the batch from source offset "
                                          f"{head.batch.source_offset} before it")

    def _abandon(self) -> None:
        """On the way out with an error: let the requests in flight finish so none lands behind our back later."""
        while self.inflight:
            try:
                self.transport.wait(self.inflight.popleft().future)
            except Exception:  # noqa: BLE001 - the error being raised is the one to report
                log.debug("abandoned produce request failed", exc_info=True)


class _Transport:
    """Several requests in flight on one target client: ``send`` returns a kafka-python Future at once, ``wait``
    drives the network until a given one is answered.

    A client with ``fast_connection(node)`` (:class:`WireClient`, any security protocol) sends hand-encoded Produce
    requests on its own socket to the broker (:mod:`mirror_core.kafka.wire_fastpath`: the batches go to ``sendmsg``
    without a copy, no event-loop turns); one offering ``send_async(node, request, timeout_ms)`` / ``wait(future)``
    is used through them; any other client (test fakes) synchronously through ``send``, its futures coming back
    resolved. All requests of one write to one broker take the same route, so their order is the send order.

    On the fast route the requests of one turn of the pipeline are deferred and leave together at :meth:`flush`
    (one ``sendmsg`` per connection; a wait or any other request on the connection sends them first, see
    :meth:`FastConnection.send`); :meth:`answered` takes answers that already arrived without waiting.
    """

    def __init__(self, client):
        self.client = client
        self._fast = getattr(client, "fast_connection", None)
        self._native = hasattr(client, "send_async") and hasattr(client, "wait")
        self._deferred: list = []  # fast connections holding deferred requests until flush()

    def send(self, node: int, writer: BatchWriter, items: dict[tuple[str, int], _Pending], timeout_ms: int,
             produce_timeout_ms: int) -> Future:
        """Send one Produce request; ``timeout_ms`` bounds the wait for its answer, ``produce_timeout_ms`` is the
        request's own timeout field (the writer's :attr:`BatchWriter.produce_timeout_ms`, computed once per send)."""
        if self._fast is not None:
            try:
                conn = self._fast(node)
                if conn is not None:
                    if len(items) == 1:
                        ((topic, partition), p), = items.items()
                        topic_data = [(topic, [(partition, p.batch.data)])]
                    else:
                        by_topic: dict[str, list] = {}
                        for (topic, partition), p in items.items():
                            by_topic.setdefault(topic, []).append((partition, p.batch.data))
                        topic_data = list(by_topic.items())
                    future = conn.produce(transactional_id=writer.transactional_id if writer._in_txn else None,
                                          acks=writer.acks, timeout_ms=produce_timeout_ms,
                                          topic_data=topic_data, max_version=PRODUCE_MAX_VERSION,
                                          request_timeout_ms=timeout_ms, defer=True)
                    if conn not in self._deferred:
                        self._deferred.append(conn)
                    return future
            except Errors.KafkaError as exc:
                return Future().failure(exc)
        request = writer._produce_request(items)
        if self._native:
            return self.client.send_async(node, request, timeout_ms)
        future = Future()
        try:
            future.success(self.client.send(node, request, timeout_ms=timeout_ms))
        except Errors.KafkaError as exc:
            future.failure(exc)
        return future

    def fast_connection(self, node: int):
        """The fast connection :meth:`send` would use for ``node``, or None (no fast route, or it cannot be opened
        now: :meth:`send` then meets the same error and fails the request with it)."""
        if self._fast is None:
            return None
        try:
            return self._fast(node)
        except Errors.KafkaError:
            return None

    def flush(self) -> None:
        """Hand every deferred request to its connection's socket."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for conn in deferred:
                conn.flush()

    def answered(self, future: Future) -> bool:
        """Whether ``future`` is resolved already, reading (never waiting for) answers that arrived."""
        conn = getattr(future, "conn", None)
        return future.is_done if conn is None else conn.answered(future)

    def wait(self, future: Future) -> None:
        conn = getattr(future, "conn", None)
        if conn is not None:
            conn.wait(future)
        elif self._native:
            self.client.wait(future)


def _error_name(error: type) -> str:
    return getattr(error, "message", None) or error.__name__


def _check_ready(batch: OutgoingBatch) -> int:
    """The batch's record count, or ValueError naming it when it cannot be written as it is."""
    data = batch.data
    if len(data) >= V2_HEADER.size:   # the usual case, one unpack: a whole v2 batch with records and no holes
        fields = V2_HEADER.unpack_from(data, 0)
        # batchLength, magic, lastOffsetDelta, recordsCount (the field order of V2_HEADER: BatchView's)
        length, magic, last_delta, count = fields[1], fields[3], fields[6], fields[12]
        if length + LOG_OVERHEAD == len(data) and magic == 2 and count > 0 and last_delta + 1 == count:
            return count
    try:
        view = parse_batch(batch.data)
    except (ValueError, CorruptBatchError):
        view = None
    if view is not None and view.magic == 2 and view.records_count > 0 and not view.has_offset_holes:
        return view.records_count
    where = f"{batch.topic}-{batch.partition} source offset {batch.source_offset}"
    if view is None or view.magic != 2:
        raise ValueError(f"{where}: only whole magic-2 batches can be written")
    raise ValueError(f"{where}: batch has {view.records_count} records for {view.last_offset_delta + 1} "
                     "offsets; re-encode it first")
