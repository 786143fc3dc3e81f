"""A lane's writer and its fence: the mixin of :class:`~mirror_core.engine.lane_session.LaneSession` that holds
the lane's transactional.id.

``InitProducerId`` with ``shoal.<pipeline>.<lane>`` fences every older writer of the lane and aborts its open
transaction. At-least-once writes are not transactions, so the session also fences the lane's target partition and
checkpoint partition with one empty aborted transaction (:meth:`BatchWriter.fence_partitions`), and renews that
fence every ``refence_interval_s`` (the coordinator forgets an idle transactional.id). On a target that refuses
transactional producers, an at-least-once lane falls back to an idempotent writer (``fenced_by_broker`` False) and
the session checks ownership before each copy instead. A failed copy's open transaction is aborted at once,
bounded and best effort.

The mixin reads the session's ``owner`` (:class:`~mirror_core.engine.checkpointed.CheckpointedCopier`),
``topic``/``partition``, ``target_topic``/``target_partition``, ``exactly_once`` and ``writer``, and keeps
``fenced_by_broker``, ``fenced_at``, ``fences`` and ``fence_marker_pending``.
"""

from __future__ import annotations

import logging
import time

import kafka.errors as Errors

from mirror_core.config.names import lane_transactional_id
from mirror_core.errors import CoordinatorUnavailableError, ProducerFencedError, TransactionsUnavailableError
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.lane_status import classify_failure
from mirror_core.state.checkpoint import checkpoint_key, checkpoint_partition

log = logging.getLogger(__name__)

# the answers that mean another writer initialised the lane's transactional.id (INVALID_TXN_STATE, also
# fencing-shaped, is what an abort gets after a commit that landed though its answer was lost)
_NEWER_WRITER = ("ProducerFencedError", "InvalidProducerEpochError")
ABORT_GIVE_UP_S = 2.0  # how long a failed copy's abort may retry before the next InitProducerId is left to end it
TRANSACTION_STATE_TOPIC = "__transaction_state"


class LaneFence:
    """The writer half of a lane session: open the lane's writer (fencing), renew the at-least-once fence, begin
    and abort its transactions."""

    def _open_writer(self, lane: int | str) -> BatchWriter:
        """The lane's writer, holding its transactional.id: InitProducerId fences every older writer of the lane
        and aborts its open transaction; at-least-once also fences the lane's partitions (see the module
        docstring), so its first copy lands one offset (the abort marker) past the checkpoint."""
        owner, policy = self.owner, self.owner.policy
        settings = {"transaction_timeout_ms": policy.transaction_timeout_ms, "retry_timeout_s": policy.write_retry_s}
        writer = BatchWriter(owner.target, transactional_id=lane_transactional_id(owner.pipeline, lane), **settings)
        try:
            writer.init_producer_id()
        except (TransactionsUnavailableError, CoordinatorUnavailableError) as exc:
            # at-least-once does not need transactions, only wants their fence: a target that refuses
            # transactional producers, or whose transaction state topic could not be created (its coordinator
            # never answers), still gets copied, with the owner check in place of the fence. A coordinator that
            # is only slow (a target restarting, its state topic loading) is waited for: falling back then would
            # leave a former holder unfenced for the whole session
            if self.exactly_once or (isinstance(exc, CoordinatorUnavailableError)
                                     and self._transaction_state_topic_exists()):
                raise
            log.warning("%s; lane %s stays at-least-once with an idempotent writer, checking before each copy "
                        "that no other writer committed its checkpoint (best effort, not a broker fence)", exc, lane)
            self.fenced_by_broker = False
            writer = BatchWriter(owner.target, **settings)
            writer.init_producer_id()
            return writer
        if not self.exactly_once:
            self._fence(writer)
        return writer

    def _transaction_state_topic_exists(self) -> bool:
        try:
            self.owner.target.topic_metadata(TRANSACTION_STATE_TOPIC, refresh=True)
        except Errors.UnknownTopicOrPartitionError:
            return False
        except Errors.KafkaError:  # there, but unhealthy (leaderless, loading): worth waiting for
            return True
        return True

    def _fence(self, writer: BatchWriter) -> None:
        owner = self.owner
        key = checkpoint_key(owner.pipeline, self.topic, self.partition)
        writer.fence_partitions([(self.target_topic, self.target_partition),
                                 (owner.store.topic, checkpoint_partition(key, owner.store.partitions))])
        self.fenced_at = time.monotonic()
        self.fences += 1

    def renew_fence_if_due(self) -> None:
        """At-least-once with a broker fence: fence the lane's partitions again every ``refence_interval_s``.

        The fence lasts only while the coordinator remembers the lane's transactional.id, and at-least-once writes
        are not transactions, so they do not keep it alive: after ``transactional.id.expiration.ms`` (7 days by
        default) of no transaction the id is forgotten, a new holder's InitProducerId gets a *new* producer id,
        and its fence would not refuse this writer's producer id any more. Each renewal is one empty aborted
        transaction (one abort marker in the target and checkpoint partitions; the next copy's landing rule allows
        for it), and it fails with ProducerFencedError if another writer took the lane meanwhile."""
        if not self.fence_due:
            return
        self._fence(self.writer)
        self.fence_marker_pending = True

    def begin_transaction(self) -> None:
        """Begin the lane's next transaction, announcing the checkpoint partition its commit will write: it is then
        added with the data partition in one AddPartitionsToTxn (a round trip less per commit)."""
        owner = self.owner
        self.writer.begin_transaction()
        key = checkpoint_key(owner.pipeline, self.topic, self.partition)
        self.writer.expect_partitions([(owner.store.topic, checkpoint_partition(key, owner.store.partitions))])

    @property
    def fence_due(self) -> bool:
        """Whether :meth:`renew_fence_if_due` would fence now (a clock check, no I/O)."""
        return not self.exactly_once and self.fenced_by_broker and \
            time.monotonic() - self.fenced_at >= self.owner.policy.refence_interval_s

    @property
    def fence_due_at(self) -> float | None:
        """The monotonic time :attr:`fence_due` turns true (None: this session renews no fence)."""
        if self.exactly_once or not self.fenced_by_broker:
            return None
        return self.fenced_at + self.owner.policy.refence_interval_s

    def _after_failed_copy(self, exc: BaseException) -> BaseException:
        """After a failed copy: end the open transaction now (bounded, best effort), so it does not hold back the
        last stable offset of the target and checkpoint partitions until its timeout. Returns the error to raise:
        the copy's own — unless the abort found the writer fenced while the copy's error would only have been
        retried. Then a newer writer owns the lane, and that is what the caller must act on (the daemon drops the
        lane instead of reopening it and fencing the newer writer back). Seen on Kafka 4.4: a commit racing a
        newer writer's InitProducerId answered UNKNOWN_SERVER_ERROR (the coordinator's "transition to ONGOING
        while it already a pending state PREPARE_EPOCH_FENCE"), and only the abort said fenced. An error that
        halts the lane stays the one raised."""
        if not (self.exactly_once and self.writer.in_transaction):
            return exc
        try:
            self.writer.abort_transaction(give_up_after_s=ABORT_GIVE_UP_S)
        except ProducerFencedError as fenced:
            if isinstance(exc, Exception) and not isinstance(exc, ProducerFencedError) and classify_failure(exc)[0] \
                    and fenced.error in _NEWER_WRITER:
                # the coordinator's own abort of a transaction past its timeout bumps the epoch too: told apart as
                # the commit path does (the abort's fence stands only if it is a newer writer's)
                judged = self.writer.fenced_or_timed_out(fenced)
                if isinstance(judged, ProducerFencedError):
                    log.info("cluster %r %s-%d: the failed copy's writer is fenced (%s); the copy failed with %s",
                             self.owner.target.cluster_name, self.target_topic, self.target_partition, fenced, exc)
                    return judged
            self._not_aborted(fenced)
        except Exception as failed:  # noqa: BLE001 - the copy's own error is the one that matters
            self._not_aborted(failed)
        return exc

    def _not_aborted(self, failed: Exception) -> None:
        log.info("cluster %r %s-%d: the failed copy's transaction was not aborted (%s); the next InitProducerId or "
                 "the transaction timeout ends it", self.owner.target.cluster_name, self.target_topic,
                 self.target_partition, failed)

