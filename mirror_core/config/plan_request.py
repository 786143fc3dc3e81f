"""A backfill request: everything the user asked for, validated at construction (the CLI's ``shoal plan`` flags, a
DAG's params). Cluster *names* only: settings and secrets never enter a request or a plan.

- **Bounds** (:class:`BoundSpec`): start = ``earliest`` | ``latest`` | a time | ``topic:partition=offset,...`` |
  ``checkpoint`` (the pipeline's stored position); end = ``latest`` | a time | explicit offsets. How the planner
  resolves each against a partition is written in :mod:`mirror_core.model.planner`.
- **Refused here** (:class:`~mirror_core.errors.ConfigError`, naming the item): a bad regex, an unknown mode or
  bound kind, a bare offset (ambiguous across partitions), a partition named twice, an end time before the start
  time, a throttle or link rate that is not a positive number.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass

from mirror_core.config.coalescing import checked_coalesce_bytes
from mirror_core.config.positions import parse_position
from mirror_core.config.topic_selection import NamingPolicy, TopicPattern
from mirror_core.errors import ConfigError

MODES = ("exactly-once", "at-least-once")
START_KINDS = ("earliest", "latest", "timestamp", "offsets", "checkpoint")
END_KINDS = ("latest", "timestamp", "offsets")


# -- range bounds ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BoundSpec:
    """A start or end spec as the user wrote it; ``offsets`` holds ``(topic, partition, offset)`` triples."""

    kind: str
    timestamp_ms: int | None = None
    offsets: tuple[tuple[str, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in START_KINDS:
            raise ConfigError(f"bound kind {self.kind!r} is not one of {', '.join(START_KINDS)}")
        if self.kind == "timestamp" and (self.timestamp_ms is None or self.timestamp_ms < 0):
            raise ConfigError(f"a timestamp bound needs a time at or after 1970, got {self.timestamp_ms!r}")
        if self.kind == "offsets" and not self.offsets:
            raise ConfigError("an offsets bound needs at least one topic:partition=offset entry")

    @classmethod
    def parse(cls, text: str, *, what: str = "start") -> BoundSpec:
        """``earliest``, ``latest``, ``checkpoint``, an ISO-8601 time, or ``topic:partition=offset,...``."""
        value = text.strip()
        if value.lower() == "checkpoint":
            return cls("checkpoint")
        if "=" in value:
            return cls("offsets", offsets=parse_partition_offsets(value, what=what))
        spec = parse_position(value, what=what)
        if spec.kind == "offset":
            raise ConfigError(f"{what} {text!r}: a bare offset is ambiguous across partitions; write "
                              "topic:partition=offset,... instead")
        if spec.kind == "timestamp":
            return cls("timestamp", timestamp_ms=spec.value)
        return cls(spec.kind)

    def offset_for(self, topic: str, partition: int) -> int | None:
        return next((o for t, p, o in self.offsets if t == topic and p == partition), None)

    def __str__(self) -> str:
        if self.kind == "timestamp":
            return format_time_ms(self.timestamp_ms)
        if self.kind == "offsets":
            return ",".join(f"{t}:{p}={o}" for t, p, o in self.offsets)
        return self.kind


def parse_partition_offsets(text: str, *, what: str = "start") -> tuple[tuple[str, int, int], ...]:
    """``topic:partition=offset,...`` → sorted ``(topic, partition, offset)`` triples (each partition once)."""
    seen: dict[tuple[str, int], int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        where, eq, offset_text = item.rpartition("=")
        topic, colon, part_text = where.rpartition(":")
        if not eq or not colon or not topic:
            raise ConfigError(f"{what} entry {item!r} is not topic:partition=offset")
        if not (part_text.strip().isdigit() and offset_text.strip().isdigit()):
            raise ConfigError(f"{what} entry {item!r}: partition and offset must be non-negative integers")
        key = (topic.strip(), int(part_text))
        if key in seen:
            raise ConfigError(f"{what} names {key[0]}-{key[1]} twice")
        seen[key] = int(offset_text)
    if not seen:
        raise ConfigError(f"{what} {text!r} lists no topic:partition=offset entry")
    return tuple(sorted((t, p, o) for (t, p), o in seen.items()))



# -- the request -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanRequest:
    """Everything the user asked for; cluster *names* only (settings and secrets never enter a plan)."""

    pipeline: str
    source_cluster: str
    target_cluster: str
    include: str
    exclude: str | None = None
    naming: NamingPolicy = NamingPolicy()
    start: BoundSpec = BoundSpec("earliest")
    end: BoundSpec = BoundSpec("latest")
    mode: str = "exactly-once"
    exact_bounds: bool = False
    throttle_mb_s: float | None = None
    accept_loss: bool = False
    link_mb_s: float | None = None  # the source link's rate: the run sizes its fetches for it (backfill_link)
    coalesce_bytes: int = 0  # > 0: runs of small batches merged up to this size (mirror_core.codec.batch_coalesce)

    def __post_init__(self) -> None:
        if not self.pipeline or not self.pipeline.strip():
            raise ConfigError("pipeline name is empty")
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.end.kind not in END_KINDS:
            raise ConfigError(f"end {self.end} is not allowed; the end is latest, a time or topic:partition=offset")
        if self.throttle_mb_s is not None and not (math.isfinite(self.throttle_mb_s) and self.throttle_mb_s > 0):
            raise ConfigError(f"throttle {self.throttle_mb_s!r} MB/s must be a positive number (or none)")
        if self.link_mb_s is not None and not (math.isfinite(self.link_mb_s) and self.link_mb_s > 0):
            raise ConfigError(f"link rate {self.link_mb_s!r} MB/s must be a positive number (or none)")
        checked_coalesce_bytes(self.coalesce_bytes, "coalesce_small_batches")
        if self.start.kind == "timestamp" and self.end.kind == "timestamp" \
                and self.end.timestamp_ms < self.start.timestamp_ms:
            raise ConfigError(f"end {self.end} is before start {self.start}")
        _ = self.include_pattern, self.exclude_pattern  # compile now: a bad regex is refused at the edge

    @classmethod
    def parse(cls, *, pipeline: str, source_cluster: str, target_cluster: str, include: str,
              exclude: str | None = None, naming: str = "identity", start: str = "earliest", end: str = "latest",
              **options) -> PlanRequest:
        """From the strings a CLI or DAG param gives."""
        return cls(pipeline=pipeline, source_cluster=source_cluster, target_cluster=target_cluster,
                   include=include, exclude=exclude or None, naming=NamingPolicy.parse(naming),
                   start=BoundSpec.parse(start, what="start"), end=BoundSpec.parse(end, what="end"), **options)

    @functools.cached_property
    def include_pattern(self) -> TopicPattern:
        return TopicPattern(self.include, "include")

    @functools.cached_property
    def exclude_pattern(self) -> TopicPattern | None:
        return TopicPattern(self.exclude, "exclude") if self.exclude else None

    def to_dict(self) -> dict:
        return {"include": self.include, "exclude": self.exclude, "naming": str(self.naming),
                "start": str(self.start), "end": str(self.end)}


def format_time_ms(ms: int | None) -> str:
    """Milliseconds since the epoch as an ISO-8601 UTC time (``1970-01-01T00:00:07Z``); None: ``-``."""
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")

