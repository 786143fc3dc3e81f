"""The continuous shallow mirror daemon: keeps a pipeline's target current, lane by lane, exactly once.

    shoal mirror run --config pipeline.yaml          (or: python -m mirror_core.daemon --config pipeline.yaml)

Each loop: re-evaluate the topic regex now and then (new topics get their target topic through the same preflight as
a copy, partitions added on the source are added on the target, and every ``config_sync_interval_s`` the topic
configs that matter are synced to the target), hold the eligible lanes the pipeline's consumer group assigned to
this process (:mod:`mirror_core.daemon.membership`), then one **fetch round**: one Fetch request per source broker
carrying every held partition it leads (:mod:`mirror_core.kafka.broker_fetch`, the Java consumer's way; the request
long-polls ``poll_interval_ms``, so an idle daemon waits on the brokers, not on a timer), and each lane's share of
the answer copied and committed, data and checkpoint together. The lanes' commits run side by side on
``commit_workers`` lane workers (:mod:`mirror_core.daemon.lane_workers`): a lane's session — its writer,
transactional.id and producer state — lives on one worker's thread and clients, so the several target round trips of
one lane's commit overlap with the other lanes' instead of queueing behind them; lanes are opened there too. Memory
per round is bounded by ``fetch_max_bytes`` per source broker.

This module holds the loop itself (:class:`ShallowMirrorDaemon`: its state, ``run`` and shutdown); the daemon's
concerns live beside it, one module each. Most are parts of this one class (mixins: they share the daemon's books —
its lanes, held set, openings and metrics — declared in ``ShallowMirrorDaemon.__init__``); the compat lease records
are a collaborator of their own (:class:`~mirror_core.daemon.compat_leases.CompatLeaseRecords`):

- :mod:`~mirror_core.daemon.rescans` — new topics and partitions found, their targets prepared, configs synced;
- :mod:`~mirror_core.daemon.eligibility` — which lanes the daemon may hold (handed off, not halted);
- :mod:`~mirror_core.daemon.group_lanes` — holding the lanes the consumer group assigns, revocations answered;
- :mod:`~mirror_core.daemon.compat_leases` — lease records for an older, lease-based daemon during an upgrade;
- :mod:`~mirror_core.daemon.lane_sessions` — opening lanes: fence, checkpoint read, resume, fetcher;
- :mod:`~mirror_core.daemon.copy_round` — the fetch round and the lanes' shares copied and committed;
- :mod:`~mirror_core.daemon.fences` — at-least-once fences renewed; a lane fenced out backs off;
- :mod:`~mirror_core.daemon.lane_failures` — a lane's failure classified: retry, halt, retire, repair;
- :mod:`~mirror_core.daemon.lane_health` — lane health published (metrics, ``/readyz``, health records);
- :mod:`~mirror_core.daemon.lane_state` — what the daemon keeps per lane;
- :mod:`~mirror_core.daemon.main` — ``main()``: arguments, metrics endpoint, signals.

The collaborators it drives have modules of their own: the group membership (:mod:`~mirror_core.daemon.membership`,
:mod:`~mirror_core.daemon.group_settings`), the openings' books (:mod:`~mirror_core.daemon.lane_openings`), the lane
workers (:mod:`~mirror_core.daemon.lane_workers`), the standing fetch round (:mod:`~mirror_core.daemon.standing_round`,
:mod:`~mirror_core.daemon.standing_pending`), the watches on threads of their own
(:mod:`~mirror_core.daemon.retention_watch`, :mod:`~mirror_core.daemon.prune_watch`,
:mod:`~mirror_core.daemon.config_sync`), the metrics endpoint and the structured events.

Shutdown: SIGTERM lets the round in progress finish (it ends with a commit), leaves the group (and releases its
compat lease records, if any) and exits; if that cannot finish within ``shutdown_grace_s`` (the target is down, say)
the process stops without it: the open transaction is aborted by the broker and the next start resumes at the last
committed checkpoint. SIGKILL loses nothing, for the same reason: every committed round carries its checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from mirror_core.config.names import CHECKPOINT_TOPIC, new_worker_id
from mirror_core.config.pipeline_file import PipelineConfig
from mirror_core.config.topic_selection import NamingPolicy, TopicPattern
from mirror_core.daemon.compat_leases import CompatLeaseRecords
from mirror_core.daemon.config_sync import ConfigSyncWatch
from mirror_core.daemon.copy_round import CopyRounds
from mirror_core.daemon.eligibility import Eligibility
from mirror_core.daemon.events import event
from mirror_core.daemon.fences import Fences
from mirror_core.daemon.group_lanes import GroupLanes
from mirror_core.daemon.lane_failures import LaneFailures
from mirror_core.daemon.lane_health import LaneHealthBooks
from mirror_core.daemon.lane_openings import HeldLanes, LaneOpenings
from mirror_core.daemon.lane_sessions import LaneSessions
from mirror_core.daemon.lane_state import DaemonStatus, LaneState
from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool
from mirror_core.daemon.membership import GroupMembership
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.daemon.prune_watch import PruneWatch
from mirror_core.daemon.rescans import Rescans
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.daemon.standing_pending import StandingPending
from mirror_core.daemon.standing_round import StandingRound
from mirror_core.engine.lane_session import LaneSession
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.on_thread import on_thread
from mirror_core.kafka.source_reachability import SourceReachability, is_transport_failure
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.lane_health_records import LaneHealthWriter, health_refresh_s
from mirror_core.state.leases import LeaseStore

# how long a lane opened while the link is still being measured waits for the sizes (the probe's own timeouts are
# 10 s per broker, one broker after another) before it fetches with the configured ones
LINK_SIZING_WAIT_S = 15.0


class ForcedShutdown(BaseException):
    """Raised on the main thread when a SIGTERM's grace period ran out (see
    :func:`mirror_core.daemon.main.run_daemon`). A BaseException, like KeyboardInterrupt, so the daemon's "log and
    retry" handlers do not swallow it."""


class ShallowMirrorDaemon(Rescans, Eligibility, GroupLanes, LaneSessions, CopyRounds, Fences, LaneFailures,
                          LaneHealthBooks):
    """Mirrors a pipeline continuously. Invariant: a lane is written only through a session opened with its
    transactional.id while this process holds it — its source partition assigned by the group (or its lease
    taken) — so at most one live writer per lane (the broker fences the rest)."""

    def __init__(self, config: PipelineConfig, *, worker_id: str | None = None, metrics: DaemonMetrics | None = None):
        self.config = config
        self.worker_id = worker_id or new_worker_id()
        self.metrics = metrics or DaemonMetrics()
        self.naming = NamingPolicy.parse(config.naming)
        self.include = TopicPattern(config.include, "include")
        self.exclude = TopicPattern(config.exclude, "exclude") if config.exclude else None
        self.lanes: dict[str, LaneState] = {}
        # which held lanes a round must look at to open (mirror_core.daemon.lane_openings): every change of a lane's
        # standing touches it there — held/dropped (HeldLanes), reset, halted, resumed, a retry time (openings.wait)
        self.openings = LaneOpenings()
        self._held_version = 0  # moves with every lane acquired or dropped (_apply_prune_floors compares it)
        self._held = HeldLanes(on_change=self._held_changed)
        self._next_openings_audit = 0.0  # the openings' books checked against the lanes (every AUDIT_MAX_S)
        # (openings.version, the ready list _open_ready returned, its (lane, fetcher) pairs for the fetch round):
        # reused while no lane was touched — an idle round builds no list of every ready lane
        self._ready_cache: tuple[int, list, list] | None = None
        # at-least-once: (time its fence falls due, seq, lane, session) per open session (_renew_fences); a walk of
        # every held lane only every AUDIT_MAX_S, as a check
        self._fence_times: list[tuple[float, int, str, LaneSession]] = []
        self._fence_seq = 0
        self._next_fence_walk = 0.0
        # lane health by events (_publish_due_states): lanes whose health may have changed since it was published;
        # (wall ms it turns stalled, lane) per retrying lane — a change no event makes — and each lane's entry there;
        # lanes that failed since they were last seen copying (the candidates for a health record)
        self._health_dirty: set[str] = set()
        self._stall_times: list[tuple[int, str]] = []
        self._stall_at: dict[str, int] = {}
        self._health_watch: set[str] = set()
        self._halts = 0  # lanes halted or retired by this process (a key of _eligible's cached answer)
        self._eligible_seen: tuple[tuple, list[str]] | None = None  # (what it depended on, the answer) (_eligible)
        self._group_seen: tuple | None = None  # what the held set was last made from (_maintain_group)
        self.status = DaemonStatus()
        self.store: CheckpointStore | None = None  # the target's checkpoints, once run() connected
        self._next_rescan = 0.0
        self._next_lease = 0.0
        self.membership: GroupMembership | None = None  # membership: group (else leases)
        self.source_reachability = SourceReachability(config.source.name)  # one statement during a source outage
        self.metrics.source_problem = lambda: self.source_reachability.problem(time.monotonic())
        self._group_changed = threading.Event()  # set by the membership's poll thread: assigned/revoking changed
        self._waiting_for_lease: set[str] = set()  # assigned lanes an older lease-based daemon still holds
        self.compat = CompatLeaseRecords(config)  # lease_compat: our lease records, heartbeat
        self._health_written: dict[str, tuple[dict, int]] = {}  # lane → the health record we wrote, when (ms)
        self._group_topics: list[str] | None = None  # the subscription, as of the last rescan
        self._answered_generation = -1  # the membership generation _answer_revocations last looked at
        self._lanes_idle = True  # no lane work runs on another thread now (see _leases_if_due)
        self._held_since_answer = False  # lanes acquired since then (from an assignment read before a revocation)
        # lane → (membership generation at its fenced drop, fencings in a row, retry not before): a fenced lane is
        # not re-acquired from the same assignment until it changes or the backoff passes (see _fenced_out)
        self._fenced: dict[str, tuple[int, int, float]] = {}
        self._group_timeouts_applied = False  # the KIP-848 group configs are set once per process
        self._join_failures = 0  # consecutive rebuilds of a membership whose thread died (or could not start)
        self._next_join = 0.0
        self._group_unjoined_reported = False  # group_not_joined logged (once per episode)
        self._next_config_sync = 0.0
        # (source topic → partitions with a lane, how many of self.lanes that covers): _lanes_per_topic
        self._topic_lanes: tuple[dict[str, set[int]], int] = ({}, 0)
        self._published_health: dict[str, tuple] = {}  # lane → its health's fields as last published
        # held (topic, partition) → offset-map prune floor, gathered off the loop (mirror_core.daemon.prune_watch)
        self.pruner = PruneWatch(config.source, self.metrics, interval_s=config.prune_interval_s)
        self.config_sync = ConfigSyncWatch(config.source, config.target, self.metrics)  # its own thread
        self._round = 0
        # the held lanes' standing fetch round (mirror_core.daemon.standing_round: a round costs what changed) and the
        # next round of it, sent before this round's shares are written (overlap, see _copy_round)
        self._rounds: StandingRound | None = None
        self._in_flight: StandingPending | None = None
        self._next_audit = 0.0  # the standing round's books checked against its sessions (every AUDIT_MAX_S)
        self._next_health_walk = 0.0  # every lane's health compared, positions checked (_publish_due_states)
        self._prune_seen: tuple[int, int] | None = None  # (held set's version, floors version) last applied
        self._round_books = False  # a round's shares are being booked: a failed lane is published at its end
        self.retention = RetentionWatch(config.source, config.target, self.metrics,
                                        interval_s=config.retention_interval_s,
                                        fetch_bytes=config.partition_fetch_max_bytes, policy=config.retention)
        # the held lanes' committed positions for the watch, kept by events: a lane's news (caught up or behind), a
        # failure or reset (behind), a drop (forgotten) — mirror_core.model.held_positions; no walk of the held lanes
        self.positions = self.retention.positions
        # lanes are opened and their shares committed on these workers, side by side (mirror_core.daemon.lane_workers):
        # a lane's session (its writer, transactional.id and producer state) lives on one worker's thread and
        # clients; the main thread fetches, decides and keeps the books
        self.workers: LaneWorkerPool | None = None
        # (bytes per fetch request, bytes per partition in it): the configured sizes, or sized for the declared
        # link at start (_size_for_link: measured beside the start, taken when a lane first needs them)
        self._sizes = (config.fetch_max_bytes, config.partition_fetch_max_bytes)
        self._sizes_measured: Future | None = None  # the link measurement (None: no link declared)
        self._sizing_late_said = False

    @property
    def held(self) -> set[str]:
        """The lanes this process holds (a set touching each added or removed lane in ``self.openings``)."""
        return self._held

    @held.setter
    def held(self, lanes) -> None:
        for lane in self._held:
            self.openings.touch(lane)
        self._held_version += 1
        self._held = HeldLanes(lanes, on_change=self._held_changed)

    def _held_changed(self, lane: str) -> None:
        self._held_version += 1
        self.openings.touch(lane)

    def _refuse_checkpoints_elsewhere(self) -> None:
        """A pipeline file naming its own ``checkpoint_topic`` while the default topic holds checkpoints of the
        same pipeline (a backfill, ``shoal copy`` or a handoff wrote them: those always use the default): the
        daemon would not see them and would start those lanes by ``new_partitions`` — skipping or repeating what
        they record. Refused at start, with the numbers, instead."""
        cfg = self.config
        found = self.store.pipeline_checkpoints_in(CHECKPOINT_TOPIC, cfg.pipeline)
        if found:
            raise ConfigError(
                f"pipeline {cfg.pipeline!r}: the pipeline file names checkpoint_topic {cfg.checkpoint_topic!r}, but "
                f"{found} checkpoint(s) of this pipeline are in {CHECKPOINT_TOPIC!r} on cluster "
                f"{cfg.target.name!r} (written by shoal backfill, shoal copy or the handoff, which always use "
                f"it); the daemon would not see them and would start those lanes by new_partitions "
                f"({cfg.new_partitions!r}), skipping or repeating data. Remove checkpoint_topic from the pipeline "
                f"file, or use another pipeline name")

    # ---- main loop ---------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        cfg = self.config
        event("start", pipeline=cfg.pipeline, worker=self.worker_id, include=cfg.include, mode=cfg.mode)
        self._size_for_link()  # beside the rest of the start (its own connections)
        with WireClient.for_cluster(cfg.source) as source, WireClient.for_cluster(cfg.target) as target:
            self.source, self.target = source, target
            self.store = CheckpointStore(cfg.target, target, topic=cfg.checkpoint_topic)
            self.store.ensure_topic()
            self._refuse_checkpoints_elsewhere()
            self.leases = LeaseStore(self.store, cfg.target.confluent())
            self.health_records = LaneHealthWriter(self.leases.producer,
                                                   refresh_s=health_refresh_s(cfg.lease_ttl_s / 3))
            self.workers = LaneWorkerPool(cfg.commit_workers, self._worker_clients)
            self._join_group()
            self.retention.start()
            self.pruner.start()
            forced = False
            try:
                while not stop.is_set():
                    self.metrics.last_loop = time.monotonic()
                    now = time.monotonic()
                    if now >= self._next_rescan:
                        self._next_rescan = now + cfg.rescan_interval_s
                        self._housekeeping("rescan", self._rescan)
                    self._leases_if_due()
                    self._report_source_reachability()
                    self._apply_prune_floors()
                    self._renew_fences()
                    idle = self._copy_round() is None
                    self._publish_pending_states()
                    if idle:  # nothing to fetch: no lane held, or all backing off
                        stop.wait(cfg.poll_interval_ms / 1000)
            except ForcedShutdown:
                forced = True
                event("shutdown_forced", logging.WARNING, lanes=",".join(sorted(self.held)),
                      note="the grace period ran out; open transactions are aborted by the broker, the next start "
                           "resumes at the last committed checkpoints")
                if self.membership is not None:  # leave (the source is not the target): the lanes move now, and
                    self.membership.close(timeout_s=2.0)  # their next holder's InitProducerId fences what we left
                raise
            finally:
                self.retention.stop()  # no join: an assessment stuck on a slow source must not eat the grace
                self.pruner.stop()
                self.config_sync.stop()  # no join either
                self.workers.close()  # no join either: a worker stuck on a dead target must not eat the grace
                if not forced:  # records of a forced stop just expire (the target may be the reason for it)
                    self._shutdown()
        event("stop", pipeline=cfg.pipeline, worker=self.worker_id)

    def _worker_clients(self) -> LaneClients:
        """A lane worker's own connections (made on its thread: a WireClient is one client per thread)."""
        cfg = self.config
        source = WireClient.for_cluster(cfg.source)
        try:
            target = WireClient.for_cluster(cfg.target)
        except BaseException:
            source.close()
            raise
        return LaneClients(source, target, CheckpointStore(cfg.target, target, topic=cfg.checkpoint_topic))

    def _size_for_link(self) -> None:
        """``link_mbps`` declared: measure each source broker's round trip once and size a round so it keeps that
        link busy (one request per broker per round, one round in flight: preflight_rules.round_bytes_for_link).
        A partition may fill its request alone (the only busy lane; rotation keeps the others from starving).

        Measured in a thread of its own while the daemon joins its group and scans the topics: over a 200 ms link
        the measurement took 1.9 of the ~7 s before the first fetch, one after the other. Nothing fetches before a
        lane is opened, and a lane's first fetch takes the sizes (:attr:`_fetch_sizes`, waiting a bounded time for
        the measurement if it still runs). Measuring is best effort: when no broker answers the probe, or the probe
        fails in any way, the configured sizes stay (``link_not_measured``)."""
        if self.config.link_mbps is None:
            return
        def measure() -> tuple[int, int] | None:
            try:
                return self._measured_sizes()
            except Exception as exc:  # noqa: BLE001 - best effort: never a lane's failure (read on lane workers)
                event("link_not_measured", logging.WARNING, error=f"{type(exc).__name__}: {exc}", exc_info=True)
                return None

        self._sizes_measured = on_thread(measure, name="shoal-link-sizing")

    @property
    def _fetch_sizes(self) -> tuple[int, int]:
        """(bytes per fetch request, bytes per partition in it): the link's once measured. A lane opened while the
        measurement still runs waits for it up to ``LINK_SIZING_WAIT_S``, then takes the configured sizes (said
        once, ``link_sizing_late``); lanes opened after the measurement ended take its sizes. Never raises: read
        on lane workers, where an error would be the lane's."""
        measured = self._sizes_measured   # never cleared: read from lane workers' threads too, without a lock
        if measured is not None:
            try:   # once a wait ran out, nobody waits again: the sizes change when the probe ends
                sizes = measured.result(timeout=0 if self._sizing_late_said else LINK_SIZING_WAIT_S)
            except FutureTimeout:
                if not self._sizing_late_said:
                    self._sizing_late_said = True
                    event("link_sizing_late", logging.WARNING, waited_s=LINK_SIZING_WAIT_S,
                          note="lanes opened until the probe ends fetch with the configured partition size")
                sizes = None
            if sizes is not None:
                return sizes
        return self._sizes

    def _measured_sizes(self) -> tuple[int, int] | None:
        """The link's sizes (see :meth:`_size_for_link`), or None (said as ``link_not_measured``)."""
        from mirror_core.kafka.round_trips import measure_links
        from mirror_core.model.preflight_rules import round_bytes_for_link

        cfg = self.config
        try:
            rtts = [link.rtt_s for link in measure_links(cfg.source, timeout_s=10.0) if link.rtt_s is not None]
        except MirrorError as exc:
            event("link_not_measured", logging.WARNING, error=str(exc))
            return None
        if not rtts:
            event("link_not_measured", logging.WARNING, error="no source broker answered the round-trip probe")
            return None
        rtt = max(rtts)
        request = round_bytes_for_link(link_bytes_per_s=cfg.link_mbps * 1e6, rtt_s=rtt, floor=cfg.fetch_max_bytes)
        partition = max(cfg.partition_fetch_max_bytes, request)
        event("sized_for_link", link_mb_s=cfg.link_mbps, rtt_ms=round(rtt * 1000, 1), fetch_max_bytes=request,
              partition_fetch_max_bytes=partition)
        return request, partition

    def _report_source_reachability(self) -> None:
        """The source stopped answering, or answers again (mirror_core.kafka.source_reachability): said once per
        change."""
        change = self.source_reachability.check(time.monotonic())
        if change is not None:
            self.metrics.source_reachable.set(0 if change.unreachable else 1)
            event("source_unreachable" if change.unreachable else "source_reachable",
                  logging.ERROR if change.unreachable else logging.INFO, cluster=change.cluster,
                  **({"failing_for_s": round(change.since_s, 1), "error": change.error, "note": change.problem}
                     if change.unreachable else {"unreachable_for_s": round(change.since_s, 1)}))

    def _housekeeping(self, what: str, action) -> None:
        """Run a rescan or a group round; a failure (e.g. the target restarting) is logged and retried on the next
        round instead of ending the daemon. Lanes keep copying meanwhile; their writers are fenced by the broker if
        a lease lapses and another daemon takes over."""
        began = time.monotonic()
        try:
            action()
            if what == "rescan":  # the source's metadata answered
                self.source_reachability.answered(began)
        except Exception as exc:  # noqa: BLE001 - a daemon outlives transient cluster trouble
            if what == "rescan" and is_transport_failure(exc):
                self.source_reachability.unanswered(began, exc)
            self.metrics.errors.labels(what).inc()
            event(f"{what}_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                  exc_info=not isinstance(exc, MirrorError))

    def _shutdown(self) -> None:
        if self.membership is not None:
            self._leave_group()
