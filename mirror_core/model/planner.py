"""Backfill planning: which source partitions to copy, from which offset to which, into which target lane, in what
order. Pure: no I/O (:mod:`mirror_core.services.plan_inputs` asks the clusters; the caller writes files).

Flow: a :class:`PlanRequest` (every user input, validated at construction) → :func:`select_topics` against the
source's topic list → the caller gathers :class:`PlanInputs` for those topics → :func:`plan_backfill` → a
:class:`Plan`, the one JSON document the Spark job receives (``version`` 1; fields may be added, never renamed).

- **Selection**: ``include`` / ``exclude`` are regular expressions matched against the *whole* topic name; a comma
  also means "or", like classic MirrorMaker whitelists (``orders,payments\\..*``), except inside ``[...]``,
  ``{...}``, ``(...)`` or after a backslash. Internal topics (``__…``) are selected only when an include
  alternative names them literally. A literal name that does not exist is refused, as is a selection of nothing.
- **Naming**: identity, a prefix (``dr.``) or an explicit map; partitions map one to one, so a work unit's lane
  is ``<target_topic>-<partition>`` and two units never share a lane.
- **Bounds** (:class:`BoundSpec`): start = ``earliest`` | ``latest`` | a time | ``topic:partition=offset,...`` |
  ``checkpoint`` (the pipeline's stored position; a partition without one starts at the log start); end =
  ``latest`` | a time | explicit offsets. "Latest" is the last stable offset (a READ_COMMITTED copy cannot read
  past it). A time is the first offset whose timestamp is at or after it, or the last stable offset if none is.
- **Refusals** (:class:`~mirror_core.errors.ConfigError`, naming the item): bad regex, unknown topic or partition,
  an end before the start or past the last stable offset, and a start below the log start — data already
  deleted — unless ``accept_loss``, which moves the start to the log start and records the lost range.
- **Bytes estimate**: (end - start) × the partition's average bytes per offset, i.e. its size on the leader
  (DescribeLogDirs: segment bytes, aborted data and markers included) over (log end - log start). Approximate on
  compacted or unevenly sized partitions; it orders work and sizes throttles, it is never a bound.
- **Order**: earliest retention deadline first (``deadline_for``, from the retention model); units without a
  deadline follow, larger first. Empty ranges are not units; they are listed in ``empty`` and the summary.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mirror_core.config.positions import parse_position
from mirror_core.errors import ConfigError, DataLossError, PlanDataLossError, SkipRefusedError
from mirror_core.model.preflight_rules import KAFKA_INTERNAL_TOPICS, is_internal_topic, target_topic_name

PLAN_VERSION = 1
MODES = ("exactly-once", "at-least-once")
START_KINDS = ("earliest", "latest", "timestamp", "offsets", "checkpoint")
END_KINDS = ("latest", "timestamp", "offsets")
MAX_TOPIC_NAME = 249
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")

DeadlineFor = Callable[[str, int, int], "int | None"]


# -- topic selection -------------------------------------------------------------------------------------------

def split_alternatives(text: str) -> list[str]:
    """Split a pattern on commas that are not escaped and not inside ``[...]``, ``{...}`` or ``(...)``."""
    parts, current, depth, in_class, i = [], [], 0, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "({":
            depth += 1
        elif ch in ")}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


@dataclass(frozen=True)
class TopicPattern:
    """An include or exclude pattern: regex alternatives, each matched against the whole topic name."""

    text: str
    what: str = "include"
    _regexes: tuple[re.Pattern, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        alternatives = split_alternatives(self.text)
        if not alternatives:
            raise ConfigError(f"{self.what} pattern {self.text!r} is empty")
        compiled = []
        for alt in alternatives:
            try:
                compiled.append(re.compile(alt))
            except re.error as exc:
                raise ConfigError(f"{self.what} pattern {self.text!r}: {alt!r} is not a valid regular expression "
                                  f"({exc})") from None
        object.__setattr__(self, "_regexes", tuple(compiled))

    def matches(self, topic: str) -> bool:
        return any(r.fullmatch(topic) for r in self._regexes)

    @property
    def named(self) -> frozenset[str]:
        """Alternatives that are plain topic names (``\\.`` counts as a dot): they name a topic explicitly."""
        out = set()
        for r in self._regexes:
            plain = re.sub(r"\\(.)", r"\1", r.pattern)
            if _TOPIC_CHARS.fullmatch(plain) and r.fullmatch(plain):
                out.add(plain)
        return frozenset(out)


# -- target naming ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NamingPolicy:
    """How a source topic's name becomes the target's: ``identity``, ``prefix:<p>`` or ``map:<src>=<dst>,...``."""

    kind: str = "identity"
    prefix: str = ""
    mapping: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("identity", "prefix", "map"):
            raise ConfigError(f"naming policy {self.kind!r} is not identity, prefix or map")
        if self.kind == "prefix" and not _TOPIC_CHARS.fullmatch(self.prefix or ""):
            raise ConfigError(f"naming prefix {self.prefix!r} must be non-empty and use only letters, digits, "
                              "'.', '_' and '-'")
        if self.kind == "map":
            if not self.mapping:
                raise ConfigError("naming map is empty; give src=dst pairs")
            sources = [s for s, _ in self.mapping]
            dup = next((s for s in sources if sources.count(s) > 1), None)
            if dup is not None:
                raise ConfigError(f"naming map lists source topic {dup!r} twice")

    @classmethod
    def parse(cls, text: str) -> NamingPolicy:
        value = text.strip()
        if value == "identity":
            return cls()
        kind, sep, rest = value.partition(":")
        if sep and kind == "prefix":
            return cls("prefix", prefix=rest)
        if sep and kind == "map":
            pairs = []
            for item in (p.strip() for p in rest.split(",") if p.strip()):
                src, eq, dst = item.partition("=")
                if not eq or not src.strip() or not dst.strip():
                    raise ConfigError(f"naming map entry {item!r} is not src=dst")
                pairs.append((src.strip(), dst.strip()))
            return cls("map", mapping=tuple(pairs))
        raise ConfigError(f"naming policy {text!r} is not identity, prefix:<prefix> or map:<src>=<dst>,...")

    def target_for(self, topic: str) -> str:
        if self.kind == "identity":
            return topic
        if self.kind == "prefix":
            return target_topic_name(topic, self.prefix)
        target = dict(self.mapping).get(topic)
        if target is None:
            raise ConfigError(f"topic {topic!r} is selected but the naming map has no target for it; add "
                              f"{topic}=<target> or narrow the include pattern")
        return target

    def __str__(self) -> str:
        if self.kind == "prefix":
            return f"prefix:{self.prefix}"
        if self.kind == "map":
            return "map:" + ",".join(f"{s}={d}" for s, d in self.mapping)
        return "identity"


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
            return _iso(self.timestamp_ms)
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


def select_topics(request: PlanRequest, topics: Mapping[str, int]) -> list[str]:
    """The source topics the request selects (``topics``: every topic on the source → partition count), after
    refusing unknown named topics, offsets for unknown or unselected partitions, and unusable target names."""
    cluster = request.source_cluster
    include, exclude = request.include_pattern, request.exclude_pattern
    for name in sorted(include.named):
        if name not in topics:
            raise ConfigError(f"topic {name!r} (named in include {request.include!r}) does not exist on cluster "
                              f"{cluster!r}")
    selected = sorted(t for t in topics if include.matches(t)
                      and (not is_internal_topic(t) or t in include.named)
                      and not (exclude and exclude.matches(t)))
    if not selected:
        raise ConfigError(f"include {request.include!r}{_excluding(request)} selects no topic on cluster "
                          f"{cluster!r} (patterns match whole names; internal topics must be named)")
    for bound, what in ((request.start, "start"), (request.end, "end")):
        for topic, partition, _offset in bound.offsets:
            if topic not in topics:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} does not exist on cluster {cluster!r}")
            if topic not in selected:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} is not selected by include "
                                  f"{request.include!r}{_excluding(request)}")
            if partition >= topics[topic]:
                raise ConfigError(f"{what} {topic}:{partition}: topic {topic!r} on cluster {cluster!r} has "
                                  f"partitions 0..{topics[topic] - 1}")
    for src, _dst in request.naming.mapping:
        if src not in topics:
            raise ConfigError(f"naming map entry {src!r}: topic does not exist on cluster {cluster!r}")
    _check_targets(request, selected)
    return selected


def _check_targets(request: PlanRequest, selected: Iterable[str]) -> None:
    owners: dict[str, str] = {}
    for topic in selected:
        target = request.naming.target_for(topic)
        if not _TOPIC_CHARS.fullmatch(target) or target in (".", "..") or len(target) > MAX_TOPIC_NAME:
            raise ConfigError(f"topic {topic!r}: target name {target!r} is not a valid Kafka topic name")
        if target in KAFKA_INTERNAL_TOPICS:
            raise ConfigError(f"topic {topic!r}: target {target!r} is one of Kafka's own state logs and the broker "
                              "refuses client writes to it; use a prefix (e.g. prefix:dr.) or a map")
        if target in owners:
            raise ConfigError(f"topics {owners[target]!r} and {topic!r} would both be copied to target {target!r}")
        owners[target] = topic


def _excluding(request: PlanRequest) -> str:
    return f" excluding {request.exclude!r}" if request.exclude else ""


# -- what the clusters said ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointPosition:
    """A pipeline's stored position for one source partition and where it was copying to."""

    position: int
    target_topic: str
    target_partition: int


@dataclass(frozen=True)
class PartitionState:
    """One source partition at plan time. ``start_time_offset`` / ``end_time_offset`` answer ListOffsets for the
    request's start / end time (None: no record at or after it); ``size_bytes`` None when DescribeLogDirs failed."""

    topic: str
    partition: int
    log_start: int
    last_stable: int
    log_end: int
    size_bytes: int | None = None
    start_time_offset: int | None = None
    end_time_offset: int | None = None
    checkpoint: CheckpointPosition | None = None

    @property
    def bytes_per_offset(self) -> float:
        span = self.log_end - self.log_start
        return self.size_bytes / span if self.size_bytes and span > 0 else 0.0


@dataclass(frozen=True)
class PlanInputs:
    """``topics``: every topic on the source → partition count; ``partitions``: a state per selected partition."""

    topics: Mapping[str, int]
    partitions: Mapping[tuple[str, int], PartitionState]


# -- the plan --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkUnit:
    """One source partition's range ``[start, end)`` and the target partition (lane) it is copied into."""

    topic: str
    partition: int
    start: int
    end: int
    target_topic: str
    target_partition: int
    bytes_estimate: int
    deadline_ms: int | None = None
    start_from: str = ""  # what the start resolved from: "earliest", "checkpoint", "log start (accept-loss)", ...

    @property
    def unit_id(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def lane(self) -> str:
        return f"{self.target_topic}-{self.target_partition}"

    @property
    def offsets(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"unit_id": self.unit_id, "topic": self.topic, "partition": self.partition, "start": self.start,
                "end": self.end, "target_topic": self.target_topic, "target_partition": self.target_partition,
                "lane": self.lane, "bytes_estimate": self.bytes_estimate, "deadline_ms": self.deadline_ms,
                "start_from": self.start_from}

    @classmethod
    def from_dict(cls, body: Mapping) -> WorkUnit:
        _check_keys(body, _UNIT_KEYS, {"start_from"}, "work unit")
        unit = cls(topic=_typed(body, "topic", str), partition=_typed(body, "partition", int),
                   start=_typed(body, "start", int), end=_typed(body, "end", int),
                   target_topic=_typed(body, "target_topic", str),
                   target_partition=_typed(body, "target_partition", int),
                   bytes_estimate=_typed(body, "bytes_estimate", int),
                   deadline_ms=_typed(body, "deadline_ms", int, optional=True),
                   start_from=_typed(body, "start_from", str) if "start_from" in body else "")
        for key in ("unit_id", "lane"):
            if body[key] != getattr(unit, key):
                raise ConfigError(f"work unit {body[key]!r}: {key} should be {getattr(unit, key)!r}")
        if not 0 <= unit.start < unit.end:
            raise ConfigError(f"work unit {unit.unit_id!r}: range [{unit.start}, {unit.end}) is empty or negative")
        return unit


@dataclass(frozen=True)
class LossRange:
    """Offsets ``[lost_start, lost_end)`` the request asked for that the source had already deleted."""

    topic: str
    partition: int
    lost_start: int
    lost_end: int

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "lost_start": self.lost_start,
                "lost_end": self.lost_end}

    @classmethod
    def from_dict(cls, body: Mapping) -> LossRange:
        _check_keys(body, ("topic", "partition", "lost_start", "lost_end"), set(), "loss")
        return cls(_typed(body, "topic", str), _typed(body, "partition", int), _typed(body, "lost_start", int),
                   _typed(body, "lost_end", int))


@dataclass(frozen=True)
class EmptyRange:
    """A selected partition with nothing to copy (start == end): not a unit, but counted and shown."""

    topic: str
    partition: int
    offset: int

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}

    @classmethod
    def from_dict(cls, body: Mapping) -> EmptyRange:
        _check_keys(body, ("topic", "partition", "offset"), set(), "empty range")
        return cls(_typed(body, "topic", str), _typed(body, "partition", int), _typed(body, "offset", int))


_UNIT_KEYS = ("unit_id", "topic", "partition", "start", "end", "target_topic", "target_partition", "lane",
              "bytes_estimate", "deadline_ms")
_PLAN_KEYS = ("version", "plan_id", "pipeline", "created_ms", "source_cluster", "target_cluster", "mode",
              "exact_bounds", "throttle_mb_s", "accept_loss", "units", "losses")
_OPTIONAL_PLAN_KEYS = {"empty", "request", "summary", "link_mb_s"}  # link_mb_s: plans written before it have none


@dataclass(frozen=True)
class Plan:
    """A backfill plan. Invariants: units are non-empty ranges in execution order (earliest deadline first, then
    larger first), one unit per source partition and per lane; ``losses`` are ranges already deleted that the
    plan skips because ``accept_loss`` was given; ``empty`` are selected partitions with nothing to copy."""

    plan_id: str
    pipeline: str
    created_ms: int
    source_cluster: str
    target_cluster: str
    mode: str
    exact_bounds: bool
    throttle_mb_s: float | None
    accept_loss: bool
    units: tuple[WorkUnit, ...]
    losses: tuple[LossRange, ...] = ()
    empty: tuple[EmptyRange, ...] = ()
    request: Mapping[str, str | None] | None = None
    version: int = PLAN_VERSION
    link_mb_s: float | None = None  # the source link's rate: the run sizes its fetches for it (backfill_link)

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise ConfigError(f"plan version {self.version!r} is not supported (this Shoal reads {PLAN_VERSION})")
        if self.mode not in MODES:
            raise ConfigError(f"plan {self.plan_id!r}: mode {self.mode!r} is not one of {', '.join(MODES)}")
        for attr in ("unit_id", "lane"):
            seen: set[str] = set()
            for unit in self.units:
                if getattr(unit, attr) in seen:
                    raise ConfigError(f"plan {self.plan_id!r}: two work units share {attr} {getattr(unit, attr)!r}")
                seen.add(getattr(unit, attr))

    def summary(self) -> dict:
        return {"units": len(self.units), "empty": len(self.empty), "partitions": len(self.units) + len(self.empty),
                "offsets": sum(u.offsets for u in self.units),
                "bytes_estimate": sum(u.bytes_estimate for u in self.units),
                "losses": len(self.losses), "lost_offsets": sum(x.lost_end - x.lost_start for x in self.losses)}

    def to_dict(self) -> dict:
        return {"version": self.version, "plan_id": self.plan_id, "pipeline": self.pipeline,
                "created_ms": self.created_ms, "source_cluster": self.source_cluster,
                "target_cluster": self.target_cluster, "mode": self.mode, "exact_bounds": self.exact_bounds,
                "throttle_mb_s": self.throttle_mb_s, "link_mb_s": self.link_mb_s, "accept_loss": self.accept_loss,
                "units": [u.to_dict() for u in self.units], "losses": [x.to_dict() for x in self.losses],
                "empty": [e.to_dict() for e in self.empty],
                "request": None if self.request is None else dict(self.request), "summary": self.summary()}

    @classmethod
    def from_dict(cls, body: Mapping) -> Plan:
        if not isinstance(body, Mapping):
            raise ConfigError("a plan must be a JSON object")
        _check_keys(body, _PLAN_KEYS, _OPTIONAL_PLAN_KEYS, "plan")
        throttle, link = body["throttle_mb_s"], body.get("link_mb_s")
        for key, value in (("throttle_mb_s", throttle), ("link_mb_s", link)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"plan field {key!r} must be a number or null, got {value!r} (a rate: above 0)")
        return cls(version=_typed(body, "version", int), plan_id=_typed(body, "plan_id", str),
                   pipeline=_typed(body, "pipeline", str), created_ms=_typed(body, "created_ms", int),
                   source_cluster=_typed(body, "source_cluster", str),
                   target_cluster=_typed(body, "target_cluster", str), mode=_typed(body, "mode", str),
                   exact_bounds=_typed(body, "exact_bounds", bool), accept_loss=_typed(body, "accept_loss", bool),
                   throttle_mb_s=None if throttle is None else float(throttle),
                   link_mb_s=None if link is None else float(link),
                   units=tuple(WorkUnit.from_dict(u) for u in _typed(body, "units", list)),
                   losses=tuple(LossRange.from_dict(x) for x in _typed(body, "losses", list)),
                   empty=tuple(EmptyRange.from_dict(e) for e in body.get("empty", [])),
                   request=body.get("request"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"plan is not valid JSON: {exc}") from None
        return cls.from_dict(body)


def _check_keys(body: Mapping, required: Iterable[str], optional: set[str], what: str) -> None:
    if not isinstance(body, Mapping):
        raise ConfigError(f"{what} must be a JSON object, got {body!r}")
    required = tuple(required)
    unknown = sorted(set(body) - set(required) - optional)
    if unknown:
        raise ConfigError(f"{what} has unknown field {unknown[0]!r}")
    missing = [k for k in required if k not in body]
    if missing:
        raise ConfigError(f"{what} lacks field {missing[0]!r}")


def _typed(body: Mapping, key: str, kind: type, *, optional: bool = False):
    value = body[key]
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"field {key!r} must be {kind.__name__}{' or null' if optional else ''}, got {value!r}")
    return value


# -- planning --------------------------------------------------------------------------------------------------

def plan_backfill(request: PlanRequest, inputs: PlanInputs, *, deadline_for: DeadlineFor | None = None,
                  created_ms: int | None = None, plan_id: str | None = None) -> Plan:
    """The plan for ``request`` given what the source said (``inputs``); see the module docstring for the rules.

    ``deadline_for(topic, partition, start_offset)`` gives the retention deadline in ms since the epoch (None:
    no deadline); without it units are ordered by size alone.
    """
    created_ms = int(time.time() * 1000) if created_ms is None else created_ms
    units, losses, empty = [], [], []
    for topic in select_topics(request, inputs.topics):
        target = request.naming.target_for(topic)
        for partition in range(inputs.topics[topic]):
            state = inputs.partitions.get((topic, partition))
            if state is None:
                raise ValueError(f"plan inputs lack partition {topic}-{partition}")
            start, end, start_from, lost = resolve_unit_range(request, state, target)
            if lost is not None:
                losses.append(lost)
            if start == end:
                empty.append(EmptyRange(topic, partition, start))
                continue
            deadline = deadline_for(topic, partition, start) if deadline_for is not None else None
            units.append(WorkUnit(topic, partition, start, end, target, partition,
                                  bytes_estimate=round((end - start) * state.bytes_per_offset),
                                  deadline_ms=None if deadline is None else int(deadline), start_from=start_from))
    return Plan(plan_id=plan_id or _new_plan_id(request.pipeline, created_ms), pipeline=request.pipeline,
                created_ms=created_ms, source_cluster=request.source_cluster, target_cluster=request.target_cluster,
                mode=request.mode, exact_bounds=request.exact_bounds, throttle_mb_s=request.throttle_mb_s,
                link_mb_s=request.link_mb_s, accept_loss=request.accept_loss, units=tuple(order_units(units)),
                losses=tuple(losses), empty=tuple(empty), request=request.to_dict())


def order_units(units: Iterable[WorkUnit]) -> list[WorkUnit]:
    """Earliest deadline first; units without a deadline after those with one, larger first; then by name."""
    def key(u: WorkUnit):
        has_deadline = u.deadline_ms is not None
        return (not has_deadline, u.deadline_ms if has_deadline else 0, -u.bytes_estimate, u.topic, u.partition)

    return sorted(units, key=key)


def resolve_unit_range(request: PlanRequest, state: PartitionState,
                       target_topic: str) -> tuple[int, int, str, LossRange | None]:
    """``(start, end, start_from, loss)`` for one partition, refusing what cannot be planned."""
    where = f"cluster {request.source_cluster!r} {state.topic}-{state.partition}"
    start, start_from = _resolve_start(request, state, target_topic, where)
    end = _resolve_end(request, state, where)
    if start > state.log_end:
        raise ConfigError(f"{where}: start {request.start} = offset {start} is past the log end {state.log_end}")
    if end < start:
        raise ConfigError(f"{where}: end {request.end} = offset {end} is before start {request.start} = offset "
                          f"{start}")
    lost = None
    if start < state.log_start:
        if not request.accept_loss:
            raise PlanDataLossError(request.source_cluster, state.topic, state.partition, start, state.log_start,
                                    request.start)
        lost = LossRange(state.topic, state.partition, start, min(state.log_start, end))
        start, start_from = min(state.log_start, end), "log start (accept-loss)"
    skipped = _skipped_past_checkpoint(request, state, target_topic, start)
    if skipped is not None:
        first = skipped.lost_start if lost is None else min(lost.lost_start, skipped.lost_start)
        lost = LossRange(state.topic, state.partition, first, skipped.lost_end)
        start_from = f"{start_from}, past the checkpoint (accept-loss)"
    return start, end, start_from, lost


def _skipped_past_checkpoint(request: PlanRequest, state: PartitionState, target_topic: str,
                             start: int) -> LossRange | None:
    """A start past the pipeline's checkpoint skips ``[checkpoint, start)``, which was never copied: refused as
    data loss (deleted on the source) or as a skip (still there), unless ``accept_loss``; then the range to
    record. The lane refuses the same at run time (:meth:`LaneSession.copy`); the plan says it first."""
    checkpoint = state.checkpoint
    if checkpoint is None or start <= checkpoint.position or \
            (checkpoint.target_topic, checkpoint.target_partition) != (target_topic, state.partition):
        return None
    if not request.accept_loss:
        if state.log_start > checkpoint.position:
            raise DataLossError(request.source_cluster, state.topic, state.partition, checkpoint.position,
                                state.log_start)
        raise SkipRefusedError(request.source_cluster, state.topic, state.partition, checkpoint.position, start)
    return LossRange(state.topic, state.partition, checkpoint.position, start)


def _resolve_start(request: PlanRequest, state: PartitionState, target_topic: str, where: str) -> tuple[int, str]:
    spec = request.start
    if spec.kind == "earliest":
        return state.log_start, "earliest"
    if spec.kind == "latest":
        return state.last_stable, "latest"
    if spec.kind == "timestamp":
        found = state.start_time_offset
        # No record at or after the time yet, or only inside an open transaction: nothing to copy now.
        return (state.last_stable if found is None else min(found, state.last_stable)), "timestamp"
    if spec.kind == "offsets":
        offset = spec.offset_for(state.topic, state.partition)
        if offset is None:
            raise ConfigError(f"{where}: start {spec} gives no offset for this partition; list every selected "
                              f"partition ({state.topic}:{state.partition}=<offset>)")
        return offset, "offset"
    checkpoint = state.checkpoint
    if checkpoint is None:
        return state.log_start, "earliest (no checkpoint)"
    if (checkpoint.target_topic, checkpoint.target_partition) != (target_topic, state.partition):
        raise ConfigError(f"{where}: pipeline {request.pipeline!r} checkpointed a copy to "
                          f"{checkpoint.target_topic}-{checkpoint.target_partition}, but this plan targets "
                          f"{target_topic}-{state.partition}; use the pipeline's naming policy or a new pipeline")
    if checkpoint.position > state.log_end:
        raise ConfigError(f"{where}: pipeline {request.pipeline!r} checkpoint position {checkpoint.position} is past "
                          f"the log end {state.log_end} (source topic truncated or recreated?)")
    return checkpoint.position, "checkpoint"


def _resolve_end(request: PlanRequest, state: PartitionState, where: str) -> int:
    spec = request.end
    if spec.kind == "latest":
        return state.last_stable
    if spec.kind == "timestamp":
        found = state.end_time_offset
        end = state.last_stable if found is None else found
    else:
        end = spec.offset_for(state.topic, state.partition)
        if end is None:
            raise ConfigError(f"{where}: end {spec} gives no offset for this partition; list every selected "
                              f"partition ({state.topic}:{state.partition}=<offset>)")
    if end > state.last_stable:
        raise ConfigError(f"{where}: end {spec} = offset {end} is past the last stable offset {state.last_stable} "
                          "(an open transaction, or data not written yet); end at latest or retry later")
    return end


def _new_plan_id(pipeline: str, created_ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(created_ms / 1000, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{pipeline}.{stamp}.{uuid.uuid4().hex[:6]}"


# -- presentation ----------------------------------------------------------------------------------------------

def render_plan_table(plan: Plan):
    """The plan as a rich Table (``--dry-run``): units in execution order, then losses and totals as caption."""
    from rich.table import Table

    s = plan.summary()
    table = Table(title=f"plan {plan.plan_id}: {plan.pipeline} {plan.source_cluster} → {plan.target_cluster} "
                        f"({plan.mode}{', exact bounds' if plan.exact_bounds else ''}"
                        f"{f', {plan.throttle_mb_s:g} MB/s' if plan.throttle_mb_s else ''}"
                        f"{f', link {plan.link_mb_s:g} MB/s' if plan.link_mb_s else ''})")
    for col in ("#", "unit", "start", "end", "offsets", "bytes (est.)", "deadline", "lane", "from"):
        numeric = col in ("#", "start", "end", "offsets", "bytes (est.)")
        table.add_column(col, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for i, u in enumerate(plan.units, 1):
        table.add_row(str(i), u.unit_id, str(u.start), str(u.end), f"{u.offsets:,}", _human_bytes(u.bytes_estimate),
                      _iso(u.deadline_ms) if u.deadline_ms is not None else "-", u.lane, u.start_from)
    lines = [f"{s['units']} units, {s['offsets']:,} offsets, ~{_human_bytes(s['bytes_estimate'])}; "
             f"{s['empty']} empty partition(s) skipped"]
    for x in plan.losses:
        lines.append(f"[red]lost[/] {x.topic}-{x.partition} [{x.lost_start}, {x.lost_end}) "
                     f"({x.lost_end - x.lost_start:,} offsets, accept-loss)")
    table.caption = "\n".join(lines)
    return table


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat().replace("+00:00", "Z")
