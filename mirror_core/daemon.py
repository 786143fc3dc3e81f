"""The continuous shallow mirror daemon: keeps a pipeline's target current, lane by lane, exactly once.

    shoal mirror run --config pipeline.yaml          (or: python -m mirror_core.daemon --config pipeline.yaml)

Each loop: re-evaluate the topic regex now and then (new topics get their target topic through the same
preflight as a copy, partitions added on the source are added on the target), keep leases on a fair share of the
eligible lanes, and copy whatever each held lane's source partition has up to its last stable offset, committing
data and checkpoint together. A lane is eligible when its checkpoint belongs to the daemon (handed off by a
backfill) or when it has none yet (a new partition, mirrored from its beginning); a lane a backfill still owns is
left alone until it is handed off.

Failure behaviour: a fenced lane (another daemon took it) or a handed-over one is dropped; a recreated source topic
halts its partitions with a clear status and is not retried; an unreachable target or source closes the lane's
session and retries with backoff, resuming from the last committed checkpoint (nothing is lost, memory stays at
one fetch plus one flush per step); a failed rescan or lease round is logged and retried on the next round, never
the end of the process. Steps are bounded (``MAX_STEP_OFFSETS``) and leases are renewed between steps, so a backlog
never lets a lease lapse. Every daemon also renews a membership heartbeat, so a newcomer that holds no lane yet is
counted and the others give lanes back down to a fair share. SIGTERM finishes the step in progress (it ends with
a commit), releases the leases and exits; SIGKILL loses nothing, because every committed step carries its
checkpoint.

Known gap: each lane fetches its own partition (no multi-partition Fetch per broker yet).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from mirror_core.checkpoint import CheckpointStore
from mirror_core.checkpointed import (
    CheckpointedCopier,
    CommitPolicy,
    DeliveryMode,
    LaneSession,
    OwnershipError,
    default_lane,
)
from mirror_core.copier import CopyOptions
from mirror_core.daemon_config import PipelineConfig, load_pipeline_config
from mirror_core.daemon_metrics import DaemonMetrics, serve_metrics
from mirror_core.errors import MirrorError, ProducerFencedError, TopicRecreatedError
from mirror_core.fetcher import list_offsets
from mirror_core.handoff import DAEMON_OWNER, new_worker_id
from mirror_core.kafka_wire import WireClient
from mirror_core.leases import Lease, LeaseStore, now_ms
from mirror_core.planner import NamingPolicy, TopicPattern
from mirror_core.preflight import run_preflight
from mirror_core.preflight_rules import is_internal_topic

log = logging.getLogger("shoal.daemon")

MAX_STEP_OFFSETS = 50_000  # source offsets one lane copies per step at most (see _step)


def event(name: str, level: int = logging.INFO, *, exc_info: bool = False, **fields) -> None:
    """One structured log line: ``event=<name> key=value ...`` (topic, partition and offsets wherever they apply)."""
    log.log(level, "event=%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()), exc_info=exc_info)


@dataclass
class LaneState:
    topic: str
    partition: int
    target_topic: str
    lane: str
    session: LaneSession | None = None
    halted: str | None = None  # why the lane stopped for good (recreated topic)
    retry_at: float = 0.0
    failures: int = 0
    start: int | None = None  # where a lane without checkpoint starts (new_partitions), fixed at first sight


@dataclass
class DaemonStatus:
    lanes_held: list[str] = field(default_factory=list)
    halted: dict[str, str] = field(default_factory=dict)


class ShallowMirrorDaemon:
    """Mirrors a pipeline continuously. Invariant: a lane is written only through a session opened with its
    transactional.id after its lease was taken, so at most one live writer per lane (the broker fences the rest)."""

    def __init__(self, config: PipelineConfig, *, worker_id: str | None = None, metrics: DaemonMetrics | None = None):
        self.config = config
        self.worker_id = worker_id or new_worker_id()
        self.metrics = metrics or DaemonMetrics()
        self.naming = NamingPolicy.parse(config.naming)
        self.include = TopicPattern(config.include, "include")
        self.exclude = TopicPattern(config.exclude, "exclude") if config.exclude else None
        self.lanes: dict[str, LaneState] = {}
        self.held: set[str] = set()
        self.status = DaemonStatus()
        self._next_rescan = 0.0
        self._next_lease = 0.0

    # ---- main loop ---------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        cfg = self.config
        event("start", pipeline=cfg.pipeline, worker=self.worker_id, include=cfg.include, mode=cfg.mode)
        with WireClient.for_cluster(cfg.source) as source, WireClient.for_cluster(cfg.target) as target:
            self.source, self.target = source, target
            self.store = CheckpointStore(cfg.target, target)
            self.store.ensure_topic()
            self.leases = LeaseStore(self.store, cfg.target.confluent())
            try:
                while not stop.is_set():
                    self.metrics.last_loop = time.monotonic()
                    now = time.monotonic()
                    if now >= self._next_rescan:
                        self._next_rescan = now + cfg.rescan_interval_s
                        self._housekeeping("rescan", self._rescan)
                    self._leases_if_due()
                    copied = 0
                    for lane in sorted(self.held):
                        if stop.is_set():
                            break
                        if lane in self.held:  # a lease round between steps may have dropped it
                            copied += self._step(self.lanes[lane])
                        # renew between steps, not once per pass: many lanes (or slow session opens) must not
                        # let our leases lapse, or another daemon takes them and the two keep fencing each other
                        self._leases_if_due()
                    if not copied:
                        stop.wait(cfg.poll_interval_ms / 1000)
            finally:
                self._shutdown()
        event("stop", pipeline=cfg.pipeline, worker=self.worker_id)

    def _leases_if_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_lease:
            self._next_lease = now + self.config.lease_ttl_s / 3
            self._housekeeping("leases", self._maintain_leases)

    def _housekeeping(self, what: str, action) -> None:
        """Run a rescan or a lease round; a failure (e.g. the target restarting) is logged and retried on the next
        round instead of ending the daemon. Lanes keep copying meanwhile; their writers are fenced by the broker if
        a lease lapses and another daemon takes over."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - a daemon outlives transient cluster trouble
            self.metrics.errors.labels(what).inc()
            event(f"{what}_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                  exc_info=not isinstance(exc, MirrorError))

    def _shutdown(self) -> None:
        for lane in sorted(self.held):
            try:
                self.leases.release(self.config.pipeline, lane, self.worker_id)
            except Exception as exc:  # noqa: BLE001 - best effort: an unreleased lease just expires
                event("lease_release_failed", logging.WARNING, lane=lane, error=exc)
        self.held.clear()
        try:
            self.leases.leave(self.config.pipeline, self.worker_id)
        except Exception as exc:  # noqa: BLE001
            event("membership_release_failed", logging.WARNING, error=exc)

    # ---- topics and lanes --------------------------------------------------------------------------------------
    def _rescan(self) -> None:
        from mirror_core.plan_inputs import list_topics

        topics = list_topics(self.source)
        for topic, partitions in sorted(topics.items()):
            if not self._selected(topic):
                continue
            target_topic = self.naming.target_for(topic)
            known = {s.partition for s in self.lanes.values() if s.topic == topic}
            if len(known) == partitions:
                continue
            try:
                self._prepare_target(topic, target_topic, partitions)
            except MirrorError as exc:
                self.metrics.errors.labels("preflight").inc()
                event("preflight_refused", logging.ERROR, topic=topic, target_topic=target_topic, error=exc)
                continue
            for p in range(partitions):
                lane = default_lane(target_topic, p)
                if lane not in self.lanes:
                    self.lanes[lane] = LaneState(topic, p, target_topic, lane)
                    event("lane_discovered", topic=topic, partition=p, lane=lane)

    def _selected(self, topic: str) -> bool:
        if is_internal_topic(topic) and topic not in self.include.named:
            return False
        return self.include.matches(topic) and not (self.exclude and self.exclude.matches(topic))

    def _prepare_target(self, topic: str, target_topic: str, partitions: int) -> None:
        from mirror_core.topics import TopicAdmin

        admin = TopicAdmin(self.config.target)
        existing = admin.list_topics().get(target_topic)
        if existing is not None and existing < partitions:
            admin.add_partitions(target_topic, partitions)
            event("partitions_added", target_topic=target_topic, partitions=partitions, were=existing)
        report = run_preflight(self.config.source, self.config.target, topic, target_topic=target_topic)
        report.raise_if_refused()
        if report.created:
            event("target_created", topic=topic, target_topic=target_topic, partitions=partitions)

    def _eligible(self) -> list[str]:
        checkpoints = self.store.read_all(self.config.pipeline)
        out = []
        for lane, state in self.lanes.items():
            if state.halted:
                continue
            cp = checkpoints.get((self.config.pipeline, state.topic, state.partition))
            if cp is None or cp.owner == DAEMON_OWNER:
                out.append(lane)
        return sorted(out)

    def _maintain_leases(self) -> None:
        pipeline, me, now = self.config.pipeline, self.worker_id, now_ms()
        leases, members = self.leases.read_with_members(pipeline)
        eligible = self._eligible()
        expires = now + int(self.config.lease_ttl_s * 1000)
        self.leases.heartbeat(pipeline, me, expires)  # so the others count us even while we hold no lane
        # live daemons: holders of unexpired leases and of unexpired membership heartbeats (a newcomer holds none)
        others = {lease.holder for lease in [*leases.values(), *members.values()] if lease.held_by_other(me, now)}
        share = math.ceil(len(eligible) / (len(others) + 1)) if eligible else 0
        for lane in sorted(self.held):  # renew ours, drop what someone else took over
            current = leases.get(lane)
            if current is not None and current.held_by_other(me, now) or lane not in eligible:
                self._drop(lane, "lease taken by another daemon" if lane in eligible else "not eligible")
                continue
            self.leases.write(Lease(pipeline, lane, me, expires))
        for lane in eligible:
            if len(self.held) >= share:
                break
            current = leases.get(lane)
            if lane in self.held or (current is not None and current.held_by_other(me, now)):
                continue
            self.leases.write(Lease(pipeline, lane, me, expires))
            self.held.add(lane)
            event("lane_acquired", lane=lane, worker=me)
        while len(self.held) > share:  # give lanes back so newcomers get a fair share
            lane = max(self.held)
            self._drop(lane, "rebalance")
            self.leases.release(pipeline, lane, me)
        self.metrics.lanes.set(len(self.held))
        self.status.lanes_held = sorted(self.held)

    def _drop(self, lane: str, why: str) -> None:
        self.held.discard(lane)
        state = self.lanes.get(lane)
        if state is not None:
            state.session = None
            for gauge in (self.metrics.lag, self.metrics.position):  # another daemon reports this lane now
                with contextlib.suppress(KeyError):  # never set in this process
                    gauge.remove(state.topic, str(state.partition))
        event("lane_dropped", lane=lane, reason=why)

    # ---- copying -----------------------------------------------------------------------------------------------
    def _session(self, state: LaneState) -> LaneSession:
        if state.session is None:
            cfg = self.config
            cp = self.store.read(cfg.pipeline, state.topic, state.partition)
            epoch = cp.owner_epoch if cp is not None and cp.owner == DAEMON_OWNER else 1
            copier = CheckpointedCopier(
                self.source, self.target, self.store, pipeline=cfg.pipeline, mode=DeliveryMode(cfg.mode),
                owner=DAEMON_OWNER, owner_epoch=epoch,
                options=CopyOptions(max_inflight_bytes=cfg.commit_bytes),
                policy=CommitPolicy(cfg.commit_bytes, cfg.commit_interval_ms))
            state.session = copier.open_lane(state.topic, state.partition, state.target_topic, state.partition,
                                             lane=state.lane)
            event("lane_opened", topic=state.topic, partition=state.partition, lane=state.lane,
                  position=state.session.position)
        return state.session

    def _step(self, state: LaneState) -> int:
        """Copy what the lane's partition has up to its last stable offset; returns records copied."""
        if time.monotonic() < state.retry_at or state.halted:
            return 0
        labels = (state.topic, str(state.partition))
        try:
            session = self._session(state)
            end = list_offsets(self.source, state.topic, state.partition, "last_stable")
            start = session.position
            if start is None:  # no checkpoint yet: fix the start once, or "latest" would move with the data
                if state.start is None:
                    state.start = list_offsets(self.source, state.topic, state.partition,
                                               "earliest" if self.config.new_partitions == "earliest"
                                               else "last_stable")
                start = state.start
            self.metrics.lag.labels(*labels).set(max(0, end - start))
            if end <= start:
                return 0
            # a bounded step: a large backlog is copied over several steps, so leases are renewed, other lanes get
            # their turn and SIGTERM is served within one step (batches are copied whole: the next step resumes
            # from the committed checkpoint, wherever the last batch ended)
            result = session.copy(start, min(end, start + MAX_STEP_OFFSETS))
        except (ProducerFencedError, OwnershipError) as exc:
            self.metrics.errors.labels("fenced").inc()
            self._drop(state.lane, f"fenced: {exc}")
            return 0
        except TopicRecreatedError as exc:
            self.metrics.errors.labels("topic_recreated").inc()
            state.halted, state.session = str(exc), None
            self.status.halted[state.lane] = str(exc)
            self._drop(state.lane, "source topic recreated")
            event("lane_halted", logging.ERROR, topic=state.topic, partition=state.partition, error=exc)
            return 0
        except Exception as exc:  # noqa: BLE001 - MirrorError, or transport trouble the wire library raised as is
            state.failures += 1
            state.session = None  # reopen: aborts whatever was open, resumes from the committed checkpoint
            state.retry_at = time.monotonic() + min(30.0, 0.5 * 2 ** min(state.failures, 6))
            self.metrics.errors.labels(type(exc).__name__).inc()
            event("lane_error", logging.WARNING, topic=state.topic, partition=state.partition,
                  error=f"{type(exc).__name__}: {exc}", retry_in_s=round(state.retry_at - time.monotonic(), 1),
                  exc_info=not isinstance(exc, MirrorError))
            return 0
        state.failures = 0
        self.metrics.observe_copy(state.topic, state.partition, result, result.newest_timestamp_ms)
        self.metrics.position.labels(*labels).set(result.source_end)
        self.metrics.lag.labels(*labels).set(max(0, end - result.source_end))
        event("copied", topic=state.topic, partition=state.partition, source_start=result.source_start,
              source_end=result.source_end, target_start=result.first_target_offset,
              target_end=result.next_target_offset, records=result.records)
        return result.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirror_core.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="pipeline YAML file")
    parser.add_argument("--worker-id", help="this process's name in leases (default: random)")
    args = parser.parse_args(argv)
    return run_daemon(args.config, args.worker_id)


def run_daemon(config_path, worker_id: str | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # the wire library narrates every connection at INFO
    try:
        config = load_pipeline_config(config_path)
        daemon = ShallowMirrorDaemon(config, worker_id=worker_id)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = serve_metrics(daemon.metrics, config.metrics_port) if config.metrics_port else None
    try:
        daemon.run(stop)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
