"""Copy capacity: how fast a copy drains a backlog (pure).

Copy throughput is measured, or estimated for one copy stream from the round-trip time and the fetch size: each
round trip moves ``D`` bytes in ``RTT + D/B`` seconds over a link of ``B`` bytes/s, ``TP = B·D / (B·RTT + D)``
(:meth:`CopyCapacity.estimate`). More streams scale linearly up to the capacity's ceiling (the link, or a throttle).
Catch-up ETA is ``backlog / (copy throughput - ingest rate)``; never when copying is not faster than ingest.
Which figures an estimate assumes by default is the retention policy's
(:meth:`~mirror_core.model.retention_policy.RetentionPolicy.estimated_capacity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mirror_core.errors import ConfigError


@dataclass(frozen=True)
class CopyCapacity:
    """Copy throughput of one stream for one partition, and the most any number of streams can reach."""

    bytes_per_s: float
    ceiling_bytes_per_s: float | None = None   # e.g. the link bandwidth; None: unknown, streams scale linearly
    how: str = "measured"
    # the figures an estimate used (None: not estimated), for reports: link rate, round trip, fetch size
    link_bytes_per_s: float | None = None
    rtt_s: float | None = None
    fetch_bytes: int | None = None

    @classmethod
    def estimate(cls, *, bandwidth_bytes_per_s: float, rtt_s: float, fetch_bytes: int, link_how: str = "",
                 rtt_how: str = "", fetch_how: str = "") -> CopyCapacity:
        """``TP = B·D / (B·RTT + D)``; the ``*_how`` texts say where each figure came from (shown in ``how``)."""
        def note(text: str) -> str:
            return f" ({text})" if text else ""

        how = (f"estimated: RTT {rtt_s * 1000:.2f} ms{note(rtt_how)}, fetch {fetch_bytes} B{note(fetch_how)}, "
               f"link {bandwidth_bytes_per_s / 1e6:.4g}MB/s{note(link_how)}")
        return cls(estimate_copy_throughput(bandwidth_bytes_per_s, rtt_s, fetch_bytes), bandwidth_bytes_per_s, how=how,
                   link_bytes_per_s=bandwidth_bytes_per_s, rtt_s=rtt_s, fetch_bytes=fetch_bytes)

    def figures(self) -> dict:
        """The estimate's inputs and result, JSON-ready (None where measured rather than estimated)."""
        return {"bytes_per_s": round(self.bytes_per_s, 3),
                "link_bytes_per_s": self.link_bytes_per_s,
                "rtt_ms": None if self.rtt_s is None else round(self.rtt_s * 1000, 3),
                "fetch_bytes": self.fetch_bytes, "how": self.how}

    def with_streams(self, streams: int) -> float:
        rate = self.bytes_per_s * streams
        return rate if self.ceiling_bytes_per_s is None else min(rate, self.ceiling_bytes_per_s)


def estimate_copy_throughput(bandwidth_bytes_per_s: float, rtt_s: float, fetch_bytes: int) -> float:
    """``TP = B·D / (B·RTT + D)``: one request of ``D`` bytes per round trip over a link of ``B`` bytes/s."""
    if bandwidth_bytes_per_s <= 0 or fetch_bytes <= 0 or rtt_s < 0:
        raise ConfigError("bandwidth and fetch size must be positive and the round-trip time not negative")
    b, d = float(bandwidth_bytes_per_s), float(fetch_bytes)
    return b * d / (b * rtt_s + d)


def catch_up_eta(backlog_bytes: int, ingest_bytes_per_s: float, copy_bytes_per_s: float) -> float:
    """Seconds until the copy reaches the log end; 0 when caught up, math.inf when copying is not faster than ingest."""
    if backlog_bytes <= 0:
        return 0.0
    net = copy_bytes_per_s - ingest_bytes_per_s
    return backlog_bytes / net if net > 0 else math.inf


def streams_needed(backlog: int, ingest: float, copy: CopyCapacity, within_s: float) -> int | None:
    """Copy streams so the backlog is copied within ``within_s`` while ingest continues; None if impossible."""
    if within_s <= 0 or copy.bytes_per_s <= 0:
        return None
    required = ingest + (0.0 if math.isinf(within_s) else backlog / within_s)
    n = max(1, math.floor(required / copy.bytes_per_s) + 1)   # strictly faster than required
    return n if copy.with_streams(n) > required else None
