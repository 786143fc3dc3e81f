"""Group sync, the user action: move the committed offsets of source consumer groups to the target, exactly
(``shoal groups sync`` calls :func:`sync_groups`; the decisions are :mod:`mirror_core.model.group_translation`, the
I/O :mod:`mirror_core.kafka.group_admin`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.group_admin import ConsumerGroupAdmin
from mirror_core.model.group_translation import (
    GroupSyncPlan,
    TopicPartitionKey,
    plan_group_sync,
    select_groups,
)


@dataclass(frozen=True)
class GroupSyncResult:
    plan: GroupSyncPlan
    committed: tuple[str, ...]  # groups whose offsets were committed on the target
    failures: Mapping[str, str]  # group → one-line error (the group's offsets were not, or not all, committed)
    dry_run: bool


def load_checkpoints(target: ClusterConfig, pipeline: str):
    """The pipeline's checkpoints by source (topic, partition), read from the target (READ_COMMITTED)."""
    from mirror_core.config.names import CHECKPOINT_TOPIC
    from mirror_core.kafka.topics import TopicAdmin
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore

    if CHECKPOINT_TOPIC not in TopicAdmin(target).list_topics():
        raise ConfigError(f"cluster {target.name!r} has no checkpoint topic {CHECKPOINT_TOPIC!r}: nothing was "
                          "copied there with checkpoints (shoal copy --mode exactly-once or at-least-once)")
    with WireClient.for_cluster(target) as client:
        found = CheckpointStore(target, client).read_all(pipeline)
    if not found:
        raise ConfigError(f"pipeline {pipeline!r} has no checkpoints on cluster {target.name!r}")
    return {(topic, partition): cp for (_p, topic, partition), cp in found.items()}


def diverged_ranges(source: ClusterConfig, checkpoints) -> dict[TopicPartitionKey, tuple[int | None, int]]:
    """(topic, partition) → diverged range, for each checkpoint whose (position, position_epoch) the source
    leader no longer vouches for (OffsetsForLeaderEpoch, :func:`mirror_core.kafka.epochs.validate_position`); a
    checkpoint without an epoch cannot be checked and is left out (logged)."""
    from mirror_core.errors import SourceTruncatedError
    from mirror_core.kafka.epochs import validate_position
    from mirror_core.kafka.wire_client import WireClient

    out: dict[TopicPartitionKey, tuple[int | None, int]] = {}
    with WireClient.for_cluster(source) as client:
        for cp in checkpoints:
            try:
                validate_position(client, cp.topic, cp.partition, cp.position, cp.position_epoch)
            except SourceTruncatedError as exc:
                out[(cp.topic, cp.partition)] = exc.diverged_range
    return out


def sync_groups(source: ClusterConfig, target: ClusterConfig, pipeline: str, pattern: re.Pattern, *,
                dry_run: bool = False) -> GroupSyncResult:
    """Read, decide (:func:`~mirror_core.model.group_translation.plan_group_sync`), and commit unless ``dry_run``.

    A group the target refuses is recorded in ``failures`` and the others still go ahead."""
    source_admin, target_admin = ConsumerGroupAdmin(source), ConsumerGroupAdmin(target)
    groups = select_groups(source_admin.list_group_ids(), pattern)
    source_offsets = {g: source_admin.committed(g) for g in groups}
    # the checkpoints after the source offsets: a position read later only covers more of them
    checkpoints = load_checkpoints(target, pipeline)
    wanted = {tp for offsets in source_offsets.values() for tp in offsets}
    diverged = diverged_ranges(source, [cp for tp, cp in checkpoints.items() if tp in wanted])
    plan = plan_group_sync(source_offsets, checkpoints, target_admin.describe(groups), diverged)
    committed, failures = [], {}
    if not dry_run:
        for group, decisions in plan.commits().items():
            try:
                target_admin.commit(group, decisions)
                committed.append(group)
            except MirrorError as exc:
                failures[group] = str(exc)
    return GroupSyncResult(plan, tuple(committed), failures, dry_run)
