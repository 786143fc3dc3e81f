"""The retention verdict's settings, in one place: the AT_RISK threshold and the copy-capacity assumptions that
turn a backlog into a catch-up ETA. Pure: no I/O.

Every component that says SAFE / AT_RISK / LOSING / LOST — ``shoal deadlines``, the daemon's retention watch, the
Airflow retention check, sensor and guard, the Shoal UI page — builds its verdict from a :class:`RetentionPolicy`
(the defaults below, or a pipeline's ``retention:`` section) through
:func:`mirror_core.services.deadlines.assess_positions`, so the paging path and the page cannot contradict each
other.

A throttle is part of the ETA: a throttled run shares its rate over the streams copying at once, so each stream is
capped at ``throttle / streams`` and more streams never beat the throttle (the capacity's ceiling).

A copy with a declared link rate (``shoal copy|backfill --link-mbps``, a plan's ``link_mb_s``) sizes its fetches
for the measured round trip (:func:`~mirror_core.model.preflight_rules.fetch_bytes_for_link`); its ETA uses the same
figures: that link rate, the measured round trip and the fetch size the copy will use
(:meth:`RetentionPolicy.capacity` with ``link_bytes_per_s``), so the model and the copy agree on a far source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mirror_core.config.durations import parse_duration
from mirror_core.errors import ConfigError
from mirror_core.model.copy_capacity import CopyCapacity
from mirror_core.model.preflight_rules import LINK_EFFICIENCY, fetch_bytes_for_link

DEFAULT_AT_RISK_BELOW_S = 3600.0        # a margin under an hour pages someone
DEFAULT_LINK_BYTES_PER_S = 100e6        # link bandwidth for the estimate, and the ceiling for more streams
DEFAULT_FETCH_BYTES = 4 * 1024 * 1024   # the copier's partition fetch size
MAX_SIZED_FETCH_BYTES = 64 * 1024 * 1024  # a fetch sized for the link stays below this (backfill_link.MAX_ROUND_BYTES)





@dataclass(frozen=True)
class RetentionPolicy:
    """How a retention verdict is reached. ``throughput_bytes_per_s`` None: estimate each stream's throughput from
    the measured round trips (source + target), the fetch size and the link (:meth:`CopyCapacity.estimate`)."""

    at_risk_below_s: float = DEFAULT_AT_RISK_BELOW_S
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    throughput_bytes_per_s: float | None = None
    ingest_sample_s: float = 0.0   # 0: ingest estimated from the retained log (no wait); else sampled this long

    # keys of a pipeline file's ``retention:`` section (and of the Airflow ``retention`` param)
    KEYS = ("at_risk_below", "link_mb_s", "fetch_bytes", "throughput_mb_s", "ingest_sample_s")

    def __post_init__(self) -> None:
        if self.at_risk_below_s < 0 or self.ingest_sample_s < 0:
            raise ConfigError("retention: at_risk_below and ingest_sample_s must not be negative")
        if self.link_bytes_per_s <= 0 or self.fetch_bytes <= 0 or (self.throughput_bytes_per_s or 1) <= 0:
            raise ConfigError("retention: link_mb_s, fetch_bytes and throughput_mb_s must be positive")

    @classmethod
    def from_mapping(cls, raw: Mapping | None, *, where: str = "retention") -> RetentionPolicy:
        """From ``{"at_risk_below": "1h", "link_mb_s": 100, "fetch_bytes": 4194304, "throughput_mb_s": null,
        "ingest_sample_s": 0}`` (every key optional); unknown keys are refused by name."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected a mapping with keys {', '.join(cls.KEYS)}")
        unknown = sorted(set(raw) - set(cls.KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(cls.KEYS)}")

        def number(key: str) -> float | None:
            value = raw.get(key)
            if value is None or value == "":
                return None
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: {key}={value!r} is not a number") from None

        d = cls()
        try:
            return cls(
                at_risk_below_s=d.at_risk_below_s if raw.get("at_risk_below") in (None, "") else parse_duration(
                    raw["at_risk_below"], what=f"{where}: at_risk_below"),
                link_bytes_per_s=(number("link_mb_s") or d.link_bytes_per_s / 1e6) * 1e6,
                fetch_bytes=int(number("fetch_bytes") or d.fetch_bytes),
                throughput_bytes_per_s=None if number("throughput_mb_s") is None else number("throughput_mb_s") * 1e6,
                ingest_sample_s=number("ingest_sample_s") or 0.0)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}" if not str(exc).startswith(where) else str(exc)) from None

    def overridden(self, *, at_risk_below_s: float | None = None, **others: Any) -> RetentionPolicy:
        """A copy with the given fields replaced; None leaves a field as it is."""
        changes = {k: v for k, v in {"at_risk_below_s": at_risk_below_s, **others}.items() if v is not None}
        return replace(self, **changes) if changes else self

    def estimated_capacity(self, rtt_s: float, *, link_bytes_per_s: float | None = None,
                           rtt_how: str = "") -> CopyCapacity:
        """The one capacity recipe: one stream's throughput estimated at round trip ``rtt_s``
        (:meth:`CopyCapacity.estimate`).

        The default assumption, when the copy declares no link: the policy's link rate
        (:data:`DEFAULT_LINK_BYTES_PER_S`, 100 MB/s, unless a pipeline's ``link_mb_s`` says otherwise) and its
        configured fetch size (:data:`DEFAULT_FETCH_BYTES`, the copier's). With a declared ``link_bytes_per_s``:
        that rate, and the fetch size the copy sizes for it at ``rtt_s`` (one stream alone on the link), never
        below the policy's ``fetch_bytes``."""
        if link_bytes_per_s:
            link, link_how = link_bytes_per_s, "declared for the copy"
            fetch = fetch_bytes_for_link(link_bytes_per_s=link_bytes_per_s, rtt_s=rtt_s, partitions=1,
                                         floor=self.fetch_bytes, cap=max(self.fetch_bytes, MAX_SIZED_FETCH_BYTES),
                                         efficiency=LINK_EFFICIENCY)
            fetch_how = "sized for the link" if fetch != self.fetch_bytes else "configured; enough for the link"
        else:  # the default assumption
            link, link_how, fetch, fetch_how = self.link_bytes_per_s, "assumed", self.fetch_bytes, "configured"
        return CopyCapacity.estimate(bandwidth_bytes_per_s=link, rtt_s=rtt_s, fetch_bytes=fetch, rtt_how=rtt_how,
                                     link_how=link_how, fetch_how=fetch_how)

    def capacity(self, rtt_s: float, *, throttle_bytes_per_s: float | None = None, streams: int = 1,
                 link_bytes_per_s: float | None = None, rtt_how: str = "") -> CopyCapacity:
        """One stream's copy throughput; with a throttle shared by ``streams`` streams, capped at its share, and
        never above the throttle however many streams run.

        Unless a throughput was measured, the estimate is :meth:`estimated_capacity`'s (``link_bytes_per_s``: the
        copy's declared link rate). ``rtt_how`` says where ``rtt_s`` came from (shown with the figures)."""
        if self.throughput_bytes_per_s is not None:
            base = CopyCapacity(self.throughput_bytes_per_s, self.link_bytes_per_s,
                                how=f"measured {self.throughput_bytes_per_s / 1e6:.4g} MB/s")
        else:
            base = self.estimated_capacity(rtt_s, link_bytes_per_s=link_bytes_per_s, rtt_how=rtt_how)
        if not throttle_bytes_per_s:
            return base
        share = throttle_bytes_per_s / max(1, streams)
        return CopyCapacity(min(base.bytes_per_s, share), min(base.ceiling_bytes_per_s or throttle_bytes_per_s,
                                                              throttle_bytes_per_s),
                            how=f"{base.how}; throttled to {throttle_bytes_per_s / 1e6:.4g} MB/s over {max(1, streams)}"
                                f" stream(s)", link_bytes_per_s=base.link_bytes_per_s, rtt_s=base.rtt_s,
                            fetch_bytes=base.fetch_bytes)
