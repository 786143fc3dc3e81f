"""How far a pipeline's checkpoints trail the source: per selected partition, last stable offset − checkpoint
position (a partition without a checkpoint trails by everything retained); used by the catch-up trigger and sensor,
the handoff DAG, the retention sensor and operators. :func:`retention_policy` turns the Airflow side's ``retention``
mapping and threshold into the one :class:`~mirror_core.model.retention_policy.RetentionPolicy` every verdict uses.
(It lived in the Airflow package, though it needs no Airflow: issue #17.)"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineLag:
    pipeline: str
    partitions: dict[str, int]  # "topic-partition" -> offsets behind

    @property
    def total(self) -> int:
        return sum(self.partitions.values())

    @property
    def worst(self) -> int:
        return max(self.partitions.values(), default=0)


def selected_partitions(source, pipeline: str, include: str, exclude: str | None = None) -> list[tuple[str, int]]:
    from mirror_core.config.plan_request import PlanRequest
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.model.planner import select_topics
    from mirror_core.services.plan_inputs import list_topics

    request = PlanRequest.parse(pipeline=pipeline, source_cluster=source.name, target_cluster=source.name,
                                include=include, exclude=exclude)
    with WireClient.for_cluster(source) as client:
        topics = list_topics(client)
        return [(t, p) for t in select_topics(request, topics) for p in range(topics[t])]


def stored_positions(target, pipeline: str) -> dict[tuple[str, int], int]:
    """The pipeline's checkpoint positions on the target (empty when it has none)."""
    from mirror_core.config.names import CHECKPOINT_TOPIC
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore

    with WireClient.for_cluster(target) as client:
        meta = client.metadata([CHECKPOINT_TOPIC]).get(CHECKPOINT_TOPIC)
        if meta is None or meta.error_code:
            return {}
        store = CheckpointStore(target, client, partitions=len(meta.partitions))
        return {(t, p): cp.position for (_pl, t, p), cp in store.read_all(pipeline, whole_maps=False).items()}


def checkpoint_positions(source, target, pipeline: str, include: str, exclude: str | None = None):
    """``(topics, positions)`` for :func:`mirror_core.kafka.retention_inputs.gather_inputs`: every selected partition at
    its checkpoint (a partition without one is absent, i.e. taken as not mirrored at all)."""
    parts = selected_partitions(source, pipeline, include, exclude)
    stored = stored_positions(target, pipeline)
    topics: dict[str, list[int]] = {}
    for t, p in parts:
        topics.setdefault(t, []).append(p)
    return topics, {tp: stored[tp] for tp in parts if tp in stored}


def measure_lag(source, target, pipeline: str, include: str, exclude: str | None = None) -> PipelineLag:
    from mirror_core.kafka.list_offsets import lookup_offsets
    from mirror_core.kafka.wire_client import WireClient

    parts = selected_partitions(source, pipeline, include, exclude)
    with WireClient.for_cluster(source) as client:
        stable = lookup_offsets(client, parts, "last_stable")
        log_start = lookup_offsets(client, parts, "earliest")
    positions = stored_positions(target, pipeline)
    lag = {f"{t}-{p}": max(0, stable[(t, p)] - positions.get((t, p), log_start[(t, p)])) for t, p in parts}
    return PipelineLag(pipeline, lag)


def retention_policy(retention=None, at_risk_below_s=None):
    """The pipeline's retention policy (a ``retention`` mapping with the pipeline file's keys; None: the defaults),
    with an explicit ``at_risk_below_s`` on top (None, "" or "None": keep the policy's)."""
    from mirror_core.model.retention_policy import RetentionPolicy

    threshold = None if at_risk_below_s in (None, "", "None") else float(at_risk_below_s)
    return RetentionPolicy.from_mapping(retention or None).overridden(at_risk_below_s=threshold)
