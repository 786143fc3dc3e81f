"""The raw-batch producer's side with the transaction coordinator: its producer id and epoch, transactions, and
fencing (:class:`TransactionalProducer`, the coordinator half of :class:`~mirror_core.kafka.writer.BatchWriter`).

Transactions use the classic protocol kafka-python speaks: InitProducerId(transactional_id) on the transaction
coordinator, AddPartitionsToTxn before the first write to a partition, EndTxn; Produce is capped at v11 and the
transaction requests at v3/v4 so a Kafka 4 broker never takes us for a "transaction version 2" client.

Bounds inside a transaction: the coordinator aborts a transaction older than ``transaction_timeout_ms`` and bumps
the producer epoch, which the writer's next request meets as INVALID_PRODUCER_EPOCH / PRODUCER_FENCED — the same
answers a newer writer of the transactional.id causes. So inside a transaction the writer stops retrying a write
once ``TRANSACTION_RETRY_SHARE`` of the timeout has passed since the transaction began (a retriable error: the
caller aborts and resumes from its checkpoint), and EndTxn never retries past the timeout. When a fencing-shaped
answer comes anyway, the writer tells the two apart (:meth:`TransactionalProducer.fenced_or_timed_out`):
InitProducerId with its own producer id and epoch succeeds only when no other writer initialised the id since, which
is how :class:`TransactionTimedOutError` (retriable) and :class:`ProducerFencedError` (stop) stay true.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence

import kafka.errors as Errors
from kafka.protocol.admin.transactions import DescribeTransactionsRequest
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from mirror_core.config.commit_policy import TRANSACTION_RETRY_SHARE
from mirror_core.errors import (
    CoordinatorUnavailableError,
    MirrorError,
    ProducerFencedError,
    TransactionsUnavailableError,
    TransactionTimedOutError,
    TransactionTimeoutRefusedError,
)
from mirror_core.kafka.produce_errors import COORDINATOR_MOVED, FENCED, NO_TRANSACTIONS
from mirror_core.kafka.retries import Backoff, is_retriable

log = logging.getLogger(__name__)


class TransactionalProducer:
    """The coordinator half of :class:`~mirror_core.kafka.writer.BatchWriter` (a mixin: its state, ``client``,
    ``transactional_id``, ``producer_id`` / ``producer_epoch``, the sequences and the ``_txn_*`` sets, is the
    writer's, made in its ``__init__``).

    Invariants: a new producer id or epoch resets every partition's sequence and forgets which partitions
    acknowledged one; a transaction writes only partitions AddPartitionsToTxn added, and EndTxn goes to the
    coordinator only when it added one; the coordinator is looked up once and forgotten on any retriable error.
    """

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
        self._sequences_unknown = False
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
                if isinstance(exc, FENCED):
                    raise ProducerFencedError(self.client.cluster_name, self._who, type(exc).__name__) from None
                if isinstance(exc, NO_TRANSACTIONS) and self.transactional_id is not None \
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

    def fenced_or_timed_out(self, fenced: ProducerFencedError) -> MirrorError:
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
        """Whether the coordinator's state is its own abort of our transaction (see :meth:`fenced_or_timed_out`)."""
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
        elif self._sequences_unknown:   # a write given up with its outcome unknown: a new epoch first
            self.init_producer_id(keep=True)
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
        if self._sequences_unknown:
            raise MirrorError(f"{self._who}: the open transaction holds a write given up with its outcome unknown; "
                              "abort it instead of committing")
        try:
            self._end_transaction(committed=True)
        except ProducerFencedError as exc:
            raise self.fenced_or_timed_out(exc) from None

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
            fenced = [e for e in errors if e in FENCED]
            fatal = [e for e in errors if not is_retriable(e) and e is not Errors.OperationNotAttemptedError]
            if fenced:
                raise ProducerFencedError(self.client.cluster_name, self._who, fenced[0].__name__)
            if fatal:
                raise MirrorError(f"AddPartitionsToTxn for {self._who} failed: {fatal[0].__name__}")
            if errors & COORDINATOR_MOVED:  # v0-3 say it per partition, never at the top (_coordinator_call's
                self._coordinator = None     # own check): look the coordinator up again before the retry
            if not backoff.wait():
                raise MirrorError(f"AddPartitionsToTxn for {self._who}: still {sorted(e.__name__ for e in errors)}")

