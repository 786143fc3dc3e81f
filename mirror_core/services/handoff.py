"""Handoff from a backfill to the daemon, and the proof that the seam is clean.

Handoff: the lane's own transactional.id is opened first, which fences the backfill's writer (it can no longer
commit); only then is the checkpoint read, and it is rewritten with owner ``daemon`` and owner epoch + 1 inside a
transaction of that same id. The newer epoch makes any later backfill of the lane refuse to start
(:class:`~mirror_core.errors.OwnershipError`). A lane the daemon started itself (a new partition) is owned
by the daemon from its first checkpoint on; a backfill takes it over only while the daemon has copied nothing into
it (:meth:`~mirror_core.engine.lane_session.LaneSession._take_over_daemon_start`), and is refused with
:class:`~mirror_core.errors.DaemonOwnsLaneError` once it has.
The daemon then resumes at exactly the checkpoint position X. ``verify_seam`` proves per partition that the target is
contiguous across X: the source records around X, translated through the offset map, are the target records
around translate(X), one for one, in order, with equal content — no gap, no duplicate.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import DAEMON_OWNER, default_lane, lane_transactional_id
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore
from mirror_core.state.leases import now_ms


def hand_off(target: ClusterConfig, pipeline: str, topic: str, partitions: list[int], *,
             wait_for_daemon_s: float = 0.0, source: ClusterConfig | None = None) -> list[Checkpoint]:
    """Transfer each partition's lane to the daemon at its checkpoint position; optionally wait until a daemon
    holds every lane (the daemon group on ``source``, needed then, has the partitions assigned; or, during an
    upgrade, a lease-based daemon holds them by a live lease). Returns the handed-off checkpoints."""
    if wait_for_daemon_s > 0 and source is None:
        raise ConfigError(f"pipeline {pipeline!r}: waiting for the daemon needs the source cluster (the daemons' "
                          "group lives there)")
    handed: list[Checkpoint] = []
    with WireClient.for_cluster(target) as client:
        store = CheckpointStore(target, client)
        for partition in partitions:
            handed.append(_hand_off_partition(store, client, pipeline, topic, partition))
        if wait_for_daemon_s > 0:
            _wait_for_daemon(store, source, pipeline, handed_lanes(handed), wait_for_daemon_s)
    return handed


def handed_lanes(handed: list[Checkpoint]) -> dict[str, tuple[str, int]]:
    """Lane → source partition of handed-off checkpoints (what the wait looks for)."""
    return {default_lane(c.target_topic, c.target_partition): (c.topic, c.partition) for c in handed}


def _hand_off_partition(store: CheckpointStore, client: WireClient, pipeline: str, topic: str,
                        partition: int) -> Checkpoint:
    """Fence, then read, then write: the handed-off position is the backfill's last commit, never an older one.

    The first read only names the lane (a pipeline's source partition is bound to one target partition for good,
    so even a stale checkpoint names it). ``InitProducerId`` with the lane's transactional.id then fences the
    backfill's writer and decides every transaction it began: its last commit is final and nothing can follow it.
    Only the checkpoint read after that (past the LSO, :meth:`CheckpointStore.read_own`) is written back with
    owner ``daemon``, in a transaction of that same id. Reading before fencing would let a backfill commit land
    in between, be overwritten by the older position and be copied again by the daemon.
    """
    seen = store.read_own(pipeline, topic, partition)
    if seen is None:
        raise ConfigError(f"pipeline {pipeline!r} has no checkpoint for {topic}-{partition}: back-fill it "
                          "before handing it off")
    if seen.owner == DAEMON_OWNER:
        return seen
    lane = default_lane(seen.target_topic, seen.target_partition)
    writer = BatchWriter(client, transactional_id=lane_transactional_id(pipeline, lane))
    writer.init_producer_id()  # fences the backfill writer of this lane; its transactions are all decided now
    current = store.read_own(pipeline, topic, partition)
    lane_now = None if current is None else default_lane(current.target_topic, current.target_partition)
    if lane_now != lane:
        raise MirrorError(f"pipeline {pipeline!r} {topic}-{partition}: the checkpoint changed lanes during the "
                          f"handoff (was {lane}, now {lane_now or 'gone'}); nothing was handed off: check what else "
                          "writes this pipeline's checkpoints")
    if current.owner == DAEMON_OWNER:  # another handoff won the race
        return current
    updated = dataclasses.replace(current, owner=DAEMON_OWNER, owner_epoch=current.owner_epoch + 1,
                                  handoff_position=current.position, updated_ms=now_ms())
    writer.begin_transaction()
    writer.write([store.checkpoint_batch(updated)])
    writer.commit_transaction()
    return updated


def _wait_for_daemon(store: CheckpointStore, source: ClusterConfig, pipeline: str, lanes: dict[str, tuple[str, int]],
                     timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            missing, unreadable = lanes_without_daemon(store, source, pipeline, lanes), None
        except MirrorError as exc:  # the group could not be described: not "no daemon", keep looking
            missing, unreadable = sorted(lanes), exc
        if not missing:
            return
        if time.monotonic() > deadline:
            if unreadable is not None:
                error = MirrorError(f"pipeline {pipeline!r}: could not tell whether a daemon holds lanes "
                                    f"{', '.join(missing)} within {timeout_s:.0f}s: {unreadable}")
                error.retriable = True
                raise error
            stopped = stopped_lanes(store, pipeline, {lane: lanes[lane] for lane in missing})
            if stopped:
                raise MirrorError(f"pipeline {pipeline!r}: no daemon copies lanes {', '.join(missing)} after "
                                  f"{timeout_s:.0f}s: stopped in the checkpoint: "
                                  + "; ".join(f"{lane} {what}" for lane, what in stopped.items())
                                  + " — a daemon does not take a stopped lane; `shoal lanes resume` it")
            raise MirrorError(f"pipeline {pipeline!r}: no daemon took lanes {', '.join(missing)} within "
                              f"{timeout_s:.0f}s (no member of the daemon group shoal.{pipeline}.daemons on cluster "
                              f"{source.name!r} has their partitions assigned); is `shoal mirror run` running for "
                              "this pipeline?")
        time.sleep(0.5)


def lanes_without_daemon(store: CheckpointStore, source: ClusterConfig, pipeline: str,
                         lanes: dict[str, tuple[str, int]]) -> list[str]:
    """The ``lanes`` (lane → source partition) no daemon holds right now: not assigned to a member of the daemon
    group on ``source`` and not held by a live lease of a lease-based daemon (an upgrade). One look; the Airflow
    trigger polls this. Raises a retriable :class:`MirrorError` when the group cannot be described and live leases
    do not cover every lane — unknown is not "no daemon". A lane halted or retired in its checkpoint is never held:
    the group still assigns its partition to a member, but no daemon takes a stopped lane (see
    :func:`stopped_lanes`)."""
    from mirror_core.model.lane_holders import lanes_without_daemon as without
    from mirror_core.services.mirror_status import read_lane_holders

    holders, _group = read_lane_holders(source, store, pipeline, timeout_s=10.0)
    stopped = stopped_lanes(store, pipeline, lanes)
    missing = sorted(set(without(holders, lanes)) | set(stopped), key=list(lanes).index)
    if [lane for lane in missing if lane not in stopped] and holders.group is None:
        error = MirrorError(holders.group_error or f"pipeline {pipeline!r}: the daemon group could not be read")
        error.retriable = True
        raise error
    return missing


def stopped_lanes(store: CheckpointStore, pipeline: str, lanes: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Of ``lanes`` (lane → source partition), those halted or retired in their checkpoint → what the checkpoint
    says (state, reason, message): no daemon copies such a lane until it is resumed (``shoal lanes resume``)."""
    checkpoints = store.read_all(pipeline, whole_maps=False)
    out = {}
    for lane, (topic, partition) in lanes.items():
        cp = checkpoints.get((pipeline, topic, partition))
        stopped = getattr(cp, "lane_state", None) if cp is not None else None
        if stopped is not None:
            out[lane] = f"{stopped.state} ({stopped.reason}: {stopped.message})"
    return out


def daemon_missing_lanes(source: ClusterConfig, target: ClusterConfig, pipeline: str,
                         lanes: dict[str, tuple[str, int]]) -> list[str]:
    """:func:`lanes_without_daemon` with a client of its own."""
    with WireClient.for_cluster(target) as client:
        return lanes_without_daemon(CheckpointStore(target, client), source, pipeline, lanes)


@dataclass(frozen=True)
class SeamReport:
    topic: str
    partition: int
    handoff_position: int
    checked_source_records: int
    ok: bool
    problem: str | None = None


def verify_seam(source: ClusterConfig, target: ClusterConfig, pipeline: str, topic: str, partition: int, *,
                window: int = 500) -> SeamReport:
    """Compare the committed records within ``window`` offsets of the handoff position on both sides."""
    from mirror_core.kafka.verify import read_range

    with WireClient.for_cluster(target) as client:
        cp = CheckpointStore(target, client).read(pipeline, topic, partition)
    if cp is None or cp.handoff_position is None or cp.offset_map is None:
        raise ConfigError(f"pipeline {pipeline!r} {topic}-{partition} has not been handed off (no handoff position)")
    seam, omap = cp.handoff_position, cp.offset_map
    lo, hi = max(omap.start, seam - window), min(cp.position, seam + window)
    t_lo, t_hi = omap.translate(lo), omap.translate(hi)
    if t_lo is None or t_hi is None:
        return SeamReport(topic, partition, seam, 0, False, f"offsets [{lo}, {hi}) do not translate")
    src = read_range(source, topic, partition, lo, hi)
    tgt = read_range(target, cp.target_topic, cp.target_partition, t_lo, t_hi)
    problem = _first_seam_problem(src, tgt, omap)
    return SeamReport(topic, partition, seam, len(src), problem is None, problem)


def _first_seam_problem(src: list[tuple[int, tuple]], tgt: list[tuple[int, tuple]], omap) -> str | None:
    """Walk both sides in step; name the first record where they part: a duplicate (the target repeats the
    previous source record), a gap (the target already holds the next one), or a mismatch."""
    for i, (s_off, s_rec) in enumerate(src):
        if i >= len(tgt):
            return f"gap: source offset {s_off} and {len(src) - i - 1} later record(s) are missing on the target"
        t_off, t_rec = tgt[i]
        if omap.translate(s_off) == t_off and s_rec == t_rec:
            continue
        if i > 0 and t_rec == src[i - 1][1]:
            return f"duplicate: target offset {t_off} repeats source offset {src[i - 1][0]}"
        if i + 1 < len(src) and t_rec == src[i + 1][1]:
            return f"gap: source offset {s_off} is missing on the target (target offset {t_off} holds the next)"
        return f"mismatch at source offset {s_off}: target offset {t_off} holds a different record"
    if len(tgt) > len(src):
        return f"duplicate: the target holds {len(tgt) - len(src)} record(s) more than the source in the window"
    return None


