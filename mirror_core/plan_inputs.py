"""Gather a backfill plan's inputs from the clusters (Kafka I/O; every decision is in :mod:`mirror_core.planner`).

Source cluster: the topic list (one Metadata request for all topics), and per selected partition the log start,
last stable offset and log end, plus the offsets of the request's start/end times (ListOffsets, one request per
leader covering all its partitions; a partition whose answer is an error is retried on its own through
:func:`mirror_core.fetcher.list_offsets`). Partition sizes for the bytes estimate come from DescribeLogDirs on each
leader through kafka-python's admin client (confluent-kafka 2.16 has no DescribeLogDirs); a cluster that refuses
it gives no sizes and estimates of 0 rather than no plan. Target cluster: the pipeline's checkpoint positions,
whatever the start (a start past a checkpoint would skip offsets never copied; the planner refuses it), required
when the start is ``checkpoint``.

:func:`build_plan` runs the whole flow; :func:`dry_run` prints a plan as a table and writes its JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel, ListOffsetsRequest, OffsetSpec

from mirror_core.checkpoint import CHECKPOINT_TOPIC, CheckpointStore
from mirror_core.cluster import ClusterConfig
from mirror_core.errors import ConfigError
from mirror_core.fetcher import list_offsets
from mirror_core.kafka_wire import WireClient
from mirror_core.planner import (
    CheckpointPosition,
    DeadlineFor,
    PartitionState,
    Plan,
    PlanInputs,
    PlanRequest,
    plan_backfill,
    render_plan_table,
    select_topics,
)
from mirror_core.topic_counts import list_topic_counts

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_LOOKUPS = {
    "earliest": (OffsetSpec.EARLIEST, IsolationLevel.READ_UNCOMMITTED),
    "latest": (OffsetSpec.LATEST, IsolationLevel.READ_UNCOMMITTED),
    "last_stable": (OffsetSpec.LATEST, IsolationLevel.READ_COMMITTED),
}


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
    that far: :mod:`mirror_core.topic_counts`)."""
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


def lookup_offsets(client: WireClient, partitions: Iterable[TopicPartition],
                   which: str | int) -> dict[TopicPartition, int | None]:
    """ListOffsets for many partitions: ``which`` as in :func:`mirror_core.fetcher.list_offsets` (a timestamp
    answers None when no record is at or after it). One request per leader; failures retried one by one."""
    if isinstance(which, str):
        timestamp, isolation = _LOOKUPS[which]
    else:
        timestamp, isolation = int(which), IsolationLevel.READ_UNCOMMITTED
    by_leader: dict[int, list[tuple[TopicPartition, int]]] = {}
    retry: list[TopicPartition] = []
    for tp in partitions:
        try:
            leader, epoch = client.leader_for(*tp)
        except Errors.KafkaError:
            retry.append(tp)
            continue
        by_leader.setdefault(leader, []).append((tp, epoch))
    found: dict[TopicPartition, int | None] = {}
    for leader, items in by_leader.items():
        for tp, offset in _list_offsets_on(client, leader, items, int(timestamp), isolation).items():
            if offset is None or (offset == -1 and isinstance(which, str)):
                retry.append(tp)
            else:
                found[tp] = None if offset == -1 else offset
    for tp in retry:
        found[tp] = list_offsets(client, *tp, which)
    return found


def _list_offsets_on(client: WireClient, leader: int, items: list[tuple[TopicPartition, int]], timestamp: int,
                     isolation: IsolationLevel) -> dict[TopicPartition, int | None]:
    """One ListOffsets to ``leader``; a partition's value is None when it answered an error (or nothing)."""
    Topic = ListOffsetsRequest.ListOffsetsTopic
    grouped: dict[str, list] = {}
    for (topic, partition), epoch in items:
        grouped.setdefault(topic, []).append(Topic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=epoch, timestamp=timestamp))
    request = ListOffsetsRequest(
        replica_id=-1, isolation_level=int(isolation), timeout_ms=client.request_timeout_ms,
        topics=[Topic(name=t, partitions=ps) for t, ps in grouped.items()],
        min_version=max(1, ListOffsetsRequest.min_version_for_isolation_level(isolation)))
    out: dict[TopicPartition, int | None] = {tp: None for tp, _ in items}
    try:
        response = client.send(leader, request)
    except Errors.KafkaError as exc:
        log.debug("ListOffsets to broker %s failed (%s); retrying partition by partition", leader, exc)
        return out
    for t in response.topics:
        for p in t.partitions:
            if (t.name, p.partition_index) in out and p.error_code == 0:
                out[(t.name, p.partition_index)] = p.offset
    return out


def partition_sizes(cluster: ClusterConfig, client: WireClient,
                    partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int] | None:
    """Bytes of each partition on its leader (DescribeLogDirs); None when the cluster refuses to say."""
    from mirror_core.retention_inputs import partition_sizes as sizes_on_leaders

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


def _partitions(topics: Mapping[str, int], selected: Iterable[str]) -> list[TopicPartition]:
    return [(t, p) for t in selected for p in range(topics[t])]
