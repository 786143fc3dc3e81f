"""The copy round: one fetch round over the ready lanes, each lane's share copied and committed with its checkpoint.

A round costs what changed, not what is held (issue #18): the fetch round is a standing one
(:mod:`mirror_core.daemon.standing_round`), the next round is sent while this one's shares are written (overlap),
and a lane's data and checkpoint commit together on its worker, the lanes side by side. The prune watch's floors
are handed to the held lanes' sessions here too (:mod:`mirror_core.daemon.prune_watch`).
"""

from __future__ import annotations

import logging
import time

from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState
from mirror_core.daemon.standing_pending import StandingPending
from mirror_core.daemon.standing_round import StandingRound
from mirror_core.engine.copier import FetchedOnce
from mirror_core.kafka.broker_fetch import PartitionOutcome, RoundStats
from mirror_core.kafka.fetcher import RawBatchFetcher


class CopyRounds:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): fetch
    rounds sent and collected, shares copied, the books of what they committed."""

    def _copy_round(self) -> int | None:
        """One fetch round over every held lane that is ready, then the lanes' shares copied and committed on their
        workers, side by side. Returns records copied, or None when no lane was ready (the caller sleeps then).

        A round costs what changed, not what is held (issue #18): the fetch round is a standing one
        (:mod:`mirror_core.daemon.standing_round`) that hands back only the lanes with news — a partition the broker's
        answer named (data, an error, a moved high watermark), a lane that joined or was placed again, a lane whose
        fetch failed — and the books below follow those lanes; an idle lane left out of the answer costs an
        identity check; its health and retention position follow events too (_publish_due_states,
        mirror_core.model.held_positions)."""
        ready = self._open_ready()
        if not ready:
            self._drop_in_flight()
            return None
        shares, answered, asked_at = self._take_round(ready)
        # a broker that answered is an answer even when it named no partition (an idle round's incremental answer);
        # stamped with when the round was sent (ahead, during the previous round's copy), not when it was taken
        self.source_reachability.observe_round(asked_at, [outcome.error for *_, outcome in shares]
                                               + [None] * min(answered, 1))
        # Overlap: the next round is sent now and travels while this round's shares are written and committed.
        # Safe because a fetcher's position moves only when a round is collected, and a lane's checkpoint comes
        # from what its writer acknowledged: a lane whose copy fails below is reset (new session, new fetcher at
        # the checkpoint), and its answer in the round in flight is then dropped unread (_take_round).
        self._in_flight = self._send_round(ready)
        self._round_books = True  # lanes failing below are published once, at the round's end
        try:
            copied = self._copy_shares(shares)
        finally:
            self._round_books = False
        self._publish_round_states([state for state, *_ in shares])
        return copied

    def _copy_shares(self, shares: list[tuple[LaneState, RawBatchFetcher, int, PartitionOutcome]]) -> int:
        """The round's shares copied and committed on the lanes' workers, side by side; returns records copied."""
        work = []  # (lane, its session, its generation, share start, fetch result) of every share to copy
        for state, fetcher, start, outcome in shares:
            # every fetched share is copied, even after SIGTERM: it is the in-flight work a stop finishes
            if state.lane not in self.held or state.fetcher is not fetcher:  # dropped or reset meanwhile
                continue
            fetched = self._share_fetched(state, start, outcome)
            if fetched is not None:
                work.append((state, state.session, state.generation, start, fetched))
        # a lane's data and checkpoint commit together on its worker; one lane's failure is its own outcome.
        # The group round runs while the workers work (revocations seen, compat lease records renewed while an old
        # daemon is around: they must not lapse, or it takes our lanes and the two keep fencing each other)
        outcomes = self.workers.run(
            [(state.lane, lane_task(session.copy, start, state.fetcher.position, fetcher=FetchedOnce(fetched, start)))
             for state, session, _generation, start, fetched in work], tick=self._leases_busy) if work else []
        copied = 0
        for (state, session, generation, _start, fetched), outcome in zip(work, outcomes, strict=True):
            if not self._still_ours(state, generation, session):  # dropped meanwhile (a group round): its books
                if not outcome.ok:                                  # are not ours any more; a failure is told
                    event("lane_result_discarded", lane=state.lane, error=f"{type(outcome.error).__name__}: "
                          f"{outcome.error}", note="the lane was dropped while its worker copied")
                continue
            if not outcome.ok:
                self._failed(state, outcome.error)
                continue
            copied += self._copied(state, fetched, outcome.value)
        return copied

    def _drop_in_flight(self) -> None:
        """Nothing to copy the round in flight into: its answers are never taken. They are discarded on the
        connections now, so the next round reads its own answers, not these (StandingPending.discard)."""
        if self._in_flight is not None:
            pending, self._in_flight = self._in_flight, None
            pending.discard()

    def _standing(self) -> StandingRound:
        if self._rounds is None or self._rounds.client is not self.source:
            self._rounds = StandingRound(self.source, max_bytes=self._fetch_sizes[0],
                                         max_wait_ms=self.config.poll_interval_ms)
        else:   # a link probe that ended late sizes the rounds from then on (read at each send)
            self._rounds.max_bytes = self._fetch_sizes[0]
        return self._rounds

    def _send_round(self, ready: list[tuple[LaneState, int]]) -> StandingPending:
        """Send one fetch round for the ``ready`` lanes (one request per source broker) without waiting for it:
        the standing round's members follow ``ready`` (a lane with a new fetcher joins, one not ready leaves), and
        each broker's request names only what changed since its last one. Every ``AUDIT_MAX_S`` the
        standing round's books are first checked against its fetch sessions
        (StandingRound.audit): a discrepancy — a lane that would never be named, never fetched — is logged and
        repaired."""
        rounds = self._standing()
        cached = self._ready_cache
        if cached is not None and ready is cached[1] and cached[0] == self.openings.version:
            rounds.sync(cached[2])  # no lane touched since the list was built: its fetchers are the lanes' own
        else:
            rounds.sync([(state.lane, state.fetcher) for state, _ in ready if state.fetcher is not None])
        now = time.monotonic()
        if now >= self._next_audit:
            # a lane the books lost is never fetched and shows nothing (health copying, lag gauge frozen) until
            # the audit finds it: at most this long
            self._next_audit = now + AUDIT_MAX_S
            repaired = rounds.audit()
            if repaired:
                event("fetch_session_repaired", logging.WARNING, lanes=len(repaired), first=repaired[0],
                      note="the standing fetch round's books differed from its sessions; the lanes are named again")
        stats = RoundStats()
        pending = rounds.send(rotation=self._round, stats=stats)
        self._round += 1
        self.metrics.fetch_rounds.inc()
        self.metrics.fetch_requests.inc(stats.requests)
        self.metrics.fetch_partitions.inc(stats.partitions)
        return pending

    def _take_round(self, ready: list[tuple[LaneState, int]]
                    ) -> tuple[list[tuple[LaneState, RawBatchFetcher, int, PartitionOutcome]], int, float]:
        """This round's news — the round sent ahead last time (or, with none in flight, one sent now) — as the
        shares of the lanes that are still held and ready with the same fetcher; how many brokers answered; and
        when the round was sent (monotonic). A lane that joins while a round is in flight is named in the next one (sent
        right after this). A lane with news that is not ready any more (dropped, backing off) had its position moved by
        the answer: it reopens at its committed checkpoint, never skipping the answer it did not copy."""
        pending, self._in_flight = self._in_flight, None
        if pending is None:
            pending = self._send_round(ready)
        news = pending.collect()
        if not news:
            return [], pending.answered, pending.sent_at
        lanes, cached = self.lanes, self._ready_cache
        if cached is not None and ready is cached[1] and cached[0] == self.openings.version:
            wanted = self.openings.ready  # the lanes of ``ready`` (none touched since): no set built per round
        else:
            wanted = {state.lane for state, _ in ready}
        shares = []
        for lane, fetcher, start, outcome in news:
            state = lanes.get(lane)
            if state is None or state.fetcher is not fetcher:
                continue  # the lane was reset meanwhile: this answer moved a fetcher nobody uses any more
            if lane in wanted and lane in self.held:
                shares.append((state, fetcher, start, outcome))
            else:  # collecting may have moved its position past an answer that is not copied now: reopen at the
                state.fetcher = None  # committed position (the checkpoint), never skip it
                self.openings.touch(lane)
                self.positions.behind((state.topic, state.partition))
        return shares, pending.answered, pending.sent_at

    def _share_fetched(self, state: LaneState, start: int, outcome: PartitionOutcome):
        """A lane's share of a fetch round, ``[start, fetcher.position)``: the fetch result to copy, or None when
        the fetch failed (classified) or brought nothing new (lag noted)."""
        if outcome.error is not None:
            self._failed(state, outcome.error, fetching=True)
            return None
        state.fetch_failures = 0
        fetched = outcome.result
        state.last_stable = fetched.last_stable_offset
        tp = (state.topic, state.partition)
        if state.fetcher.position <= start:  # nothing new
            self._healthy_at(state, start, fetched)
            # committed up to ``start`` (a share of the previous round was committed before this one was read)
            self.positions.caught_up(tp, state.session.position if state.session is not None else start,
                                     fetched.high_watermark)
            lag = max(0, fetched.last_stable_offset - start)
            if lag != state.shown_lag:  # an idle lane's gauge is set once, not every round
                state.shown_lag = lag
                self.metrics.lag.labels(state.topic, str(state.partition)).set(lag)
            return None
        self.positions.behind(tp)  # data to copy: behind until its commit (_copied)
        return fetched

    def _copied(self, state: LaneState, fetched, result) -> int:
        """The books of a share its worker copied and committed with its checkpoint."""
        labels = (state.topic, str(state.partition))
        state.failures = 0
        self._healthy_at(state, result.source_end, fetched)
        if state.session.position != state.fetcher.position:  # cannot happen; if it did, trust the checkpoint
            event("position_realigned", logging.WARNING, topic=state.topic, partition=state.partition,
                  checkpoint=state.session.position, fetcher=state.fetcher.position)
            state.fetcher = None
            self.openings.touch(state.lane)
            self.positions.behind((state.topic, state.partition), state.session.position)
        else:  # committed up to source_end: caught up if that is the high watermark the answer reported
            self.positions.caught_up((state.topic, state.partition), state.session.position, fetched.high_watermark)
        self.metrics.observe_copy(state.topic, state.partition, result, result.newest_timestamp_ms)
        self.metrics.position.labels(*labels).set(result.source_end)
        state.shown_lag = max(0, fetched.last_stable_offset - result.source_end)
        self.metrics.lag.labels(*labels).set(state.shown_lag)
        if result.records:
            event("copied", topic=state.topic, partition=state.partition, source_start=result.source_start,
                  source_end=result.source_end, target_start=result.first_target_offset,
                  target_end=result.next_target_offset, records=result.records)
        return result.records

    def _apply_prune_floors(self) -> None:
        """Hand each held lane the newest floor the prune watch gathered (its next commit prunes below it), and
        tell the watch which partitions are held now — when either changed (the held lanes, the watch's floors),
        not every pass: a lane opened meanwhile takes its floor when it opens (_open_ready)."""
        seen = (self._held_version, self.pruner.version)  # no copy of the held set per pass
        if seen == self._prune_seen:
            return
        self._prune_seen = seen
        held = [self.lanes[lane] for lane in self.held if lane in self.lanes]
        self.pruner.publish({(state.topic, state.partition) for state in held})
        floors = self.pruner.floors()
        for state in held:
            if state.session is not None:
                state.session.prune_floor = floors.get((state.topic, state.partition), state.session.prune_floor)


def lane_task(fn, *args, **kwargs):
    """A lane worker task calling ``fn(*args, **kwargs)`` (it does not need the worker's clients)."""
    return lambda _clients: fn(*args, **kwargs)
