"""Runs of constant shift between source and target offsets (pure): what the copier records of where each batch
landed.

Batches are copied whole, so a record at source offset ``b + d`` lands at target ``b' + d``: the mapping is a
list of runs ``[source_start, source_end) -> target_start``. Consecutive runs with the same shift merge, so a
partition copied without gaps is one run however many batches it took. Offsets in gaps between runs (control
markers, compaction holes, aborted transactions) were never copied.

:class:`OffsetRuns` is the raw list the copier builds: exact or nothing (sorted, merged, strictly increasing in
source and target offsets). :class:`~mirror_core.model.offset_map.OffsetMap` adds what the copy position knows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

_source_end = attrgetter("source_end")
_target_end = attrgetter("target_end")


@dataclass(frozen=True, slots=True)
class OffsetRun:
    """Source offsets ``[source_start, source_end)`` landed at target ``[target_start, target_start + length)``."""

    source_start: int
    source_end: int
    target_start: int

    @property
    def length(self) -> int:
        return self.source_end - self.source_start

    @property
    def shift(self) -> int:
        return self.target_start - self.source_start

    @property
    def target_end(self) -> int:
        return self.target_start + self.length


class OffsetRuns:
    """An append-only, merged list of :class:`OffsetRun` for one partition.

    Invariant: runs are sorted, non-overlapping in both source and target offsets, and strictly increasing in
    both; :meth:`append` refuses anything that would break that, because a map that lies loses data when a
    consumer group is moved with it.
    """

    def __init__(self, runs: Iterable[OffsetRun] = ()):
        self._runs: list[OffsetRun] = []
        if isinstance(runs, OffsetRuns):  # already checked and merged
            self._runs.extend(runs._runs)
            return
        for run in runs:
            self.append(run)

    def __iter__(self) -> Iterator[OffsetRun]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __getitem__(self, index: int) -> OffsetRun:
        return self._runs[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRuns) and self._runs == other._runs

    def __repr__(self) -> str:
        return f"OffsetRuns({self._runs!r})"

    def append(self, run: OffsetRun) -> None:
        if run.length <= 0:
            raise ValueError(f"empty or negative run {run}")
        if self._runs:
            last = self._runs[-1]
            if run.source_start < last.source_end or run.target_start < last.target_end:
                raise ValueError(f"run {run} overlaps or precedes {last}")
            if run.shift == last.shift and run.source_start == last.source_end:
                self._runs[-1] = OffsetRun(last.source_start, run.source_end, last.target_start)
                return
        self._runs.append(run)

    def add_batch(self, target_base: int, runs_in_batch: Iterable[tuple[int, int, int]]) -> None:
        """Add a written batch: ``(source_offset, target_delta, length)`` runs relative to its target base.

        A run that continues the last one (next source offset, same shift: every batch of a plain shallow copy)
        extends it directly; that is exactly what :meth:`append` would do, without its intermediate run."""
        runs = self._runs
        for source_offset, delta, length in runs_in_batch:
            target_start = target_base + delta
            if runs and length > 0:
                last = runs[-1]
                if source_offset == last.source_end and target_start - source_offset == last.shift:
                    runs[-1] = OffsetRun(last.source_start, source_offset + length, last.target_start)
                    continue
            self.append(OffsetRun(source_offset, source_offset + length, target_start))

    def index_from_source(self, source_offset: int) -> int:
        """Index of the run holding ``source_offset``, else of the first run after it (``len(self)`` if none)."""
        return bisect_right(self._runs, source_offset, key=_source_end)

    def index_from_target(self, target_offset: int) -> int:
        """Index of the run holding ``target_offset``, else of the first run after it (``len(self)`` if none)."""
        return bisect_right(self._runs, target_offset, key=_target_end)

    def translate(self, source_offset: int) -> int | None:
        """The exact target offset of a copied source offset; None if that offset was not copied."""
        i = self.index_from_source(source_offset)
        if i < len(self._runs) and self._runs[i].source_start <= source_offset:
            return source_offset + self._runs[i].shift
        return None

    def drop_below(self, source_offset: int) -> int:
        """Drop the runs that end at or below ``source_offset`` (a straddling run stays whole); how many went."""
        i = self.index_from_source(source_offset)
        del self._runs[:i]
        return i

    def truncate(self, source_offset: int) -> int:
        """Forget source offsets at or above ``source_offset`` (a run straddling it is cut there): the runs as
        they were when the map's position was ``source_offset``. Returns how many runs went or were cut."""
        cut = 0
        while self._runs and self._runs[-1].source_end > source_offset:
            last = self._runs.pop()
            cut += 1
            if last.source_start < source_offset:
                self._runs.append(OffsetRun(last.source_start, source_offset, last.target_start))
                break
        return cut

    def as_tuples(self) -> list[tuple[int, int, int]]:
        return [(r.source_start, r.source_end, r.target_start) for r in self._runs]

    def tail(self, index: int) -> OffsetRuns:
        """A new list of the runs from ``index`` on (already checked and merged: no re-validation)."""
        out = OffsetRuns()
        out._runs = self._runs[index:]
        return out

    def extend_checked(self, other: OffsetRuns) -> None:
        """Append every run of ``other``: only the seam is checked (``other`` already holds the invariant), and a
        first run continuing this list's last one with the same shift merges with it, as :meth:`append` would."""
        if not other._runs:
            return
        self.append(other._runs[0])
        self._runs.extend(other._runs[1:])
