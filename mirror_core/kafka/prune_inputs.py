"""Gathers what :func:`mirror_core.model.map_segments.prune_floor` decides on: each source partition's log start and the
offsets the source's consumer groups hold for it (I/O: confluent-kafka admin for groups, ListOffsets for the log
start). Called now and then (the daemon: from its prune watch thread, :mod:`mirror_core.daemon.prune_watch`), never on
every commit.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import MirrorError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.map_segments import prune_floor

log = logging.getLogger(__name__)


def group_offsets_by_partition(source: ClusterConfig, partitions: Iterable[tuple[str, int]]
                               ) -> dict[tuple[str, int], list[int]]:
    """(topic, partition) → the committed offsets every consumer group on ``source`` holds for it."""
    from mirror_core.kafka.group_admin import ConsumerGroupAdmin

    wanted = sorted(set(partitions))
    admin = ConsumerGroupAdmin(source)
    out: dict[tuple[str, int], list[int]] = defaultdict(list)
    for held in admin.committed_many(admin.list_group_ids(), wanted).values():
        for tp, committed in held.items():
            if tp in wanted:
                out[tp].append(committed.offset)
    return dict(out)


def gather_prune_floors(source: ClusterConfig, client: WireClient, partitions: Iterable[tuple[str, int]]
                        ) -> dict[tuple[str, int], int]:
    """(topic, partition) → the source offset below which no translation can be asked for (see
    :func:`~mirror_core.model.map_segments.prune_floor`). Raises MirrorError when a group listing fails: then nothing
    is pruned (a partial group list could prune what a group still holds). A partition whose log start cannot be
    read now (offline, leaderless) gets no floor this time; the others still do."""
    from mirror_core.kafka.list_offsets import lookup_offsets

    partitions = list(partitions)
    held = group_offsets_by_partition(source, partitions)
    try:  # one ListOffsets per leader (issue #18: one per partition cost the idle 2,000-lane daemon seconds)
        starts = lookup_offsets(client, partitions, "earliest")
    except MirrorError:  # a partition that cannot answer: ask one by one, so the others still get their floor
        starts = {}
    floors: dict[tuple[str, int], int] = {}
    for topic, partition in partitions:
        log_start = starts.get((topic, partition))
        if log_start is None:
            try:
                log_start = list_offsets(client, topic, partition, "earliest")
            except MirrorError as exc:
                log.info("cluster %r %s-%d: no prune floor this time (%s)", source.name, topic, partition, exc)
                continue
        floors[(topic, partition)] = prune_floor(log_start, held.get((topic, partition), ()))
    return floors
