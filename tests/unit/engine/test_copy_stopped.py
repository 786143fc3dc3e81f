"""Where each partition of a failed ``shoal copy --mode none`` got (mirror_core.engine.copy_stopped): pure."""

from __future__ import annotations

from types import SimpleNamespace

from mirror_core.engine.copier import CopyResult
from mirror_core.engine.copy_stopped import landed_position, lane_rows
from mirror_core.model.ranges import PartitionRange


def lane(partition: int, start: int, end: int, reached: int, next_target: int | None, records: int = 0):
    rng = PartitionRange("t", partition, start, end, "dr.t", partition)
    result = CopyResult(rng, source_start=start, source_end=reached, records=records)
    result.next_target_offset = next_target
    return SimpleNamespace(range=rng, result=result)


SPANS = [(110, 10), (130, 20), (131, 1)]   # three batches of the failed share [100, 131)


def test_a_landed_prefix_of_whole_batches_gives_the_exact_resume_offset():
    assert landed_position(SPANS, 10) == 110
    assert landed_position(SPANS, 30) == 130
    assert landed_position(SPANS, 15) is None, "half a batch: not something a whole-batch copy leaves"
    assert landed_position(None, 10) is None


def test_rows_say_complete_stopped_or_failed_with_the_next_offset():
    lanes = [lane(0, 0, 50, 50, 50, 50), lane(1, 0, 200, 100, 100, 100), lane(2, 0, 200, 80, 80, 80)]
    writing = {1: (100, 131, SPANS)}
    rows = lane_rows(lanes, writing, target_before={0: 0, 1: 0, 2: 0}, target_now={1: 130})
    assert [(r["partition"], r["state"], r["next"]) for r in rows] == [(0, "complete", 50), (1, "FAILED", 130),
                                                                        (2, "stopped", 80)]
    assert "30 target offset(s) of it landed after dr.t-1 offset 100" in rows[1]["note"]


def test_nothing_landed_resumes_at_the_acknowledged_offset_and_an_unreadable_target_gives_no_offset():
    writing = {1: (0, 131, SPANS)}
    [nothing] = lane_rows([lane(1, 0, 200, 0, None)], writing, target_before={1: 7}, target_now={1: 7})
    assert nothing["next"] == 0 and "nothing of it landed" in nothing["note"]
    [unknown] = lane_rows([lane(1, 0, 200, 0, None)], writing, target_before={1: 7}, target_now={1: None})
    assert unknown["next"] is None and "could not be read" in unknown["note"]
    [odd] = lane_rows([lane(1, 0, 200, 0, None)], writing, target_before={1: 7}, target_now={1: 12})
    assert odd["next"] is None and "compare the target" in odd["note"]


def test_a_partition_whose_whole_range_landed_in_a_failed_shared_write_is_complete():
    """Lanes share Produce requests in --mode none: another partition's rejected batch fails the whole request, and
    every lane in it gets the error. A partition whose share all landed is complete: no resume command (it would
    be an empty range ``--from 200 --to 200``)."""
    spans = [(100, 100), (200, 100)]   # two batches of 100 records: (offset after it, target offsets it takes)
    [row] = lane_rows([lane(0, 0, 200, 0, None)], {0: (0, 200, spans)}, target_before={0: 0}, target_now={0: 200})
    assert (row["state"], row["next"]) == ("complete", 200)
    assert "landed" in row["note"]
