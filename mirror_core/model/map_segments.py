"""A lane's offset map in bounded pieces: sealed segments in records of their own, the open tail in the
checkpoint; and what may be pruned (pure).

Why: a source partition with one transaction per second adds a run per record, for ever. Re-encoding the whole
map into every checkpoint makes each commit cost O(all runs) and the checkpoint grows until the broker refuses it
(MESSAGE_TOO_LARGE). So the map is cut into **sealed segments**, each written once as its own compacted record in
the checkpoint topic, in the same transaction as the first checkpoint that references it; a checkpoint carries
only the **open tail** (at most :data:`SEGMENT_RUNS` runs, at most :data:`SEGMENT_BYTES` encoded) and the
:class:`SegmentChain` that names the sealed ones. A commit therefore writes O(new runs), and pruning drops whole
sealed segments (tombstones for their records).

Layout in the checkpoint topic (the partition of the lane's checkpoint key, so a read of one checkpoint refreshes
one partition, and a segment and its checkpoint share a transaction's partition)::

    key    {"map_segment":[pipeline, topic, partition, start]}      JSON
    value  OffsetMap.to_bytes() of the segment: its start, its runs, position = the next segment's start (the
           last one's: the tail's start), target_next = the target offset of the next segment's first record

Invariants of a chain (first, end, count): ``count`` segments, the first starting at ``first``, each one's
position the next one's start, the last one's position ``end`` = the tail's start; runs never straddle a segment
bound. Assembled (segments then tail) they give exactly the map one list of runs would: translation is the same.

Pruning (:func:`prune_floor`): an offset can still be asked for when a consumer group on the source holds it or
when the source still has it (a group may yet commit it). Below both, nothing can ask: sealed segments ending at
or below the floor are dropped. A group's offset at or above the floor keeps every segment it may fall into, so
its translation stays exact; an offset below the map's new start translates to None (declined, with a reason).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRuns

SEGMENT_RUNS = 1024  # seal the open tail once it holds this many runs ...
SEGMENT_BYTES = 6 * 1024  # ... or once its encoding outgrows this; no sealed segment's value is larger either


@dataclass(frozen=True)
class SegmentChain:
    """The sealed segments a checkpoint references: ``count`` records chaining from ``first`` to ``end`` (the
    tail's start). ``starts`` (each segment's start, ascending) is filled in by a reader that walked the chain and
    by a commit; it is not stored (the chain is), so the checkpoint stays the same size however many segments."""

    first: int
    end: int
    count: int
    starts: tuple[int, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.count <= 0 or not 0 <= self.first < self.end:
            raise ValueError(f"invalid segment chain [{self.first}, {self.end}) of {self.count}")
        if self.starts and (len(self.starts) != self.count or self.starts[0] != self.first
                            or any(a >= b for a, b in zip(self.starts, (*self.starts[1:], self.end), strict=True))):
            raise ValueError(f"segment starts {self.starts} do not chain [{self.first}, {self.end})")

    def bounds(self) -> list[tuple[int, int]]:
        """(start, end) of every segment (``starts`` must be known)."""
        return list(zip(self.starts, (*self.starts[1:], self.end), strict=True))

    def as_list(self) -> list[int]:
        return [self.first, self.end, self.count]

    @classmethod
    def from_list(cls, data: Sequence[int] | None) -> SegmentChain | None:
        if data is None:
            return None
        first, end, count = (int(x) for x in data)
        return cls(first, end, count)


def segment_key(pipeline: str, topic: str, partition: int, start: int) -> bytes:
    """The record key of a sealed segment (a JSON object: checkpoint readers skip it, lease readers too)."""
    return json.dumps({"map_segment": [pipeline, topic, partition, start]}, separators=(",", ":")).encode()


def segment_key_prefix(pipeline: str, topic: str, partition: int) -> bytes:
    """What every segment key of one (pipeline, topic, partition) starts with (followed by the start)."""
    key = segment_key(pipeline, topic, partition, 0)
    return key[:key.rindex(b",") + 1]


def split_for_records(segment: OffsetMap, budget: int = SEGMENT_BYTES) -> list[OffsetMap]:
    """``segment`` cut at run bounds into pieces whose encodings fit ``budget`` (a single run always fits)."""
    if len(segment) <= 1 or len(segment.to_bytes()) <= budget:
        return [segment]
    runs = segment.runs
    mid = len(runs) // 2
    cut = runs[mid].source_start
    left = OffsetMap(cut, runs[mid].target_start, runs[:mid], start=segment.start)
    return split_for_records(left, budget) + split_for_records(segment.tail_from(cut), budget)


def prune_floor(log_start: int, group_offsets: Iterable[int]) -> int:
    """The source offset below which nothing can ask for a translation: the lower of the source's log start and
    every offset a consumer group on the source holds for the partition."""
    return min([log_start, *group_offsets])


@dataclass(frozen=True)
class MapCommit:
    """What one commit writes for the map: the checkpoint's tail and chain, new sealed segments, and the starts
    of pruned segments (tombstones)."""

    tail: OffsetMap
    chain: SegmentChain | None
    sealed: tuple[OffsetMap, ...] = ()
    dropped: tuple[int, ...] = ()

    @property
    def start(self) -> int:
        """The lowest source offset the whole map answers for."""
        return self.chain.first if self.chain is not None else self.tail.start


class LaneMap:
    """A lane's offset map as its commit path holds it: the bounds of the sealed segments and the open tail runs.

    Invariants: ``segments`` are (start, end) pairs, ascending and contiguous, the last end == ``tail_start``;
    every run of ``tail_runs`` starts at or above ``tail_start``. The copier appends to ``tail_runs`` (the same
    object for the session's life: :meth:`apply` shortens it in place), so memory holds the tail only.
    """

    def __init__(self, segments: Sequence[tuple[int, int]] = (), tail_runs: OffsetRuns | None = None, *,
                 tail_start: int, segment_runs: int = SEGMENT_RUNS, segment_bytes: int = SEGMENT_BYTES):
        self.segment_runs, self.segment_bytes = segment_runs, segment_bytes
        self.segments = list(segments)
        self.tail_runs = tail_runs if tail_runs is not None else OffsetRuns()
        self.tail_start = tail_start
        if self.segments and self.segments[-1][1] != tail_start:
            raise ValueError(f"segments end at {self.segments[-1][1]}, the tail starts at {tail_start}")
        if self.tail_runs and self.tail_runs[0].source_start < tail_start:
            raise ValueError(f"tail run {self.tail_runs[0]} starts below the tail start {tail_start}")
        starts = tuple(start for start, _end in self.segments)
        self._chain = SegmentChain(starts[0], tail_start, len(starts), starts) if starts else None

    @classmethod
    def from_checkpoint(cls, offset_map: OffsetMap | None, chain: SegmentChain | None, *, start: int) -> LaneMap:
        """The commit-side state of a checkpoint as a reader assembled it (``start``: where a lane without a map
        begins)."""
        if offset_map is None:
            return cls(tail_start=start)
        if chain is None:
            return cls(tail_runs=offset_map.offset_runs(), tail_start=offset_map.start)
        if len(chain.starts) != chain.count:
            raise ValueError("the checkpoint's segment chain was not walked (segment starts unknown)")
        bounds = chain.bounds()
        return cls(bounds, offset_map.tail_from(chain.end).offset_runs(), tail_start=chain.end)

    def include_start(self, offset: int) -> None:
        """A fresh lane's first batch straddled its requested start: the map starts where the copy did."""
        if not self.segments and offset < self.tail_start:
            self.tail_start = offset

    def commit(self, *, position: int, target_next: int, floor: int | None = None) -> MapCommit:
        """Decide what this commit writes (nothing changes until :meth:`apply`): prune sealed segments ending at or
        below ``floor``, then seal the tail if it holds ``segment_runs`` runs or encodes above ``segment_bytes``
        (default :data:`SEGMENT_RUNS`, :data:`SEGMENT_BYTES`). Costs O(tail), never O(all runs)."""
        kept, dropped = self.segments, ()
        if floor is not None:
            n = next((i for i, (_s, end) in enumerate(self.segments) if end > floor), len(self.segments))
            kept, dropped = self.segments[n:], tuple(s for s, _e in self.segments[:n])
        tail = OffsetMap(position, target_next, self.tail_runs, start=self.tail_start)
        sealed: tuple[OffsetMap, ...] = ()
        if len(tail) >= self.segment_runs or (len(tail) and len(tail.to_bytes()) > self.segment_bytes):
            sealed = tuple(split_for_records(tail, self.segment_bytes))
            tail = OffsetMap(position, target_next, (), start=position)
        if not sealed and not dropped:
            return MapCommit(tail, self._chain)  # the common commit: O(tail), the chain as it was
        bounds = [*kept, *((m.start, m.position) for m in sealed)]
        chain = SegmentChain(bounds[0][0], tail.start, len(bounds), tuple(s for s, _e in bounds)) if bounds else None
        return MapCommit(tail, chain, sealed, dropped)

    def apply(self, commit: MapCommit) -> None:
        """Take a written commit's state: sealed runs leave the tail (in place), pruned segments are forgotten."""
        if commit.sealed:
            self.tail_runs.drop_below(commit.tail.start)
        self.tail_start = commit.tail.start
        chain = commit.chain
        if chain is not self._chain:
            self.segments = [] if chain is None else chain.bounds()
            self._chain = chain


def assemble_map(chain: SegmentChain | None, tail: OffsetMap, lookup: Callable[[int], OffsetMap | None]
                 ) -> tuple[OffsetMap, SegmentChain | None]:
    """The whole map: the chain's segments (``lookup(start)``: the segment decoded from its record) then ``tail``;
    and
    the chain with its ``starts`` filled in. Raises ValueError naming the segment when the chain is broken."""
    if chain is None:
        return tail, None
    runs = OffsetRuns()
    start, starts = chain.first, []
    for _ in range(chain.count):
        segment = lookup(start)
        if segment is None:
            raise ValueError(f"map segment at source offset {start} is missing")
        if segment.start != start or segment.position <= start:
            raise ValueError(f"map segment at {start} covers [{segment.start}, {segment.position}): not the chain's")
        runs.extend_checked(segment.offset_runs())
        starts.append(start)
        start = segment.position
    if start != chain.end or tail.start != chain.end:
        raise ValueError(f"map segments end at {start}, the chain says {chain.end}, the tail starts at {tail.start}")
    runs.extend_checked(tail.offset_runs())
    whole = OffsetMap(tail.position, tail.target_next, runs, start=chain.first, lost=tail.lost)
    return whole, SegmentChain(chain.first, chain.end, chain.count, tuple(starts))

