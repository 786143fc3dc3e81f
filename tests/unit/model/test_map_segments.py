"""Sealed map segments and pruning (pure): a lane's map committed in pieces assembles to exactly the map one list
of runs gives, every piece stays within its budget, and pruning forgets only what nothing can ask for.

The oracle is the whole map built the old way (:class:`OffsetMap`, every run in one list): above the assembled
map's start, translation must agree with it everywhere; below the prune floor nothing is promised; at or above it
nothing may be lost.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirror_core.model.map_segments import (
    LaneMap,
    SegmentChain,
    assemble_map,
    prune_floor,
    segment_key,
    segment_key_prefix,
    split_for_records,
)
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun, OffsetRuns
from mirror_core.state.checkpoint import Checkpoint

# a step: ("records", source gap, length, target gap) appends a run; ("commit", floor fraction or None)
_records = st.tuples(st.just("records"), st.integers(0, 3), st.integers(1, 5), st.integers(0, 2))
_commit = st.tuples(st.just("commit"), st.one_of(st.none(), st.floats(0, 1)))
_lanes = st.tuples(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(2, 12),
                   st.lists(st.one_of(_records, _records, _commit), max_size=120))


class Lane:
    """A lane that commits its map in segments into ``records`` (segment start → value), beside the oracle."""

    def __init__(self, start: int, target: int, segment_runs: int, segment_bytes: int = 10**6):
        self.lane_map = LaneMap(tail_start=start, segment_runs=segment_runs, segment_bytes=segment_bytes)
        self.oracle = OffsetMap(position=start, target_next=target)
        self.records: dict[int, bytes] = {}
        self.tail, self.chain = OffsetMap(position=start, target_next=target), None
        self.segment_bytes = segment_bytes

    def add(self, source_gap: int, length: int, target_gap: int) -> None:
        s, t = self.oracle.position + source_gap, self.oracle.target_next + target_gap
        run = OffsetRun(s, s + length, t)
        self.oracle.extend([run], position=run.source_end)
        self.lane_map.tail_runs.append(run)

    def commit(self, floor: int | None):
        commit = self.lane_map.commit(position=self.oracle.position, target_next=self.oracle.target_next,
                                      floor=floor)
        for segment in commit.sealed:
            self.records[segment.start] = segment.to_bytes()
        for start in commit.dropped:
            del self.records[start]
        self.lane_map.apply(commit)
        self.tail, self.chain = OffsetMap.from_bytes(commit.tail.to_bytes()), commit.chain
        return commit

    def assembled(self) -> OffsetMap:
        lookup = lambda start: None if start not in self.records else OffsetMap.from_bytes(self.records[start])  # noqa: E731
        return assemble_map(self.chain, self.tail, lookup)[0]


def _run(start, target, segment_runs, steps) -> tuple[Lane, int]:
    lane, floor_seen = Lane(start, target, segment_runs), start
    for step in steps:
        if step[0] == "records":
            lane.add(*step[1:])
            continue
        fraction = step[1]
        floor = None if fraction is None else start + int((lane.oracle.position - start) * fraction)
        if floor is not None:
            floor_seen = max(floor_seen, floor)
        lane.commit(floor)
    lane.commit(None)
    return lane, floor_seen


@settings(max_examples=200)
@given(_lanes)
def test_the_assembled_map_translates_as_the_whole_map_at_and_above_its_start(lane_spec):
    lane, floor = _run(*lane_spec)
    whole, oracle = lane.assembled(), lane.oracle
    assert (whole.position, whole.target_next) == (oracle.position, oracle.target_next)
    assert whole.start <= max(floor, oracle.start), "never pruned above a floor"
    for s in range(max(0, oracle.start - 2), oracle.position + 3):
        assert whole.translate(s) == (oracle.translate(s) if s >= whole.start else None)
    for run in oracle:
        if run.source_start >= whole.start:
            assert whole.translate(run.source_start) == run.target_start


@settings(max_examples=200)
@given(_lanes)
def test_without_pruning_the_assembled_map_is_the_whole_map(lane_spec):
    start, target, segment_runs, steps = lane_spec
    lane, _ = _run(start, target, segment_runs, [s if s[0] == "records" else ("commit", None) for s in steps])
    assert lane.assembled() == lane.oracle


@settings(max_examples=100)
@given(_lanes)
def test_the_open_tail_stays_below_the_segment_bound_and_only_sealed_records_are_live(lane_spec):
    lane, _ = _run(*lane_spec)
    assert len(lane.tail) < lane.lane_map.segment_runs
    chain = lane.chain
    if chain is None:
        assert lane.records == {}
    else:
        assert sorted(lane.records) == list(chain.starts), "every pruned segment was tombstoned"


def test_a_large_irregular_tail_is_sealed_in_pieces_that_each_fit_the_record_budget():
    rnd, runs, s, t = random.Random(7), [], 0, 0
    for _ in range(3000):
        n = rnd.randint(1, 5)
        runs.append(OffsetRun(s, s + n, t))
        s, t = s + n + rnd.randint(1, 3), t + n + rnd.randint(0, 1)
    lane_map = LaneMap((), OffsetRuns(runs), tail_start=0, segment_bytes=2048)
    commit = lane_map.commit(position=s, target_next=t)
    assert len(commit.sealed) > 1 and all(len(m.to_bytes()) <= 2048 for m in commit.sealed)
    assert commit.tail.start == s and len(commit.tail) == 0
    assert [m.start for m in commit.sealed] == list(commit.chain.starts)
    whole = OffsetMap(s, t, runs, start=0)
    records = {m.start: m for m in commit.sealed}
    assert assemble_map(commit.chain, commit.tail, records.get)[0] == whole


def test_split_for_records_cuts_only_at_run_bounds():
    m = OffsetMap(100, 90, [OffsetRun(0, 10, 0), OffsetRun(20, 30, 10), OffsetRun(40, 90, 20)], start=0)
    pieces = split_for_records(m, budget=1)
    assert [(p.start, p.position, p.target_next) for p in pieces] == [(0, 20, 10), (20, 40, 20), (40, 100, 90)]


def test_pruning_drops_whole_segments_ending_at_or_below_the_floor_and_tombstones_them():
    lane = Lane(0, 0, segment_runs=2)
    for _ in range(8):
        lane.add(1, 2, 0)  # runs [1,3) [4,6) ... a marker between each
        lane.commit(None)
    starts = lane.lane_map.segments
    assert len(starts) == 4
    floor = starts[1][1]  # the end of the second segment
    commit = lane.commit(floor)
    assert commit.dropped == (starts[0][0], starts[1][0])
    assert commit.start == floor and lane.assembled().start == floor
    assert lane.assembled().translate(floor) == lane.oracle.translate(floor)
    assert lane.assembled().translate(floor - 1) is None


def test_a_floor_inside_a_segment_keeps_that_segment():
    lane = Lane(0, 0, segment_runs=2)
    for _ in range(6):
        lane.add(1, 2, 0)
        lane.commit(None)
    (s0, e0), (s1, e1), _ = lane.lane_map.segments
    commit = lane.commit(e0 + 1)
    assert commit.dropped == (s0,) and commit.start == s1


def test_the_prune_floor_is_the_lower_of_the_log_start_and_every_group_offset():
    assert prune_floor(100, []) == 100
    assert prune_floor(100, [250, 90, 300]) == 90
    assert prune_floor(100, [250]) == 100


def test_a_broken_chain_is_refused_naming_the_segment():
    lane = Lane(0, 0, segment_runs=2)
    for _ in range(6):
        lane.add(1, 2, 0)
        lane.commit(None)
    missing = lane.lane_map.segments[1][0]
    del lane.records[missing]
    with pytest.raises(ValueError, match=f"map segment at source offset {missing} is missing"):
        lane.assembled()


def test_a_lane_resumes_from_an_assembled_checkpoint_with_its_segment_bounds():
    lane = Lane(0, 0, segment_runs=2)
    for _ in range(5):
        lane.add(1, 2, 0)
        lane.commit(None)
    whole, chain = assemble_map(lane.chain, lane.tail, lambda s: OffsetMap.from_bytes(lane.records[s]))
    resumed = LaneMap.from_checkpoint(whole, chain, start=0)
    assert resumed.segments == lane.lane_map.segments and resumed.tail_start == lane.lane_map.tail_start
    assert resumed.tail_runs == lane.lane_map.tail_runs


def test_a_format_3_map_is_sealed_at_the_first_commit():
    runs = [OffsetRun(2 * i, 2 * i + 1, i) for i in range(50)]
    resumed = LaneMap.from_checkpoint(OffsetMap(100, 50, runs, start=0), None, start=0)
    resumed.segment_runs = 16
    commit = resumed.commit(position=100, target_next=50)
    assert commit.sealed and commit.chain.first == 0 and commit.chain.end == 100


def test_an_uncommitted_run_is_forgotten_when_the_copy_resumes():
    runs = OffsetRuns([OffsetRun(0, 10, 0), OffsetRun(11, 20, 10)])
    runs.truncate(15)
    assert runs.as_tuples() == [(0, 10, 0), (11, 15, 10)]
    runs.truncate(11)
    assert runs.as_tuples() == [(0, 10, 0)]


def test_segment_keys_share_the_lanes_prefix_and_are_not_checkpoint_keys():
    key = segment_key("p", "orders", 1, 500)
    assert key.startswith(segment_key_prefix("p", "orders", 1))
    assert not key.startswith(segment_key_prefix("p", "orders", 10))
    assert not segment_key("p", "orders", 10, 5).startswith(segment_key_prefix("p", "orders", 1))


def test_a_chain_round_trips_through_a_checkpoint_value_without_its_starts():
    tail = OffsetMap(60, 40, [OffsetRun(50, 60, 30)], start=50)
    cp = Checkpoint(pipeline="p", topic="t", partition=0, position=60, target_topic="dr.t", target_partition=0,
                    target_next=40, owner="daemon", owner_epoch=1, offset_map=tail,
                    map_segments=SegmentChain(0, 50, 3, (0, 20, 30)), map_pruned_below=0)
    again = Checkpoint.from_value(cp.to_value())
    assert again.map_segments == SegmentChain(0, 50, 3) and again.map_segments.starts == ()
    assert again.offset_map == tail
