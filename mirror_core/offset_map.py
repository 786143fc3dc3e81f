"""Runs of constant shift between source and target offsets (pure).

Batches are copied whole, so a record at source offset ``b + d`` lands at target ``b' + d``: the mapping is a
list of runs ``[source_start, source_end) -> target_start``. Consecutive runs with the same shift merge, so a
partition copied without gaps is one run however many batches it took. Offsets in gaps between runs (control
markers, compaction holes, aborted transactions) were never copied.

Invariant of :class:`OffsetRuns`: runs are sorted, non-overlapping in both source and target offsets, and strictly
increasing in both; :meth:`OffsetRuns.append` refuses anything that would break that, because a map that lies
loses data when a consumer group is moved with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


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
    """An append-only, merged list of :class:`OffsetRun` for one partition."""

    def __init__(self, runs: Iterable[OffsetRun] = ()):
        self._runs: list[OffsetRun] = []
        for run in runs:
            self.append(run)

    def __iter__(self) -> Iterator[OffsetRun]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

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
        """Add a written batch: ``(source_offset, target_delta, length)`` runs relative to its target base."""
        for source_offset, delta, length in runs_in_batch:
            self.append(OffsetRun(source_offset, source_offset + length, target_base + delta))

    def translate(self, source_offset: int) -> int | None:
        """The exact target offset of a copied source offset; None if that offset was not copied."""
        for run in self._runs:
            if run.source_start <= source_offset < run.source_end:
                return source_offset + run.shift
        return None

    def as_tuples(self) -> list[tuple[int, int, int]]:
        return [(r.source_start, r.source_end, r.target_start) for r in self._runs]
