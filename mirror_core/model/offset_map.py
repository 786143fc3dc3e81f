"""The partition's offset map (pure): the runs of constant shift the copier recorded
(:mod:`mirror_core.model.offset_runs`: exact or nothing) and what the copy position knows.

:class:`OffsetMap` adds to the runs what the copy position knows, so it can answer for every source offset a
consumer group may have committed: the exact target offset of a copied record, the next copied record's target
offset for an offset in a gap, the target's next offset for the copy position itself, and None for anything it
cannot vouch for (never a guess: guessing high loses data, guessing low duplicates it).

Checkpoint encoding (:meth:`OffsetMap.to_bytes`), version 1::

    byte 0      version (1)
    bytes 1..   zlib(payload)
    payload     uvarint start
                uvarint n                          number of runs
                n x uvarint source_gap             run.source_start - previous run's source_end (first: - start)
                n x uvarint length                 run.source_end - run.source_start
                n x svarint shift_delta            run.shift - previous run's shift (first: - 0), zigzag
                uvarint position_gap               position - last run's source_end (no runs: - start)
                uvarint target_gap                 target_next - last run's target_end (no runs: - 0)

Columns rather than rows, so zlib sees a column of identical marker gaps and identical shift deltas as the
near-nothing it is; a partition with 10,000 single-marker transactions encodes in a few KiB.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from mirror_core.model.offset_runs import OffsetRun, OffsetRuns

ENCODING_VERSION = 1


class OffsetMap:
    """The exact source→target offset map of one mirrored partition, as far as the copy has got.

    State: merged :class:`OffsetRuns`, ``start`` (the lowest source offset the map answers for: where copying
    began, or the prune point), ``position`` (the next source offset to copy) and ``target_next`` (the target
    offset the next copied record will get: the target's log end offset as the mirror left it).

    Invariants (checked on every change; a refused change raises ValueError before touching the map, run by run
    in :meth:`add_batch` and :meth:`extend`):

    - ``0 <= start <= position`` and ``target_next >= 0``;
    - runs are sorted, merged and strictly increasing in source and target offsets (:class:`OffsetRuns`);
    - every run lies in ``[start, position)`` on the source side (:meth:`prune` stops ``start`` at the
      ``source_start`` of a run it keeps) and ends at or below ``target_next`` on the target side;
    - ``position`` and ``target_next`` never go backwards, and a new run never starts below them: offsets the
      map has already answered for (as gaps) are never re-answered differently.

    :meth:`translate` answers, for a source offset ``s``:

    - ``start <= s < position`` inside a run: the exact target offset of that record;
    - ``start <= s < position`` in a gap (marker, aborted data, compaction hole, or offsets before the first
      copied record): the target offset of the next copied record, or ``target_next`` if no record was copied
      after ``s``. A consumer that committed ``s`` has read everything before it; it resumes on the target at
      the first record it has not read, and what lies between was never data it could see;
    - ``s == position``: ``target_next`` (a caught-up consumer group commits exactly that);
    - ``s > position`` (not copied yet) or ``s < start`` (pruned, or before the copy began): None;
    - ``s`` inside a ``lost`` range (deleted on the source before it was copied, accepted by an operator), or in
      a gap whose next record lies in a lost range: None. Those records never reached the target, so no target
      offset resumes a consumer "just before" them: translation declines rather than silently skipping them.

    :meth:`inverse` is the mirror image for target offsets (failback): the exact source offset of a copied
    record; for a target gap (the mirror's own transaction markers) the next copied record's source offset, or
    ``position`` after the last run; ``target_next`` → ``position``; below the first run's target offset or
    above ``target_next``: None.
    """

    def __init__(self, position: int, target_next: int, runs: Iterable[OffsetRun] = (), *,
                 start: int | None = None, lost: Iterable[tuple[int, int]] = ()):
        self._runs = OffsetRuns(runs)  # a copy: the caller's OffsetRuns stays theirs
        first = self._runs[0].source_start if self._runs else position
        self._start = first if start is None else start
        self._position = position
        self._target_next = target_next
        self._lost = normalise_ranges(lost)
        self._check()

    def with_lost(self, lost: Iterable[tuple[int, int]]) -> OffsetMap:
        """The same map with ``lost`` as its accepted-loss ranges (kept outside the binary encoding: the
        checkpoint stores them in a field of its own)."""
        return OffsetMap(self._position, self._target_next, self._runs, start=self._start, lost=lost)

    @classmethod
    def from_runs(cls, runs: Iterable[OffsetRun], *, start: int, position: int, target_next: int) -> OffsetMap:
        """A map from a copy's results, e.g. ``CopyResult``'s ``offset_runs``, ``source_start``, ``source_end``
        and ``next_target_offset``."""
        return cls(position, target_next, runs, start=start)

    def _check(self) -> None:
        if self._start < 0 or self._target_next < 0:
            raise ValueError(f"negative offsets in {self!r}")
        if self._start > self._position:
            raise ValueError(f"start {self._start} is above position {self._position}")
        if self._runs:
            first, last = self._runs[0], self._runs[-1]
            if first.source_start < self._start:
                raise ValueError(f"run {first} starts below start {self._start}")
            if last.source_end > self._position:
                raise ValueError(f"run {last} ends above position {self._position}")
            if last.target_end > self._target_next:
                raise ValueError(f"run {last} ends above target_next {self._target_next}")
        for lo, hi in self._lost:
            i = self._runs.index_from_source(lo)
            if i < len(self._runs) and self._runs[i].source_start < hi:
                raise ValueError(f"lost range [{lo}, {hi}) overlaps copied run {self._runs[i]}")

    # -- reading ---------------------------------------------------------------------------------------------

    @property
    def start(self) -> int:
        return self._start

    @property
    def position(self) -> int:
        return self._position

    @property
    def target_next(self) -> int:
        return self._target_next

    @property
    def runs(self) -> tuple[OffsetRun, ...]:
        return tuple(self._runs)

    def offset_runs(self) -> OffsetRuns:
        """A copy of the runs as :class:`OffsetRuns` (a list copy: no re-validation)."""
        return self._runs.tail(0)

    @property
    def lost(self) -> tuple[tuple[int, int], ...]:
        """Accepted-loss source ranges ``[start, end)``: never copied, never translated into."""
        return self._lost

    def lost_range_at(self, source_offset: int) -> tuple[int, int] | None:
        """The lost range a consumer committed at ``source_offset`` would read into next, if any: the one holding
        it, or the first one above it when no copied record lies in between."""
        following = next(((lo, hi) for lo, hi in self._lost if hi > source_offset), None)
        if following is None or following[0] <= source_offset:
            return following
        i = self._runs.index_from_source(source_offset)
        next_copied = self._runs[i].source_start if i < len(self._runs) else None
        reads_copied_first = next_copied is not None and next_copied < following[0]
        return None if reads_copied_first else following

    def __iter__(self) -> Iterator[OffsetRun]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetMap) and (self._start, self._position, self._target_next, self._runs,
                                                 self._lost) == (other._start, other._position, other._target_next,
                                                                 other._runs, other._lost)

    def __repr__(self) -> str:
        lost = f", lost={list(self._lost)!r}" if self._lost else ""
        return (f"OffsetMap(start={self._start}, position={self._position}, target_next={self._target_next}, "
                f"runs={self._runs.as_tuples()!r}{lost})")

    def translate(self, source_offset: int) -> int | None:
        """The target offset a consumer committed at ``source_offset`` resumes from; None when not vouched for."""
        if source_offset < self._start or source_offset > self._position:
            return None
        if self._lost and self.lost_range_at(source_offset) is not None:
            return None
        i = self._runs.index_from_source(source_offset)
        if i == len(self._runs):
            return self._target_next
        run = self._runs[i]
        in_run = run.source_start <= source_offset
        return source_offset + run.shift if in_run else run.target_start

    def inverse(self, target_offset: int) -> int | None:
        """The source offset matching ``target_offset`` (see the class docstring); None when not vouched for."""
        if target_offset == self._target_next:
            return self._position
        if target_offset > self._target_next or not self._runs or target_offset < self._runs[0].target_start:
            return None
        i = self._runs.index_from_target(target_offset)
        if i == len(self._runs):
            return self._position
        run = self._runs[i]
        in_run = run.target_start <= target_offset
        return target_offset - run.shift if in_run else run.source_start

    def as_tuples(self) -> list[tuple[int, int, int]]:
        """The runs as ``(source_start, source_end, target_start)``."""
        return self._runs.as_tuples()

    def tail_from(self, source_offset: int) -> OffsetMap:
        """The map from ``source_offset`` on (a segment bound: no run may straddle it): same position,
        ``target_next`` and lost ranges; costs the size of the tail, not of the map."""
        if not self._start <= source_offset <= self._position:
            raise ValueError(f"cut at {source_offset} lies outside [{self._start}, {self._position}]")
        i = self._runs.index_from_source(source_offset)
        if i < len(self._runs) and self._runs[i].source_start < source_offset:
            raise ValueError(f"run {self._runs[i]} straddles the cut at {source_offset}")
        return OffsetMap(self._position, self._target_next, self._runs.tail(i), start=source_offset,
                         lost=self._lost)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form of the whole map."""
        return {"start": self._start, "position": self._position, "target_next": self._target_next,
                "runs": [list(t) for t in self.as_tuples()], "lost": [list(r) for r in self._lost]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffsetMap:
        unknown = set(data) - {"start", "position", "target_next", "runs", "lost"}
        if unknown:
            raise ValueError(f"unknown offset map keys {sorted(unknown)}")
        runs = (OffsetRun(int(s), int(e), int(t)) for s, e, t in data["runs"])
        return cls(int(data["position"]), int(data["target_next"]), runs, start=int(data["start"]),
                   lost=data.get("lost", ()))

    # -- growing and shrinking -------------------------------------------------------------------------------

    def _append(self, run: OffsetRun) -> None:
        if run.source_start < self._position or run.target_start < self._target_next:
            raise ValueError(f"run {run} starts below the map's position {self._position} or target_next "
                             f"{self._target_next}: those offsets were already accounted for")
        self._runs.append(run)
        self._position = run.source_end
        self._target_next = run.target_end

    def add_batch(self, target_base: int, runs_in_batch: Iterable[tuple[int, int, int]], *,
                  source_next: int | None = None) -> None:
        """Add a written batch: ``(source_offset, target_delta, length)`` runs relative to ``target_base`` (as
        ``PreparedBatch.offset_runs()``); ``source_next`` (``PreparedBatch.source_next_offset``) moves the
        position over compaction holes at the batch's end."""
        for source_offset, delta, length in runs_in_batch:
            self._append(OffsetRun(source_offset, source_offset + length, target_base + delta))
        if source_next is not None:
            self.advance(source_next)

    def extend(self, runs: Iterable[OffsetRun], *, position: int, target_next: int | None = None) -> None:
        """Append a later copy's runs (e.g. a ``CopyResult``), then advance to its ``source_end``/next target."""
        for run in runs:
            self._append(run)
        self.advance(position, target_next)

    def mark_lost(self, start: int, end: int) -> None:
        """Record ``[start, end)`` as an accepted loss and move the position past it (it lies at or above the
        position: everything below was copied)."""
        if start < self._position:
            raise ValueError(f"lost range [{start}, {end}) starts below the position {self._position}")
        self.advance(end)
        self._lost = normalise_ranges(self._lost + ((start, end),))

    def advance(self, position: int, target_next: int | None = None) -> None:
        """Move the copy position over offsets that carried nothing to copy (markers, aborted data, holes), and
        ``target_next`` over offsets the mirror itself used on the target (its transaction markers)."""
        target_next = self._target_next if target_next is None else target_next
        if position < self._position or target_next < self._target_next:
            raise ValueError(f"advance to ({position}, {target_next}) goes back from "
                             f"({self._position}, {self._target_next})")
        self._position, self._target_next = position, target_next

    def prune(self, below_source_offset: int) -> int:
        """Forget source offsets below ``below_source_offset`` (no consumer needs them any more): runs entirely
        below go, a straddling run stays whole. Offsets at or above the prune point translate as before; offsets
        below the new ``start`` translate to None. Returns how many runs went."""
        below = min(below_source_offset, self._position)
        if below <= self._start:
            return 0
        dropped = self._runs.drop_below(below)
        self._start = min(below, self._runs[0].source_start) if self._runs else below
        self._lost = tuple((lo, hi) for lo, hi in self._lost if hi > self._start)
        return dropped

    # -- checkpoint encoding ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Compact, versioned encoding for the checkpoint store (layout in the module docstring)."""
        out = bytearray()
        _put_uvarint(out, self._start)
        _put_uvarint(out, len(self._runs))
        source_end, shift, target_end = self._start, 0, 0
        for run in self._runs:
            _put_uvarint(out, run.source_start - source_end)
            source_end = run.source_end
        for run in self._runs:
            _put_uvarint(out, run.length)
        for run in self._runs:
            _put_uvarint(out, _zigzag(run.shift - shift))
            shift = run.shift
        if self._runs:
            target_end = self._runs[-1].target_end
        _put_uvarint(out, self._position - source_end)
        _put_uvarint(out, self._target_next - target_end)
        return bytes([ENCODING_VERSION]) + zlib.compress(bytes(out), 9)

    @classmethod
    def from_bytes(cls, data: bytes) -> OffsetMap:
        if not data:
            raise ValueError("empty offset map encoding")
        if data[0] != ENCODING_VERSION:
            raise ValueError(f"offset map encoding version {data[0]} is not supported (this code reads "
                             f"{ENCODING_VERSION})")
        try:
            payload = zlib.decompress(data[1:])
        except zlib.error as exc:
            raise ValueError(f"corrupt offset map encoding: {exc}") from exc
        reader = _Reader(payload)
        start = reader.uvarint()
        n = reader.uvarint()
        gaps = [reader.uvarint() for _ in range(n)]
        lengths = [reader.uvarint() for _ in range(n)]
        shift_deltas = [_unzigzag(reader.uvarint()) for _ in range(n)]
        runs = OffsetRuns()
        source_end, shift, target_end = start, 0, 0
        for gap, length, shift_delta in zip(gaps, lengths, shift_deltas, strict=True):
            source_start = source_end + gap
            shift += shift_delta
            run = OffsetRun(source_start, source_start + length, source_start + shift)
            runs.append(run)
            source_end, target_end = run.source_end, run.target_end
        position = source_end + reader.uvarint()
        target_next = target_end + reader.uvarint()
        reader.expect_end()
        return cls(position, target_next, runs, start=start)


def normalise_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged, non-empty ``[start, end)`` ranges; raises ValueError on a negative or inverted one."""
    out: list[list[int]] = []
    for start, end in sorted((int(a), int(b)) for a, b in ranges):
        if start < 0 or end < start:
            raise ValueError(f"invalid range [{start}, {end})")
        if start == end:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((a, b) for a, b in out)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value >> 1 if not value & 1 else -((value + 1) >> 1)


def _put_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"cannot encode negative {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


class _Reader:
    def __init__(self, data: bytes):
        self._data = data
        self._pos = 0

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            if self._pos >= len(self._data):
                raise ValueError("truncated offset map encoding")
            byte = self._data[self._pos]
            self._pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63 + 7:
                raise ValueError("varint too long in offset map encoding")

    def expect_end(self) -> None:
        if self._pos != len(self._data):
            raise ValueError(f"{len(self._data) - self._pos} trailing bytes in offset map encoding")

