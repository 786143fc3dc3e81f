"""Range-bound specs as users write them (pure parsing; resolution against a partition is the caller's I/O).

``earliest`` (the log start), ``latest`` (the last stable offset: a READ_COMMITTED copy cannot read past it and an
open source transaction would otherwise stall the range), a non-negative offset, or an ISO-8601 time (the first
offset whose timestamp is at or after it).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from mirror_core.errors import ConfigError


@dataclass(frozen=True)
class PositionSpec:
    kind: str  # "earliest" | "latest" | "offset" | "timestamp"
    value: int | None = None  # the offset, or the timestamp in ms

    def __str__(self) -> str:
        if self.kind == "offset":
            return str(self.value)
        if self.kind == "timestamp":
            return dt.datetime.fromtimestamp(self.value / 1000, dt.UTC).isoformat()
        return self.kind


def parse_position(text: str, *, what: str = "position") -> PositionSpec:
    """Parse ``earliest``, ``latest``, an offset or an ISO-8601 time (naive times are UTC)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return PositionSpec(value.lower())
    if value.lstrip("-").isdigit():
        offset = int(value)
        if offset < 0:
            raise ConfigError(f"{what} {text!r}: an offset must be >= 0")
        return PositionSpec("offset", offset)
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{what} {text!r} is not earliest, latest, an offset or an ISO-8601 time "
                          "(e.g. 2026-11-20T08:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return PositionSpec("timestamp", int(when.timestamp() * 1000))


def parse_partitions(text: str | None, partition_count: int, topic: str) -> list[int]:
    """``None`` → all partitions; else a comma list of partitions and ranges like ``0,2,4-6``."""
    if text is None:
        return list(range(partition_count))
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                chosen.update(range(lo, hi + 1))
            else:
                chosen.add(int(part))
        except ValueError:
            raise ConfigError(f"--partitions {text!r}: {part!r} is not a partition number or range") from None
    bad = sorted(p for p in chosen if not 0 <= p < partition_count)
    if bad:
        raise ConfigError(f"topic {topic!r} has partitions 0..{partition_count - 1}; no partition {bad[0]}")
    return sorted(chosen)
