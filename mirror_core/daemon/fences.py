"""Fences: the broker's guard that a lane has one live writer, kept and respected.

At-least-once: a held lane's broker fence is renewed when due (idle or not), on the lane's worker; which lanes are
due comes from a heap of the times their sessions' fences fall due, checked by a walk of every held lane every
:data:`~mirror_core.daemon.lane_state.AUDIT_MAX_S`. A lane fenced out of this process (another process opened it
with the lane's transactional.id) is dropped, and not re-acquired from the same assignment until it changes or a
backoff passes.
"""

from __future__ import annotations

import heapq
import logging
import time

from mirror_core.daemon.copy_round import lane_task
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState

FENCED_BACKOFF_CAP_S = 300.0  # a lane fenced out of this process is retried after at most this (see _fenced_out)


class Fences:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): fence
    renewals (at-least-once) and the backoff of lanes fenced out."""

    def _fenced_out(self, generation: int) -> set[str]:
        """Lanes not to re-acquire now: fenced while held (another process opened them with the lane's
        transactional.id) under this same membership generation. Our assignment may be stale — a member the broker
        expired but cut off from the coordinator still lists its old partitions — and re-adding the lane would fence
        the new holder back, and so on. Re-acquired once the assignment changes, or after a backoff doubling with
        each fencing in a row (from ``lease_ttl_s / 3`` up to FENCED_BACKOFF_CAP_S), so a rightful holder fenced
        by such a stale member gets its lane back. A fencing more than FENCED_BACKOFF_CAP_S after the lane was
        last let back starts a new row (:meth:`_note_fenced`): a lone member's generation never changes, and
        fencings days apart must not add up to the cap, while two processes fencing each other back and forth
        (each fencing soon after its lane was let back, whatever they commit in between) still back off."""
        now = time.monotonic()
        out = set()
        for lane, (fenced_gen, _count, retry_at) in list(self._fenced.items()):
            if fenced_gen != generation:
                del self._fenced[lane]  # the assignment changed: count anew
            elif now < retry_at:
                out.add(lane)
        return out

    def _note_fenced(self, lane: str) -> None:
        """A held lane was fenced (see _fenced_out)."""
        if self.membership is None:
            return
        generation = self.membership.generation
        _gen, count, let_back_at = self._fenced.get(lane, (generation, 0, 0.0))
        if time.monotonic() - let_back_at > FENCED_BACKOFF_CAP_S:  # held unfenced longer than the longest wait
            count = 0                                                # since it was let back: a new row
        count += 1
        delay = min(FENCED_BACKOFF_CAP_S, self.config.lease_ttl_s / 3 * 2 ** (count - 1))
        self._fenced[lane] = (generation, count, time.monotonic() + delay)
        event("lane_fenced_backoff", logging.WARNING, lane=lane, fencings=count, retry_in_s=round(delay, 1),
              note="another process opened this lane; not re-acquired until the group's assignment changes or the "
                   "backoff passes")

    def _renew_fences(self) -> None:
        """At-least-once: renew each held lane's broker fence when due (LaneSession.renew_fence_if_due), idle or
        not — an idle lane calls no copy, and its fence must not lapse while it is held. Renewals run on the
        lanes' workers (the writer lives there), side by side. Which lanes are due comes from a heap of the times
        their sessions' fences fall due (pushed when a session is installed or renewed), not a walk of every held
        lane per round; the walk runs every AUDIT_MAX_S, as a check that no session
        was left out."""
        if self.config.mode == "exactly-once":
            return
        now, heap, lanes = time.monotonic(), self._fence_times, self.lanes
        due: dict[str, LaneState] = {}
        while heap and heap[0][0] <= now:
            _at, _seq, lane, session = heapq.heappop(heap)
            state = lanes.get(lane)
            if state is None or lane not in self.held or state.session is not session:
                continue  # dropped or reopened: its new session has its own entry
            if session.fence_due:
                due[lane] = state
            else:
                self._schedule_fence(state)  # renewed meanwhile: due later
        if now >= self._next_fence_walk:
            # like the audits: a fence the heap missed lapses for at most this long
            self._next_fence_walk = now + AUDIT_MAX_S
            for lane in self.held:
                state = lanes.get(lane)
                # due as of the same ``now`` the heap was drained at (not session.fence_due, a later clock read: a
                # fence falling due in between is in the heap, popped next pass — not a missed hook)
                at = getattr(state.session, "fence_due_at", None) if state is not None else None
                if at is not None and at <= now and lane not in due:
                    event("fence_renewal_repaired", logging.WARNING, lane=lane,
                          note="a held lane's fence was due without being scheduled; renewed now")
                    due[lane] = state
        if not due:
            return
        states = [due[lane] for lane in sorted(due)]
        began = [(state.session, state.generation) for state in states]
        outcomes = self.workers.run([(state.lane, lane_task(state.session.renew_fence_if_due)) for state in states],
                                    tick=self._leases_busy)
        for state, (session, generation), outcome in zip(states, began, outcomes, strict=True):
            if not self._still_ours(state, generation, session):  # dropped meanwhile (a group round)
                continue
            if not outcome.ok:  # classified like any lane error (fenced → dropped)
                self._failed(state, outcome.error)
            else:
                self._schedule_fence(state)

    def _schedule_fence(self, state: LaneState) -> None:
        """At-least-once: remember when the lane's session's fence falls due (for _renew_fences)."""
        session = state.session
        at = getattr(session, "fence_due_at", None) if session is not None else None
        if at is None or self.config.mode == "exactly-once":
            return
        self._fence_seq += 1
        heapq.heappush(self._fence_times, (at, self._fence_seq, state.lane, session))
