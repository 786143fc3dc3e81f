"""Accepting a named loss on a halted lane (mirror_core/state/lane_control.py): the checkpoint moves past the range,
records it as lost (translation declines inside it) and a deleted topic's lane is retired; the ledger row says so."""

from __future__ import annotations

from mirror_core.model.lane_status import PersistedLaneState
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.state.checkpoint import Checkpoint
from mirror_core.state.lane_control import _ledger_row, _with_loss


def _halted(reason: str, end: int | None) -> tuple[Checkpoint, PersistedLaneState]:
    halt = PersistedLaneState("halted", reason, "deleted before it was copied", 1, 50, end)
    omap = OffsetMap(50, 40, [OffsetRun(0, 50, -10)], start=0)
    return Checkpoint("p", "t", 0, 50, "dr.t", 0, 40, "daemon", 2, offset_map=omap, lane_state=halt), halt


def test_accepting_a_data_loss_moves_past_the_range_and_translation_declines_inside_it():
    cp, halt = _halted("data_loss", 80)
    after = _with_loss(cp, (50, 80), halt)
    assert (after.position, after.lost_ranges, after.lane_state) == (80, ((50, 80),), None)
    assert after.offset_map.translate(49) == 39
    assert after.offset_map.translate(60) is None
    assert after.offset_map.translate(80) == 40
    row = _ledger_row(after, halt, (50, 80))
    assert (row.status, row.planned_start, row.planned_end) == ("lost", 50, 80)
    assert "data_loss" in row.error


def test_accepting_the_loss_of_a_deleted_source_topic_retires_the_lane():
    cp, halt = _halted("source_deleted", 90)
    after = _with_loss(cp, (50, 90), halt)
    assert after.lane_state.state == "retired" and after.lost_ranges == ((50, 90),)
