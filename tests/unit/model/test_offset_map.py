"""Offset runs: merged runs of constant shift, exact translation, refusal of anything that would lie."""

from __future__ import annotations

import json
import random
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun, OffsetRuns


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


# -- OffsetMap: what a consumer group committed at a source offset resumes from on the target ------------------

def _transactions_map() -> OffsetMap:
    """Source: txn records 100..104, commit marker 105, aborted 106..109 + abort marker 110, records 111..112,
    commit marker 113; the copy position is 114. Target (dense, non-transactional) starts at 0."""
    m = OffsetMap(position=100, target_next=0)
    m.add_batch(0, [(100, 0, 5)])
    m.add_batch(5, [(111, 0, 2)])
    m.advance(114)
    return m


def test_translate_copied_gap_position_and_beyond():
    m = _transactions_map()
    assert m.as_tuples() == [(100, 105, 0), (111, 113, 5)]
    assert [m.translate(s) for s in (100, 104, 111, 112)] == [0, 4, 5, 6], "copied records: exact"
    assert m.translate(105) == 5 and m.translate(108) == 5 and m.translate(110) == 5, "gap: next copied record"
    assert m.translate(113) == 7, "trailing commit marker below the position: target_next"
    assert m.translate(114) == 7 == m.target_next, "a caught-up group commits exactly target_next"
    assert m.translate(115) is None, "not copied yet: decline, never guess"
    assert m.translate(99) is None, "before the copy began: decline"


def test_gap_before_the_first_copied_record_belongs_to_the_map_from_its_start():
    m = OffsetMap(position=50, target_next=1000)  # the range starts on a commit marker
    m.add_batch(1000, [(51, 0, 3)])
    assert m.start == 50 and m.translate(50) == 1000 and m.translate(51) == 1000 and m.translate(53) == 1002
    assert m.translate(54) == 1003 and m.translate(49) is None


def test_inverse_maps_target_records_back_and_target_next_to_position():
    m = _transactions_map()
    assert [m.inverse(t) for t in range(7)] == [100, 101, 102, 103, 104, 111, 112]
    assert m.inverse(7) == 114 and m.inverse(8) is None and m.inverse(-1) is None


def test_inverse_of_the_mirrors_own_transaction_markers_is_the_next_copied_record():
    m = OffsetMap(position=0, target_next=0)
    m.add_batch(0, [(0, 0, 3)])
    m.advance(4, target_next=4)  # source commit marker at 3, our own commit marker at target 3
    m.add_batch(4, [(4, 0, 2)])
    m.advance(7, target_next=7)
    assert m.as_tuples() == [(0, 3, 0), (4, 6, 4)]
    assert m.inverse(3) == 4 and m.inverse(6) == 7 and m.inverse(7) == 7
    assert m.translate(3) == 4 and m.translate(6) == 7


def test_add_batch_with_holes_and_source_next_moves_over_a_trailing_hole():
    m = OffsetMap(position=100, target_next=0)
    m.add_batch(0, [(102, 0, 2), (105, 2, 1)], source_next=108)  # compacted batch 100..107, re-encoded densely
    assert m.as_tuples() == [(102, 104, 0), (105, 106, 2)] and (m.position, m.target_next) == (108, 3)
    assert [m.translate(s) for s in range(100, 110)] == [0, 0, 0, 1, 2, 2, 3, 3, 3, None]


def test_a_map_refuses_runs_that_would_re_answer_offsets_and_going_backwards():
    m = _transactions_map()
    with pytest.raises(ValueError):
        m.add_batch(7, [(113, 0, 1)])  # 113 was already answered as a gap
    with pytest.raises(ValueError):
        m.add_batch(6, [(114, 0, 1)])  # target 6 is taken
    with pytest.raises(ValueError):
        m.advance(113)
    with pytest.raises(ValueError):
        m.advance(115, target_next=6)
    with pytest.raises(ValueError):
        OffsetMap(position=10, target_next=0, runs=[OffsetRun(5, 12, 0)])
    with pytest.raises(ValueError):
        OffsetMap(position=20, target_next=3, runs=[OffsetRun(5, 12, 0)])
    assert m == _transactions_map(), "a refused change leaves the map as it was"


def test_extend_appends_a_later_copy_result():
    first = OffsetRuns()
    first.add_batch(0, [(0, 0, 10)])
    m = OffsetMap.from_runs(first, start=0, position=11, target_next=10)
    later = OffsetRuns()
    later.add_batch(10, [(11, 0, 5)])
    m.extend(later, position=17, target_next=15)
    assert m.as_tuples() == [(0, 10, 0), (11, 16, 10)] and (m.position, m.target_next) == (17, 15)
    assert len(first) == 1, "the caller's runs are not aliased"


def test_prune_drops_runs_below_keeps_a_straddling_run_and_declines_below():
    m = _transactions_map()
    assert m.prune(103) == 0 and m.start == 100, "run (100, 105) straddles 103: kept whole"
    assert m.translate(100) == 0
    assert m.prune(107) == 1 and m.start == 107 and m.as_tuples() == [(111, 113, 5)]
    assert m.translate(106) is None and m.translate(107) == 5 and m.translate(114) == 7
    assert m.prune(10_000) == 1 and m.start == m.position == 114 and len(m) == 0
    assert m.translate(114) == 7 and m.translate(113) is None


def test_checkpoint_encodings_round_trip_and_reject_garbage():
    m = _transactions_map()
    assert OffsetMap.from_bytes(m.to_bytes()) == m
    assert OffsetMap.from_dict(json.loads(json.dumps(m.as_dict()))) == m
    empty = OffsetMap(position=7, target_next=3)
    assert OffsetMap.from_bytes(empty.to_bytes()) == empty
    data = m.to_bytes()
    with pytest.raises(ValueError, match="version 9"):
        OffsetMap.from_bytes(b"\x09" + data[1:])
    with pytest.raises(ValueError):
        OffsetMap.from_bytes(data[:-3])
    with pytest.raises(ValueError):
        OffsetMap.from_bytes(data[:1] + zlib.compress(zlib.decompress(data[1:]) + b"\x00"))
    with pytest.raises(ValueError):
        OffsetMap.from_bytes(b"")


def _ten_thousand_transactions(transactional_target: bool) -> OffsetMap:
    """10,000 source transactions of 1..50 records (seeded), each followed by its commit marker."""
    rng = random.Random(20240607)
    m = OffsetMap(position=0, target_next=0)
    for _ in range(10_000):
        size = rng.randint(1, 50)
        m.add_batch(m.target_next, [(m.position, 0, size)])
        m.advance(m.position + 1, target_next=m.target_next + transactional_target)
    return m


@pytest.mark.parametrize("transactional_target", [False, True], ids=["dense-target", "transactional-target"])
def test_ten_thousand_transactions_encode_well_under_100_kib(transactional_target):
    m = _ten_thousand_transactions(transactional_target)
    assert len(m) == 10_000
    encoded = m.to_bytes()
    print(f"10,000 runs ({transactional_target=}): {len(encoded)} bytes")
    assert len(encoded) < 16 * 1024, f"{len(encoded)} bytes"  # budget: 100 KiB; this pattern takes ~7 KiB
    assert OffsetMap.from_bytes(encoded) == m


# -- accepted losses ---------------------------------------------------------------------------------------------

def test_a_lost_range_and_the_gap_leading_into_it_decline_translation():
    """[10, 20) was deleted before it was copied; 8-9 were markers, so a consumer at 8 would read 10 next."""
    omap = OffsetMap(30, 22, [OffsetRun(0, 8, 0), OffsetRun(20, 30, 10)], lost=[(10, 20)])
    assert omap.translate(7) == 7
    assert omap.translate(8) is None and omap.translate(10) is None and omap.translate(19) is None
    assert omap.translate(20) == 10
    assert omap.translate(30) == 22
    assert omap.lost_range_at(9) == (10, 20)
    assert omap.lost_range_at(5) is None


def test_mark_lost_moves_the_position_past_the_range_and_never_below_it():
    omap = OffsetMap(10, 10, [OffsetRun(0, 10, 0)])
    omap.mark_lost(10, 25)
    assert (omap.position, omap.lost) == (25, ((10, 25),))
    assert omap.translate(10) is None and omap.translate(25) == 10
    with pytest.raises(ValueError):
        omap.mark_lost(5, 8)


def test_a_lost_range_cannot_overlap_copied_runs():
    with pytest.raises(ValueError, match="overlaps"):
        OffsetMap(30, 30, [OffsetRun(0, 30, 0)], lost=[(10, 20)])


def test_pruning_forgets_lost_ranges_below_the_new_start():
    omap = OffsetMap(40, 20, [OffsetRun(0, 10, 0), OffsetRun(20, 30, 10)], lost=[(10, 20)])
    omap.prune(25)
    assert omap.lost == ()


_batch_runs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(-1, 4)), min_size=0, max_size=3)


@given(st.lists(st.tuples(st.integers(0, 3), _batch_runs), max_size=25))
def test_add_batch_is_append_of_each_run(batches):
    """add_batch's shortcut for a run continuing the last one builds the same map, and refuses the same runs, as
    appending every run one by one. Batches are generated as gaps after the previous end, so most continue it."""
    fast, slow = OffsetRuns(), OffsetRuns()
    source = target = 0
    for target_gap, runs in batches:
        base = target + target_gap
        spec = []
        for source_gap, delta, length in runs:
            spec.append((source + source_gap, delta, length))
            source += source_gap + max(length, 0)
        target = base + sum(max(length, 0) for _, _, length in runs)
        assert _refusal(fast.add_batch, base, spec) == _refusal(_append_each, slow, base, spec)
        assert fast == slow


def _append_each(runs: OffsetRuns, base: int, spec: list) -> None:
    for source, delta, length in spec:
        runs.append(OffsetRun(source, source + length, base + delta))


def _refusal(add, *args) -> str | None:
    try:
        add(*args)
    except ValueError as exc:
        return str(exc)
    return None
