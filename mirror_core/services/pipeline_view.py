"""What the Shoal page shows of one pipeline, read from the clusters (issue #17: the page's domain logic, which
needs no Airflow): its lanes — checkpoint position, lag in offsets, bytes and seconds, who holds each lane, its state
with the reason and offsets — the daemon group's health, and the retention verdict at the lanes' positions.

:func:`read_holders` reads the target's checkpoints, lease and health records and the source's daemon group;
:func:`read_lanes` joins them with the source's offsets and the verdict
(:func:`mirror_core.services.deadlines.assess_positions`). The page (``shoal_airflow/shoal_ui.py``) renders what
these return. Kafka clients are imported inside the functions: Airflow imports the page's module in every process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig

GROUP_TIMEOUT_S = 5.0    # describing the daemon group on the source waits this long, then says it is not readable


@dataclass(frozen=True)
class LaneRow:
    """One source partition of a pipeline. ``position`` None: no checkpoint yet (lag counts from the log start)."""

    lane: str | None
    topic: str
    partition: int
    position: int | None
    last_stable: int
    lag: int
    target_topic: str | None = None
    target_partition: int | None = None
    target_next: int | None = None
    owner: str | None = None
    owner_epoch: int | None = None
    holder: str | None = None      # the group members the partition is assigned to; "<worker> (lease)" for a
    held: bool | None = None       # lease-based daemon; held None: unknown (the daemon group was not readable)
    updated_ms: int | None = None
    state: str = "copying"  # the lane state persisted with the checkpoint: copying, halted or retired
    reason: str = "none"
    state_detail: str | None = None  # the halt's sentence: what happened, which offsets, what to do
    state_range: tuple[int | None, int | None] | None = None  # (position, range end) the halt names
    lag_bytes: int | None = None   # unmirrored bytes (the retention model's estimate)
    lag_s: float | None = None     # age of the oldest record not copied yet


def read_target_state(target, pipeline: str):
    """``(checkpoints, leases, health records)`` of one pipeline on the target; all empty when there is no
    checkpoint topic."""
    from mirror_core.config.names import CHECKPOINT_TOPIC
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore
    from mirror_core.state.lane_health_records import read_all_health_records
    from mirror_core.state.leases import LeaseStore

    with WireClient.for_cluster(target) as client:
        meta = client.metadata([CHECKPOINT_TOPIC]).get(CHECKPOINT_TOPIC)
        if meta is None or meta.error_code:
            return {}, {}, {}
        store = CheckpointStore(target, client, partitions=len(meta.partitions))
        return (store.read_all(pipeline, whole_maps=False), LeaseStore(store, producer_config={}).read(pipeline),
                read_all_health_records(store, pipeline))


def read_daemon_group(source, pipeline: str):
    """``(group description, None)`` or ``(None, why it could not be read)`` (the source's group coordinator)."""
    from mirror_core.services.mirror_status import describe_group_or_error

    return describe_group_or_error(source, pipeline, timeout_s=GROUP_TIMEOUT_S)


def _clock(ms) -> str:
    return "?" if not ms else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def lane_rows(checkpoints: Mapping, holders, parts: Sequence[tuple[str, int]], last_stable: Mapping,
              log_start: Mapping, pipeline: str) -> list[LaneRow]:
    """Join checkpoints, who holds each lane and its live health (``holders``: a
    :class:`~mirror_core.model.lane_holders.LaneHolders`) and source offsets per selected partition."""
    from mirror_core.config.names import default_lane

    rows = []
    for topic, p in parts:
        stable = last_stable[(topic, p)]
        cp = checkpoints.get((pipeline, topic, p))
        if cp is None:
            rows.append(LaneRow(None, topic, p, None, stable, max(0, stable - log_start[(topic, p)])))
            continue
        lane = default_lane(cp.target_topic, cp.target_partition)
        stopped = getattr(cp, "lane_state", None)
        live = holders.live_health(lane, (topic, p)) if stopped is None else None
        state = {} if stopped is None else {
            "state": stopped.state, "reason": stopped.reason, "state_detail": stopped.message,
            "state_range": (stopped.position, stopped.range_end)}
        if live is not None:  # the holder's health record: retrying (attempt n, since when) or stalled
            state = {"state": live.state, "reason": live.reason, "state_detail": live.detail(_clock)}
        rows.append(LaneRow(lane, topic, p, cp.position, stable, max(0, stable - cp.position), cp.target_topic,
                            cp.target_partition, cp.target_next, cp.owner, cp.owner_epoch,
                            holders.holder((topic, p), lane), holders.held((topic, p), lane), cp.updated_ms,
                            **state))
    return rows


def with_lag_and_state(rows: Sequence[LaneRow], verdict, now_ms: int, stall_after_s: float) -> list[LaneRow]:
    """Lag in bytes and seconds from the retention inputs, and each lane's state as seen from outside the daemon
    (:func:`mirror_core.model.lane_status.observed_state`)."""

    from mirror_core.model.lane_status import observed_state

    snaps = {(s.topic, s.partition): s for s in verdict.inputs.snapshots}
    out = []
    for r in rows:
        snap = snaps.get((r.topic, r.partition))
        lag_bytes = snap.unmirrored_bytes if snap is not None else None
        ts = snap.position_ts if snap is not None and r.lag > 0 else None
        lag_s = None if r.lag > 0 and ts is None else (max(0.0, (now_ms - ts) / 1000) if ts is not None else 0.0)
        if r.state in ("retrying", "stalled"):  # the holder said so in its live health record: it knows best
            out.append(dataclasses.replace(r, lag_bytes=lag_bytes, lag_s=lag_s))
            continue
        state, why = observed_state(None if r.state == "copying" else r.state, lag=r.lag, held=r.held,
                                    owner=r.owner, updated_ms=r.updated_ms, now_ms=now_ms,
                                    stall_after_s=stall_after_s)
        changes = {"lag_bytes": lag_bytes, "lag_s": lag_s, "state": state}
        if why:
            changes["state_detail"] = why
        out.append(dataclasses.replace(r, **changes))
    return out


def read_holders(source: ClusterConfig, target: ClusterConfig, pipeline: str, now_ms: int):
    """``(checkpoints, holders, daemon health sentences)``: the pipeline's checkpoints, lease and health records on
    the target and its daemon group on the source, joined as :class:`~mirror_core.model.lane_holders.LaneHolders`."""
    from mirror_core.model.lane_holders import LaneHolders, daemon_health

    checkpoints, leases, health = read_target_state(target, pipeline)
    group, group_error = read_daemon_group(source, pipeline)
    holders = LaneHolders(group.holders() if group is not None else None, leases, health, now_ms, group_error)
    return checkpoints, holders, daemon_health(group, group_error, leases, now_ms)


def read_lanes(source: ClusterConfig, target: ClusterConfig, pipeline: str, topics: Sequence[str], checkpoints,
               holders, policy: Callable[[], object], *, stall_after_s: float, now_ms: int):
    """``(lane rows, retention verdict)`` for every partition of ``topics``: the source's last stable offsets and log
    starts joined with the checkpoints and holders, the verdict at the lanes' positions (``policy()``: the
    pipeline's retention policy), then each lane's lag in bytes and seconds and its state as seen from outside."""
    from mirror_core.kafka.list_offsets import lookup_offsets
    from mirror_core.kafka.topics import topic_metadata_or_error
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.services.deadlines import assess_positions

    with WireClient.for_cluster(source) as client:
        parts = [(t, p) for t in topics for p in sorted(topic_metadata_or_error(client, t).partitions)]
        stable = lookup_offsets(client, parts, "last_stable")
        start = lookup_offsets(client, parts, "earliest")
    rows = lane_rows(checkpoints, holders, parts, stable, start, pipeline)
    positions = {(r.topic, r.partition): r.position for r in rows if r.position is not None}
    verdict = assess_positions(source, {t: None for t in topics}, positions, policy(), target=target)
    return with_lag_and_state(rows, verdict, now_ms, stall_after_s), verdict


def read_runs(ledger_dir: str, pipeline: str) -> list[dict]:
    """The pipeline's backfill runs from the ledger, newest first, with their units finished
    (:func:`mirror_core.state.ledger.run_summaries`): a run in flight shows."""
    from pathlib import Path

    from mirror_core.state.ledger import run_summaries

    return run_summaries(Path(ledger_dir), pipeline)
