"""Halted and retired lanes on the target: persist a lane's state with its checkpoint, list lane states, and the
operator's way out (``shoal lanes resume``), recorded in the ledger.

A lane state is written as a new value of the lane's checkpoint (``Checkpoint.lane_state``), so it lives where the
daemon looks before it opens a lane and survives restarts. In exactly-once mode the write goes through the lane's
own transactional.id (``InitProducerId`` fences any writer of the lane first, then the checkpoint is read past the
LSO and rewritten in one transaction): a state never overwrites a newer commit. A halted lane has no writer (the
daemon skips it), so the operator's resume never races a copy.

Ledger location: the directory given to ``shoal lanes resume --ledger-dir`` (the same Parquet ledger as backfills,
one run directory per decision, ``run=lanes-<time>-<id>``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import default_lane, lane_transactional_id
from mirror_core.errors import ConfigError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.lane_status import HALTED, PersistedLaneState
from mirror_core.model.offset_map import OffsetMap
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore
from mirror_core.state.ledger import STATUS_LOST, STATUS_RESUMED, LedgerRow, write_ledger

LOSS_REASONS = ("data_loss", "source_deleted")  # halts whose way out is accepting a named loss


def rewrite_checkpoint(store: CheckpointStore, client: WireClient, pipeline: str, topic: str, partition: int,
                       change: Callable[[Checkpoint], Checkpoint], *, transactional: bool = True,
                       initial: Checkpoint | None = None) -> Checkpoint | None:
    """Apply ``change`` to the lane's newest checkpoint (or to ``initial`` when the partition has none yet) and
    write it (see the module docstring); None when there is neither."""
    seen = store.read_own(pipeline, topic, partition) or initial
    if seen is None:
        return None
    lane = default_lane(seen.target_topic, seen.target_partition)
    writer = BatchWriter(client, transactional_id=lane_transactional_id(pipeline, lane) if transactional else None)
    writer.init_producer_id()
    current = (store.read_own(pipeline, topic, partition) if transactional else None) or seen
    updated = change(current)
    if transactional:
        writer.begin_transaction()
    writer.write([store.checkpoint_batch(updated)])
    if transactional:
        writer.commit_transaction()
    return updated


def persist_lane_state(store: CheckpointStore, client: WireClient, pipeline: str, topic: str, partition: int,
                       state: PersistedLaneState | None, *, transactional: bool = True,
                       initial: Checkpoint | None = None) -> Checkpoint | None:
    """Store ``state`` (None: healthy) in the lane's checkpoint; a lane that committed nothing yet gets
    ``initial`` (its start position, nothing written) so the state has a place to live."""
    return rewrite_checkpoint(store, client, pipeline, topic, partition,
                              lambda cp: dataclasses.replace(cp, lane_state=state, updated_ms=_now_ms()),
                              transactional=transactional, initial=initial)


@dataclasses.dataclass(frozen=True)
class ResumeDecision:
    checkpoint: Checkpoint
    previous: PersistedLaneState
    lost_range: tuple[int, int] | None
    ledger_path: Path


def resume_lane(target: ClusterConfig, pipeline: str, topic: str, partition: int, *, ledger_dir: Path,
                accept_loss: bool = False, source: ClusterConfig | None = None,
                transactional: bool = True) -> ResumeDecision:
    """Clear a halted lane's state so the daemon reopens it; with ``accept_loss`` (a ``data_loss`` or
    ``source_deleted`` halt) first record the named range as lost in the checkpoint (``lost_ranges``, where
    translation declines) and move the position past it, as ``shoal copy --accept-loss`` does. The decision is
    written to the ledger."""
    with WireClient.for_cluster(target) as client:
        store = CheckpointStore(target, client)
        found = store.read(pipeline, topic, partition)
        halt = _halt_of(found, pipeline, topic, partition)
        lost = _lost_range(halt, found, topic, partition, source) if accept_loss else None
        if lost is None and halt.reason in LOSS_REASONS:
            raise ConfigError(f"pipeline {pipeline!r} {topic}-{partition} halted because data can no longer be "
                              f"copied ({halt.message}); resuming would halt again: pass --accept-loss to record "
                              "the loss and continue past it")
        if accept_loss and halt.reason not in LOSS_REASONS:
            raise ConfigError(f"--accept-loss applies to a data_loss or source_deleted halt; {topic}-{partition} "
                              f"halted for {halt.reason}: fix the cause, then resume without it")

        def change(cp: Checkpoint) -> Checkpoint:
            if _halt_of(cp, pipeline, topic, partition) != halt:
                raise ConfigError(f"pipeline {pipeline!r} {topic}-{partition}: the lane's state changed while "
                                  "resuming; look again with `shoal lanes status`")
            if cp.target_next is None:
                # halted before writing anything: resuming accepts what the target partition holds now (a lane
                # with nothing of its own there refuses any committed record: TargetNotEmptyError), and the
                # landing rule checks from its end on
                cp = dataclasses.replace(cp, target_next=list_offsets(client, cp.target_topic, cp.target_partition,
                                                                      "latest"))
            if lost is None:
                return dataclasses.replace(cp, lane_state=None, updated_ms=_now_ms())
            return _with_loss(cp, lost, halt)

        updated = rewrite_checkpoint(store, client, pipeline, topic, partition, change, transactional=transactional)
    path = write_ledger(ledger_dir, f"lanes-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}",
                        [_ledger_row(updated, halt, lost)])
    return ResumeDecision(updated, halt, lost, path)


def _halt_of(cp: Checkpoint | None, pipeline: str, topic: str, partition: int) -> PersistedLaneState:
    if cp is None:
        raise ConfigError(f"pipeline {pipeline!r} has no checkpoint for {topic}-{partition}")
    if cp.lane_state is None or cp.lane_state.state != HALTED:
        now = "copying" if cp.lane_state is None else cp.lane_state.state
        raise ConfigError(f"pipeline {pipeline!r} {topic}-{partition} is not halted (it is {now}); nothing to resume")
    return cp.lane_state


def _lost_range(halt: PersistedLaneState, cp: Checkpoint, topic: str, partition: int,
                source: ClusterConfig | None) -> tuple[int, int] | None:
    """The range accepting the loss skips: up to the source's log start now (data loss) or the end the halt named
    (deleted source topic)."""
    if halt.reason == "source_deleted":
        end = halt.range_end if halt.range_end is not None else cp.position
        return (cp.position, max(end, cp.position))
    if halt.reason != "data_loss":
        return None
    if source is None:
        raise ConfigError("--accept-loss for a data_loss halt needs --source: the loss ends at the source's log start")
    with WireClient.for_cluster(source) as client:
        log_start = list_offsets(client, topic, partition, "earliest")
    return (cp.position, max(log_start, cp.position))


def _with_loss(cp: Checkpoint, lost: tuple[int, int], halt: PersistedLaneState) -> Checkpoint:
    """The checkpoint past ``lost``: position moved to its end, the range recorded as lost; a deleted source topic's
    lane is retired (nothing is left to copy)."""
    lo, hi = lost
    offset_map = None
    if cp.offset_map is not None:
        offset_map = OffsetMap.from_bytes(cp.offset_map.to_bytes())
        if hi > lo:
            offset_map.mark_lost(lo, hi)
    retired = None
    if halt.reason == "source_deleted":
        retired = PersistedLaneState("retired", halt.reason, f"source topic deleted; offsets [{lo}, {hi}) accepted as "
                                     "lost by the operator", _now_ms(), lo, hi)
    return dataclasses.replace(cp, position=hi, position_epoch=None if hi > lo else cp.position_epoch,
                               offset_map=offset_map, lost_ranges=cp.lost_ranges + (((lo, hi),) if hi > lo else ()),
                               lane_state=retired, updated_ms=_now_ms())


def _ledger_row(cp: Checkpoint, halt: PersistedLaneState, lost: tuple[int, int] | None) -> LedgerRow:
    start, end = lost if lost is not None else (halt.position if halt.position is not None else cp.position,
                                               cp.position)
    verdict = (f"offsets [{start}, {end}) accepted as lost by the operator" if lost is not None
               else "resumed by the operator")
    return LedgerRow(run_id="", unit_id=f"{cp.topic}-{cp.partition}:{'lost' if lost else 'resume'}",
                     pipeline=cp.pipeline, source_topic=cp.topic, source_partition=cp.partition,
                     target_topic=cp.target_topic, target_partition=cp.target_partition, planned_start=start,
                     planned_end=end, source_start=None, source_end=None, target_start=None, target_end=None,
                     records=0, batches=0, bytes=0, deep_batches=0, records_digest="", duration_s=0.0,
                     status=STATUS_LOST if lost is not None else STATUS_RESUMED,
                     error=f"{verdict}; the lane had halted ({halt.reason}): {halt.message}")


def lane_states(target: ClusterConfig, pipeline: str) -> list[dict]:
    """Every lane of ``pipeline`` with a checkpoint: its state — the persisted ``halted``/``retired``, else the
    ``retrying``/``stalled`` its holder's live health record reports (:mod:`mirror_core.state.lane_health_records`),
    else ``copying`` — reason, offsets and owner, as the daemons left them on the target; ``lease_holder``: a
    lease-based daemon of an older release holding the lane by a live lease (an upgrade in progress), else None."""
    from mirror_core.model.lane_holders import LaneHolders
    from mirror_core.state.lane_health_records import read_all_health_records
    from mirror_core.state.leases import LeaseStore

    with WireClient.for_cluster(target) as client:
        store = CheckpointStore(target, client)
        checkpoints = store.read_all(pipeline, whole_maps=False)
        leases = LeaseStore(store, producer_config={}).read(pipeline)
        health = read_all_health_records(store, pipeline)
    now = _now_ms()
    holders = LaneHolders(None, leases, health, now)
    rows = []
    for (_pl, topic, partition), cp in sorted(checkpoints.items()):
        lane = default_lane(cp.target_topic, cp.target_partition)
        stopped = cp.lane_state
        live = None if stopped else holders.live_health(lane, (topic, partition))
        old = holders.holder((topic, partition), lane)
        row = {"lane": lane, "topic": topic, "partition": partition,
               "state": stopped.state if stopped else "copying", "reason": stopped.reason if stopped else "none",
               "message": stopped.message if stopped else None, "since_ms": stopped.since_ms if stopped else None,
               "position": cp.position, "range_end": stopped.range_end if stopped else None,
               "owner": cp.owner, "lease_holder": old.removesuffix(" (lease)") if old else None,
               "lost_ranges": [list(r) for r in cp.lost_ranges]}
        if live is not None:
            row.update(state=live.state, reason=live.reason, message=live.message, since_ms=live.since_ms,
                       attempts=live.attempts, reported_by=live.holder)
        rows.append(row)
    return rows


def _now_ms() -> int:
    return int(time.time() * 1000)
