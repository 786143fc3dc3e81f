"""The continuous shallow mirror daemon: keeps a pipeline's target current, lane by lane, exactly once.

    shoal mirror run --config pipeline.yaml          (or: python -m mirror_core.daemon --config pipeline.yaml)

Each loop: re-evaluate the topic regex now and then (new topics get their target topic through the same
preflight as a copy, partitions added on the source are added on the target, and every ``config_sync_interval_s``
the topic configs that matter are synced to the target), hold the eligible lanes the pipeline's consumer group
assigned to this process (:mod:`mirror_core.daemon.membership`), then
one **fetch round**: one Fetch request per source broker carrying every held partition it leads
(:mod:`mirror_core.kafka.broker_fetch`, the Java consumer's way; the request long-polls ``poll_interval_ms``, so an idle
daemon waits on the brokers, not on a timer), and each
lane's share of the answer copied and committed, data and checkpoint together. The lanes' commits run side by side
on ``commit_workers`` lane workers (:mod:`mirror_core.daemon.lane_workers`): a lane's session — its writer,
transactional.id
and producer state — lives on one worker's thread and clients, so the several target round trips of one lane's
commit overlap with the other lanes' instead of queueing behind them; lanes are opened there too.
A lane is eligible when its checkpoint belongs to the daemon (handed off by a backfill, or its own first checkpoint
of a new partition) or when it has none yet (a new partition, mirrored from its beginning); a lane a backfill still
owns is left alone until it is handed off.

Failure behaviour: a fenced lane (another daemon took it) or a handed-over one is dropped; a recreated source topic
or data deleted before it was copied (or truncated from the source log after it was) halts the partition with a
clear status and is not retried (an operator decides); a retriable source error (leader moved, broker restarting)
retries the fetch with a short backoff; an
unreachable target closes the lane's session and retries with backoff, resuming from the last committed checkpoint
— nothing is buffered across a failure, so memory stays at one fetch round plus one flush however long the target
is down; a failed rescan or group round is logged and retried on the next round, never the end of the process.
Memory per round is bounded by ``fetch_max_bytes`` per source broker.

Membership: the daemons of a pipeline are members of one consumer group on the
source; Kafka detects dead members and balances the partitions; an assigned partition is a lane this process holds
once it is eligible. A revocation is honoured once per pass of the main loop (after that pass's lane work has
returned, so about one copy round): the lane's transaction is finished (every copy ends
with its commit) or aborted, the lane dropped, and only then the partition given back (the hand-shake and its
timeout: :mod:`mirror_core.daemon.membership`). A daemon also keeps off lanes an older, lease-based daemon holds by
a live lease, and — ``lease_compat``, by default only while such a daemon is seen — writes lease records for its
own lanes so the old one keeps off them: both kinds run side by side during an upgrade
(:mod:`mirror_core.state.leases`).
A lane that is not simply copying (retrying, stalled) has a health record of its own in the checkpoint topic,
written when its state changes (:mod:`mirror_core.state.lane_health_records`), so the Shoal page and ``shoal lanes
status`` see it.

Shutdown: SIGTERM lets the round in progress finish (it ends with a commit), leaves the group (and releases its
compat lease records, if any) and exits; if that
cannot finish within ``shutdown_grace_s`` (the target is down, say) the process stops without it: the open
transaction is aborted by the broker and the next start resumes at the last committed checkpoint. SIGKILL loses
nothing, for the same reason: every committed round carries its checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import itertools
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import kafka.errors as Errors

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import CHECKPOINT_TOPIC, DAEMON_OWNER, default_lane, lane_transactional_id, new_worker_id
from mirror_core.config.pipeline_file import PipelineConfig, load_pipeline_config
from mirror_core.daemon import thread_sampler
from mirror_core.daemon.config_sync import ConfigSyncWatch
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_openings import HeldLanes, LaneOpenings
from mirror_core.daemon.lane_openings import audit as audit_openings
from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool, TaskOutcome
from mirror_core.daemon.membership import GroupMembership, apply_group_timeouts, choose_protocol
from mirror_core.daemon.metrics import DaemonMetrics, serve_metrics
from mirror_core.daemon.prune_watch import PruneWatch
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.daemon.standing_round import StandingPending, StandingRound
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode, LaneSession
from mirror_core.engine.copier import CopyOptions, FetchedOnce
from mirror_core.errors import (
    BatchRejectedError,
    ConfigError,
    MirrorError,
    NotHandedOffError,
    OwnershipError,
    ProducerFencedError,
    SourceTopicDeletedError,
    TopicRecreatedError,
)
from mirror_core.kafka.broker_fetch import PartitionOutcome, RoundStats
from mirror_core.kafka.epochs import EpochEnd, epoch_ends_many
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.source_reachability import SourceReachability, is_transport_failure
from mirror_core.kafka.wire_client import WireClient, is_retriable
from mirror_core.model.lane_status import (
    HALTED,
    RETIRED,
    RETRYING,
    STALLED,
    LaneHealth,
    PersistedLaneState,
    classify_failure,
)
from mirror_core.model.planner import NamingPolicy, TopicPattern
from mirror_core.model.preflight_rules import is_internal_topic
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore, checkpoint_key, checkpoint_partition
from mirror_core.state.lane_control import persist_lane_state
from mirror_core.state.lane_health_records import LaneHealthWriter, health_refresh_s, live_health, plan_health_writes
from mirror_core.state.leases import (
    Lease,
    LeaseStore,
    compat_records_wanted,
    lease_based_daemon_seen,
    member_lane,
    now_ms,
)

log = logging.getLogger("shoal.daemon")
REPAIRABLE_REJECTIONS = ("MESSAGE_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_TIMESTAMP")  # config sync may fix
DELETION_SIGNS = ("UnknownTopicOrPartition", "UnknownTopicId", "UNKNOWN_TOPIC", "InconsistentTopicId")
DELETION_CONFIRM_S = 1.0  # a source topic must be missing from metadata twice, this far apart, to count as deleted
GROUP_UNJOINED_SESSIONS = 3  # subscribed this many session timeouts without an assignment: the group did not form
DEFAULT_GROUP_SESSION_MS = 45_000  # the session timeout when the pipeline sets none (both protocols' default)
REJOIN_BACKOFF_S = (1.0, 60.0)  # a membership whose thread died is rebuilt after 1 s, doubling up to 60 s
OPEN_BATCH_MIN_LANES = 4  # fewer lanes opening together look their coordinators and epoch ends up alone
OPEN_LOOKUP_TIMEOUT_S = 2.0  # a batched look-up of a lane opening (coordinators, epoch ends) holds the main thread
# the standing round's and the openings' books audited, and the fence walk: this often, whatever the rescan
# interval. They are nets for a bug in the books kept by events (a drift is repaired and logged), each a walk of
# every held lane: on the rescan cadence (10 s by default) they were most of what an idle round cost per held lane
# (issue #18), though nothing about discovering topics makes a drift likelier or its repair more urgent.
AUDIT_MAX_S = 30.0
# every lane's health compared and its retention position checked, as a check of the events that keep them
# (_publish_due_states): this often
HEALTH_WALK_S = AUDIT_MAX_S
FENCED_BACKOFF_CAP_S = 300.0  # a lane fenced out of this process is retried after at most this (see _fenced_out)
PREFLIGHT_WORKERS = 4  # target preparations (preflights) of new topics run this many at a time



class ForcedShutdown(BaseException):
    """Raised on the main thread when a SIGTERM's grace period ran out (see :func:`run_daemon`). A BaseException,
    like KeyboardInterrupt, so the daemon's "log and retry" handlers do not swallow it."""


@dataclass
class LaneState:
    topic: str
    partition: int
    target_topic: str
    lane: str
    session: LaneSession | None = None
    fetcher: RawBatchFetcher | None = None  # at the session's committed position; dropped with the session
    health: LaneHealth = field(default_factory=LaneHealth)  # what the user sees (lane_status); halted: not reopened
    retry_at: float = 0.0
    failures: int = 0
    start: int | None = None  # where a lane without checkpoint starts (new_partitions), fixed at first sight
    fetch_failures: int = 0
    last_stable: int | None = None  # the source partition's last stable offset at the last fetch
    repaired_at: int | None = None  # source offset of the rejected batch a config sync last repaired
    shown_lag: int | None = None  # the lag gauge's value for the lane (None: not set by this process, or removed)
    # the lane's halt is stored in its checkpoint (we wrote it, or read it there): from then on a checkpoint of the
    # lane without a halt can only be the operator's resume (no clock is compared: machines' clocks differ)
    halt_stored: bool = False
    # bumped whenever the lane is dropped: work a worker began before (an open, a fence renewal, a copy) finds a
    # different number when it returns, and its result (a session, a fetcher, an error) is not this lane's any more
    generation: int = 0

    def reset(self) -> None:
        """Forget the open session and fetch position: the next round reopens the lane (fencing any older writer
        of it, aborting our open transaction) and resumes from the committed checkpoint."""
        self.session = None
        self.fetcher = None


@dataclass
class DaemonStatus:
    lanes_held: list[str] = field(default_factory=list)
    halted: dict[str, str] = field(default_factory=dict)


class ShallowMirrorDaemon:
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
        self._compat_writing = False  # lease_compat records are being written (logged when that changes)
        self._compat_records_until = 0  # wall-clock ms our last compat lease records expire (0: none written)
        self._member_heartbeat = False  # our compat membership heartbeat was written and not yet tombstoned
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
        # link at start (_size_for_link)
        self._fetch_sizes = (config.fetch_max_bytes, config.partition_fetch_max_bytes)

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
        with WireClient.for_cluster(cfg.source) as source, WireClient.for_cluster(cfg.target) as target:
            self.source, self.target = source, target
            self.store = CheckpointStore(cfg.target, target, topic=cfg.checkpoint_topic)
            self.store.ensure_topic()
            self._refuse_checkpoints_elsewhere()
            self.leases = LeaseStore(self.store, cfg.target.confluent())
            self.health_records = LaneHealthWriter(self.leases.producer,
                                                   refresh_s=health_refresh_s(cfg.lease_ttl_s / 3))
            self._size_for_link()
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

    def _size_for_link(self) -> None:
        """``link_mbps`` declared: measure each source broker's round trip once and size a round so it keeps that
        link busy (one request per broker per round, one round in flight: preflight_rules.round_bytes_for_link).
        A partition may fill its request alone (the only busy lane; rotation keeps the others from starving).
        Measuring is best effort: when no broker answers the probe, the configured sizes stay."""
        from mirror_core.kafka.round_trips import measure_links
        from mirror_core.model.preflight_rules import round_bytes_for_link

        cfg = self.config
        if cfg.link_mbps is None:
            return
        try:
            rtts = [link.rtt_s for link in measure_links(cfg.source, timeout_s=10.0) if link.rtt_s is not None]
        except MirrorError as exc:
            event("link_not_measured", logging.WARNING, error=str(exc))
            return
        if not rtts:
            event("link_not_measured", logging.WARNING, error="no source broker answered the round-trip probe")
            return
        rtt = max(rtts)
        request = round_bytes_for_link(link_bytes_per_s=cfg.link_mbps * 1e6, rtt_s=rtt, floor=cfg.fetch_max_bytes)
        partition = max(cfg.partition_fetch_max_bytes, request)
        self._fetch_sizes = (request, partition)
        event("sized_for_link", link_mb_s=cfg.link_mbps, rtt_ms=round(rtt * 1000, 1), fetch_max_bytes=request,
              partition_fetch_max_bytes=partition)

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

    # ---- topics and lanes --------------------------------------------------------------------------------------
    def _rescan(self) -> None:
        """New topics and partitions get their lanes (their targets prepared first); every
        ``config_sync_interval_s`` the known topics' configs are synced. The source's Metadata is decoded only down
        to partition counts (:mod:`mirror_core.kafka.topic_counts`) and the lanes known per topic are kept between
        rescans
        (:meth:`_lanes_per_topic`): a rescan that finds nothing new costs per topic of the source, not per lane."""
        import kafka.errors as errors

        from mirror_core.kafka.topic_counts import topic_answers

        answer = topic_answers(self.source)
        topics = answer.counts
        now = time.monotonic()
        sync_configs = now >= self._next_config_sync
        if sync_configs:
            self._next_config_sync = now + self.config.config_sync_interval_s
        known = self._lanes_per_topic()
        unprepared = []  # (topic, target topic, partitions) whose target is prepared (preflight) now
        in_step = []  # (topic, target topic) with every partition's lane: their configs are synced when due
        for topic, partitions in sorted(topics.items()):
            if not self._selected(topic):
                continue
            target_topic = self.naming.target_for(topic)
            have = known.get(topic, frozenset())
            # in step when partitions 0..n-1 all have lanes: a count alone is fooled by lanes of partitions past n
            # (adopted from a deleted incarnation's halted checkpoints, or a re-creation with fewer partitions)
            if len(have) >= partitions and have.issuperset(range(partitions)):
                in_step.append((topic, target_topic))
                continue
            unprepared.append((topic, target_topic, partitions))
        if sync_configs:
            self._sync_configs(in_step)
        prepared, unexpected = self._prepare_targets(unprepared)
        discovered = []
        for topic, target_topic, partitions in prepared:
            for p in range(partitions):
                lane = default_lane(target_topic, p)
                if lane not in self.lanes:
                    self.lanes[lane] = state = LaneState(topic, p, target_topic, lane, health=self._new_health())
                    discovered.append(state)
                    event("lane_discovered", topic=topic, partition=p, lane=lane)
        if discovered and self.config.new_partitions == "latest":
            self._fix_latest_starts(discovered)
        if self.membership is not None:  # the names Shoal's selection chose, never a broker-side regex
            # a topic answered with an error other than "unknown" (leader not available on an older broker, not
            # authorized for a moment, being created) is not gone: unsubscribing it would revoke its partitions
            unknown = errors.UnknownTopicOrPartitionError.errno
            listed = topics.keys() | {t for t, code in answer.errors.items() if code != unknown}
            self._group_topics = sorted(topic for topic in self._lanes_per_topic() if topic in listed)
            self.membership.subscribe(self._group_topics)
        if unexpected is not None:  # the rescan fails (logged, retried) after the topics that passed got lanes
            raise unexpected

    def _lanes_per_topic(self) -> dict[str, set[int]]:
        """Source topic → the partitions it has lanes for (held or not). Lanes are only ever added to
        ``self.lanes`` (a dict keeps its insertion order), so the answer is kept and extended by the lanes added
        since it was made — the walk of every lane happens once, not once per rescan."""
        book, seen = self._topic_lanes
        lanes = self.lanes
        if seen != len(lanes):
            for state in itertools.islice(lanes.values(), seen, None):
                book.setdefault(state.topic, set()).add(state.partition)
            self._topic_lanes = (book, len(lanes))
        return book

    def _fix_latest_starts(self, states: list[LaneState]) -> None:
        """``new_partitions: latest``: a partition without checkpoint starts at its last stable offset *at first
        sight* — fixed here, when its lane is discovered, not when the lane first opens, which may be much later (the
        target down, the group slow to assign, a fence refused, an older daemon's lease) and would skip, recorded
        nowhere, what the partition received in between. A lane with a checkpoint resumes there and never uses it;
        the start is stored as the lane's first checkpoint at its open (:meth:`_open`). One ListOffsets per source
        leader; if it fails, the start is fixed at the open, as before, and the event says so."""
        from mirror_core.kafka.list_offsets import lookup_offsets

        try:
            found = lookup_offsets(self.source, [(s.topic, s.partition) for s in states], "last_stable")
        except (MirrorError, Errors.KafkaError, OSError) as exc:  # the open fixes it then, as before
            event("start_lookup_failed", logging.WARNING, lanes=len(states), first=states[0].lane,
                  error=f"{type(exc).__name__}: {exc}", note="new_partitions latest: the start is fixed at the open")
            return
        for state in states:
            if state.start is None:
                state.start = found.get((state.topic, state.partition))

    def _sync_configs(self, pairs: list[tuple[str, str]]) -> None:
        """Bring each target topic's mirrored configs (retention, cleanup policy, compaction, size and timestamp
        bounds: :mod:`mirror_core.kafka.topic_config_sync`) in step with its source topic's — all of ``pairs``
        (topic, target topic), on the config-sync watch's thread (:mod:`mirror_core.daemon.config_sync`): the
        rounds never wait for it. A topic's failure is logged and counted, naming it; the next sync tries again."""
        self.config_sync.submit(pairs)

    def _selected(self, topic: str) -> bool:
        if is_internal_topic(topic) and topic not in self.include.named:
            return False
        return self.include.matches(topic) and not (self.exclude and self.exclude.matches(topic))

    def _prepare_targets(self, unprepared: list[tuple[str, str, int]]
                         ) -> tuple[list[tuple[str, str, int]], BaseException | None]:
        """Prepare the target of every topic in ``unprepared`` (:meth:`_prepare_target`); returns those whose
        preflight passed, in the given order, and the first unexpected error (not a refusal), if any. The
        target's topics are listed once for all of them, and the preflights (several admin round trips each,
        mostly waiting) run ``PREFLIGHT_WORKERS`` at a time: a daemon starting on 40 topics paid 40 target topic
        lists and 40 preflights one after the other. Each topic keeps
        its own checks and its own ``preflight_refused`` event naming it."""
        if not unprepared:
            return [], None
        from concurrent.futures import ThreadPoolExecutor

        from mirror_core.kafka.topics import TopicAdmin

        admin = TopicAdmin(self.config.target)
        existing = admin.list_topics()
        with ThreadPoolExecutor(max_workers=min(PREFLIGHT_WORKERS, len(unprepared)),
                                thread_name_prefix="shoal-preflight") as pool:
            futures = [pool.submit(self._prepare_target, topic, target_topic, partitions,
                                   existing.get(target_topic), admin)
                       for topic, target_topic, partitions in unprepared]
        passed, unexpected = [], None
        for (topic, target_topic, partitions), future in zip(unprepared, futures, strict=True):
            exc = future.exception()
            if exc is None:
                passed.append((topic, target_topic, partitions))
            elif isinstance(exc, MirrorError):
                self.metrics.errors.labels("preflight").inc()
                event("preflight_refused", logging.ERROR, topic=topic, target_topic=target_topic, error=exc)
            else:  # each named here: the rescan's own failure event carries only the first one
                event("preflight_failed", logging.WARNING, topic=topic, target_topic=target_topic,
                      error=f"{type(exc).__name__}: {exc}", note="no lanes for this topic yet; retried next rescan")
                unexpected = exc if unexpected is None else unexpected
        return passed, unexpected

    def _prepare_target(self, topic: str, target_topic: str, partitions: int, existing: int | None,
                        admin) -> None:
        """Add partitions the source gained to the target topic (``existing``: its partition count as listed by
        the caller, None: missing), then the preflight of a copy, which creates a missing target topic."""
        if existing is not None and existing < partitions:
            admin.add_partitions(target_topic, partitions)
            event("partitions_added", target_topic=target_topic, partitions=partitions, were=existing)
        report = run_preflight(self.config.source, self.config.target, topic, target_topic=target_topic)
        report.raise_if_refused()
        if report.created:
            event("target_created", topic=topic, target_topic=target_topic, partitions=partitions)

    def _eligible(self) -> list[str]:
        """The lanes this daemon may hold: not halted or retired (here or in their checkpoint: a halt persisted by
        any daemon is followed, an operator's resume too) and owned by the daemon (a checkpoint a backfill or copy
        claimed is not). Derived from every checkpoint of the pipeline — recomputed only when something it depends
        on can have changed: the checkpoint topic's content (a handoff, a newer owner, a halt or resume written by
        anyone, CheckpointStore.content_version), the lanes known, a lane halted here; otherwise the last answer
        stands (a group round every few seconds must not decode 2,000 unchanged checkpoints)."""
        self.store.refresh()
        key = (self.store.content_version(), len(self.lanes), self._halts)
        if self._eligible_seen is not None and self._eligible_seen[0] == key:
            return list(self._eligible_seen[1])
        checkpoints = self.store.read_all(self.config.pipeline, whole_maps=False, refresh=False)
        self._adopt_stopped_lanes(checkpoints)
        out = []
        for lane, state in self.lanes.items():
            cp = checkpoints.get((self.config.pipeline, state.topic, state.partition))
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

    def _new_health(self) -> LaneHealth:
        return LaneHealth(stall_after_s=self.config.stall_after_s)

    def _publish_lane_states(self) -> None:
        """Show every lane's health in metrics and ``/readyz`` — when some lane's health changed (or a lane came
        or went) since the last time: the full walk (every lane's state refreshed and compared), on the group
        round's recomputation and as the check of :meth:`_publish_due_states` every ``HEALTH_WALK_S``."""
        now = now_ms()
        health = {}
        for lane, state in self.lanes.items():
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
            at = health.since_ms + int(health.stall_after_s * 1000)
            if self._stall_at.get(lane) != at:
                self._stall_at[lane] = at
                heapq.heappush(self._stall_times, (at, lane))
                # a lane failing anew after recovering leaves its superseded due time in the heap until that time
                # comes (stall_after_s later): rebuilt from the live ones when those are most of it, so the heap
                # stays bounded by the lanes, not by the failure rate times stall_after_s
                if len(self._stall_times) > 2 * len(self._stall_at) + 64:
                    self._stall_times = [(due, name) for name, due in self._stall_at.items()]
                    heapq.heapify(self._stall_times)

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

    # ---- membership through the consumer group (mirror_core.daemon.membership) ---------------------------------
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
        if closed and self._compat_records_live():
            self._housekeeping("leases", lambda: self._release_own_leases(closed))
        # likewise our health records of the closed lanes (keyed per writer, so a late clear could not erase the next
        # holder's record either; cleared here so readers see none of ours once the partition is given back)
        if closed and self._health_written:
            self._housekeeping("health_records", lambda: self._write_health_records(now_ms()))
        self.membership.released(revoking, as_of=generation)
        self.metrics.lanes.set(len(self.held))
        self.status.lanes_held = sorted(self.held)

    def _deleted_source_topics(self, topics: set[str]) -> set[str]:
        """Of ``topics``, those confirmed deleted on the source: missing from metadata twice, DELETION_CONFIRM_S
        apart — one look-up (and at most one wait) for all of them, not one per lane."""
        gone = self._topics_missing_on_source(topics)
        if gone:
            time.sleep(DELETION_CONFIRM_S)
            gone &= self._topics_missing_on_source(gone)
        return gone

    def _topics_missing_on_source(self, topics: set[str]) -> set[str]:
        """Of ``topics``, those the source's metadata does not know (one request; an error: none)."""
        import kafka.errors as errors

        if not topics:
            return set()
        try:
            meta = self.source.metadata(sorted(topics))
        except Exception:  # noqa: BLE001 - cannot tell: treat as present (the fetch path still detects it)
            return set()
        return {t for t in topics if meta.get(t) is None
                or meta[t].error_code == errors.UnknownTopicOrPartitionError.errno}

    def _release_own_leases(self, lanes: list[str], records: dict[str, Lease] | None = None) -> None:
        """Release our lease records of ``lanes`` — only those still ours at write time, as far as a log without
        conditional writes allows: the record read is ours and not expired (an older daemon writes a lane's lease
        only once ours has expired), and the group still has the partition with this process (assigned, possibly
        being revoked: no other group daemon writes the lane's record before the revocation completes). A lane the
        group already moved (a lost assignment, a revocation that timed out) keeps our record until it expires:
        its next holder may have written its own record since, which a release would erase."""
        if records is None:
            records = self.leases.read(self.config.pipeline)
        ours = self.membership.view().assigned
        limit = now_ms() + 1000  # a record about to expire may be taken over before our release lands
        release = []
        for lane in lanes:
            record, state = records.get(lane), self.lanes.get(lane)
            if record is None or record.holder != self.worker_id or record.expires_ms <= limit:
                continue
            if state is None or (state.topic, state.partition) not in ours:
                continue
            release.append(Lease(self.config.pipeline, lane, self.worker_id, 0, group=True))
        self.leases.write_many(release)

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
        records, members = self.leases.read_with_members(pipeline)
        blocked = {lane: lease.holder for lane, lease in records.items() if lease.blocks_group_daemon(me, now)}
        fenced = self._fenced_out(self.membership.generation)
        # what decides the held set, as of the last time it was applied: unchanged (an idle daemon's usual group
        # round), nothing to apply — compared in C (list, frozenset, dict and set equality), no walk of the lanes
        seen = (eligible, assigned, blocked, fenced, self._held_version)
        if seen != self._group_seen:
            self._hold_wanted(eligible, assigned, blocked, fenced, records)
            self._group_seen = (eligible, assigned, blocked, fenced, self._held_version)
        self._write_compat_records(lease_based_daemon_seen(records, members, me, now), now)
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
        if dropped and self._compat_records_live():
            self._release_own_leases(dropped, records)
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

    def _write_compat_records(self, old_daemon: str | None, now: int) -> None:
        """``lease_compat``: a lease record (marked ``group``) per held lane, in one batch (every record produced, one
        flush: not a round trip per lane) — always, never, or (auto) only while a lease-based daemon is seen."""
        wanted = compat_records_wanted(self.config.lease_compat, old_daemon)
        if wanted != self._compat_writing:
            self._compat_writing = wanted
            event("lease_compat_records", state="writing" if wanted else "stopped", mode=self.config.lease_compat,
                  lease_based_daemon=old_daemon or "-",
                  note="lease records for our lanes and a membership heartbeat, so a lease-based daemon keeps off "
                       "our lanes and counts us in its fair share" if wanted else
                       "no lease-based daemon seen: nothing written per lane; our last records expire by themselves")
        if not wanted:
            self._release_member_heartbeat()
            return
        expires = now + int(self.config.lease_ttl_s * 1000)
        pipeline, me = self.config.pipeline, self.worker_id
        # the heartbeat (first, so the lease-based daemon counts us even while we hold no lane: its fair share then
        # leaves lanes to us and it gives back what it holds beyond it — 18af6cc _maintain_leases)
        self.leases.write_many([Lease(pipeline, member_lane(me), me, expires, group=True)]
                               + [Lease(pipeline, lane, me, expires, group=True) for lane in sorted(self.held)])
        self._member_heartbeat = True
        self._compat_records_until = expires

    def _release_member_heartbeat(self) -> None:
        """Tombstone our compat membership heartbeat, if written (compat writing stopped, or leaving)."""
        if self._member_heartbeat:
            self.leases.release_member(self.config.pipeline, self.worker_id)
            self._member_heartbeat = False

    def _compat_records_live(self) -> bool:
        """Whether a compat lease record we wrote may still be live (then a lane we give up is released)."""
        return now_ms() < self._compat_records_until

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

    def _fenced_out(self, generation: int) -> set[str]:
        """Lanes not to re-acquire now: fenced while held (another process opened them with the lane's
        transactional.id) under this same membership generation. Our assignment may be stale — a member the broker
        expired but cut off from the coordinator still lists its old partitions — and re-adding the lane would fence
        the new holder back, and so on. Re-acquired once the assignment changes, or after a backoff doubling with
        each fencing in a row (from ``lease_ttl_s / 3`` up to FENCED_BACKOFF_CAP_S), so a rightful holder fenced
        by such a stale member gets its lane back."""
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
        _gen, count, _at = self._fenced.get(lane, (generation, 0, 0.0))
        count += 1
        delay = min(FENCED_BACKOFF_CAP_S, self.config.lease_ttl_s / 3 * 2 ** (count - 1))
        self._fenced[lane] = (generation, count, time.monotonic() + delay)
        event("lane_fenced_backoff", logging.WARNING, lane=lane, fencings=count, retry_in_s=round(delay, 1),
              note="another process opened this lane; not re-acquired until the group's assignment changes or the "
                   "backoff passes")

    def _leave_group(self) -> None:
        """Shutdown (the round in progress has committed): drop every lane, release our lease records (while the
        partitions are still ours: see _release_own_leases), leave."""
        lanes = sorted(self.held)
        for lane in lanes:
            self._close_lane(self.lanes[lane])
            self._drop(lane, "shutdown")
        if lanes and self._compat_records_live():
            try:
                self._release_own_leases(lanes)
            except Exception as exc:  # noqa: BLE001 - best effort: an unreleased lease just expires
                event("lease_release_failed", logging.WARNING, lanes=",".join(lanes), error=exc)
        if self._health_written:  # our lanes' health records: cleared (their next holders write their own)
            self._housekeeping("health_records", lambda: self._write_health_records(now_ms()))
        if self._member_heartbeat:  # a lease-based daemon stops counting us (else: until the heartbeat expires)
            self._housekeeping("leases", self._release_member_heartbeat)
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
            self.positions.forget((state.topic, state.partition))  # its retention is watched by its next holder
            if state.health.state in (RETRYING, STALLED):  # its health is its next holder's to tell: not turning
                state.health.succeeded()                   # ``stalled`` here (not ready) for a lane not copied here
                self._health_dirty.add(lane)
        event("lane_dropped", lane=lane, reason=why)

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
        outcomes = self.workers.run([(state.lane, _call(state.session.renew_fence_if_due)) for state in states],
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

    def _still_ours(self, state: LaneState, generation: int, session: LaneSession | None = None) -> bool:
        """Whether work a worker began for the lane (at ``generation``, with ``session``) is still this lane's:
        held, not dropped since (a drop, even followed by a new acquisition, bumps the generation) and, when a
        session is given, still the lane's session."""
        return state.lane in self.held and state.generation == generation and \
            (session is None or state.session is session)

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

    # ---- copying -----------------------------------------------------------------------------------------------
    # Where each step runs: the main thread fetches (one request per source broker), decides and keeps the books
    # (leases, health, metrics, events); a lane's own wire work — opening its session, writing and committing its
    # share, renewing its fence — runs on its worker (self.workers), the lanes side by side. The main thread touches
    # a lane's session only between worker batches, never a worker's clients.
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
            options=CopyOptions(max_inflight_bytes=cfg.commit_bytes),
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
            topic_id=session.source_topic_id, last_epoch=epoch)
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
            [(state.lane, _call(session.copy, start, state.fetcher.position, fetcher=FetchedOnce(fetched, start)))
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
        when the round was sent (monotonic).
        A lane that joins while a round is in flight is named in the next one (sent right after this). A lane
        with news that is not ready any more (dropped, backing off) had its position moved by the answer: it
        reopens at its committed checkpoint, never skipping the answer it did not copy."""
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
            state.health.succeeded()
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
        state.health.succeeded()
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

    def _place_failed_lane(self, state: LaneState, position: int | None) -> None:
        """A failed lane is behind — assessed by the next retention assessment — at the best position known, so a
        lane that cannot copy is never left out of the watch (DESIGN §3: retention must not delete unmirrored data
        unannounced): its committed position (kept while it is reset); else the one reported before; else, for a
        lane never opened here, its checkpoint as last read (no request: the target may be what fails), the start
        it chose, or — with none, starting at the earliest — the log start. A lane starting at the latest with no
        start chosen yet has nothing retention could take from it."""
        tp = (state.topic, state.partition)
        positions = self.positions
        if position is None and positions.position(tp) is None:
            try:
                cp = None if self.store is None else self.store.cached(self.config.pipeline, state.topic,
                                                                       state.partition)
            except Exception:  # noqa: BLE001 - undecodable (a newer Shoal's): that is the lane's own failure
                cp = None      # already; placed as if it had none, from where the lane would start
            position = cp.position if cp is not None else state.start
            if position is None:
                if self.config.new_partitions == "earliest":
                    positions.behind_from_log_start(tp)
                return
        positions.behind(tp, position)

    def _failed(self, state: LaneState, exc: BaseException, *, fetching: bool = False) -> None:
        """Classify a lane's error once (:func:`~mirror_core.model.lane_status.classify_failure`): fenced → drop; a
        deleted source topic → halt naming what was not copied, or retire; a rejection config sync can repair →
        repair and retry; not retriable → halt (persisted); a retriable source fetch error → retry the fetch
        soon, session kept; anything else → reopen the lane after a backoff (``retrying``, ``stalled`` once it
        lasts longer than ``stall_after_s``)."""
        if isinstance(exc, ProducerFencedError | OwnershipError | NotHandedOffError):
            self.metrics.errors.labels("fenced").inc()
            self._drop(state.lane, f"fenced: {exc}")
            self._note_fenced(state.lane)
            return
        retriable, reason = classify_failure(exc)
        if self._maybe_deleted(exc) and self._source_deleted(state):
            return
        if isinstance(exc, BatchRejectedError) and self._repaired_by_config_sync(state, exc):
            retriable = True
        if not retriable:
            self._halt(state, exc, reason)
            return
        self.metrics.errors.labels(reason if reason != "unknown" else type(exc).__name__).inc()
        position = state.session.position if state.session else None
        state.health.failed(reason, f"{type(exc).__name__}: {exc}", now_ms(), position=position)
        self._health_failed(state)
        self._place_failed_lane(state, position)
        if fetching and isinstance(exc, Errors.KafkaError) and is_retriable(type(exc)):
            state.fetch_failures += 1
            state.retry_at = time.monotonic() + min(5.0, 0.1 * 2 ** min(state.fetch_failures, 6))
            self.openings.wait(state.lane, state.retry_at)
            event("fetch_retry", logging.INFO if state.fetch_failures < 5 else logging.WARNING, topic=state.topic,
                  partition=state.partition, offset=state.fetcher.position if state.fetcher else None,
                  error=type(exc).__name__, attempt=state.fetch_failures, state=state.health.state)
        else:  # MirrorError, or transport trouble the wire library raised as is
            state.failures += 1
            state.reset()
            state.retry_at = time.monotonic() + min(30.0, 0.5 * 2 ** min(state.failures, 6))
            self.openings.wait(state.lane, state.retry_at)
            event("lane_error", logging.WARNING, topic=state.topic, partition=state.partition, offset=position,
                  error=f"{type(exc).__name__}: {exc}", retry_in_s=round(state.retry_at - time.monotonic(), 1),
                  state=state.health.state, attempt=state.health.attempts,
                  exc_info=not isinstance(exc, MirrorError | Errors.KafkaError))
        if not self._round_books:  # inside a round the round's end publishes (once, not once per failed lane);
            self._publish_due_states()  # elsewhere the lanes marked since (nothing per idle lane)

    def _halt(self, state: LaneState, exc: BaseException, reason: str, *, stopped: str = HALTED,
              range_end: int | None = None) -> None:
        """Stop the lane until an operator acts: state persisted with the checkpoint (so a restart does not
        reopen it), shown in metrics, /readyz and the log."""
        self.metrics.errors.labels(reason).inc()
        position = _first_known(state.session.position if state.session is not None else None,
                                getattr(exc, "expected_offset", None), getattr(exc, "position", None), state.start)
        if range_end is None:
            range_end = _first_known(getattr(exc, "log_start_offset", None), getattr(exc, "source_offset", None))
        persisted = PersistedLaneState(stopped, reason, str(exc), now_ms(), position, range_end)
        state.health.stop(persisted)
        self._health_dirty.add(state.lane)
        self._halts += 1
        self.openings.touch(state.lane)  # a halted lane stays out of the round (looked at: stopped, not opened)
        self.status.halted[state.lane] = str(exc)
        self._drop(state.lane, reason)
        saved = self._persist(state, persisted)
        state.halt_stored = saved  # not stored: the halt holds in this process only, and no checkpoint resumes it
        event("lane_halted" if stopped == HALTED else "lane_retired", logging.ERROR if stopped == HALTED
              else logging.WARNING, topic=state.topic, partition=state.partition, lane=state.lane, reason=reason,
              position=position, range_end=range_end, persisted=saved, error=exc)
        # published once per pass (_publish_pending_states), not once per halt

    def _publish_pending_states(self) -> None:
        """Once per pass of the loop: lanes halted during it, and any other lane whose health is due
        (:meth:`_publish_due_states`: nothing per idle lane) — also when no round ran (every lane backing off)."""
        self._publish_due_states()

    def _persist(self, state: LaneState, persisted: PersistedLaneState) -> bool:
        """Write the lane state into the lane's checkpoint; False (logged) when there is none or the write
        failed — the state then holds in this process only."""
        initial = None if persisted.position is None else Checkpoint(
            pipeline=self.config.pipeline, topic=state.topic, partition=state.partition, position=persisted.position,
            target_topic=state.target_topic, target_partition=state.partition, target_next=None,
            owner=DAEMON_OWNER, owner_epoch=1)
        try:
            return persist_lane_state(self.store, self.target, self.config.pipeline, state.topic, state.partition,
                                      persisted, transactional=self.config.mode == "exactly-once",
                                      initial=initial) is not None
        except Exception as exc:  # noqa: BLE001 - the halt stands in memory; the log says it was not stored
            event("lane_state_not_persisted", logging.WARNING, topic=state.topic, partition=state.partition,
                  error=f"{type(exc).__name__}: {exc}")
            return False

    @staticmethod
    def _maybe_deleted(exc: BaseException) -> bool:
        """Errors a deleted source topic shows up as (an unknown topic or topic id, as raised or inside a retry's
        give-up, or a topic id that is "now gone"); only these pay for the metadata look-ups that confirm it."""
        if isinstance(exc, TopicRecreatedError):
            return exc.new_id is None
        text = f"{type(exc).__name__} {exc}"
        return any(sign in text for sign in DELETION_SIGNS)

    def _source_deleted(self, state: LaneState, *, confirmed: bool = False) -> bool:
        """Confirm a source topic deletion (missing from fresh metadata twice, ``DELETION_CONFIRM_S`` apart; or
        ``confirmed`` already, for a whole topic at once), then retire the lane when it had copied everything it
        saw, else halt naming the range never copied."""
        if not confirmed and not (self._source_topic_missing(state.topic) and
                                  (time.sleep(DELETION_CONFIRM_S) or self._source_topic_missing(state.topic))):
            return False
        position = state.session.position if state.session is not None else None
        if position is None:
            position = state.start if state.start is not None else 0
        seen_end = state.last_stable if state.last_stable is not None else position
        exc = SourceTopicDeletedError(self.config.source.name, state.topic, state.partition, position,
                                      max(seen_end, position))
        if seen_end <= position:
            self._halt(state, f"source topic {state.topic!r} was deleted after the lane had copied everything it saw "
                              f"(up to offset {position}); the lane is retired", "source_deleted", stopped=RETIRED,
                       range_end=position)
        else:
            self._halt(state, exc, "source_deleted", range_end=seen_end)
        return True

    def _source_topic_missing(self, topic: str) -> bool:
        import kafka.errors as errors

        try:
            meta = self.source.metadata([topic]).get(topic)
        except Exception:  # noqa: BLE001 - cannot tell: not a confirmation
            return False
        return meta is None or meta.error_code == errors.UnknownTopicOrPartitionError.errno

    def _repaired_by_config_sync(self, state: LaneState, exc: BatchRejectedError) -> bool:
        """A refusal topic config sync can fix (the target's size or timestamp bounds below the source's): sync
        now and retry. Once per rejected batch: the same batch refused again after a repair halts."""
        if exc.error not in REPAIRABLE_REJECTIONS or state.repaired_at == exc.source_offset:
            return False
        from mirror_core.kafka.topic_config_sync import sync_topic_configs

        try:  # not undone by a batched sync running on the watch's thread (mirror_core.daemon.config_sync)
            with self.config_sync.repairing(state.target_topic) as synced_meanwhile:
                changes = sync_topic_configs(self.config.source, self.config.target, state.topic, state.target_topic)
        except MirrorError as sync_error:
            event("config_repair_failed", logging.WARNING, topic=state.topic, target_topic=state.target_topic,
                  error=sync_error)
            return False
        if not changes and not synced_meanwhile:
            return False
        # no changes left but the periodic sync (its own thread) changed the topic since a repair last looked: it
        # may have repaired it after the refusal — retried once too (the same batch refused again halts)
        state.repaired_at = exc.source_offset
        self.metrics.config_changes.labels(state.target_topic).inc(len(changes))
        event("config_repaired", logging.WARNING, topic=state.topic, partition=state.partition,
              target_topic=state.target_topic, rejected=exc.error, source_offset=exc.source_offset,
              changes=f"'{'; '.join(map(str, changes)) or 'made by the periodic config sync'}'")
        return True


def _is_cluster_error(exc: BaseException) -> bool:
    """Whether a checkpoint read failed because of the cluster (a broker's error, unavailable, unreachable) rather
    than because of what a lane's checkpoint holds: the former would fail each lane's own read alike."""
    return isinstance(exc, Errors.KafkaError | OSError | TimeoutError) or bool(getattr(exc, "retriable", False)) \
        or is_transport_failure(exc)


def _call(fn, *args, **kwargs):
    """A lane worker task calling ``fn(*args, **kwargs)`` (it does not need the worker's clients)."""
    return lambda _clients: fn(*args, **kwargs)


def _first_known(*values):
    return next((v for v in values if v is not None), None)


def _epoch_end_of(epoch_ends: dict[tuple[str, int, int], EpochEnd], checkpoint: Checkpoint | None) -> EpochEnd | None:
    """The batched answer for exactly this checkpoint's position epoch, if one was found."""
    if checkpoint is None or checkpoint.position_epoch is None:
        return None
    return epoch_ends.get((checkpoint.topic, checkpoint.partition, checkpoint.position_epoch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirror_core.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="pipeline YAML file")
    parser.add_argument("--worker-id", help="this process's name in the group (its client.id) and in lease records "
                                            "(default: random)")
    parser.add_argument("--thread-sample", metavar="PATH",
                        help="diagnostics: write CPU per thread name and busy stacks to PATH ({pid}: the process "
                             "id) every few seconds and at exit (mirror_core.daemon.thread_sampler)")
    args = parser.parse_args(argv)
    return run_daemon(args.config, args.worker_id, thread_sample=args.thread_sample)


def run_daemon(config_path, worker_id: str | None = None, *, thread_sample: str | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # the wire library narrates every connection at INFO
    try:
        config = load_pipeline_config(config_path)
        daemon = ShallowMirrorDaemon(config, worker_id=worker_id)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = serve_metrics(daemon.metrics, config.metrics_port, host=config.metrics_host) if config.metrics_port \
            else None
    except OSError as exc:  # before anything was joined, opened or installed
        print(f"shoal mirror: error: pipeline {config.pipeline!r}: cannot serve /metrics on "
              f"{config.metrics_host}:{config.metrics_port} ({exc.strerror or exc}); another process (a second daemon "
              "on this machine?) has that port: give this one another metrics_port, or 0 for none", file=sys.stderr)
        return 2
    stop = threading.Event()
    sampler = thread_sampler.start(thread_sample) if thread_sample else None  # diagnostics only

    def on_stop(*_):
        if not stop.is_set():  # the first signal: finish the round, commit, release; the alarm bounds that
            stop.set()
            signal.alarm(max(1, math.ceil(config.shutdown_grace_s)))

    def on_alarm(*_):
        raise ForcedShutdown()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        daemon.run(stop)
    except ForcedShutdown:
        print(f"shoal mirror: stopped after the {config.shutdown_grace_s:g}s grace period without finishing the "
              "round in progress; nothing is lost (the next start resumes at the last committed checkpoints)",
              file=sys.stderr)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
        if server is not None:
            server.shutdown()
        if sampler is not None:
            sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
