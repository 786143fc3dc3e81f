"""Gathers what :func:`mirror_core.map_segments.prune_floor` decides on: each source partition's log start and the
offsets the source's consumer groups hold for it (I/O: confluent-kafka admin for groups, ListOffsets for the log
start). Called now and then (the daemon: at lane open and every ``prune_interval_s``), never on every commit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mirror_core.cluster import ClusterConfig
from mirror_core.fetcher import list_offsets
from mirror_core.kafka_wire import WireClient
from mirror_core.map_segments import prune_floor


def group_offsets_by_partition(source: ClusterConfig, partitions: Iterable[tuple[str, int]]
                               ) -> dict[tuple[str, int], list[int]]:
    """(topic, partition) → the committed offsets every consumer group on ``source`` holds for it."""
    from mirror_core.groups_command import ConsumerGroupAdmin

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
    :func:`~mirror_core.map_segments.prune_floor`). Raises MirrorError when a listing fails: then nothing is
    pruned (a partial group list could prune what a group still holds)."""
    partitions = list(partitions)
    held = group_offsets_by_partition(source, partitions)
    return {tp: prune_floor(list_offsets(client, tp[0], tp[1], "earliest"), held.get(tp, ()))
            for tp in partitions}
