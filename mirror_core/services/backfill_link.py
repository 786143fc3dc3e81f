"""A backfill sized for its link: the fetch size each lane uses, from the declared link rate and the measured round
trip to the source (the sizing ``shoal copy --link-mbps`` does, for lanes that run one partition each).

The driver measures each source broker's round trip once (:func:`measure_backfill_link`, at preflight) and
passes the sized fetch bytes to every lane (:attr:`mirror_core.engine.backfill.LaneJob.fetch_max_bytes`); the units
never measure anything. Why the size: a lane keeps one fetch in flight while it writes the previous one (the prefetch of
:class:`~mirror_core.engine.copier.RangeCopier`), so a lane moves ``D`` bytes per ``RTT + D/B`` and the lanes running at
once share the link: ``TP = B·nD / (B·RTT + nD)`` for ``n`` lanes of ``D`` bytes. 80 % of the link needs ``nD ≥
4·B·RTT`` (:func:`~mirror_core.model.preflight_rules.fetch_bytes_for_link`).

Bounds (DESIGN §3.8, bounded memory): a lane holds about two fetches and its write window
(:attr:`~mirror_core.engine.copier.CopyOptions.budget_bytes`), so the fetches of the lanes that run at once share
``MAX_ROUND_BYTES`` (the same bound as ``shoal copy``'s fetch round); a size is never below the unsized one. A
throttled lane is sized for its share of the throttle, not for the link (it cannot use more), so a throttle keeps
its short-window smoothness as far as the round trip allows.

Pure except :func:`measure_backfill_link`, which does the I/O
(preflight's :func:`~mirror_core.services.preflight.measure_links`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mirror_core.model.preflight_rules import Finding, SourceLink, check_link_buffers, fetch_bytes_for_link

MAX_ROUND_BYTES = 64 * 1024 * 1024  # the fetches of the lanes running at once never exceed this (memory)


@dataclass(frozen=True)
class LinkSizing:
    """What the driver decided for the run's lanes, and from which figures (kept in the run's manifest)."""

    link_mb_s: float
    rtt_ms: float | None          # the largest measured source round trip; None: not measured (sizes unchanged)
    lanes_at_once: int
    fetch_bytes: int              # per lane fetch (the unsized size when the round trip is unknown)
    unsized_fetch_bytes: int

    @property
    def sized(self) -> bool:
        return self.fetch_bytes != self.unsized_fetch_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.rtt_ms is None:
            return (f"link {self.link_mb_s:g} MB/s declared, but no source round trip could be measured: fetches "
                    f"stay at {self.unsized_fetch_bytes / 1e6:.1f} MB per lane")
        return (f"sized for the link: fetches of {self.fetch_bytes / 1e6:.1f} MB per lane (round trip "
                f"{self.rtt_ms:.0f} ms, link {self.link_mb_s:g} MB/s, {self.lanes_at_once} lane(s) at once"
                f"{'' if self.sized else '; the unsized fetch already keeps the link busy'})")


def size_lanes_for_link(*, link_bytes_per_s: float, rtt_s: float | None, lanes_at_once: int, unsized_fetch_bytes: int,
                        throttle_bytes_per_s_per_lane: float | None = None,
                        max_round_bytes: int = MAX_ROUND_BYTES) -> LinkSizing:
    """Per-lane fetch size for ``lanes_at_once`` lanes sharing a link of ``link_bytes_per_s`` at round trip
    ``rtt_s`` (see the module docstring). Pure."""
    if link_bytes_per_s <= 0:
        raise ValueError("the link rate must be positive")
    lanes = max(1, lanes_at_once)
    fetch = unsized_fetch_bytes
    if rtt_s is not None:
        cap = max(unsized_fetch_bytes, max_round_bytes // lanes)
        if throttle_bytes_per_s_per_lane:  # a throttled lane needs its share's window only
            fetch = fetch_bytes_for_link(link_bytes_per_s=min(link_bytes_per_s / lanes, throttle_bytes_per_s_per_lane),
                                         rtt_s=rtt_s, partitions=1, floor=unsized_fetch_bytes, cap=cap)
        else:
            fetch = fetch_bytes_for_link(link_bytes_per_s=link_bytes_per_s, rtt_s=rtt_s, partitions=lanes,
                                         floor=unsized_fetch_bytes, cap=cap)
    return LinkSizing(link_mb_s=link_bytes_per_s / 1e6, rtt_ms=None if rtt_s is None else round(rtt_s * 1000, 3),
                      lanes_at_once=lanes, fetch_bytes=fetch, unsized_fetch_bytes=unsized_fetch_bytes)


def slowest_round_trip_s(links: list[SourceLink]) -> float | None:
    """The largest measured round trip (the far broker paces the lanes it leads); None when none was measured."""
    rtts = [link.rtt_s for link in links if link.rtt_s is not None]
    return max(rtts) if rtts else None


def measure_backfill_link(source, link_bytes_per_s: float, *, lanes_at_once: int, unsized_fetch_bytes: int,
                          throttle_bytes_per_s_per_lane: float | None = None,
                          timeout_s: float = 30.0) -> tuple[LinkSizing, list[Finding]]:
    """Measure the source brokers once (send buffers and round trips) and size the lanes' fetches; the findings
    warn where a broker's socket buffer caps a connection below the link (``check_link_buffers``)."""
    from mirror_core.kafka.round_trips import measure_links

    links = measure_links(source, timeout_s=timeout_s)
    sizing = size_lanes_for_link(link_bytes_per_s=link_bytes_per_s, rtt_s=slowest_round_trip_s(links),
                                 lanes_at_once=lanes_at_once, unsized_fetch_bytes=unsized_fetch_bytes,
                                 throttle_bytes_per_s_per_lane=throttle_bytes_per_s_per_lane)
    return sizing, check_link_buffers(source.name, links, link_bytes_per_s=link_bytes_per_s)
