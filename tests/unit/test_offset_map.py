"""Offset runs: merged runs of constant shift, exact translation, refusal of anything that would lie."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirror_core.offset_map import OffsetRun, OffsetRuns


def test_contiguous_batches_merge_into_one_run():
    runs = OffsetRuns()
    runs.add_batch(0, [(100, 0, 10)])
    runs.add_batch(10, [(110, 0, 5)])
    assert runs.as_tuples() == [(100, 115, 0)]


def test_a_marker_gap_starts_a_new_run_and_gap_offsets_do_not_translate():
    runs = OffsetRuns()
    runs.add_batch(0, [(0, 0, 10)])
    runs.add_batch(10, [(11, 0, 10)])  # offset 10 was a commit marker
    assert runs.as_tuples() == [(0, 10, 0), (11, 21, 10)]
    assert runs.translate(9) == 9 and runs.translate(11) == 10 and runs.translate(20) == 19
    assert runs.translate(10) is None and runs.translate(21) is None


def test_overlap_and_going_backwards_are_refused():
    runs = OffsetRuns([OffsetRun(10, 20, 0)])
    with pytest.raises(ValueError):
        runs.append(OffsetRun(15, 25, 10))
    with pytest.raises(ValueError):
        runs.append(OffsetRun(20, 25, 5))
    with pytest.raises(ValueError):
        runs.append(OffsetRun(30, 30, 10))


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 50)), min_size=1, max_size=40))
def test_translation_is_exact_for_every_copied_offset(batches):
    """Batches of random sizes separated by random gaps: every copied offset maps to its dense target index."""
    runs, expected = OffsetRuns(), {}
    source, target = 0, 0
    for gap, size in batches:
        source += gap
        runs.add_batch(target, [(source, 0, size)])
        for i in range(size):
            expected[source + i] = target + i
        source += size
        target += size
    assert all(runs.translate(s) == t for s, t in expected.items())
    assert all(runs.translate(s) is None for s in range(source + 5) if s not in expected)
    shifts = [r.shift for r in runs]
    assert shifts == sorted(shifts, reverse=True) and len(set(shifts)) == len(shifts), "merged: one run per shift"
