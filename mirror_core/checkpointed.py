"""Copies that survive restarts: exactly-once (data and checkpoint in one target transaction) or at-least-once.

Exactly-once: the writer of a lane uses the transactional.id ``shoal.<pipeline>.<lane>`` (DESIGN.md §3: a lane
is a fixed set of target partitions, default one). ``InitProducerId`` with that id fences every older writer of
the lane and aborts its open transaction; only then is the checkpoint read (READ_COMMITTED), so the copy resumes
exactly where the last *committed* transaction left it. Batches and the checkpoint record are committed together
every ``commit_bytes`` or ``commit_interval_ms``: a crash loses at most the open transaction, which the broker
aborts, and nothing is ever written twice.

At-least-once (targets without transactions): an idempotent writer, and the checkpoint is written after the data
was acknowledged. A crash between the two re-copies what was acknowledged since the last checkpoint: the
duplicate window is at most one commit interval of records (``commit_bytes`` of data).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from mirror_core.checkpoint import Checkpoint, CheckpointStore
from mirror_core.copier import BatchSource, CopyOptions, CopyResult, PartitionRange, Progress, RangeCopier
from mirror_core.errors import ConfigError, MirrorError, TopicRecreatedError
from mirror_core.kafka_wire import WireClient
from mirror_core.offset_map import OffsetMap, OffsetRuns
from mirror_core.writer import BatchWriter


class DeliveryMode(str, enum.Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


@dataclass(frozen=True)
class CommitPolicy:
    commit_bytes: int = 4 * 1024 * 1024
    commit_interval_ms: int = 1000

    def __post_init__(self) -> None:
        if self.commit_bytes <= 0 or self.commit_interval_ms <= 0:
            raise ConfigError("commit bytes and interval must be positive")


def lane_transactional_id(pipeline: str, lane: int | str) -> str:
    return f"shoal.{pipeline}.{lane}"


def default_lane(target_topic: str, target_partition: int) -> str:
    """The lane of a target partition when lanes hold one partition (the default): the same name the planner,
    a backfill task, ``shoal copy``, a handoff and the daemon all derive, so they fence each other."""
    return f"{target_topic}-{target_partition}"


class CheckpointedCopier:
    """Copies one lane (one target partition) of a pipeline, resuming from and committing to the checkpoint store.

    Invariant: the stored checkpoint's position never passes data the target has not acknowledged (exactly-once:
    committed in the same transaction; at-least-once: written after the acknowledgement).
    """

    def __init__(self, source: WireClient, target: WireClient, store: CheckpointStore, *, pipeline: str,
                 mode: DeliveryMode = DeliveryMode.EXACTLY_ONCE, owner: str = "copy", owner_epoch: int = 0,
                 options: CopyOptions | None = None, policy: CommitPolicy | None = None):
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

    def copy(self, rng: PartitionRange, progress: Progress | None = None, *, lane: int | str | None = None
             ) -> CopyResult:
        """Open the lane (fencing older writers), resume from its checkpoint and copy up to ``rng.end``."""
        session = self.open_lane(rng.topic, rng.partition, rng.target_topic, rng.target_partition, lane=lane)
        return session.copy(rng.start, rng.end, progress)

    def open_lane(self, topic: str, partition: int, target_topic: str, target_partition: int, *,
                  lane: int | str | None = None) -> LaneSession:
        return LaneSession(self, topic, partition, target_topic, target_partition,
                           default_lane(target_topic, target_partition) if lane is None else lane)


class OwnershipError(MirrorError):
    """The partition's checkpoint belongs to a newer owner (a handoff happened): this writer must stop."""

    def __init__(self, pipeline: str, topic: str, partition: int, owner: str, epoch: int, stored: Checkpoint):
        super().__init__(
            f"pipeline {pipeline!r} {topic}-{partition}: owned by {stored.owner!r} at epoch {stored.owner_epoch}, "
            f"newer than this writer ({owner!r}, epoch {epoch}); it was handed off, so this writer stops")


class LaneSession:
    """An open lane of one source partition: the writer holds the lane's transactional.id (every older writer is
    fenced, its open transaction aborted), the checkpoint has been read, and ranges can be copied repeatedly (the
    daemon calls :meth:`copy` in a loop).

    Invariants: ``checkpoint`` is the last one committed by this session or found at open; ranges resume at its
    position, so nothing below it is copied twice; the stored owner epoch is never newer than ours.
    """

    def __init__(self, owner: CheckpointedCopier, topic: str, partition: int, target_topic: str,
                 target_partition: int, lane: int | str):
        self.owner = owner
        self.topic, self.partition = topic, partition
        self.target_topic, self.target_partition = target_topic, target_partition
        self.exactly_once = owner.mode is DeliveryMode.EXACTLY_ONCE
        self.writer = BatchWriter(owner.target, transactional_id=lane_transactional_id(owner.pipeline, lane)
                                  if self.exactly_once else None)
        self.writer.init_producer_id()  # exactly-once: fences older writers of the lane and aborts their transaction
        self.checkpoint = owner.store.read(owner.pipeline, topic, partition)
        topic_id = owner.source.topic_metadata(topic, refresh=True).topic_id
        self.source_topic_id = str(topic_id) if topic_id else None
        self._check_resumable(self.checkpoint)

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
        if previous.owner_epoch > owner.owner_epoch:
            raise OwnershipError(owner.pipeline, self.topic, self.partition, owner.owner, owner.owner_epoch, previous)

    @property
    def position(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.position

    def copy(self, start: int, end: int, progress: Progress | None = None, *,
             fetcher: BatchSource | None = None) -> CopyResult:
        """Copy ``[start, end)`` (resuming at the checkpoint when it is further), committing as the policy says.
        ``fetcher``: batches already fetched (see :meth:`RangeCopier.copy`); they must start at the position."""
        owner, previous = self.owner, self.checkpoint
        runs = OffsetRuns(previous.offset_map.runs) if previous is not None and previous.offset_map else OffsetRuns()
        if previous is not None:
            start = min(max(start, previous.position), end)
        listener = _CheckpointCommitter(self, start=start)
        if self.exactly_once:
            self.writer.begin_transaction()
        copier = RangeCopier(owner.source, owner.target, self.writer, owner.options, listener=listener)
        rng = PartitionRange(self.topic, self.partition, start, end, self.target_topic, self.target_partition)
        result = copier.copy(rng, progress, offset_runs=runs, fetcher=fetcher,
                             resume=previous is not None and start == previous.position)
        result.commits = listener.commits
        return result


class _CheckpointCommitter:
    """Turns the copier's flushes into checkpoints (and, exactly-once, commits of the open transaction)."""

    def __init__(self, session: LaneSession, *, start: int):
        self.session = session
        self.owner = session.owner
        previous = session.checkpoint
        self.previous_target_next = previous.target_next if previous is not None else None
        self.previous_handoff = previous.handoff_position if previous is not None else None
        # the lowest source offset the map answers for: where this partition's copy began (or was pruned to)
        self.map_start = previous.offset_map.start if previous is not None and previous.offset_map is not None \
            else start
        self.writer = session.writer
        self.exactly_once = session.exactly_once
        self.commits = 0
        self._bytes_at_commit = 0
        self._last_commit = time.monotonic()

    def flushed(self, result: CopyResult, *, final: bool) -> int:
        policy = self.owner.policy
        due = final or result.bytes - self._bytes_at_commit >= policy.commit_bytes or \
            (time.monotonic() - self._last_commit) * 1000 >= policy.commit_interval_ms
        if not due:
            return 0
        target_next = result.next_target_offset if result.next_target_offset is not None else \
            self.previous_target_next
        offset_map = None if target_next is None else OffsetMap.from_runs(
            # a first batch straddling the requested start is copied whole: the map starts where the copy did
            result.offset_runs, start=min(self.map_start, result.source_start, result.source_end),
            position=result.source_end,
            target_next=target_next)
        session = self.session
        checkpoint = Checkpoint(
            pipeline=self.owner.pipeline, topic=session.topic, partition=session.partition,
            position=result.source_end, target_topic=session.target_topic,
            target_partition=session.target_partition, target_next=target_next, owner=self.owner.owner,
            owner_epoch=self.owner.owner_epoch, offset_map=offset_map, source_topic_id=session.source_topic_id,
            handoff_position=self.previous_handoff)  # the seam stays on record for `shoal verify seam`
        self.writer.write([self.owner.store.checkpoint_batch(checkpoint)])
        markers = 0
        if self.exactly_once:
            self.writer.commit_transaction()
            markers = 1
            if not final:
                self.writer.begin_transaction()
        session.checkpoint = checkpoint  # what a later copy of this session resumes from
        self.commits += 1
        self._bytes_at_commit = result.bytes
        self._last_commit = time.monotonic()
        return markers
