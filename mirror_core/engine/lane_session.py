"""An open lane of one source partition (:class:`LaneSession`): fenced, its checkpoint read and checked, and ranges
copied from it repeatedly, each committed to the checkpoint store as the delivery mode says
(:mod:`mirror_core.engine.checkpointed` describes the modes).

Who may write a lane: the stored owner epoch is never newer than the session's (else :class:`OwnershipError`; a lane
the daemon started and copied into is :class:`DaemonOwnsLaneError`, one it started without copying anything is taken
over); without a broker fence, a checkpoint that moved under the session is :class:`LaneTakenError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import kafka.errors as Errors

from mirror_core.config.names import DAEMON_OWNER
from mirror_core.engine.checkpoint_committer import CheckpointCommitter
from mirror_core.engine.copier import BatchSource, CopyResult, Progress, RangeCopier
from mirror_core.engine.lane_fence import LaneFence
from mirror_core.engine.resume_landing import TOO_MANY, ResumeLanding, committed_records, refuse_unclaimed_target
from mirror_core.errors import (
    ConfigError,
    DaemonOwnsLaneError,
    DataLossError,
    FetchError,
    LaneTakenError,
    MirrorError,
    OwnershipError,
    PartitionUnavailableError,
    SkipRefusedError,
    TargetTopicUnsettledError,
    TopicRecreatedError,
)
from mirror_core.kafka.epochs import EpochEnd, validate_position
from mirror_core.kafka.fetcher import fresh_topic_metadata, metadata_stamp_of
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.model.map_segments import LaneMap
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from mirror_core.engine.checkpointed import CheckpointedCopier
    from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

OPEN_VALIDATION_TIMEOUT_S = 5.0  # how long a lane open waits for the source leader's OffsetsForLeaderEpoch answer
# a lane that never wrote its target topic finds it missing from metadata: asked again this long before that is a
# ConfigError (the daemon's preflight may have created it a moment ago; a broker serves Metadata from a cache its
# controller updates asynchronously, so a topic just created can be unknown for a little while)
TARGET_TOPIC_APPEAR_S = 5.0
TARGET_TOPIC_RETRY_S = 0.2
# a target topic a lane wrote counts as deleted under it (a halt that needs an operator) only when, this long after
# a Metadata answer did not know it, no broker of the target knows it: one broker's answer can lag the cluster (a
# broker that just started and has not caught up on metadata answers UNKNOWN_TOPIC_OR_PARTITION); the daemon
# confirms a source deletion with a second look too
TARGET_DELETION_CONFIRM_S = 1.0
# answers of "unknown" not confirmed by the look after them, before TargetTopicUnsettledError (retriable: metadata
# that keeps contradicting itself is neither a deletion nor an answer)
TARGET_DELETION_LOOKS = 3


def target_topic_gone(target: WireClient, topic: str) -> bool:
    """After one Metadata answer said ``topic`` is unknown: whether, ``TARGET_DELETION_CONFIRM_S`` later, every
    broker of the target that answers says so too, asked one by one (the first answer came from whichever broker
    was least loaded, possibly one behind the others). A broker that cannot be reached has no say; when none
    answers, or the broker list cannot be had, it is not a confirmation (False)."""
    time.sleep(TARGET_DELETION_CONFIRM_S)
    try:
        nodes = target.broker_ids()
    except Exception:  # noqa: BLE001 - cannot tell: not a confirmation
        return False
    answered = 0
    for node in nodes:
        try:
            if target.topic_known_by(node, topic) is not None:
                return False        # a broker knows the topic: the first answer lagged
        except Errors.KafkaError:
            continue                # unreachable or not answering: no say
        answered += 1
    return answered > 0



def _commit_identity(checkpoint: Checkpoint | None) -> tuple | None:
    if checkpoint is None:
        return None
    return (checkpoint.owner, checkpoint.owner_epoch, checkpoint.position, checkpoint.target_next)



class LaneSession(LaneFence):
    """An open lane of one source partition: the writer holds the lane's transactional.id (every older writer is
    fenced, its open transaction aborted), the checkpoint has been read, and ranges can be copied repeatedly (the
    daemon calls :meth:`copy` in a loop).

    Invariants: ``checkpoint`` is the last one committed by this session or found at open — read past the LSO
    (:meth:`CheckpointStore.read_own`), so it is never older than the lane's own last commit; ranges resume at
    its position, so nothing below it is copied twice, and never start above it unless the loss is accepted and
    recorded; the stored owner epoch is never newer than ours; the target topic is the one the checkpoint's
    offsets live in (topic id checked at open and before every commit), and every copy's first batch lands where
    the checkpoint says the target ends (:class:`ResumeLanding`), so a foreign write or a recreated target
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
        self.exactly_once = owner.exactly_once
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
        in the broker's metadata cache yet) before it is a :class:`ConfigError`; one it wrote is gone once every
        broker asked ``TARGET_DELETION_CONFIRM_S`` later agrees (:func:`target_topic_gone`); brokers that still
        disagree after ``TARGET_DELETION_LOOKS`` looks: :class:`TargetTopicUnsettledError` (retriable)."""
        target = self.owner.target
        give_up_at = time.monotonic() + TARGET_TOPIC_APPEAR_S
        looks = 0
        while True:
            try:
                meta = target.topic_metadata(self.target_topic, refresh=True) if since is None else \
                    fresh_topic_metadata(target, self.target_topic, since)
                topic_id = meta.topic_id
                break
            except Errors.UnknownTopicOrPartitionError:
                pinned = self.checkpoint.target_topic_id if getattr(self, "checkpoint", None) is not None else None
                if pinned:  # the lane wrote there before: the topic was deleted under it, if the brokers agree
                    if target_topic_gone(target, self.target_topic):
                        raise TopicRecreatedError(target.cluster_name, self.target_topic, pinned, None) from None
                    looks += 1
                    if looks >= TARGET_DELETION_LOOKS:
                        raise TargetTopicUnsettledError(target.cluster_name, self.target_topic, looks) from None
                    since = None
                    continue
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
            raise _other_target(owner, self.topic, self.partition, self.target_topic, self.target_partition, previous)
        if previous.target_topic_id and previous.target_topic_id != self.target_topic_id:
            raise TopicRecreatedError(owner.target.cluster_name, self.target_topic, previous.target_topic_id,
                                      self.target_topic_id)
        if previous.owner_epoch > owner.owner_epoch:
            if self._take_over_daemon_start(previous):
                return
            raise _newer_owner(owner, self.topic, self.partition, previous)

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
        if not _untouched_daemon_start(owner, previous):
            return False
        if self.exactly_once:
            # an at-least-once daemon writes the data partition with its idempotent producer of the lane's id:
            # our InitProducerId alone does not make the partition refuse it (exactly-once transactions of the
            # daemon are refused), so fence both partitions before looking (the at-least-once open fenced them
            # already): no daemon write can land after the look and below our first checkpoint's landing
            self._fence(self.writer)
        if previous.target_next is not None:
            found = committed_records(owner.target, self.target_topic, self.target_partition,
                                       previous.target_next, None, limit=1, max_bytes=owner.policy.commit_bytes)
            if found is TOO_MANY or found:
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
        listener = CheckpointCommitter(self, start=start, lost=lost, before_final_commit=before_commit)
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
            result = copier.copy(rng, progress, offset_runs=runs, fetcher=fetcher, landing=ResumeLanding(self),
                                 start_epoch=start_epoch, resume=previous is not None or not self.exactly_once,
                                 topic_id=self.source_topic_id)
        except BaseException as exc:
            raised = self._after_failed_copy(exc)
            if raised is exc:
                raise
            raise raised from exc
        result.commits = listener.commits
        result.lost_ranges = lost
        return result

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
        if self.checkpoint is None and self.taken_over is None:  # (a daemon's untouched start, taken over, names
            refuse_unclaimed_target(self, position, target_end)    # a landing the daemon found empty)
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


def refused_before_fencing(owner: CheckpointedCopier, rng: PartitionRange, previous: Checkpoint | None,
                           source_topic_id: str | None = None, target_topic_id: str | None = None
                           ) -> MirrorError | None:
    """What :meth:`LaneSession._check_resumable` refuses in ``previous`` whatever fencing the lane decides — read
    before the lane's InitProducerId, ``previous`` is the newest *decided* checkpoint, and a transaction fencing
    aborts or finds committed only ever leaves a checkpoint of the same target and an owner epoch as high: a
    checkpoint of another target partition, or one of a newer owner that is not the daemon's untouched start (which
    a backfill may take over, judged only after the fence). ``None``: nothing refused yet (the check after the
    fence decides). Asked before any lane of a copy is opened, so a copy refused for one lane fences none: a
    daemon's lanes of the same pipeline keep their open transactions. ``source_topic_id`` / ``target_topic_id``:
    the topics' ids now (None: unknown): a checkpoint of another id was written for a topic since deleted and
    recreated."""
    if previous is None:
        return None
    if source_topic_id and previous.source_topic_id and previous.source_topic_id != source_topic_id:
        return TopicRecreatedError(owner.source.cluster_name, rng.topic, previous.source_topic_id, source_topic_id)
    if target_topic_id and previous.target_topic_id and previous.target_topic_id != target_topic_id:
        return TopicRecreatedError(owner.target.cluster_name, rng.target_topic, previous.target_topic_id,
                                   target_topic_id)
    if (previous.target_topic, previous.target_partition) != (rng.target_topic, rng.target_partition):
        return _other_target(owner, rng.topic, rng.partition, rng.target_topic, rng.target_partition, previous)
    if previous.owner_epoch > owner.owner_epoch and not _untouched_daemon_start(owner, previous):
        return _newer_owner(owner, rng.topic, rng.partition, previous)
    return None


def _other_target(owner: CheckpointedCopier, topic: str, partition: int, target_topic: str, target_partition: int,
                  previous: Checkpoint) -> MirrorError:
    return MirrorError(
        f"pipeline {owner.pipeline!r} copied {topic}-{partition} to {previous.target_topic}-"
        f"{previous.target_partition} before; it cannot continue into {target_topic}-{target_partition} "
        "(use another pipeline name)")


def _newer_owner(owner: CheckpointedCopier, topic: str, partition: int, previous: Checkpoint) -> OwnershipError:
    if previous.owner == DAEMON_OWNER and previous.handoff_position is None and owner.owner != DAEMON_OWNER:
        return DaemonOwnsLaneError(owner.pipeline, topic, partition, owner.owner, previous)
    return OwnershipError(owner.pipeline, topic, partition, owner.owner, owner.owner_epoch, previous)


def _untouched_daemon_start(owner: CheckpointedCopier, previous: Checkpoint) -> bool:
    """``previous`` has the shape of the daemon's first checkpoint of a lane it started and wrote nothing under
    (owner ``daemon``, no offset map, no handoff, no loss, no halt), and this writer is not the daemon: a candidate
    for :meth:`LaneSession._take_over_daemon_start`, which also looks at the target after fencing."""
    return (previous.owner == DAEMON_OWNER and owner.owner != DAEMON_OWNER and previous.offset_map is None
            and previous.map_segments is None and previous.handoff_position is None
            and not previous.lost_ranges and previous.lane_state is None)
