"""Membership, the loop's side: hold the lanes the pipeline's consumer group assigns to this process.

The daemons of a pipeline are members of one consumer group on the source; Kafka detects dead members and balances
the partitions; an assigned partition is a lane this process holds once it is eligible
(:mod:`mirror_core.daemon.eligibility`). A revocation is honoured once per pass of the main loop (after that pass's
lane work has returned, so about one copy round): the lane's transaction is finished (every copy ends with its
commit) or aborted, the lane dropped, and only then the partition given back (the hand-shake and its timeout:
:mod:`mirror_core.daemon.membership`). A daemon also keeps off lanes an older, lease-based daemon holds by
a live lease (and writes lease records of its own while one is seen: :mod:`mirror_core.daemon.compat_leases`).
A group that never forms is said so (an event, a metric, ``/readyz``); a membership whose thread died is rebuilt
with a backoff; a failed group round is logged and retried on the next round, never the end of the process.
"""

from __future__ import annotations

import contextlib
import logging
import time

from mirror_core.daemon.events import event
from mirror_core.daemon.group_settings import apply_group_timeouts, choose_protocol
from mirror_core.daemon.lane_state import LaneState
from mirror_core.daemon.membership import GroupMembership
from mirror_core.engine.lane_session import LaneSession
from mirror_core.errors import MirrorError
from mirror_core.model.lane_status import RETRYING, STALLED
from mirror_core.state.checkpoint import checkpoint_partition
from mirror_core.state.leases import lease_based_daemon_seen, lease_key, now_ms

GROUP_UNJOINED_SESSIONS = 3  # subscribed this many session timeouts without an assignment: the group did not form
DEFAULT_GROUP_SESSION_MS = 45_000  # the session timeout when the pipeline sets none (both protocols' default)
REJOIN_BACKOFF_S = (1.0, 60.0)  # a membership whose thread died is rebuilt after 1 s, doubling up to 60 s


class GroupLanes:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): the
    held set follows the group's assignment; revocations are answered between lanes."""

    def _leases_if_due(self, *, lanes_idle: bool = True) -> None:
        """Called between lanes: membership work that is due. Group: revocations are answered at once (a lock and
        a set read when there is none), the assignment is applied when it changed or every ``lease_ttl_s / 3``
        (the compat lease records and lane health records are written then, when due).

        ``lanes_idle=False``: lane work may be running on other threads right now (a pool's progress tick): then
        no lane's writer is touched here and revocations are answered only once that work has returned (the next
        call with lanes idle, at most one round later), so a revoked lane's last commit still comes first."""
        self._lanes_idle = lanes_idle
        if self.membership is not None and lanes_idle:
            self._answer_revocations()
            if not self.membership.alive and time.monotonic() >= self._next_join:
                # its thread died (logged there): nothing is assigned any more. Rebuilt with a backoff (a consumer
                # that dies at once must not be re-created on every pass), and a failure to rebuild (the source
                # unreachable for the version probe, say) is retried, never the end of run()
                self.metrics.errors.labels("membership").inc()
                self._join_failures += 1
                delay = min(REJOIN_BACKOFF_S[1], REJOIN_BACKOFF_S[0] * 2 ** (self._join_failures - 1))
                self._next_join = time.monotonic() + delay
                event("group_rejoining", logging.WARNING, error=self.membership.error, attempt=self._join_failures,
                      next_retry_in_s=delay)
                self._housekeeping("membership", self._join_group)
        if self.membership is not None:
            self._check_group_formed()
        now = time.monotonic()
        if now >= self._next_lease or self._group_changed.is_set():
            self._next_lease = now + self.config.lease_ttl_s / 3
            self._group_changed.clear()
            if self.membership is not None:
                self._housekeeping("leases", self._maintain_group)
            if self.membership is not None and lanes_idle:  # a revocation begun during that round: answered
                self._answer_revocations()                   # before any lane opens

    def _leases_busy(self) -> None:
        """The lane pool's progress tick: membership work while lanes run on worker threads (no writer touched),
        and lanes that came due to turn ``stalled`` shown — one lane's commit hanging on the target (up to
        ``write_retry_s``, more with a slow coordinator) must not hold back another lane's stall from the metrics
        and ``/readyz``. ``_lanes_idle`` is False exactly while a tick runs: the pool calls it on this thread while
        lane work runs on others, and between its calls this thread is back in the pool's wait or past the pool
        run (lanes idle)."""
        try:
            self._leases_if_due(lanes_idle=False)
            stalls = self._stall_times
            if stalls and stalls[0][0] < now_ms():  # a heap read per tick: nothing per lane unless one is due
                # not the lanes of the running batch: their outcome (a reopen that succeeds, say) decides their
                # state, published at the batch's end — shown stalled now, they could be copying a moment later
                self._publish_due_states(busy=self.workers.running if self.workers is not None else frozenset())
        finally:
            self._lanes_idle = True

    def _check_group_formed(self) -> None:
        """A group that never forms is no error librdkafka reports (a broker without the protocol, a missing group
        ACL): subscribed to a non-empty selection and still not joined after GROUP_UNJOINED_SESSIONS session
        timeouts, the daemon says so — an event naming the group, the cluster and what to check, the
        ``shoal_group_joined`` metric at 0, and ``/readyz`` failing — until an assignment arrives."""
        unjoined_s = self.membership.unjoined_for_s()
        session_s = (self.config.group_session_timeout_ms or DEFAULT_GROUP_SESSION_MS) / 1000
        stuck = bool(self._group_topics) and unjoined_s >= GROUP_UNJOINED_SESSIONS * session_s
        joined = self.membership.joined  # a flag read: this runs on every pass, whatever the number of lanes
        self.metrics.group_joined.set(1 if joined else 0)
        if joined and self.membership.alive:
            self._join_failures = 0  # a membership that works again: the next rebuild starts at the shortest wait
        if stuck and not self._group_unjoined_reported:
            self._group_unjoined_reported = True
            self.metrics.errors.labels("group_not_joined").inc()
            check = ("that the brokers run the consumer group protocol (KIP-848: Kafka 4+, or "
                     "group.coordinator.rebalance.protocols including 'consumer'; group_protocol: classic or auto "
                     "otherwise)" if self.membership.protocol == "consumer" else
                     "that the group coordinator is reachable")
            problem = (f"daemon {self.worker_id} has not joined group {self.membership.group!r} on cluster "
                       f"{self.config.source.name!r} ({self.membership.protocol} protocol) after {unjoined_s:.0f}s "
                       f"subscribed to {len(self._group_topics)} topic(s): check {check}, and that the principal "
                       f"has Read on the group and Describe on the topics (last client error: "
                       f"{self.membership.error or 'none'}); no lane is copied by this process meanwhile")
            self.metrics.group_problem = problem
            event("group_not_joined", logging.ERROR, group=self.membership.group, cluster=self.config.source.name,
                  protocol=self.membership.protocol, waited_s=round(unjoined_s), error=self.membership.error,
                  note=problem)
        elif not stuck and self._group_unjoined_reported:
            self._group_unjoined_reported = False
            self.metrics.group_problem = None
            if joined:
                event("group_joined", group=self.membership.group, cluster=self.config.source.name,
                      protocol=self.membership.protocol)

    def _join_group(self) -> None:
        cfg = self.config
        protocol = choose_protocol(cfg.group_protocol, self.source.broker_version)
        if cfg.group_session_timeout_ms and protocol == "consumer" and not self._group_timeouts_applied:
            self._group_timeouts_applied = True  # once per process: a rejoin does not need another AdminClient
            try:
                apply_group_timeouts(cfg.source, cfg.pipeline, cfg.group_session_timeout_ms)
            except MirrorError as exc:  # the group still works, with the broker's default session timeout
                event("group_timeouts_refused", logging.WARNING, error=exc)
        self.membership = GroupMembership(
            cfg.source, cfg.pipeline, self.worker_id, protocol=protocol, revoke_timeout_s=cfg.revoke_timeout_s,
            classic_session_timeout_ms=cfg.group_session_timeout_ms if protocol == "classic" else None,
            metadata_refresh_ms=int(cfg.rescan_interval_s * 1000), on_change=self._group_changed.set,
            reachability=self.source_reachability)
        self._answered_generation = -1  # a new membership counts its generations anew
        self._fenced.clear()  # ... and its assignment is a new one
        if self._group_topics is not None:
            self.membership.subscribe(self._group_topics)
        self.membership.start()
        event("group_joining", group=self.membership.group, protocol=protocol, worker=self.worker_id)

    def _answer_revocations(self) -> None:
        """The loop's side of the revocation hand-shake: close every held lane whose partition the group is
        taking back (or has taken: a lost assignment), then tell the membership, whose callback is waiting."""
        generation = self.membership.generation
        if generation == self._answered_generation and not self._held_since_answer:
            return  # nothing changed since the last answer: O(1) between lanes, however many lanes are held
        revoking = self.membership.revoking()  # read first: a partition revoked after this read is not in
        assigned = self.membership.assigned()  # ``assigned`` (closed now) nor in ``revoking`` (released next time)
        self._answered_generation, self._held_since_answer = generation, False
        closed = [lane for lane in sorted(self.held)
                  if (self.lanes[lane].topic, self.lanes[lane].partition) not in assigned]
        gone = self._deleted_source_topics({self.lanes[lane].topic for lane in closed})
        for lane in closed:
            state = self.lanes[lane]
            self._close_lane(state)
            # a deleted source topic's partitions leave the group before the lane's fetch reports it: the lane
            # halts (or retires) as it would have while held, naming what was never copied
            if state.topic in gone and self._source_deleted(state, confirmed=True):
                continue
            self._drop(lane, "revoked by the group")
        # our lease records are released while the partitions are still ours (the revocation waits for released()),
        # so no other group daemon has written its record of the lane yet: the release cannot erase it
        if closed and self.compat.live():
            self._housekeeping("leases", lambda: self.compat.release(self.leases, self.worker_id, self.membership,
                                                                   self.lanes, closed))
        # likewise our health records of the closed lanes (keyed per writer, so a late clear could not erase the next
        # holder's record either; cleared here so readers see none of ours once the partition is given back)
        if closed and self._health_written:
            self._housekeeping("health_records", lambda: self._write_health_records(now_ms()))
        self.membership.released(revoking, as_of=generation)
        self.metrics.lanes.set(len(self.held))
        self.status.lanes_held = sorted(self.held)

    def _close_lane(self, state: LaneState) -> None:
        """Before a lane is given up: no transaction of ours may stay open on it. Between lanes every copy has
        ended with its commit (or its abort, on failure); a transaction a failed abort left open is aborted here,
        bounded (the next holder's InitProducerId would abort it anyway, and fences this writer)."""
        writer = getattr(state.session, "writer", None) if state.session is not None else None
        if not self._lanes_idle:  # its work may be running on another thread: never touch its writer from here
            return
        if writer is not None and getattr(writer, "in_transaction", False):
            try:
                writer.abort_transaction(give_up_after_s=2.0)
            except Exception as exc:  # noqa: BLE001 - the next holder's fencing ends it
                event("lane_abort_failed", logging.INFO, lane=state.lane, error=f"{type(exc).__name__}: {exc}")

    def _maintain_group(self) -> None:
        """Hold exactly the eligible lanes whose source partition the group assigned to this process — minus lanes
        an older lease-based daemon holds by a live lease (read in every ``lease_compat`` mode: the upgrade path) —
        write our compat lease records while they are wanted (:func:`~mirror_core.state.leases.compat_records_wanted`),
        and the lane health records that changed."""
        pipeline, me, now = self.config.pipeline, self.worker_id, now_ms()
        eligible = self._eligible()
        assigned = self.membership.assigned()
        records, members = self.leases.read_with_members(pipeline, skip_damaged=True)
        blocked = {lane: lease.holder for lane, lease in records.items() if lease.blocks_group_daemon(me, now)}
        old_daemon = lease_based_daemon_seen(records, members, me, now)
        damaged = self.store.damaged if self.store is not None else {}
        if damaged and (old_daemon is not None or self.compat.writing):
            # a lease-based daemon runs beside us (an upgrade): its lease records in a damaged partition of the
            # checkpoint topic cannot be read, so the lanes whose record lives there are kept off as if leased
            unread = f"unknown (the lease record's partition of {self.store.topic!r} cannot be read)"
            for lane in self.lanes:
                if checkpoint_partition(lease_key(pipeline, lane), self.store.partitions) in damaged:
                    blocked.setdefault(lane, unread)
            old_daemon = old_daemon or unread   # and our compat records go on: its heartbeat may be hidden there
        fenced = self._fenced_out(self.membership.generation)
        # what decides the held set, as of the last time it was applied: unchanged (an idle daemon's usual group
        # round), nothing to apply — compared in C (list, frozenset, dict and set equality), no walk of the lanes
        seen = (eligible, assigned, blocked, fenced, self._held_version)
        if seen != self._group_seen:
            self._hold_wanted(eligible, assigned, blocked, fenced, records)
            self._group_seen = (eligible, assigned, blocked, fenced, self._held_version)
        self.compat.write(self.leases, me, self.held, old_daemon, now)
        self._write_health_records(now)

    def _hold_wanted(self, eligible: list[str], assigned, blocked: dict[str, str], fenced: set[str], records) -> None:
        """Hold exactly the eligible, assigned lanes not blocked by a lease nor fenced out (see _maintain_group)."""
        me = self.worker_id
        want = {lane for lane in eligible if (self.lanes[lane].topic, self.lanes[lane].partition) in assigned
                and lane not in blocked and lane not in fenced}
        dropped = sorted(self.held - want)
        unassigned = [lane for lane in dropped if lane in eligible and lane not in blocked and lane not in fenced]
        # a deleted source topic's partitions leave the assignment before the lane's fetch reports the deletion
        # (the group may drop them between two revocation answers): such a lane halts or retires as it would have
        # while held, naming what was never copied, instead of being dropped unassigned
        gone = self._deleted_source_topics({self.lanes[lane].topic for lane in unassigned})
        for lane in dropped:
            state = self.lanes[lane]
            self._close_lane(state)
            if lane in unassigned and state.topic in gone and self._source_deleted(state, confirmed=True):
                continue
            self._drop(lane, f"leased by {blocked[lane]}" if lane in blocked else
                       "not eligible" if lane not in eligible else "not assigned")
        if dropped and self.compat.live():
            self.compat.release(self.leases, me, self.membership, self.lanes, dropped, records)
        for lane in sorted(want - self.held):
            self.held.add(lane)
            self._held_since_answer = True
            event("lane_acquired", lane=lane, worker=me)
        waiting = {ln for ln in blocked if ln in eligible
                   and (self.lanes[ln].topic, self.lanes[ln].partition) in assigned}
        for lane in sorted(waiting - self._waiting_for_lease):  # logged once per wait
            event("lane_waits_for_lease", lane=lane, holder=blocked[lane],
                  note="assigned by the group, held by a lease-based daemon; taken when that lease ends")
        self._waiting_for_lease = waiting
        self.metrics.lanes.set(len(self.held))
        self.status.lanes_held = sorted(self.held)

    def _leave_group(self) -> None:
        """Shutdown (the round in progress has committed): drop every lane, release our lease records (while the
        partitions are still ours: see CompatLeaseRecords.release), leave."""
        lanes = sorted(self.held)
        for lane in lanes:
            self._close_lane(self.lanes[lane])
            self._drop(lane, "shutdown")
        if lanes and self.compat.live():
            try:
                self.compat.release(self.leases, self.worker_id, self.membership, self.lanes, lanes)
            except Exception as exc:  # noqa: BLE001 - best effort: an unreleased lease just expires
                event("lease_release_failed", logging.WARNING, lanes=",".join(lanes), error=exc)
        if self._health_written:  # our lanes' health records: cleared (their next holders write their own)
            self._housekeeping("health_records", lambda: self._write_health_records(now_ms()))
        if self.compat.heartbeat:  # a lease-based daemon stops counting us (else: until the heartbeat expires)
            self._housekeeping("leases", lambda: self.compat.release_heartbeat(self.leases, self.worker_id))
        generation = self.membership.generation
        self.membership.released(self.membership.revoking(), as_of=generation)
        self.membership.close()

    def _drop(self, lane: str, why: str) -> None:
        self.held.discard(lane)  # touches it in self.openings
        state = self.lanes.get(lane)
        if state is not None:
            state.reset()
            state.generation += 1  # what a worker is doing for the lane now is not installed when it returns
            if self.workers is not None:  # its next session may open on another worker (load stays even)
                self.workers.release(lane)
            for gauge in (self.metrics.lag, self.metrics.position):  # another daemon reports this lane now
                with contextlib.suppress(KeyError):  # never set in this process
                    gauge.remove(state.topic, str(state.partition))
            state.shown_lag = None
            state.hold = None  # a source transaction it waited behind is its next holder's to time
            self.positions.forget((state.topic, state.partition))  # its retention is watched by its next holder
            if state.health.state in (RETRYING, STALLED):  # its health is its next holder's to tell: not turning
                state.health.succeeded()                   # ``stalled`` here (not ready) for a lane not copied here
                self._health_dirty.add(lane)
        event("lane_dropped", lane=lane, reason=why)

    def _still_ours(self, state: LaneState, generation: int, session: LaneSession | None = None) -> bool:
        """Whether work a worker began for the lane (at ``generation``, with ``session``) is still this lane's:
        held, not dropped since (a drop, even followed by a new acquisition, bumps the generation) and, when a
        session is given, still the lane's session."""
        return state.lane in self.held and state.generation == generation and \
            (session is None or state.session is session)
