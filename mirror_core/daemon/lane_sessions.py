"""Opening lanes: a held lane's session (its writer, fenced with its transactional.id) and a fetcher at its checkpoint.

A lane without a session opens in three steps, each for all the lanes opening together: one read of their
checkpoints (a lane a backfill still owns is refused before anything fences its writer), InitProducerId per lane
on the lanes' workers side by side, then one more read of the checkpoints and each session resumed from its own
(DESIGN §3.4). The look-ups that can be batched (transaction coordinators, epoch ends) are asked once for all, as
hints. The main thread installs what a worker opened only if the lane was not dropped meanwhile.
"""

from __future__ import annotations

import functools
import logging
import time

import kafka.errors as Errors

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import DAEMON_OWNER, lane_transactional_id
from mirror_core.daemon.events import event, log
from mirror_core.daemon.lane_openings import audit as audit_openings
from mirror_core.daemon.lane_state import AUDIT_MAX_S, LaneState
from mirror_core.daemon.lane_workers import LaneClients, TaskOutcome
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.engine.lane_session import LaneSession
from mirror_core.errors import NotHandedOffError
from mirror_core.kafka.epochs import EpochEnd, epoch_ends_many
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.source_reachability import is_transport_failure
from mirror_core.state.checkpoint import Checkpoint, checkpoint_key, checkpoint_partition

OPEN_BATCH_MIN_LANES = 4  # fewer lanes opening together look their coordinators and epoch ends up alone
OPEN_LOOKUP_TIMEOUT_S = 2.0  # a batched look-up of a lane opening (coordinators, epoch ends) holds the main thread


class LaneSessions:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): the
    lanes a round may fetch, opened.

    Where each step runs: the main thread fetches (one request per source broker), decides and keeps the books
    (leases, health, metrics, events); a lane's own wire work — opening its session, writing and committing its
    share, renewing its fence — runs on its worker (self.workers), the lanes side by side. The main thread touches
    a lane's session only between worker batches, never a worker's clients."""

    def _find_coordinators(self, lanes: list[str]) -> dict[str, object]:
        """Lane → its transactional.id's coordinator (a FindCoordinator entry), for the lanes about to be fenced,
        asked in one batched request (:meth:`WireClient.find_coordinators`) instead of one per lane. Best effort:
        a lane left out (an old broker, an error) looks its coordinator up itself. Fewer than
        :data:`OPEN_BATCH_MIN_LANES` lanes (a lane reopening after a failure): each asks alone on its worker, no
        request on this thread."""
        if len(lanes) < OPEN_BATCH_MIN_LANES:
            return {}
        ids = {lane_transactional_id(self.config.pipeline, lane): lane for lane in lanes}
        try:
            found = self.target.find_coordinators(list(ids), timeout_s=self._open_lookup_timeout_s())
        except Exception as exc:  # noqa: BLE001 - a hint only: every lane can still look its own up
            log.debug("batched FindCoordinator for %d lanes failed: %s", len(lanes), exc)
            return {}
        return {ids[key]: entry for key, entry in found.items() if key in ids}

    def _open_lookup_timeout_s(self) -> float:
        """How long a batched look-up of a lane opening may hold this (the main) thread: it runs between pool
        runs, so no tick renews the leases meanwhile — a silent broker must cost far less than a renewal period
        (``lease_ttl_s / 3``), not the client's request timeout. A lane left out asks alone, on its worker.
        Never below a fetch's wait and a second: without the fast path (a proxy) the standing round's fetch may be
        parked on the same kafka-python connection, the broker answers it first, and a request that times out
        closes that connection — failing the round in flight."""
        cfg = self.config
        return min(max(OPEN_LOOKUP_TIMEOUT_S, cfg.poll_interval_ms / 1000 + 1.0), cfg.lease_ttl_s / 4)

    def _epoch_ends(self, checkpoints: list[Checkpoint]) -> dict[tuple[str, int, int], EpochEnd]:
        """The source leaders' answers for ``checkpoints``' position epochs (:func:`epochs.epoch_ends_many`):
        best effort, a lane left out asks on its own."""
        asks = [(cp.topic, cp.partition, cp.position_epoch) for cp in checkpoints
                if cp.position_epoch is not None and cp.position_epoch >= 0]
        if len(asks) < OPEN_BATCH_MIN_LANES:  # as _find_coordinators: a few lanes ask alone on their workers
            return {}
        try:
            return epoch_ends_many(self.source, asks, timeout_s=self._open_lookup_timeout_s())
        except Exception as exc:  # noqa: BLE001 - a hint only: every lane can still ask alone
            log.debug("batched OffsetsForLeaderEpoch for %d lanes failed: %s", len(asks), exc)
            return {}

    def _fence_lane(self, state: LaneState, handed_over: Checkpoint | None, clients: LaneClients, *,
                    coordinator: object | None = None) -> LaneSession:
        """The first half of a new session of the lane, on its worker: InitProducerId with its transactional.id
        (every former holder fenced, its open transaction aborted). The checkpoint is read afterwards, for all the
        lanes opening together (:meth:`_open_lanes`), and handed to :meth:`_open`. ``handed_over``: the lane's
        checkpoint as read before fencing (owned by the daemon, or None); ``coordinator``: its transaction
        coordinator as a batched look-up found it (:meth:`_find_coordinators`), or None."""
        cfg = self.config
        if coordinator is not None:
            clients.target.hint_coordinator(lane_transactional_id(cfg.pipeline, state.lane), coordinator)
        epoch = handed_over.owner_epoch if handed_over is not None else 1
        copier = CheckpointedCopier(
            clients.source, clients.target, clients.store, pipeline=cfg.pipeline, mode=DeliveryMode(cfg.mode),
            owner=DAEMON_OWNER, owner_epoch=epoch,
            options=CopyOptions(max_inflight_bytes=cfg.commit_bytes, coalesce_bytes=cfg.coalesce_bytes),
            policy=CommitPolicy(cfg.commit_bytes, cfg.commit_interval_ms, cfg.transaction_timeout_ms,
                                cfg.write_retry_s))
        return copier.open_lane(state.topic, state.partition, state.target_topic, state.partition,
                                lane=state.lane, read_checkpoint=False)

    def _open(self, state: LaneState, session: LaneSession, clients: LaneClients, *, fenced: bool = False,
              checkpoint: Checkpoint | None = None, epoch_end: EpochEnd | None = None
              ) -> tuple[LaneSession, RawBatchFetcher]:
        """The lane's session and a fetcher at its committed position. ``fenced``: ``session`` was just opened by
        :meth:`_fence_lane` and ``checkpoint`` is the lane's, read after its InitProducerId returned — the session
        resumes from it here. Runs on the lane's worker (where its writer lives) and hands both back as the task's
        value — the main thread installs them only if the lane was not dropped meanwhile (:meth:`_open_ready`);
        the one thing stored here is ``state.start``, set once (None → offset) so a retry keeps the start it chose.
        The fetcher itself is driven by the main thread's fetch rounds (``self.source``)."""
        if fenced:
            session.resume(checkpoint, epoch_end=epoch_end)
            if session.checkpoint is not None and session.checkpoint.owner != DAEMON_OWNER:
                # a backfill claimed the lane between our first read and the fence: leave it (its retry fences us)
                raise NotHandedOffError(self.config.pipeline, session.checkpoint)
        position, epoch = session.position, session.position_epoch
        if position is None:  # no checkpoint yet: fix the start once, or "latest" would move with the data
            if state.start is None:
                state.start = list_offsets(clients.source, state.topic, state.partition,
                                           "earliest" if self.config.new_partitions == "earliest" else "last_stable")
            # stored before any copy: a restart (this daemon's or another's) resumes there instead of choosing
            # "latest" anew and skipping what arrived in between
            session.write_first_checkpoint(state.start)
            position, epoch = session.position, session.position_epoch
        fetcher = RawBatchFetcher(
            self.source, state.topic, state.partition, position, None,
            max_bytes=self._fetch_sizes[1], max_wait_ms=self.config.poll_interval_ms,
            topic_id=session.source_topic_id, last_epoch=epoch,
            check_crcs=False)   # a copy: prepare_for_target checks each batch it writes
        return session, fetcher

    def _open_ready(self) -> list[tuple[LaneState, int]]:
        """Every held lane that may copy now, opened (on the workers, side by side: opening is several round trips
        per lane), with the position its fetch starts at.

        A group round runs as the pool's tick while the workers open lanes, and may drop one of them: the
        opened session and fetcher are then not installed (a later acquisition must open anew: InitProducerId,
        checkpoint read), and an error is not classified (the lane is not ours: no 'retrying', no halt)."""
        now, lanes, openings = time.monotonic(), self.lanes, self.openings
        self._audit_openings_if_due(now)
        closed = []
        for lane in openings.take(now):  # touched, or its retry time came: not every held lane
            state = lanes.get(lane)
            if state is None or lane not in self.held or state.health.stopped:
                continue  # touched again when acquired or resumed
            if now < state.retry_at:
                openings.wait(lane, state.retry_at)
            elif state.session is None or state.fetcher is None:
                closed.append(state)
            else:
                openings.set_ready(lane, state)
        if closed:
            began = [(state.session, state.generation) for state in closed]
            outcomes = self._open_lanes(closed, began)
            floors = self.pruner.floors()  # a copy of every held lane's floor: taken once, not once per lane
            for state, (session, generation), outcome in zip(closed, began, outcomes, strict=True):
                if not self._still_ours(state, generation, session):
                    if outcome.ok and outcome.value[0] is not session:
                        event("lane_open_discarded", lane=state.lane,
                              note="dropped while it opened; its next holder's InitProducerId fences this writer")
                    continue
                if not outcome.ok:
                    self._failed(state, outcome.error)  # waits for its retry time (or halts, or is dropped)
                    continue
                opened, state.fetcher = outcome.value
                # a new fetcher: behind until its first answer says where the high watermark is
                self.positions.behind((state.topic, state.partition), opened.position)
                if opened is not session:
                    opened.prune_floor = floors.get((state.topic, state.partition))
                    state.session = opened
                    self._schedule_fence(state)
                    event("lane_opened", topic=state.topic, partition=state.partition, lane=state.lane,
                          position=opened.position)
                openings.set_ready(state.lane, state)
        cached = self._ready_cache
        if cached is not None and cached[0] == openings.version:
            return cached[1]  # nothing changed since the last round: the same lanes, the same fetchers
        ready = []
        for lane, state in list(openings.ready.items()):
            if state.fetcher is None or state.session is None or lane not in self.held:
                openings.touch(lane)  # reset without being touched (a missed hook): looked at next round
                continue
            ready.append((state, state.fetcher.position))
        self._ready_cache = (openings.version, ready, [(state.lane, state.fetcher) for state, _ in ready])
        return ready

    def _audit_openings_if_due(self, now: float) -> None:
        """Every AUDIT_MAX_S: the openings' books checked against the held lanes
        (lane_openings.audit); a lane that would never be opened again is logged and repaired — never a silent stall."""
        if now < self._next_openings_audit:
            return
        # a lane a hook missed is opened by nothing else: it stays unopened (and shows retrying, then stalled) at
        # most this long
        self._next_openings_audit = now + AUDIT_MAX_S
        repaired = audit_openings(self.openings, self.held, self.lanes, now)
        if repaired:
            event("lane_openings_repaired", logging.WARNING, lanes=len(repaired), first=repaired[0],
                  note="a held lane was missing from the lanes a round opens; it is looked at again")

    def _read_checkpoints(self, lanes: list[tuple[str, int]]
                          ) -> dict[tuple[str, int], Checkpoint | None | BaseException]:
        """(topic, partition) → the lane's checkpoint as :meth:`CheckpointStore.read_own` gives it, or the error
        reading it raised. One pass for all (``read_own_many``); when that fails, each checkpoint partition's lanes
        are read again on their own, and when a partition's lanes fail with an error of the data (not of the
        cluster: an undecodable checkpoint, a format a newer Shoal wrote), each of them alone — so a leaderless
        checkpoint partition fails only the lanes stored there, and one unreadable checkpoint only its own lane,
        as when each lane read its own checkpoint. Cluster errors are not split further (an unreachable target not
        at all): the main thread does not ask a failing cluster once per lane."""
        pipeline, store = self.config.pipeline, self.store
        try:
            return dict(store.read_own_many(pipeline, lanes))
        except Exception as exc:  # noqa: BLE001 - split below; each lane's error is classified by the caller
            if len(lanes) <= 1 or is_transport_failure(exc):  # the target unreachable: each read would wait alike
                return {lane: exc for lane in lanes}
            first = exc
        groups: dict[int, list[tuple[str, int]]] = {}
        for topic, partition in lanes:
            part = checkpoint_partition(checkpoint_key(pipeline, topic, partition), store.partitions)
            groups.setdefault(part, []).append((topic, partition))
        out: dict[tuple[str, int], Checkpoint | None | BaseException] = {}
        for group in groups.values():
            error: BaseException = first
            if len(groups) > 1:
                try:
                    out.update(store.read_own_many(pipeline, group))
                    continue
                except Exception as exc:  # noqa: BLE001
                    error = exc
            if len(group) == 1 or _is_cluster_error(error):
                out.update({lane: error for lane in group})
                continue
            for lane in group:
                try:
                    out.update(store.read_own_many(pipeline, [lane]))
                except Exception as exc:  # noqa: BLE001
                    out[lane] = exc
        return out

    def _open_lanes(self, states: list[LaneState], began: list[tuple[LaneSession | None, int]]
                    ) -> list[TaskOutcome]:
        """Open ``states`` (each with the session and generation it had when the open began; a lane that has a
        session only needs a fetcher): per lane the outcome of :meth:`_open`.

        A lane without a session opens in three steps, each for all such lanes at once:
          1. one read of their checkpoints (:meth:`CheckpointStore.read_own_many`): a lane a backfill still owns is
             refused before anything fences its writer;
          2. InitProducerId with each lane's transactional.id, on the lanes' workers side by side;
          3. one more read of the checkpoints of the lanes step 2 fenced, then each session resumes from its own
             on its worker (topic ids, position validation, a first checkpoint where none exists).
        Ordering (DESIGN §3.4): step 3's read begins only after every InitProducerId of step 2 returned
        (``workers.run`` returns when all its tasks have): by then each former holder of those lanes is fenced
        and its transactions are decided, so the checkpoint a lane resumes from is the newest its former holder
        committed, never one an open transaction hides — exactly what a per-lane ``read_own`` after the lane's
        own InitProducerId read (and one pass over the checkpoint topic instead of two reads per lane). A lane
        dropped during step 2 (a group round runs as the pool's tick) skips step 3: its fenced session is
        discarded, and its next holder's InitProducerId fences that writer."""
        outcomes: list[TaskOutcome | None] = [None] * len(states)
        sessions = [session for session, _generation in began]  # what step 3 opens on (a fenced one, after step 2)
        fresh = [i for i, session in enumerate(sessions) if session is None]
        resumed: dict[int, Checkpoint | None] = {}  # index → the checkpoint its fenced session resumes from
        if fresh:
            pipeline = self.config.pipeline
            lanes = [(states[i].topic, states[i].partition) for i in fresh]
            # past the LSO: a handoff committed behind another lane's open transaction still counts. A lane whose
            # checkpoint could not be read retries after its backoff (classified by the caller), alone
            before = self._read_checkpoints(lanes)
            for i in fresh:
                cp = before.get((states[i].topic, states[i].partition))
                if isinstance(cp, BaseException):
                    outcomes[i] = TaskOutcome(error=cp)
                elif cp is not None and cp.owner != DAEMON_OWNER:  # checked before opening: opening fences its writer
                    outcomes[i] = TaskOutcome(error=NotHandedOffError(pipeline, cp))
            fresh = [i for i in fresh if outcomes[i] is None]
            coordinators = self._find_coordinators([states[i].lane for i in fresh])
            fenced = self.workers.run(
                [(states[i].lane, functools.partial(self._fence_lane, states[i],
                                                    before.get((states[i].topic, states[i].partition)),
                                                    coordinator=coordinators.get(states[i].lane)))
                 for i in fresh], tick=self._leases_busy)  # revocations are answered meanwhile
            kept = []
            for i, outcome in zip(fresh, fenced, strict=True):
                if not outcome.ok:
                    outcomes[i] = outcome
                elif not self._still_ours(states[i], began[i][1]):
                    outcomes[i] = TaskOutcome(value=(outcome.value, None))  # dropped: not resumed, not installed
                else:
                    kept.append(i)
                    sessions[i] = outcome.value  # a fenced session, resumed in step 3
            if kept:  # every InitProducerId of step 2 has returned (see the docstring)
                after = self._read_checkpoints([(states[i].topic, states[i].partition) for i in kept])
                for i in kept:
                    cp = after.get((states[i].topic, states[i].partition))
                    if isinstance(cp, BaseException):
                        outcomes[i] = TaskOutcome(error=cp)
                    else:
                        resumed[i] = cp
        # the source leaders' answers for the resumed positions' epochs, asked now (after the checkpoints were
        # read), a request per leader for all of them: each lane's truncation check uses its own (or asks alone)
        epoch_ends = self._epoch_ends([cp for cp in resumed.values() if cp is not None])
        rest = [i for i in range(len(states)) if outcomes[i] is None]
        opened = self.workers.run(
            [(states[i].lane, functools.partial(self._open, states[i], sessions[i], fenced=i in resumed,
                                                checkpoint=resumed.get(i),
                                                epoch_end=_epoch_end_of(epoch_ends, resumed.get(i))))
             for i in rest], tick=self._leases_busy)
        for i, outcome in zip(rest, opened, strict=True):
            outcomes[i] = outcome
        return outcomes  # type: ignore[return-value]


def _is_cluster_error(exc: BaseException) -> bool:
    """Whether a checkpoint read failed because of the cluster (a broker's error, unavailable, unreachable) rather
    than because of what a lane's checkpoint holds: the former would fail each lane's own read alike."""
    return isinstance(exc, Errors.KafkaError | OSError | TimeoutError) or bool(getattr(exc, "retriable", False)) \
        or is_transport_failure(exc)


def _epoch_end_of(epoch_ends: dict[tuple[str, int, int], EpochEnd], checkpoint: Checkpoint | None) -> EpochEnd | None:
    """The batched answer for exactly this checkpoint's position epoch, if one was found."""
    if checkpoint is None or checkpoint.position_epoch is None:
        return None
    return epoch_ends.get((checkpoint.topic, checkpoint.partition, checkpoint.position_epoch))
