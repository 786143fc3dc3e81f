"""Offset map properties over random copies: markers, aborted ranges and compaction holes inside batches.

A brute-force model (a dict of every copied source offset → target offset) is the oracle: the map must agree with
it everywhere, never answer past what was copied, and survive encoding and pruning.
"""

from __future__ import annotations

from bisect import bisect_right

from hypothesis import given, settings
from hypothesis import strategies as st

from mirror_core.codec.batch_codec import PreparedBatch
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRuns

# one step of a copy: ("batch", source gap before it, kept-mask of its span, target gap before it)
#                  or ("advance", source gap, target gap): markers / aborted data with nothing to copy
_batch = st.tuples(st.just("batch"), st.integers(0, 4), st.lists(st.booleans(), min_size=1, max_size=25),
                   st.integers(0, 2))
_advance = st.tuples(st.just("advance"), st.integers(0, 6), st.integers(0, 1))
_copies = st.tuples(st.integers(0, 2**40), st.integers(0, 2**40), st.lists(st.one_of(_batch, _advance), max_size=30))


class Model:
    """The brute-force oracle: every copied source offset and its target, plus the copy position."""

    def __init__(self, start: int, target_next: int):
        self.start, self.position, self.target_next = start, start, target_next
        self.copied: dict[int, int] = {}

    def expected(self, source_offset: int) -> int | None:
        if source_offset < self.start or source_offset > self.position:
            return None
        later = [self.copied[s] for s in self.copied if s >= source_offset]
        return min(later) if later else self.target_next

    def expected_inverse(self, target_offset: int) -> int | None:
        if target_offset == self.target_next:
            return self.position
        targets = sorted((t, s) for s, t in self.copied.items())
        if not targets or not targets[0][0] <= target_offset < self.target_next:
            return None
        i = bisect_right(targets, (target_offset, -1))
        return targets[i][1] if i < len(targets) else self.position


def replay(start: int, target_start: int, steps) -> tuple[OffsetMap, OffsetRuns, Model]:
    """Apply ``steps`` to an :class:`OffsetMap` (incrementally, as a daemon would), to an :class:`OffsetRuns` (as
    the copier does) and to the model."""
    m, runs, model = OffsetMap(position=start, target_next=target_start), OffsetRuns(), Model(start, target_start)
    for step in steps:
        if step[0] == "advance":
            _, source_gap, target_gap = step
            model.position += source_gap
            model.target_next += target_gap
            m.advance(model.position, model.target_next)
            continue
        _, source_gap, kept, target_gap = step
        first = model.position + source_gap
        offsets = tuple(first + i for i, keep in enumerate(kept) if keep)
        model.position = first + len(kept)
        if not offsets:  # an empty batch left by the cleaner: skipped, the position moves over it
            m.advance(model.position)
            continue
        prepared = PreparedBatch(bytearray(), len(offsets), first, model.position,
                                 source_offsets=None if len(offsets) == len(kept) else offsets)
        base = model.target_next + target_gap
        for i, s in enumerate(offsets):
            model.copied[s] = base + i
        model.target_next = base + len(offsets)
        m.add_batch(base, prepared.offset_runs(), source_next=prepared.source_next_offset)
        runs.add_batch(base, prepared.offset_runs())
    assert (m.position, m.target_next) == (model.position, model.target_next)
    return m, runs, model


def _probe(m: OffsetMap) -> range:
    return range(max(0, m.start - 3), m.position + 4)


@given(_copies)
def test_translation_matches_the_brute_force_model_everywhere(copies):
    m, _, model = replay(*copies)
    assert all(m.translate(s) == model.expected(s) for s in _probe(m))
    assert all(m.translate(s) == t for s, t in model.copied.items()), "copied offsets translate exactly"


@given(_copies)
def test_translation_is_monotonic_and_never_past_what_was_copied(copies):
    m, _, _ = replay(*copies)
    answers = [m.translate(s) for s in range(m.start, m.position + 1)]
    assert None not in answers and answers == sorted(answers)
    assert all(t <= m.target_next for t in answers) and answers[-1] == m.target_next
    assert m.translate(m.position + 1) is None and m.translate(m.position + 10**6) is None


@given(_copies)
def test_inverse_undoes_translation_and_matches_the_model(copies):
    m, _, model = replay(*copies)
    assert all(m.inverse(m.translate(s)) == s for s in model.copied)
    assert m.inverse(m.translate(m.position)) == m.position
    low = min(model.copied.values(), default=m.target_next)
    assert all(m.inverse(t) == model.expected_inverse(t) for t in range(max(0, low - 3), m.target_next + 4))


@given(_copies)
def test_the_map_the_copier_builds_is_the_same_map(copies):
    m, runs, _ = replay(*copies)
    assert OffsetMap.from_runs(runs, start=m.start, position=m.position, target_next=m.target_next) == m
    assert m.as_tuples() == runs.as_tuples()
    for a, b in zip(m, list(m)[1:], strict=False):
        assert not (a.source_end == b.source_start and a.shift == b.shift), "runs with a common shift merge"


@given(_copies)
def test_encodings_round_trip(copies):
    m, _, _ = replay(*copies)
    assert OffsetMap.from_bytes(m.to_bytes()) == m
    assert OffsetMap.from_dict(m.as_dict()) == m


@settings(max_examples=200)
@given(_copies, st.integers(-5, 500))
def test_prune_keeps_translation_at_and_above_the_prune_point(copies, above_start):
    m, _, _ = replay(*copies)
    before = {s: m.translate(s) for s in _probe(m)}
    old_start, point = m.start, m.start + above_start
    m.prune(point)
    effective = min(point, m.position)  # the map never forgets its own position
    assert old_start <= m.start <= max(old_start, effective)
    assert all(m.translate(s) == t for s, t in before.items() if s >= point), "nothing a consumer still needs"
    assert all(m.translate(s) is None for s in before if s < m.start), "pruned offsets decline"
    assert all(r.source_end > effective for r in m), "runs entirely below the point are gone"
    assert OffsetMap.from_bytes(m.to_bytes()) == m
