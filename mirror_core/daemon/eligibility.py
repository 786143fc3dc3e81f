"""Which lanes the daemon may hold, read from the pipeline's checkpoints.

A lane is eligible when its checkpoint belongs to the daemon (handed off by a backfill, or its own first checkpoint
of a new partition) or when it has none yet (a new partition, mirrored from its beginning); a lane a backfill still
owns is left alone until it is handed off. A lane halted or retired — here, or by any daemon in its checkpoint — is
not eligible until an operator resumes it (``shoal lanes resume``), which is followed here too.

A lane whose checkpoint is stored in a partition of the checkpoint topic that cannot be read (a damaged batch:
:attr:`~mirror_core.state.checkpoint_cache.CheckpointTopicReader.damaged`) is halted here, in this process only (a
halt written there could not be read back): nothing about it can be known — its position, its owner, an operator's
halt — while every other lane goes on. It resumes by itself once the partition reads again (an intact replica serves
it), from the checkpoint read then.
"""

from __future__ import annotations

import logging

from mirror_core.config.names import DAEMON_OWNER, default_lane
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import LaneState
from mirror_core.state.checkpoint import checkpoint_key, checkpoint_partition


class Eligibility:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): the
    eligible lanes, recomputed only when the checkpoints, the lanes known or the halts changed."""

    def _eligible(self) -> list[str]:
        """The lanes this daemon may hold: not halted or retired (here or in their checkpoint: a halt persisted by
        any daemon is followed, an operator's resume too) and owned by the daemon (a checkpoint a backfill or copy
        claimed is not). Derived from every checkpoint of the pipeline — recomputed only when something it depends
        on can have changed: the checkpoint topic's content (a handoff, a newer owner, a halt or resume written by
        anyone, CheckpointStore.content_version), the lanes known, a lane halted here; otherwise the last answer
        stands (a group round every few seconds must not decode 2,000 unchanged checkpoints)."""
        self.store.refresh(skip_damaged=True)   # one damaged partition must not blind the round to every lane
        key = (self.store.content_version(), len(self.lanes), self._halts)
        if self._eligible_seen is not None and self._eligible_seen[0] == key:
            return list(self._eligible_seen[1])
        checkpoints = self.store.read_all(self.config.pipeline, whole_maps=False, refresh=False)
        self._adopt_stopped_lanes(checkpoints)
        out = []
        damaged = dict(self.store.damaged)
        for lane, state in self.lanes.items():
            if damaged:
                stored_in = checkpoint_partition(checkpoint_key(self.config.pipeline, state.topic, state.partition),
                                                 self.store.partitions)
                if stored_in in damaged:
                    self._checkpoint_unreadable(state, stored_in, damaged[stored_in])
                    continue
            cp = checkpoints.get((self.config.pipeline, state.topic, state.partition))
            if state.checkpoint_unreadable:
                self._checkpoint_readable(state, cp)
            self._follow_persisted_state(state, cp)
            if state.health.stopped:
                continue
            if cp is None or cp.owner == DAEMON_OWNER:
                out.append(lane)
        self._publish_lane_states()
        out.sort()
        # the content version as of BEFORE the walk (what ``checkpoints`` was read at): a resume check's read_own
        # above refreshes a checkpoint partition, and a record it reads in (a handoff, a halt) is in none of this
        # answer — the next round must recompute, not find that record already covered. Lanes adopted above come
        # from these same checkpoints, so the lane count is taken after the walk.
        self._eligible_seen = ((key[0], len(self.lanes), self._halts), out)
        return list(out)

    def _checkpoint_unreadable(self, state: LaneState, stored_in: int, error: BaseException) -> None:
        """Halt a lane whose checkpoint partition cannot be read (once per episode; not persisted), still watched
        by the retention watch at the best position known (it resumes by itself, maybe hours later). A lane
        already stopped (halted or retired for another reason) stays as it is: only this halt is lifted by
        :meth:`_checkpoint_readable`."""
        if state.checkpoint_unreadable or state.health.stopped:
            return
        state.checkpoint_unreadable = True
        self._halt(state, f"its checkpoint cannot be read: partition {stored_in} of checkpoint topic "
                          f"{self.store.topic!r} is damaged ({error}). The lane resumes by itself once that partition "
                          "reads again (have an intact replica serve it)", "corrupt_batch", persist=False)
        self._place_failed_lane(state, None)

    def _checkpoint_readable(self, state: LaneState, cp) -> None:
        """A lane halted by :meth:`_checkpoint_unreadable` whose partition reads again: resumed — unless the
        checkpoint read now holds a halt of its own (written before the damage), which then stops it instead
        (:meth:`_follow_persisted_state`)."""
        state.checkpoint_unreadable = False
        if state.halt_stored or not state.health.stopped or (cp is not None and cp.lane_state is not None):
            return
        state.health.resumed()
        self._health_dirty.add(state.lane)
        self.status.halted.pop(state.lane, None)
        state.failures = state.fetch_failures = 0
        state.retry_at = 0.0
        self.openings.touch(state.lane)
        event("lane_resumed", logging.WARNING, topic=state.topic, partition=state.partition, lane=state.lane,
              note="its checkpoint partition reads again")

    def _adopt_stopped_lanes(self, checkpoints) -> None:
        """Lanes halted or retired in checkpoints whose source topic is no longer listed (deleted) still show."""
        for (_pipeline, topic, partition), cp in checkpoints.items():
            lane = default_lane(cp.target_topic, cp.target_partition)
            if cp.lane_state is not None and lane not in self.lanes:
                self.lanes[lane] = LaneState(topic, partition, cp.target_topic, lane, health=self._new_health())

    def _follow_persisted_state(self, state: LaneState, cp) -> None:
        """A persisted halt (by any daemon, before any restart) stops the lane here too; a checkpoint written
        after our halt without one is the operator's resume (``shoal lanes resume``)."""
        health = state.health
        if cp is not None and cp.lane_state is not None:
            state.halt_stored = True
            if not health.stopped or health.since_ms != cp.lane_state.since_ms:
                health.stop(cp.lane_state)
                self._health_dirty.add(state.lane)
                self.openings.touch(state.lane)  # leaves the round (dropped below when held)
                if state.lane in self.held:
                    self._drop(state.lane, f"{cp.lane_state.state}: {cp.lane_state.reason}")
            return
        if health.stopped and cp is not None and state.halt_stored:
            # a checkpoint without our stored halt: the operator's resume, or a READ_COMMITTED read held below the
            # halt by another writer's open transaction on the partition; the newest decided value tells which
            latest = self.store.read_own(self.config.pipeline, state.topic, state.partition)
            if latest is None or latest.lane_state is not None:
                return
            state.halt_stored = False
            health.resumed()
            self._health_dirty.add(state.lane)
            self.status.halted.pop(state.lane, None)
            state.failures = state.fetch_failures = 0
            state.retry_at = 0.0
            state.repaired_at = None
            self.openings.touch(state.lane)  # held and resumed: opened by the next round
            event("lane_resumed", topic=state.topic, partition=state.partition, lane=state.lane,
                  position=cp.position, lost_ranges=list(cp.lost_ranges))
