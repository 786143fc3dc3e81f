"""Lane health, published: metrics, ``/readyz`` and the lane health records in the checkpoint topic.

A lane's health changes by events (a round's news, a failure, a halt, a resume) and — turning ``stalled`` — by time
alone; both are published when they change, nothing per idle lane, with a full walk every :data:`HEALTH_WALK_S` as
a check (which also checks the retention positions kept by events). A lane that is not simply copying (retrying,
stalled) has a health record of its own in the checkpoint topic, written when its state changes
(:mod:`mirror_core.state.lane_health_records`), so the Shoal page and ``shoal lanes status`` see it.

A lane can also stall with nothing failing: caught up to a source last stable offset that stays below the high
watermark (a transaction open there, which no READ_COMMITTED copy can pass), its lag to that offset is 0 while the
source grows. Held at the same offset for longer than ``open_transaction_alert_s`` it turns ``stalled``
(``source_transaction_open``, :meth:`LaneHealthBooks._hold_due`), by time alone like a failing lane, since an idle
partition is left out of the standing round's answers.
"""

from __future__ import annotations

import heapq
import logging
import time

from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState, SourceHold
from mirror_core.model.lane_status import COPYING, HALTED, RETRYING, SOURCE_TRANSACTION_OPEN, LaneHealth
from mirror_core.state.lane_health_records import health_refresh_s, live_health, plan_health_writes
from mirror_core.state.leases import now_ms

# every lane's health compared and its retention position checked, as a check of the events that keep them
# (_publish_due_states): this often
HEALTH_WALK_S = AUDIT_MAX_S


class LaneHealthBooks:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): the
    lanes' health compared and published, and our lane health records written."""

    def _new_health(self) -> LaneHealth:
        return LaneHealth(stall_after_s=self.config.stall_after_s)

    def _publish_lane_states(self) -> None:
        """Show every lane's health in metrics and ``/readyz`` — when some lane's health changed (or a lane came
        or went) since the last time: the full walk (every lane's state refreshed and compared), on the group
        round's recomputation and as the check of :meth:`_publish_due_states` every ``HEALTH_WALK_S``."""
        now = now_ms()
        health = {}
        for lane, state in self.lanes.items():
            if state.hold is not None:
                self._hold_due(state, now)
            state.health.refresh(now)
            health[lane] = tuple(vars(state.health).values())
        self._health_dirty.clear()
        if health == self._published_health:
            return
        self._published_health = health
        self.metrics.halted.set(sum(1 for s in self.lanes.values() if s.health.state == HALTED))
        self.metrics.publish_lanes(self.config.pipeline, {
            lane: {"topic": s.topic, "partition": s.partition, **s.health.as_dict()}
            for lane, s in self.lanes.items()})

    def _publish_round_states(self, touched: list[LaneState]) -> None:
        """After a round: the lanes it touched compared (:meth:`_publish_due_states`); an idle round compares
        nothing per idle lane."""
        dirty = self._health_dirty
        for state in touched:
            dirty.add(state.lane)
        self._publish_due_states()

    def _publish_due_states(self, busy: frozenset[str] = frozenset()) -> None:
        """Publish the health of the lanes whose health may have changed — marked by the event that changed it (a
        round's news, a failure, a halt, a resume) or due to turn ``stalled`` by time alone (``_stall_times``, a heap
        pushed when a lane starts retrying: the change no event makes) — compared with what was published and
        shown only when it differs. Every lane at once when lanes came (lanes are only ever added to
        ``self.lanes``: equal counts mean the same lanes) and, as a check that no event was missed, every
        ``HEALTH_WALK_S`` (with the retention positions: :meth:`_audit_positions`). Nothing per idle lane.

        ``busy``: lanes whose work is running on the workers right now (the pool's tick): left marked, published
        after their outcome; no full walk then."""
        now = time.monotonic()
        if not busy and (now >= self._next_health_walk or len(self.lanes) != len(self._published_health)):
            self._next_health_walk = now + HEALTH_WALK_S
            self._audit_positions()
            self._publish_lane_states()
            return
        stamp = now_ms()
        heap, dirty = self._stall_times, self._health_dirty
        while heap and heap[0][0] < stamp:  # LaneHealth.refresh: stalled once now - since_ms > stall_after_s
            at, lane = heapq.heappop(heap)
            if self._stall_at.get(lane) == at:
                del self._stall_at[lane]
                dirty.add(lane)
        if not dirty:
            return
        self._health_dirty = dirty & busy if busy else set()
        published, lanes = self._published_health, self.lanes
        changed: dict[str, tuple] = {}
        for lane in dirty:
            if lane in busy:
                continue
            state = lanes.get(lane)
            if state is None:
                continue
            if state.hold is not None:
                self._hold_due(state, stamp)
            state.health.refresh(stamp)
            fields = tuple(vars(state.health).values())
            if fields != published.get(lane):
                changed[lane] = fields
        if not changed:
            return
        halts_moved = any(lanes[lane].health.state == HALTED or (published.get(lane) or (None,))[0] == HALTED
                          for lane in changed)
        published.update(changed)
        if halts_moved:
            self.metrics.halted.set(sum(1 for fields in published.values() if fields[0] == HALTED))
        self.metrics.update_lanes(self.config.pipeline, {
            lane: {"topic": lanes[lane].topic, "partition": lanes[lane].partition, **lanes[lane].health.as_dict()}
            for lane in changed})

    def _health_failed(self, state: LaneState) -> None:
        """A lane's health took a failure: compared at the next publication, a candidate for a health record, and
        — while it retries — looked at again when it turns ``stalled`` with no other event."""
        lane, health = state.lane, state.health
        self._health_dirty.add(lane)
        self._health_watch.add(lane)
        if health.state == RETRYING and health.since_ms is not None:
            self._stall_due(lane, health.since_ms + int(health.stall_after_s * 1000))

    def _stall_due(self, lane: str, at: int) -> None:
        """Look at ``lane`` again at ``at`` (wall ms), when it may turn ``stalled`` with no event to say so."""
        if self._stall_at.get(lane) != at:
            self._stall_at[lane] = at
            heapq.heappush(self._stall_times, (at, lane))
            # a lane failing anew after recovering leaves its superseded due time in the heap until that time
            # comes (stall_after_s later): rebuilt from the live ones when those are most of it, so the heap
            # stays bounded by the lanes, not by the failure rate times stall_after_s
            if len(self._stall_times) > 2 * len(self._stall_at) + 64:
                self._stall_times = [(due, name) for name, due in self._stall_at.items()]
                heapq.heapify(self._stall_times)

    def _healthy_at(self, state: LaneState, position: int, fetched) -> None:
        """A good answer for the lane — a share copied and committed, or nothing new — leaving it at ``position``:
        ``copying``, unless it is held up by a source transaction (:meth:`_track_hold`); a lane stalled for one
        it still waits behind stays so (and returns to that alarm if a failure in between replaced it)."""
        self._track_hold(state, position, fetched)
        hold, health = state.hold, state.health
        if hold is not None and hold.reported:
            if health.reason != SOURCE_TRANSACTION_OPEN:  # a failure meanwhile took its place: the alarm again,
                health.succeeded()                         # as it was (no second event: the same hold)
                health.held_up(SOURCE_TRANSACTION_OPEN, hold.message, hold.since_ms, position=hold.offset)
                self._health_dirty.add(state.lane)
            return
        health.succeeded()
        if hold is not None:  # due at its own time, also after a failure's due time took the lane's slot
            self._stall_due(state.lane, hold.since_ms + int(self.config.open_transaction_alert_s * 1000))
            self._hold_due(state, now_ms())

    def _track_hold(self, state: LaneState, position: int, fetched) -> None:
        """Note whether the lane at ``position`` is caught up to a last stable offset below the high watermark — a
        source transaction open there, which no READ_COMMITTED copy can pass. Normal while a transaction lasts;
        a hold at a new offset is timed from now (:class:`SourceHold`) and looked at again
        ``open_transaction_alert_s`` later (scheduled by :meth:`_healthy_at`, judged by :meth:`_hold_due`, by time
        alone: under fetch sessions a partition whose only change is none is left out of the answers); a last
        stable offset that moved ends it. Noted on the answer that brought the lane to that offset as well as on an
        idle one: after it the broker may never name the partition again."""
        stable, high = fetched.last_stable_offset, fetched.high_watermark
        hold = state.hold
        if high > stable and position >= stable:
            if hold is not None and hold.offset == stable:
                hold.high_watermark = max(hold.high_watermark, high)
                return
            if hold is not None:
                self._hold_ended(state)
            state.hold = SourceHold(stable, now_ms(), high)  # due time set by _healthy_at, the only caller
        elif hold is not None:
            self._hold_ended(state)

    def _hold_due(self, state: LaneState, now: int) -> None:
        """A lane held at the same last stable offset for longer than ``open_transaction_alert_s`` (and not failing)
        turns ``stalled`` with reason ``source_transaction_open`` — a message naming the cluster, topic, partition
        and offset, and the command that aborts a hanging transaction — and the event says so."""
        hold, health = state.hold, state.health
        if hold is None or hold.reported or health.state != COPYING or \
                now - hold.since_ms <= self.config.open_transaction_alert_s * 1000:
            return
        waited_s = (now - hold.since_ms) / 1000
        # the topic named once (in the command), so a health record (lane_health_records.MESSAGE_CHARS) keeps the
        # command whole even for a topic name of Kafka's 249 characters
        message = (f"cluster {self.config.source.name!r}: an open transaction has held the last stable offset at "
                   f"{hold.offset} (high watermark {hold.high_watermark}); no READ_COMMITTED copy passes it. If it "
                   "hangs: kafka-transactions.sh --bootstrap-server <source> abort --topic "
                   f"{state.topic} --partition {state.partition} --start-offset {hold.offset}")
        hold.message = message
        health.held_up(SOURCE_TRANSACTION_OPEN, message, hold.since_ms, position=hold.offset)
        self._health_dirty.add(state.lane)
        self._health_watch.add(state.lane)  # a health record while it lasts, as for a failing lane
        event("source_transaction_open", logging.WARNING, cluster=self.config.source.name, topic=state.topic,
              partition=state.partition, offset=hold.offset, high_watermark=hold.high_watermark,
              waiting_s=round(waited_s),
              note="find hanging transactions with kafka-transactions.sh find-hanging --broker-id <leader>")

    def _hold_ended(self, state: LaneState) -> None:
        """The last stable offset the lane waited at moved: the hold ends, and a lane stalled for it copies again."""
        hold, state.hold = state.hold, None
        if hold is None or not hold.reported:
            return
        event("source_transaction_decided", cluster=self.config.source.name, topic=state.topic,
              partition=state.partition, offset=hold.offset, held_s=round((now_ms() - hold.since_ms) / 1000))
        if state.health.reason == SOURCE_TRANSACTION_OPEN:
            state.health.succeeded()
        self._health_dirty.add(state.lane)

    def _audit_positions(self) -> None:
        """Every ``HEALTH_WALK_S``: the retention positions kept by events checked against the held lanes — a lane
        shown caught up without a fetch in the round (no session or fetcher: it cannot have seen the high
        watermark lately) is marked behind, a held lane with a session and no position gets its position, and a
        lane no longer held is forgotten. A missed event costs at most this long, and a warning."""
        positions, lanes, held = self.positions, self.lanes, self.held
        behind, caught = positions.snapshot()
        missed = []
        held_tps = set()
        for lane in held:
            state = lanes.get(lane)
            if state is None:
                continue
            tp = (state.topic, state.partition)
            held_tps.add(tp)
            if tp in caught:
                if state.session is None or state.fetcher is None:
                    missed.append(lane)
                    positions.behind(tp)
            elif tp not in behind and state.session is not None and state.session.position is not None:
                missed.append(lane)
                positions.behind(tp, state.session.position)
        for tp in (behind.keys() | caught.keys()) - held_tps:
            missed.append(f"{tp[0]}-{tp[1]}")
            positions.forget(tp)
        if missed:
            event("retention_positions_repaired", logging.WARNING, lanes=len(missed), first=missed[0],
                  note="a lane's retention position differed from its state; corrected")

    def _write_health_records(self, now: int) -> None:
        """The health records that are due (:func:`~mirror_core.state.lane_health_records.plan_health_writes`): a held
        lane's record when it enters or changes retrying/stalled, rewritten every ``HEALTH_REFRESH_S`` while that
        lasts, cleared (tombstone) once it copies again or is no longer ours; one batch, nothing for copying lanes.
        Only lanes that failed since they were last seen copying are looked at (``_health_watch``): a lane enters
        retrying only through a failure (:meth:`_failed` → :meth:`_health_failed`)."""
        current = {}
        for lane in list(self._health_watch):  # the lanes that failed since last seen copying, not every held one
            state = self.lanes.get(lane)  # (its turn to stalled by time is refreshed by _publish_due_states)
            health = live_health(state.health) if state is not None else None
            if health is None:  # copying again (or halted: stored with the checkpoint)
                self._health_watch.discard(lane)
            elif lane in self.held:
                current[lane] = health
        writes, clears = plan_health_writes(current, self._health_written, now,
                                            refresh_s=health_refresh_s(self.config.lease_ttl_s / 3))
        if not writes and not clears:
            return
        self.health_records.write(self.config.pipeline, self.worker_id, writes, clears, now)
        for lane, health in writes.items():
            self._health_written[lane] = (health, now)
        for lane in clears:
            self._health_written.pop(lane, None)

    def _publish_pending_states(self) -> None:
        """Once per pass of the loop: lanes halted during it, and any other lane whose health is due
        (:meth:`_publish_due_states`: nothing per idle lane) — also when no round ran (every lane backing off)."""
        self._publish_due_states()
