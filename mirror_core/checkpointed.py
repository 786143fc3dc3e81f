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
from mirror_core.copier import CopyOptions, CopyResult, PartitionRange, Progress, RangeCopier
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
        exactly_once = self.mode is DeliveryMode.EXACTLY_ONCE
        lane = rng.target_partition if lane is None else lane
        writer = BatchWriter(self.target, transactional_id=lane_transactional_id(self.pipeline, lane)
                             if exactly_once else None)
        writer.init_producer_id()  # exactly-once: fences older writers of the lane and aborts their transaction
        previous = self.store.read(self.pipeline, rng.topic, rng.partition)
        topic_id = self.source.topic_metadata(rng.topic, refresh=True).topic_id
        runs = OffsetRuns()
        start = rng.start
        if previous is not None:
            if previous.source_topic_id and topic_id and previous.source_topic_id != str(topic_id):
                raise TopicRecreatedError(self.source.cluster_name, rng.topic, previous.source_topic_id, topic_id)
            if (previous.target_topic, previous.target_partition) != (rng.target_topic, rng.target_partition):
                raise MirrorError(
                    f"pipeline {self.pipeline!r} copied {rng.topic}-{rng.partition} to {previous.target_topic}-"
                    f"{previous.target_partition} before; it cannot continue into {rng.target_topic}-"
                    f"{rng.target_partition} (use another pipeline name)")
            if previous.offset_map is not None:
                runs = OffsetRuns(previous.offset_map.runs)
            start = min(max(rng.start, previous.position), rng.end)
        listener = _CheckpointCommitter(self, writer, rng, exactly_once, previous=previous, start=start,
                                        source_topic_id=str(topic_id) if topic_id else None)
        if exactly_once:
            writer.begin_transaction()
        copier = RangeCopier(self.source, self.target, writer, self.options, listener=listener)
        resumed = PartitionRange(rng.topic, rng.partition, start, rng.end, rng.target_topic, rng.target_partition)
        result = copier.copy(resumed, progress, offset_runs=runs)
        result.commits = listener.commits
        return result


class _CheckpointCommitter:
    """Turns the copier's flushes into checkpoints (and, exactly-once, commits of the open transaction)."""

    def __init__(self, owner: CheckpointedCopier, writer: BatchWriter, rng: PartitionRange, exactly_once: bool, *,
                 previous: Checkpoint | None, start: int, source_topic_id: str | None):
        self.owner = owner
        self.source_topic_id = source_topic_id
        self.previous_target_next = previous.target_next if previous is not None else None
        # the lowest source offset the map answers for: where this partition's copy began (or was pruned to)
        self.map_start = previous.offset_map.start if previous is not None and previous.offset_map is not None \
            else start
        self.writer = writer
        self.rng = rng
        self.exactly_once = exactly_once
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
            result.offset_runs, start=min(self.map_start, result.source_end), position=result.source_end,
            target_next=target_next)
        checkpoint = Checkpoint(
            pipeline=self.owner.pipeline, topic=self.rng.topic, partition=self.rng.partition,
            position=result.source_end, target_topic=self.rng.target_topic,
            target_partition=self.rng.target_partition, target_next=target_next, owner=self.owner.owner,
            owner_epoch=self.owner.owner_epoch, offset_map=offset_map, source_topic_id=self.source_topic_id)
        self.writer.write([self.owner.store.checkpoint_batch(checkpoint)])
        markers = 0
        if self.exactly_once:
            self.writer.commit_transaction()
            markers = 1
            if not final:
                self.writer.begin_transaction()
        self.commits += 1
        self._bytes_at_commit = result.bytes
        self._last_commit = time.monotonic()
        return markers
