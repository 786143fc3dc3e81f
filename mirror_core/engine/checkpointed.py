"""Copies that survive restarts: exactly-once (data and checkpoint in one target transaction) or at-least-once.

Exactly-once: the writer of a lane uses the transactional.id ``shoal.<pipeline>.<lane>`` (DESIGN.md §3: a lane
is a fixed set of target partitions, default one). ``InitProducerId`` with that id fences every older writer of
the lane and aborts its open transaction; only then is the checkpoint read (READ_COMMITTED), so the copy resumes
exactly where the last *committed* transaction left it. Batches and the checkpoint record are committed together
every ``commit_bytes`` or ``commit_interval_ms``: a crash loses at most the open transaction, which the broker
aborts, and nothing is ever written twice.

At-least-once: the checkpoint is written after the data was acknowledged. A crash between the two re-copies what
was acknowledged since the last checkpoint: the duplicate window is at most one commit interval of records
(``commit_bytes`` of data). Writes are not transactional (no markers, no held-back LSO), but the writer still holds
the lane's transactional.id, so a new holder of the lane fences a former one by the broker: its InitProducerId
bumps the epoch, and one empty aborted transaction over the lane's target partition and checkpoint partition puts
that epoch in both logs (:meth:`BatchWriter.fence_partitions`), after which they refuse the former holder's writes.
On a target that refuses transactional producers, the lane falls back to an idempotent writer and, before each
copy, checks that nobody else committed the lane's checkpoint since it last did (best effort: a check, not a fence).

Bounds: a transaction lasts one commit window plus the writer's retries; both must fit in
``TRANSACTION_RETRY_SHARE`` of ``transaction_timeout_ms`` (:class:`CommitPolicy`), so a write that keeps failing
ends as a retriable error before the coordinator aborts the transaction under it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.batch_codec import PreparedBatch
from mirror_core.codec.batch_deep import decode_record_tail, read_records
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import DAEMON_OWNER, default_lane, lane_transactional_id
from mirror_core.engine.copier import BatchSource, CopyOptions, CopyResult, PartitionRange, Progress, RangeCopier
from mirror_core.errors import (
    ConfigError,
    CoordinatorUnavailableError,
    DaemonOwnsLaneError,
    DataLossError,
    FetchError,
    ForeignWriteError,
    LaneTakenError,
    MirrorError,
    OwnershipError,
    PartitionUnavailableError,
    SkipRefusedError,
    TopicRecreatedError,
    TransactionsUnavailableError,
)
from mirror_core.kafka.epochs import EpochEnd, validate_position
from mirror_core.kafka.fetcher import RawBatchFetcher, fresh_topic_metadata, metadata_stamp_of
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.map_segments import LaneMap
from mirror_core.model.offset_map import normalise_ranges
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore, checkpoint_key, checkpoint_partition

log = logging.getLogger(__name__)

OPEN_VALIDATION_TIMEOUT_S = 5.0  # how long a lane open waits for the source leader's OffsetsForLeaderEpoch answer
ABORT_GIVE_UP_S = 2.0  # how long a failed copy's abort may retry before the next InitProducerId is left to end it
TRANSACTION_STATE_TOPIC = "__transaction_state"
# a lane that never wrote its target topic finds it missing from metadata: asked again this long before that is a
# ConfigError (the daemon's preflight may have created it a moment ago; a broker serves Metadata from a cache its
# controller updates asynchronously, so a topic just created can be unknown for a little while)
TARGET_TOPIC_APPEAR_S = 5.0
TARGET_TOPIC_RETRY_S = 0.2


class DeliveryMode(str, enum.Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


class CheckpointedCopier:
    """Copies one lane (one target partition) of a pipeline, resuming from and committing to the checkpoint store.

    Invariant: the stored checkpoint's position never passes data the target has not acknowledged (exactly-once:
    committed in the same transaction; at-least-once: written after the acknowledgement).
    """

    def __init__(self, source: WireClient, target: WireClient, store: CheckpointStore, *, pipeline: str,
                 mode: DeliveryMode = DeliveryMode.EXACTLY_ONCE, owner: str = "copy", owner_epoch: int = 0,
                 options: CopyOptions | None = None, policy: CommitPolicy | None = None,
                 accept_loss: bool = False):
        if not pipeline or any(c in pipeline for c in " /\\"):
            raise ConfigError(f"pipeline name {pipeline!r} must be non-empty, without spaces or slashes")
        self.source = source
        self.target = target
        self.store = store
        self.pipeline = pipeline
        self.mode = DeliveryMode(mode)
        self.owner = owner
        self.owner_epoch = owner_epoch
        self.options = options or CopyOptions(max_inflight_bytes=(policy or CommitPolicy()).commit_bytes)
        self.policy = policy or CommitPolicy()
        # a start past the checkpoint skips offsets never copied: refused, unless the operator accepts the loss
        # (then it is recorded in the checkpoint's lost ranges, where translation declines, and in the ledger)
        self.accept_loss = accept_loss

    def copy(self, rng: PartitionRange, progress: Progress | None = None, *, lane: int | str | None = None
             ) -> CopyResult:
        """Open the lane (fencing older writers), resume from its checkpoint and copy up to ``rng.end``."""
        session = self.open_lane(rng.topic, rng.partition, rng.target_topic, rng.target_partition, lane=lane)
        return session.copy(rng.start, rng.end, progress)

    def open_lane(self, topic: str, partition: int, target_topic: str, target_partition: int, *,
                  lane: int | str | None = None, read_checkpoint: bool = True) -> LaneSession:
        """Open the lane (see :class:`LaneSession`; ``read_checkpoint=False``: fenced only, the caller reads the
        checkpoint and calls :meth:`LaneSession.resume`)."""
        return LaneSession(self, topic, partition, target_topic, target_partition,
                           default_lane(target_topic, target_partition) if lane is None else lane,
                           read_checkpoint=read_checkpoint)


def _commit_identity(checkpoint: Checkpoint | None) -> tuple | None:
    if checkpoint is None:
        return None
    return (checkpoint.owner, checkpoint.owner_epoch, checkpoint.position, checkpoint.target_next)


class LaneSession:
    """An open lane of one source partition: the writer holds the lane's transactional.id (every older writer is
    fenced, its open transaction aborted), the checkpoint has been read, and ranges can be copied repeatedly (the
    daemon calls :meth:`copy` in a loop).

    Invariants: ``checkpoint`` is the last one committed by this session or found at open — read past the LSO
    (:meth:`CheckpointStore.read_own`), so it is never older than the lane's own last commit; ranges resume at
    its position, so nothing below it is copied twice, and never start above it unless the loss is accepted and
    recorded; the stored owner epoch is never newer than ours; the target topic is the one the checkpoint's
    offsets live in (topic id checked at open and before every commit), and every copy's first batch lands where
    the checkpoint says the target ends (:class:`_ResumeLanding`), so a foreign write or a recreated target
    halts the lane instead of bending the offset map.
    """

    def __init__(self, owner: CheckpointedCopier, topic: str, partition: int, target_topic: str,
                 target_partition: int, lane: int | str, *, read_checkpoint: bool = True):
        """Open the lane: InitProducerId with its transactional.id, then (``read_checkpoint``) its checkpoint read
        and checked (:meth:`resume`). ``read_checkpoint=False``: only the first half; the caller reads the
        checkpoint once this returned — e.g. many lanes' in one pass (:meth:`CheckpointStore.read_own_many`) —
        and hands it to :meth:`resume` before the session is used."""
        self.owner = owner
        self.topic, self.partition = topic, partition
        self.target_topic, self.target_partition = target_topic, target_partition
        self.exactly_once = owner.mode is DeliveryMode.EXACTLY_ONCE
        self.fenced_by_broker = True  # False: at-least-once on a target without transactions (owner check instead)
        self.fenced_at = 0.0  # at-least-once: monotonic time of the last fence (renewed, see renew_fence_if_due)
        self.fences = 0
        # metadata answered from here on is fresh enough for the topic ids checked at open (resume): one answer
        # per topic serves all the lanes a worker opens together
        self._opened_at = (metadata_stamp_of(owner.source), metadata_stamp_of(owner.target))
        self.checkpoint: Checkpoint | None = None
        self.writer = self._open_writer(lane)
        # at-least-once with a broker fence: the fence's abort marker sits before this session's first landing only
        self.fence_marker_pending = not self.exactly_once and self.fenced_by_broker
        if read_checkpoint:
            # after InitProducerId the lane's own transactions are all decided: read its key past the LSO
            self.resume(owner.store.read_own(owner.pipeline, topic, partition))

    def resume(self, checkpoint: Checkpoint | None, *, epoch_end: EpochEnd | None = None) -> None:
        """The second half of opening: take ``checkpoint`` — the lane's, read past the LSO
        (:meth:`CheckpointStore.read_own` or ``read_own_many``) only AFTER this session's InitProducerId returned,
        so every transaction a former holder left is decided — pin the topic ids and check that the lane can
        resume from it (a recreated topic, another target, a newer owner refuse). ``epoch_end``: the source
        leader's answer for the checkpoint's position epoch, asked after the checkpoint was read
        (:func:`~mirror_core.kafka.epochs.epoch_ends_many`, for many lanes at once); None: asked here."""
        owner, topic = self.owner, self.topic
        self.checkpoint = checkpoint
        topic_id = fresh_topic_metadata(owner.source, topic, self._opened_at[0]).topic_id
        self.source_topic_id = str(topic_id) if topic_id else None
        self.target_topic_id = self._current_target_topic_id(since=self._opened_at[1])
        self.duplicates_reported = 0  # at-least-once: records found twice on the target after a crash
        # at-least-once: this session's first landing found (and reported) duplicates, and the checkpoint still
        # points below them; the flush that found them is checkpointed at once (not when the commit window fills),
        # so a next holder resuming from this lane judges only what came after and never reports them again
        self.checkpoint_now = False
        # the offset map as commits extend it: sealed segments' bounds and the open tail (None: nothing copied yet)
        self.lane_map = None if self.checkpoint is None or self.checkpoint.offset_map is None else \
            LaneMap.from_checkpoint(self.checkpoint.offset_map, self.checkpoint.map_segments,
                                    start=self.checkpoint.position)
        # map segments ending at or below this are pruned at the next commit (mirror_core.kafka.prune_inputs gathers it:
        # nothing can ask for offsets below the source's log start and every source group's committed offset)
        self.prune_floor: int | None = None
        # the daemon's data-less first checkpoint this session took over (see _take_over_daemon_start), if any
        self.taken_over: Checkpoint | None = None
        self._check_resumable(self.checkpoint)
        if self.checkpoint is not None:
            self._validate_source_position(self.checkpoint, epoch_end)

    def _validate_source_position(self, checkpoint: Checkpoint, answer: EpochEnd | None = None) -> None:
        """Before the first fetch: does the source log below the position still hold what was copied? Best
        effort and quick: when the source leader cannot answer now (offline partition, an old broker), the first
        fetch's LastFetchedEpoch makes the broker run the same check, so the lane does not wait here."""
        try:
            validate_position(self.owner.source, self.topic, self.partition, checkpoint.position,
                              checkpoint.position_epoch, retry_timeout_s=OPEN_VALIDATION_TIMEOUT_S, answer=answer)
        except (PartitionUnavailableError, FetchError) as exc:
            log.info("cluster %r %s-%d: position %d not validated at lane open (%s); the first fetch checks it",
                     self.owner.source.cluster_name, self.topic, self.partition, checkpoint.position, exc)

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

    def check_still_owner(self) -> None:
        """Without a broker fence: raise :class:`LaneTakenError` if the lane's stored checkpoint is no longer the
        one this session read or wrote last (another writer committed the lane meanwhile)."""
        if self.fenced_by_broker:
            return
        stored = self.owner.store.read(self.owner.pipeline, self.topic, self.partition)
        if _commit_identity(stored) != _commit_identity(self.checkpoint):
            raise LaneTakenError(self.owner.pipeline, self.topic, self.partition, self.checkpoint, stored)

    def _current_target_topic_id(self, *, since: int | None = None) -> str | None:
        """The target topic's id now (``since``: from a Metadata answer taken after that stamp of the target
        client, :func:`~mirror_core.kafka.fetcher.fresh_topic_metadata`; default: asked now). A topic the lane never
        wrote that metadata does not know is asked again for up to ``TARGET_TOPIC_APPEAR_S`` (just created: not
        in the broker's metadata cache yet) before it is a :class:`ConfigError`; one it wrote is gone at once."""
        target = self.owner.target
        give_up_at = time.monotonic() + TARGET_TOPIC_APPEAR_S
        while True:
            try:
                meta = target.topic_metadata(self.target_topic, refresh=True) if since is None else \
                    fresh_topic_metadata(target, self.target_topic, since)
                topic_id = meta.topic_id
                break
            except Errors.UnknownTopicOrPartitionError:
                pinned = self.checkpoint.target_topic_id if getattr(self, "checkpoint", None) is not None else None
                if pinned:  # the lane wrote there before: the topic was deleted under it
                    raise TopicRecreatedError(target.cluster_name, self.target_topic, pinned, None) from None
                if time.monotonic() >= give_up_at:
                    raise ConfigError(f"target topic {self.target_topic!r} does not exist on cluster "
                                      f"{target.cluster_name!r}") from None
                time.sleep(TARGET_TOPIC_RETRY_S)
                since = None  # asked anew
        return str(topic_id) if topic_id else None

    def check_target_topic(self) -> None:
        """Raise :class:`TopicRecreatedError` if the target topic is not the one this lane's offsets live in
        (Produce goes by name inside classic transactions, so a recreated topic would silently take our data)."""
        pinned = self.checkpoint.target_topic_id if self.checkpoint is not None else None
        pinned = pinned or self.target_topic_id
        current = self._current_target_topic_id()
        if pinned and current != pinned:
            raise TopicRecreatedError(self.owner.target.cluster_name, self.target_topic, pinned, current)

    def _check_resumable(self, previous: Checkpoint | None) -> None:
        if previous is None:
            return
        owner = self.owner
        if previous.source_topic_id and self.source_topic_id and previous.source_topic_id != self.source_topic_id:
            raise TopicRecreatedError(owner.source.cluster_name, self.topic, previous.source_topic_id,
                                      self.source_topic_id)
        if (previous.target_topic, previous.target_partition) != (self.target_topic, self.target_partition):
            raise MirrorError(
                f"pipeline {owner.pipeline!r} copied {self.topic}-{self.partition} to {previous.target_topic}-"
                f"{previous.target_partition} before; it cannot continue into {self.target_topic}-"
                f"{self.target_partition} (use another pipeline name)")
        if previous.target_topic_id and previous.target_topic_id != self.target_topic_id:
            raise TopicRecreatedError(owner.target.cluster_name, self.target_topic, previous.target_topic_id,
                                      self.target_topic_id)
        if previous.owner_epoch > owner.owner_epoch:
            if self._take_over_daemon_start(previous):
                return
            if previous.owner == DAEMON_OWNER and previous.handoff_position is None and owner.owner != DAEMON_OWNER:
                raise DaemonOwnsLaneError(owner.pipeline, self.topic, self.partition, owner.owner, previous)
            raise OwnershipError(owner.pipeline, self.topic, self.partition, owner.owner, owner.owner_epoch, previous)

    def _take_over_daemon_start(self, previous: Checkpoint) -> bool:
        """A backfill (any writer but the daemon) takes over the daemon's *first* checkpoint of a lane the daemon
        started itself and has written nothing into yet: the start it stored before copying (owner ``daemon``, no
        offset map, no handoff, no loss, no halt), with no committed record on the target at or past the landing
        it names (at-least-once writes could precede their checkpoint). Nothing of the daemon's is then on the
        target, so nothing is skipped or reordered if the backfill copies from its own start. The daemon's
        writer is fenced before the look (this session's InitProducerId with the lane's own transactional.id, and
        an aborted empty transaction over the data and checkpoint partitions, whatever either side's mode); the
        session continues as a first run, and :meth:`copy` first commits a checkpoint of its own owner, so the
        daemon finds the lane taken (not handed off) and leaves it until ``shoal handoff`` gives it back."""
        owner = self.owner
        untouched = (previous.owner == DAEMON_OWNER and owner.owner != DAEMON_OWNER and previous.offset_map is None
                     and previous.map_segments is None and previous.handoff_position is None
                     and not previous.lost_ranges and previous.lane_state is None)
        if not untouched:
            return False
        if self.exactly_once:
            # an at-least-once daemon writes the data partition with its idempotent producer of the lane's id:
            # our InitProducerId alone does not make the partition refuse it (exactly-once transactions of the
            # daemon are refused), so fence both partitions before looking (the at-least-once open fenced them
            # already): no daemon write can land after the look and below our first checkpoint's landing
            self._fence(self.writer)
        if previous.target_next is not None:
            found = _committed_records(owner.target, self.target_topic, self.target_partition,
                                       previous.target_next, None, limit=1, max_bytes=owner.policy.commit_bytes)
            if found is _TOO_MANY or found:
                return False  # the daemon wrote data its checkpoint does not cover yet: it is not untouched
        log.warning("cluster %r %s-%d: pipeline %r: taking over the lane the daemon started at source offset %d "
                    "without copying anything; %r owns it now (the daemon's writer is fenced; hand it back with "
                    "`shoal handoff`)", owner.target.cluster_name, self.target_topic, self.target_partition,
                    owner.pipeline, previous.position, owner.owner)
        self.taken_over = previous
        self.checkpoint = None
        self.lane_map = None
        return True

    @property
    def position(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.position

    @property
    def position_epoch(self) -> int | None:
        """The source leader epoch below :attr:`position` (a fetcher starting there sends it as LastFetchedEpoch)."""
        return None if self.checkpoint is None else self.checkpoint.position_epoch

    def copy(self, start: int, end: int, progress: Progress | None = None, *,
             fetcher: BatchSource | None = None, before_commit: Callable[[], object] | None = None) -> CopyResult:
        """Copy ``[start, end)`` (resuming at the checkpoint when it is further), committing as the policy says.
        ``fetcher``: batches already fetched (see :meth:`RangeCopier.copy`); they must start at the position.

        A ``start`` past the checkpoint would skip offsets never copied: :class:`DataLossError` when the source
        has deleted them, :class:`SkipRefusedError` when it still has them — unless the copier accepts the loss,
        which records ``[checkpoint, start)`` in the checkpoint's lost ranges (``CopyResult.lost_ranges``).
        ``before_commit`` is called once, after the range's data is written and before its last commit (a
        throttle's wait, so it holds the transaction open instead of idling between transactions)."""
        if self.taken_over is not None and self.checkpoint is None:
            # claim the lane before anything else: the daemon, fenced, finds a checkpoint it does not own
            self.write_first_checkpoint(min(start, end))
        owner, previous = self.owner, self.checkpoint
        self.check_still_owner()
        self.renew_fence_if_due()
        if previous is not None and previous.position >= end:
            # a rerun of finished work (the checkpoint may even lie past ``end``: a straddling batch was copied
            # whole): nothing to copy, nothing to commit
            done = PartitionRange(self.topic, self.partition, end, end, self.target_topic, self.target_partition)
            return CopyResult(done, source_start=previous.position, source_end=previous.position)
        lost: tuple[tuple[int, int], ...] = ()
        if previous is not None:
            if start > previous.position:
                lost = self._skipped_range(previous.position, min(start, end))
            start = min(max(start, previous.position), end)
        if self.lane_map is None or previous is None:
            self.lane_map = LaneMap(tail_start=start)
        runs = self.lane_map.tail_runs  # the copier appends to the open tail: a commit costs O(new runs)
        if previous is not None:  # a failed copy of this session may have appended runs it never committed
            runs.truncate(previous.position)
        listener = _CheckpointCommitter(self, start=start, lost=lost, before_final_commit=before_commit)
        if self.exactly_once:
            self.begin_transaction()
        copier = RangeCopier(owner.source, owner.target, self.writer, owner.options, listener=listener)
        rng = PartitionRange(self.topic, self.partition, start, end, self.target_topic, self.target_partition)
        start_epoch = previous.position_epoch if previous is not None and start == previous.position else None
        try:
            # resume: below ``start`` everything is on the target (or an accepted loss), so a first batch
            # straddling it is trimmed there, never copied whole
            # at-least-once, a lane's first copy is trimmed there too: its first checkpoint (written before the
            # first batch) must say exactly where the copy began, or a retry of the same range would find the
            # checkpoint below its start and refuse a skip that is none
            result = copier.copy(rng, progress, offset_runs=runs, fetcher=fetcher, landing=_ResumeLanding(self),
                                 start_epoch=start_epoch, resume=previous is not None or not self.exactly_once)
        except BaseException:
            self._abort_quietly()
            raise
        result.commits = listener.commits
        result.lost_ranges = lost
        return result

    def _abort_quietly(self) -> None:
        """After a failed copy: end the open transaction now (bounded, best effort), so it does not hold back the
        last stable offset of the target and checkpoint partitions until its timeout; never masks the error."""
        if self.exactly_once and self.writer.in_transaction:
            try:
                self.writer.abort_transaction(give_up_after_s=ABORT_GIVE_UP_S)
            except Exception as exc:  # noqa: BLE001 - the copy's own error is the one that matters
                log.info("cluster %r %s-%d: the failed copy's transaction was not aborted (%s); the next "
                         "InitProducerId or the transaction timeout ends it", self.owner.target.cluster_name,
                         self.target_topic, self.target_partition, exc)

    def write_first_checkpoint(self, position: int) -> None:
        """Before any of the lane's data is written: a checkpoint at ``position`` (where the first copy begins)
        saying the data will land at the target partition's current end.

        At-least-once (written by the copy itself, just before its first batch): without it, a first run stopped
        or fenced before its first commit would leave copies on the target that nobody could judge: the next
        holder, finding no checkpoint, would copy the same records again, unreported. With it, the next holder
        resumes here and the landing rule recognises (and reports) those copies as the at-most-one-window
        duplicates an at-least-once restart may leave, or halts on anything else.

        Exactly-once (in a transaction of its own, called by the daemon when it fixes a new partition's start):
        an uncommitted first transaction is aborted by the next InitProducerId, but a start chosen "latest" at
        first sight would be chosen anew after a restart, skipping what arrived in between; stored, it holds."""
        target = self.owner.target
        target_end = list_offsets(target, self.target_topic, self.target_partition, "latest")
        first = Checkpoint(
            pipeline=self.owner.pipeline, topic=self.topic, partition=self.partition, position=position,
            target_topic=self.target_topic, target_partition=self.target_partition, target_next=target_end,
            owner=self.owner.owner, owner_epoch=self.owner.owner_epoch, source_topic_id=self.source_topic_id,
            target_topic_id=self.target_topic_id)
        batch = self.owner.store.checkpoint_batch(first)
        if self.exactly_once:
            if self.writer.in_transaction:
                raise MirrorError("a first checkpoint is written before the lane's first transaction, not inside it")
            self.writer.begin_transaction()
            self.writer.write([batch])
            self.writer.commit_transaction()
        else:
            self.writer.write([batch])
        self.checkpoint = first
        self.fence_marker_pending = False  # the fence's marker lies below target_end
        log.info("cluster %r %s-%d: lane starts at source offset %d, landing at target offset %d",
                 target.cluster_name, self.target_topic, self.target_partition, position, target_end)

    def _skipped_range(self, position: int, start: int) -> tuple[tuple[int, int], ...]:
        """``[position, start)``, refused unless the loss is accepted (see :meth:`copy`)."""
        if start <= position:
            return ()
        source = self.owner.source
        if not self.owner.accept_loss:
            log_start = list_offsets(source, self.topic, self.partition, "earliest")
            if log_start > position:
                raise DataLossError(source.cluster_name, self.topic, self.partition, position, log_start)
            raise SkipRefusedError(source.cluster_name, self.topic, self.partition, position, start)
        log.warning("cluster %r %s-%d: offsets [%d, %d) past the checkpoint are skipped (--accept-loss); recorded "
                    "as lost", source.cluster_name, self.topic, self.partition, position, start)
        return ((position, start),)


class _ResumeLanding:
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
            return  # nothing of ours on the target yet
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
        # exactly-once, our own transaction starts at ``base``; anything open below it is another producer's
        stable = list_offsets(target, topic, partition, "last_stable")
        if stable < base:
            raise ForeignWriteError(*where, f"another producer's transaction is open at offset {stable}")
        lo = max(expected, list_offsets(target, topic, partition, "earliest"))
        if lo >= base:
            return  # retention already removed what lay in between: nothing of it can be read any more
        window = session.owner.policy.commit_bytes
        found = _committed_records(target, topic, partition, lo, base, limit=1 if session.exactly_once else None,
                                   max_bytes=2 * window)
        if found is not _TOO_MANY and not found:
            return  # aborted transactions and markers only
        if session.exactly_once:
            raise ForeignWriteError(*where, "committed records from another writer lie in between")
        if found is _TOO_MANY or lo > expected:
            detail = "more than one commit window of records" if found is _TOO_MANY else "records whose start " \
                     "retention removed"
            raise ForeignWriteError(*where, f"{detail} lie in between, more than an at-least-once restart leaves")
        copied = _committed_records(session.owner.source, session.topic, session.partition, checkpoint.position,
                                    None, limit=len(found), max_bytes=2 * window)
        if copied is _TOO_MANY or not _restarted_copies(found, copied):
            raise ForeignWriteError(*where, f"{len(found)} committed record(s) in between are not the source's "
                                            f"records from offset {checkpoint.position}")
        session.duplicates_reported += len(found)
        session.checkpoint_now = True
        log.warning("cluster %r %s-%d: at-least-once resume found %d record(s) at [%d, %d) equal to the source's "
                    "from offset %d: a crash between write and checkpoint duplicated them", target.cluster_name,
                    topic, partition, len(found), expected, base, checkpoint.position)


def _restarted_copies(found: list[tuple], source: list[tuple]) -> bool:
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


class _TooMany:
    """The type of :data:`_TOO_MANY`. Truthy and not a list: a budget overrun must never read as "no records"
    (an empty list did once, and a record larger than the budget let a backfill take over a lane the daemon had
    written to, and let the landing rule pass foreign records); callers test ``is _TOO_MANY`` first."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "_TOO_MANY"


_TOO_MANY = _TooMany()  # sentinel: _committed_records read past its byte budget


def _committed_records(client: WireClient, topic: str, partition: int, start: int, end: int | None, *,
                       limit: int | None = None, max_bytes: int) -> list[tuple] | _TooMany:
    """(timestamp, key, value, headers) of the committed records in ``[start, end)`` (or the first ``limit``
    from ``start``), as a READ_COMMITTED consumer sees them; never past the last stable offset (it does not
    wait for open transactions) and never more than ``max_bytes`` of keys and values (then :data:`_TOO_MANY`)."""
    out: list[tuple] = []
    size = 0
    fetcher = RawBatchFetcher(client, topic, partition, start, end, isolation=IsolationLevel.READ_COMMITTED,
                              max_bytes=1024 * 1024)
    while not fetcher.done and (limit is None or len(out) < limit):
        fetched = fetcher.fetch()
        for view in fetched.batches:
            for record in read_records(view):
                if limit is not None and len(out) >= limit:
                    return out
                if record.offset >= start and (end is None or record.offset < end):
                    key, value, headers = decode_record_tail(record.tail)
                    size += len(key or b"") + len(value or b"")
                    if size > max_bytes:
                        return _TOO_MANY
                    out.append((record.timestamp, key, value, headers))
        if fetcher.position >= fetched.last_stable_offset:
            break  # the rest is not decided (or not there): READ_COMMITTED readers stop here too
    return out


class _CheckpointCommitter:
    """Turns the copier's flushes into checkpoints (and, exactly-once, commits of the open transaction)."""

    def __init__(self, session: LaneSession, *, start: int, lost: tuple[tuple[int, int], ...] = (),
                 before_final_commit: Callable[[], object] | None = None):
        self.session = session
        self.before_final_commit = before_final_commit
        self.owner = session.owner
        previous = session.checkpoint
        self.previous_target_next = previous.target_next if previous is not None else None
        self.previous_handoff = previous.handoff_position if previous is not None else None
        self.previous_position = (previous.position, previous.position_epoch) if previous is not None else None
        self.lost_ranges = normalise_ranges((previous.lost_ranges if previous is not None else ()) + lost)
        self.pruned_below = previous.map_pruned_below if previous is not None else None
        self.writer = session.writer
        self.exactly_once = session.exactly_once
        self.commits = 0
        self._bytes_at_commit = 0
        self._last_commit = time.monotonic()

    def flushed(self, result: CopyResult, *, final: bool) -> int:
        policy = self.owner.policy
        due = final or self.session.checkpoint_now or result.bytes - self._bytes_at_commit >= policy.commit_bytes \
            or (time.monotonic() - self._last_commit) * 1000 >= policy.commit_interval_ms
        if not due:
            return 0
        if final and self.before_final_commit is not None:
            self.before_final_commit()
        target_next = result.next_target_offset if result.next_target_offset is not None else \
            self.previous_target_next
        session = self.session
        lane_map = session.lane_map
        map_commit = None
        if target_next is not None:
            # a fresh copy copies a first batch straddling its start whole: the map starts where the copy did
            lane_map.include_start(min(result.source_start, result.source_end))
            map_commit = lane_map.commit(position=result.source_end, target_next=target_next,
                                         floor=session.prune_floor)
            if map_commit.dropped:
                self.pruned_below = map_commit.start
        checkpoint = Checkpoint(
            pipeline=self.owner.pipeline, topic=session.topic, partition=session.partition,
            position=result.source_end, target_topic=session.target_topic,
            target_partition=session.target_partition, target_next=target_next, owner=self.owner.owner,
            owner_epoch=self.owner.owner_epoch, offset_map=None if map_commit is None else map_commit.tail,
            source_topic_id=session.source_topic_id,
            handoff_position=self.previous_handoff,  # the seam stays on record for `shoal verify seam`
            target_topic_id=session.target_topic_id, lost_ranges=self.lost_ranges,
            position_epoch=self._position_epoch(result),
            map_segments=None if map_commit is None else map_commit.chain, map_pruned_below=self.pruned_below)
        if result.bytes > self._bytes_at_commit:
            session.check_target_topic()  # the data just written went to the topic the map describes
        store = self.owner.store
        self.writer.write(store.checkpoint_batches(checkpoint, map_commit))
        markers = 0
        if self.exactly_once:
            self.writer.commit_transaction()
            markers = 1
            if not final:
                session.begin_transaction()
        session.checkpoint = checkpoint  # what a later copy of this session resumes from
        session.checkpoint_now = False
        if map_commit is not None:
            lane_map.apply(map_commit)
        self.commits += 1
        self._bytes_at_commit = result.bytes
        self._last_commit = time.monotonic()
        return markers

    def _position_epoch(self, result: CopyResult) -> int | None:
        """The epoch below the new position: the copy's, or the previous checkpoint's when it did not move."""
        if result.source_end_epoch is not None:
            return result.source_end_epoch
        previous = self.previous_position
        return previous[1] if previous is not None and previous[0] == result.source_end else None
