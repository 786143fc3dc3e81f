"""Backfill planning: which source partitions to copy, from which offset to which, into which target lane, in what
order. Pure: no I/O (:mod:`mirror_core.services.plan_inputs` asks the clusters; the caller writes files).

Flow: a :class:`~mirror_core.config.plan_request.PlanRequest` (every user input, validated at construction) →
:func:`select_topics` against the source's topic list → the caller gathers :class:`PlanInputs` for those topics →
:func:`plan_backfill` → a :class:`~mirror_core.model.plan.Plan`, the one JSON document the Spark job receives.

- **Selection** (the patterns and the naming policy: :mod:`mirror_core.config.topic_selection`): internal topics
  (``__…``) are selected only when an include alternative names them literally. A literal name that does not
  exist is refused, as is a selection of nothing, and a target name Kafka refuses or two topics sharing a target.
- **Bounds**: a ``checkpoint`` start is the pipeline's stored position; a partition without one starts at the log
  start. "Latest" is the last stable offset (a READ_COMMITTED copy cannot read past it). A time is the first
  offset whose timestamp is at or after it, or the last stable offset if none is.
- **Refusals** (:class:`~mirror_core.errors.ConfigError`, naming the item): unknown topic or partition, an end
  before the start or past the last stable offset, and a start below the log start — data already deleted —
  unless ``accept_loss``, which moves the start to the log start and records the lost range.
- **Bytes estimate**: (end - start) × the partition's average bytes per offset, i.e. its size on the leader
  (DescribeLogDirs: segment bytes, aborted data and markers included) over (log end - log start). Approximate on
  compacted or unevenly sized partitions; it orders work and sizes throttles, it is never a bound.
- **Order**: earliest retention deadline first (``deadline_for``, from the retention model); units without a
  deadline follow, larger first. Empty ranges are not units; they are listed in ``empty`` and the summary.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mirror_core.config.plan_request import PlanRequest
from mirror_core.config.topic_selection import is_valid_topic_name
from mirror_core.errors import ConfigError, DataLossError, PlanDataLossError, SkipRefusedError
from mirror_core.model.plan import EmptyRange, LossRange, Plan, WorkUnit
from mirror_core.model.preflight_rules import KAFKA_INTERNAL_TOPICS, is_internal_topic

DeadlineFor = Callable[[str, int, int], "int | None"]


# -- topic selection -------------------------------------------------------------------------------------------

def select_topics(request: PlanRequest, topics: Mapping[str, int]) -> list[str]:
    """The source topics the request selects (``topics``: every topic on the source → partition count), after
    refusing unknown named topics, offsets for unknown or unselected partitions, and unusable target names."""
    cluster = request.source_cluster
    include, exclude = request.include_pattern, request.exclude_pattern
    for name in sorted(include.named):
        if name not in topics:
            raise ConfigError(f"topic {name!r} (named in include {request.include!r}) does not exist on cluster "
                              f"{cluster!r}")
    selected = sorted(t for t in topics if include.matches(t)
                      and (not is_internal_topic(t) or t in include.named)
                      and not (exclude and exclude.matches(t)))
    if not selected:
        raise ConfigError(f"include {request.include!r}{_excluding(request)} selects no topic on cluster "
                          f"{cluster!r} (patterns match whole names; internal topics must be named)")
    for bound, what in ((request.start, "start"), (request.end, "end")):
        for topic, partition, _offset in bound.offsets:
            if topic not in topics:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} does not exist on cluster {cluster!r}")
            if topic not in selected:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} is not selected by include "
                                  f"{request.include!r}{_excluding(request)}")
            if partition >= topics[topic]:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} on cluster {cluster!r} has "
                                  f"partitions 0..{topics[topic] - 1}")
    for src, _dst in request.naming.mapping:
        if src not in topics:
            raise ConfigError(f"naming map entry {src!r}: topic does not exist on cluster {cluster!r}")
    _check_targets(request, selected)
    return selected


def _check_targets(request: PlanRequest, selected: Iterable[str]) -> None:
    owners: dict[str, str] = {}
    for topic in selected:
        target = request.naming.target_for(topic)
        if not is_valid_topic_name(target):
            raise ConfigError(f"topic {topic!r}: target name {target!r} is not a valid Kafka topic name")
        if target in KAFKA_INTERNAL_TOPICS:
            raise ConfigError(f"topic {topic!r}: target {target!r} is one of Kafka's own state logs and the broker "
                              "refuses client writes to it; use a prefix (e.g. prefix:dr.) or a map")
        if target in owners:
            raise ConfigError(f"topics {owners[target]!r} and {topic!r} would both be copied to target {target!r}")
        owners[target] = topic


def _excluding(request: PlanRequest) -> str:
    return f" excluding {request.exclude!r}" if request.exclude else ""



# -- what the clusters said ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointPosition:
    """A pipeline's stored position for one source partition and where it was copying to."""

    position: int
    target_topic: str
    target_partition: int


@dataclass(frozen=True)
class PartitionState:
    """One source partition at plan time. ``start_time_offset`` / ``end_time_offset`` answer ListOffsets for the
    request's start / end time (None: no record at or after it); ``size_bytes`` None when DescribeLogDirs failed."""

    topic: str
    partition: int
    log_start: int
    last_stable: int
    log_end: int
    size_bytes: int | None = None
    start_time_offset: int | None = None
    end_time_offset: int | None = None
    checkpoint: CheckpointPosition | None = None

    @property
    def bytes_per_offset(self) -> float:
        span = self.log_end - self.log_start
        return self.size_bytes / span if self.size_bytes and span > 0 else 0.0


@dataclass(frozen=True)
class PlanInputs:
    """``topics``: every topic on the source → partition count; ``partitions``: a state per selected partition."""

    topics: Mapping[str, int]
    partitions: Mapping[tuple[str, int], PartitionState]



# -- planning --------------------------------------------------------------------------------------------------

def plan_backfill(request: PlanRequest, inputs: PlanInputs, *, deadline_for: DeadlineFor | None = None,
                  created_ms: int | None = None, plan_id: str | None = None) -> Plan:
    """The plan for ``request`` given what the source said (``inputs``); see the module docstring for the rules.

    ``deadline_for(topic, partition, start_offset)`` gives the retention deadline in ms since the epoch (None:
    no deadline); without it units are ordered by size alone.
    """
    created_ms = int(time.time() * 1000) if created_ms is None else created_ms
    units, losses, empty = [], [], []
    for topic in select_topics(request, inputs.topics):
        target = request.naming.target_for(topic)
        for partition in range(inputs.topics[topic]):
            state = inputs.partitions.get((topic, partition))
            if state is None:
                raise ValueError(f"plan inputs lack partition {topic}-{partition}")
            start, end, start_from, lost = resolve_unit_range(request, state, target)
            if lost is not None:
                losses.append(lost)
            if start == end:
                empty.append(EmptyRange(topic, partition, start))
                continue
            deadline = deadline_for(topic, partition, start) if deadline_for is not None else None
            units.append(WorkUnit(topic, partition, start, end, target, partition,
                                  bytes_estimate=round((end - start) * state.bytes_per_offset),
                                  deadline_ms=None if deadline is None else int(deadline), start_from=start_from))
    return Plan(plan_id=plan_id or _new_plan_id(request.pipeline, created_ms), pipeline=request.pipeline,
                created_ms=created_ms, source_cluster=request.source_cluster, target_cluster=request.target_cluster,
                mode=request.mode, exact_bounds=request.exact_bounds, throttle_mb_s=request.throttle_mb_s,
                link_mb_s=request.link_mb_s, accept_loss=request.accept_loss, units=tuple(order_units(units)),
                coalesce_bytes=request.coalesce_bytes,
                losses=tuple(losses), empty=tuple(empty), request=request.to_dict())


def order_units(units: Iterable[WorkUnit]) -> list[WorkUnit]:
    """Earliest deadline first; units without a deadline after those with one, larger first; then by name."""
    def key(u: WorkUnit):
        has_deadline = u.deadline_ms is not None
        return (not has_deadline, u.deadline_ms if has_deadline else 0, -u.bytes_estimate, u.topic, u.partition)

    return sorted(units, key=key)


def resolve_unit_range(request: PlanRequest, state: PartitionState,
                       target_topic: str) -> tuple[int, int, str, LossRange | None]:
    """``(start, end, start_from, loss)`` for one partition, refusing what cannot be planned."""
    where = f"cluster {request.source_cluster!r} {state.topic}-{state.partition}"
    start, start_from = _resolve_start(request, state, target_topic, where)
    end = _resolve_end(request, state, where)
    if start > state.log_end:
        raise ConfigError(f"{where}: start {request.start} = offset {start} is past the log end {state.log_end}")
    if end < start:
        raise ConfigError(f"{where}: end {request.end} = offset {end} is before start {request.start} = offset "
                          f"{start}")
    lost = None
    if start < state.log_start:
        if not request.accept_loss:
            raise PlanDataLossError(request.source_cluster, state.topic, state.partition, start, state.log_start,
                                    request.start)
        lost = LossRange(state.topic, state.partition, start, min(state.log_start, end))
        start, start_from = min(state.log_start, end), "log start (accept-loss)"
    skipped = _skipped_past_checkpoint(request, state, target_topic, start)
    if skipped is not None:
        first = skipped.lost_start if lost is None else min(lost.lost_start, skipped.lost_start)
        lost = LossRange(state.topic, state.partition, first, skipped.lost_end)
        start_from = f"{start_from}, past the checkpoint (accept-loss)"
    return start, end, start_from, lost


def _skipped_past_checkpoint(request: PlanRequest, state: PartitionState, target_topic: str,
                             start: int) -> LossRange | None:
    """A start past the pipeline's checkpoint skips ``[checkpoint, start)``, which was never copied: refused as
    data loss (deleted on the source) or as a skip (still there), unless ``accept_loss``; then the range to
    record. The lane refuses the same at run time (:meth:`LaneSession.copy`); the plan says it first."""
    checkpoint = state.checkpoint
    if checkpoint is None or start <= checkpoint.position or \
            (checkpoint.target_topic, checkpoint.target_partition) != (target_topic, state.partition):
        return None
    if not request.accept_loss:
        if state.log_start > checkpoint.position:
            raise DataLossError(request.source_cluster, state.topic, state.partition, checkpoint.position,
                                state.log_start)
        raise SkipRefusedError(request.source_cluster, state.topic, state.partition, checkpoint.position, start)
    return LossRange(state.topic, state.partition, checkpoint.position, start)


def _resolve_start(request: PlanRequest, state: PartitionState, target_topic: str, where: str) -> tuple[int, str]:
    spec = request.start
    if spec.kind == "earliest":
        return state.log_start, "earliest"
    if spec.kind == "latest":
        return state.last_stable, "latest"
    if spec.kind == "timestamp":
        found = state.start_time_offset
        # No record at or after the time yet, or only inside an open transaction: nothing to copy now.
        return (state.last_stable if found is None else min(found, state.last_stable)), "timestamp"
    if spec.kind == "offsets":
        offset = spec.offset_for(state.topic, state.partition)
        if offset is None:
            raise ConfigError(f"{where}: start {spec} gives no offset for this partition; list every selected "
                              f"partition ({state.topic}:{state.partition}=<offset>)")
        return offset, "offset"
    checkpoint = state.checkpoint
    if checkpoint is None:
        return state.log_start, "earliest (no checkpoint)"
    if (checkpoint.target_topic, checkpoint.target_partition) != (target_topic, state.partition):
        raise ConfigError(f"{where}: pipeline {request.pipeline!r} checkpointed a copy to "
                          f"{checkpoint.target_topic}-{checkpoint.target_partition}, but this plan targets "
                          f"{target_topic}-{state.partition}; use the pipeline's naming policy or a new pipeline")
    if checkpoint.position > state.log_end:
        raise ConfigError(f"{where}: pipeline {request.pipeline!r} checkpoint position {checkpoint.position} is past "
                          f"the log end {state.log_end} (source topic truncated or recreated?)")
    return checkpoint.position, "checkpoint"


def _resolve_end(request: PlanRequest, state: PartitionState, where: str) -> int:
    spec = request.end
    if spec.kind == "latest":
        return state.last_stable
    if spec.kind == "timestamp":
        found = state.end_time_offset
        end = state.last_stable if found is None else found
    else:
        end = spec.offset_for(state.topic, state.partition)
        if end is None:
            raise ConfigError(f"{where}: end {spec} gives no offset for this partition; list every selected "
                              f"partition ({state.topic}:{state.partition}=<offset>)")
    if end > state.last_stable:
        raise ConfigError(f"{where}: end {spec} = offset {end} is past the last stable offset {state.last_stable} "
                          "(an open transaction, or data not written yet); end at latest or retry later")
    return end


def _new_plan_id(pipeline: str, created_ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(created_ms / 1000, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{pipeline}.{stamp}.{uuid.uuid4().hex[:6]}"

