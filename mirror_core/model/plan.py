"""The backfill plan: the one JSON document the Spark job receives (``version`` 1; fields may be added, never
renamed, so a plan file written by an older Shoal still loads), and its table for ``--dry-run``. Pure: the caller
reads and writes the files; :mod:`mirror_core.model.planner` makes plans.

A work unit is a :class:`~mirror_core.model.ranges.PartitionRange` with what orders it (its bytes estimate and its
retention deadline); ``lane`` and ``unit_id`` are written for readers and checked on load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mirror_core.config.coalescing import checked_coalesce_bytes
from mirror_core.config.plan_request import MODES, format_time_ms
from mirror_core.errors import ConfigError
from mirror_core.model.ranges import PartitionRange

PLAN_VERSION = 1


@dataclass(frozen=True)
class WorkUnit(PartitionRange):
    """One source partition's range ``[start, end)`` and the target partition (lane) it is copied into, with what
    orders it: its size estimate and its retention deadline."""

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
        start, end = _typed(body, "start", int), _typed(body, "end", int)
        if not 0 <= start < end:  # before the range refuses it, so the message names the unit
            raise ConfigError(f"work unit {body['unit_id']!r}: range [{start}, {end}) is empty or negative")
        unit = cls(topic=_typed(body, "topic", str), partition=_typed(body, "partition", int),
                   start=start, end=end,
                   target_topic=_typed(body, "target_topic", str),
                   target_partition=_typed(body, "target_partition", int),
                   bytes_estimate=_typed(body, "bytes_estimate", int),
                   deadline_ms=_typed(body, "deadline_ms", int, optional=True),
                   start_from=_typed(body, "start_from", str) if "start_from" in body else "")
        for key in ("unit_id", "lane"):
            if body[key] != getattr(unit, key):
                raise ConfigError(f"work unit {body[key]!r}: {key} should be {getattr(unit, key)!r}")
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
# link_mb_s, coalesce_bytes: plans written before them have none
_OPTIONAL_PLAN_KEYS = {"empty", "request", "summary", "link_mb_s", "coalesce_bytes"}


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
    coalesce_bytes: int = 0  # > 0: the lanes merge runs of small batches up to this size (a counted deep case)

    def __post_init__(self) -> None:
        checked_coalesce_bytes(self.coalesce_bytes, f"plan {self.plan_id!r}: coalesce_bytes")
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
                "coalesce_bytes": self.coalesce_bytes,
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
                   coalesce_bytes=body.get("coalesce_bytes", 0),
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



# -- presentation ----------------------------------------------------------------------------------------------

def render_plan_table(plan: Plan):
    """The plan as a rich Table (``--dry-run``): units in execution order, then losses and totals as caption."""
    from rich.table import Table

    s = plan.summary()
    table = Table(title=f"plan {plan.plan_id}: {plan.pipeline} {plan.source_cluster} → {plan.target_cluster} "
                        f"({plan.mode}{', exact bounds' if plan.exact_bounds else ''}"
                        f"{f', {plan.throttle_mb_s:g} MB/s' if plan.throttle_mb_s else ''}"
                        f"{f', link {plan.link_mb_s:g} MB/s' if plan.link_mb_s else ''}"
                        f"{f', small batches coalesced up to {plan.coalesce_bytes} B' if plan.coalesce_bytes else ''})")
    for col in ("#", "unit", "start", "end", "offsets", "bytes (est.)", "deadline", "lane", "from"):
        numeric = col in ("#", "start", "end", "offsets", "bytes (est.)")
        table.add_column(col, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for i, u in enumerate(plan.units, 1):
        table.add_row(str(i), u.unit_id, str(u.start), str(u.end), f"{u.offsets:,}", _human_bytes(u.bytes_estimate),
                      format_time_ms(u.deadline_ms) if u.deadline_ms is not None else "-", u.lane, u.start_from)
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

