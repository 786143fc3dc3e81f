"""Gather a backfill plan's inputs from the clusters (Kafka I/O; every decision is in :mod:`mirror_core.model.planner`).

Source cluster: the topic list (one Metadata request for all topics), and per selected partition the log start, last
stable offset and log end, plus the offsets of the request's start/end times (ListOffsets, one request per leader
covering all its partitions; a partition whose answer is an error is retried on its own through
:func:`mirror_core.kafka.list_offsets.list_offsets`). Partition sizes for the bytes estimate come from
DescribeLogDirs on each leader through kafka-python's admin client (confluent-kafka 2.16 has no DescribeLogDirs); a
cluster that refuses it gives no sizes and estimates of 0 rather than no plan. Target cluster: the pipeline's
checkpoint positions, whatever the start (a start past a checkpoint would skip offsets never copied; the planner
refuses it), required when the start is ``checkpoint``.

:func:`build_plan` runs the whole flow; :func:`dry_run` prints a plan as a table and writes its JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.config.plan_request import PlanRequest
from mirror_core.errors import ConfigError
from mirror_core.kafka.list_offsets import lookup_offsets
from mirror_core.kafka.topic_counts import list_topic_counts
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.plan import Plan, render_plan_table
from mirror_core.model.planner import (
    CheckpointPosition,
    DeadlineFor,
    PartitionState,
    PlanInputs,
    plan_backfill,
    select_topics,
)
from mirror_core.state.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def build_plan(source: ClusterConfig, target: ClusterConfig, request: PlanRequest, *,
               deadline_for: DeadlineFor | None = None, clock: Callable[[], float] = time.time) -> Plan:
    """Ask ``source`` (and ``target`` for checkpoints) and plan ``request``; cluster names must match it."""
    for cluster, named, role in ((source, request.source_cluster, "source"),
                                 (target, request.target_cluster, "target")):
        if cluster.name != named:
            raise ConfigError(f"the request names {role} cluster {named!r} but was given cluster {cluster.name!r}")
    with WireClient.for_cluster(source) as client:
        topics = list_topics(client)
        selected = select_topics(request, topics)
        checkpoints = read_checkpoints(target, request.pipeline, required=request.start.kind == "checkpoint")
        inputs = gather_plan_inputs(client, request, topics, selected, checkpoints=checkpoints,
                                    sizes=partition_sizes(source, client, _partitions(topics, selected)))
    return plan_backfill(request, inputs, deadline_for=deadline_for, created_ms=int(clock() * 1000))


def list_topics(client: WireClient) -> dict[str, int]:
    """Every topic on the cluster (internal ones included) → partition count (one Metadata request, decoded only
    that far: :mod:`mirror_core.kafka.topic_counts`)."""
    return list_topic_counts(client)


def gather_plan_inputs(client: WireClient, request: PlanRequest, topics: Mapping[str, int], selected: Iterable[str],
                       *, checkpoints: Mapping[TopicPartition, CheckpointPosition] | None = None,
                       sizes: Mapping[TopicPartition, int] | None = None) -> PlanInputs:
    """Offsets of every partition of the ``selected`` topics, plus the given checkpoints and sizes."""
    parts = _partitions(topics, selected)
    # Times first, then the stable offset, then the log end: each later answer is at least the earlier ones'.
    at_start = lookup_offsets(client, parts, request.start.timestamp_ms) if request.start.kind == "timestamp" else {}
    at_end = lookup_offsets(client, parts, request.end.timestamp_ms) if request.end.kind == "timestamp" else {}
    log_start = lookup_offsets(client, parts, "earliest")
    stable = lookup_offsets(client, parts, "last_stable")
    log_end = lookup_offsets(client, parts, "latest")
    checkpoints, sizes = checkpoints or {}, sizes
    states = {tp: PartitionState(*tp, log_start=log_start[tp], last_stable=stable[tp], log_end=log_end[tp],
                                 size_bytes=None if sizes is None else sizes.get(tp, 0),
                                 start_time_offset=at_start.get(tp), end_time_offset=at_end.get(tp),
                                 checkpoint=checkpoints.get(tp))
              for tp in parts}
    return PlanInputs(topics=dict(topics), partitions=states)






def partition_sizes(cluster: ClusterConfig, client: WireClient,
                    partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int] | None:
    """Bytes of each partition on its leader (DescribeLogDirs); None when the cluster refuses to say."""
    from mirror_core.kafka.retention_inputs import partition_sizes as sizes_on_leaders

    try:
        leaders = {tp: client.leader_for(*tp)[0] for tp in partitions}
        return sizes_on_leaders(cluster, leaders) if leaders else {}
    except Exception as exc:  # noqa: BLE001 - not authorized or not supported: plan without size estimates
        log.warning("cluster %r: DescribeLogDirs failed (%s); bytes estimates will be 0", cluster.name, exc)
        return None


def read_checkpoints(target: ClusterConfig, pipeline: str, *, required: bool = True
                     ) -> dict[TopicPartition, CheckpointPosition]:
    """The pipeline's stored positions on the target; when ``required``, refuses a pipeline that has none (a typo,
    or never ran)."""
    with WireClient.for_cluster(target) as client:
        meta = client.metadata([CHECKPOINT_TOPIC]).get(CHECKPOINT_TOPIC)
        found = {}
        if meta is not None and not meta.error_code:
            store = CheckpointStore(target, client, partitions=len(meta.partitions))
            found = {(topic, partition): CheckpointPosition(cp.position, cp.target_topic, cp.target_partition)
                     for (_pipeline, topic, partition), cp in store.read_all(pipeline, whole_maps=False).items()}
    if not found and required:
        raise ConfigError(f"start checkpoint: pipeline {pipeline!r} has no checkpoints in {CHECKPOINT_TOPIC!r} on "
                          f"cluster {target.name!r}; check the pipeline name or start from earliest or a time")
    return found


def dry_run(plan: Plan, path: str | Path, console=None) -> Path:
    """``--dry-run``: print the plan as a table and write it as JSON to ``path``."""
    from rich.console import Console

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.to_json())
    console = console or Console()
    console.print(render_plan_table(plan))
    console.print(f"plan written to {path}", highlight=False)
    return path


def read_plan(path: str | Path) -> Plan:
    """A plan file as :func:`dry_run` (or ``shoal backfill plan``) wrote it, in this or an earlier release's format."""
    return Plan.from_json(Path(path).read_text())


def _partitions(topics: Mapping[str, int], selected: Iterable[str]) -> list[TopicPartition]:
    return [(t, p) for t in selected for p in range(topics[t])]


def retention_deadlines(source: ClusterConfig):
    """``deadline_for(topic, partition, start)``: when the source may delete the oldest record of the unit, from the
    retention model (None: never, e.g. infinite retention)."""
    from mirror_core.kafka.retention_inputs import gather_inputs
    from mirror_core.model.copy_capacity import CopyCapacity
    from mirror_core.model.retention import assess_partition

    # a deadline is when the source may delete the unit's oldest record, whatever the copy's speed: no copy
    # figures enter it (the retention check after planning judges the ETA with the measured ones)
    capacity = CopyCapacity(float("inf"), how="not used: only the deletion deadline orders the plan")

    def deadline_for(topic: str, partition: int, start: int) -> int | None:
        inputs = gather_inputs(source, {topic: [partition]}, {(topic, partition): start})
        snapshot = inputs.snapshots[0]
        status = assess_partition(snapshot, inputs.topics[topic], capacity, at_risk_below_s=600,
                                  check_interval_ms=inputs.check_interval_ms)
        return status.deletion_at_ms()

    return deadline_for
