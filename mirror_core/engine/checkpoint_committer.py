"""A lane's checkpoint commits: the copier's flushes become checkpoints (and, exactly-once, commits of the open
transaction) every ``commit_bytes`` or ``commit_interval_ms`` (:class:`~mirror_core.config.commit_policy.CommitPolicy`).

Invariants: a checkpoint's position never passes data the target acknowledged; exactly-once, it is committed in the
data's transaction; the offset map grows by the commit's new runs only, pruned below the session's floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mirror_core.engine.copier import CopyResult
from mirror_core.model.offset_map import normalise_ranges
from mirror_core.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from mirror_core.engine.lane_session import LaneSession


class CheckpointCommitter:
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
