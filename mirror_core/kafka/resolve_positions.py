"""Resolve user range specs (:mod:`mirror_core.config.positions`) to concrete offsets of one partition (Kafka I/O)."""

from __future__ import annotations

from mirror_core.config.positions import PositionSpec
from mirror_core.errors import ConfigError, DataLossError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient


def resolve_position(client: WireClient, topic: str, partition: int, spec: PositionSpec, *, is_end: bool) -> int:
    """The offset ``spec`` names on ``topic-partition``; a time past the newest record resolves to the end."""
    if spec.kind == "earliest":
        return list_offsets(client, topic, partition, "earliest")
    if spec.kind == "latest":
        return list_offsets(client, topic, partition, "last_stable")
    if spec.kind == "offset":
        return int(spec.value)
    found = list_offsets(client, topic, partition, int(spec.value))
    return found if found is not None else list_offsets(client, topic, partition, "last_stable")


def resolve_range(client: WireClient, topic: str, partition: int, start: PositionSpec, end: PositionSpec, *,
                  accept_loss: bool = False) -> tuple[int, int]:
    """``[start, end)`` for one partition, refusing what cannot be copied: an end before the start, an end past
    the last stable offset, or a start below the log start (data already deleted) unless ``accept_loss``."""
    lo = resolve_position(client, topic, partition, start, is_end=False)
    hi = resolve_position(client, topic, partition, end, is_end=True)
    log_start = list_offsets(client, topic, partition, "earliest")
    stable = list_offsets(client, topic, partition, "last_stable")
    where = f"cluster {client.cluster_name!r} {topic}-{partition}"
    if hi > stable:
        raise ConfigError(f"{where}: end {end} = offset {hi} is past the last stable offset {stable}")
    if lo < log_start:
        if not accept_loss:
            raise DataLossError(client.cluster_name, topic, partition, lo, log_start)
        lo = log_start
    if hi < lo:
        raise ConfigError(f"{where}: end {end} = offset {hi} is before start {start} = offset {lo}")
    return lo, hi
