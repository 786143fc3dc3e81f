"""The one range value: a source partition's offsets ``[start, end)`` and the target partition (lane) they are
copied into.

The copier copies a :class:`PartitionRange`; the backfill planner's work units are ranges with a size estimate and
a deadline (:class:`~mirror_core.model.plan.WorkUnit`). Invariants: ``0 <= start <= end`` (an empty range is a
range; the planner refuses empty *units* itself); partitions map one to one, so the lane is
``<target_topic>-<target_partition>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirror_core.errors import ConfigError


@dataclass(frozen=True)
class PartitionRange:
    """Source ``topic-partition`` offsets ``[start, end)`` to be written to ``target_topic-target_partition``."""

    topic: str
    partition: int
    start: int
    end: int
    target_topic: str
    target_partition: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ConfigError(f"{self.topic}-{self.partition}: invalid range [{self.start}, {self.end})")

    def __str__(self) -> str:
        return (f"{self.topic}-{self.partition} [{self.start}, {self.end}) -> "
                f"{self.target_topic}-{self.target_partition}")
