"""Where the retention watch places a lane that failed (``ShallowMirrorDaemon._place_failed_lane``): a lane that
cannot copy is the one retention threatens, so it is never left out of the assessments — its committed position,
else its checkpoint as last read (no request), else the start it chose, else (``new_partitions: earliest``) the log
start. The real-broker case is tests/faults/test_retention_unopened_lane.py."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon.lane_state import LaneState
from mirror_core.errors import MirrorError
from mirror_core.model.held_positions import HeldPositions
from tests.unit.daemon.test_daemon_idle_rounds import BASE

TP = ("orders", 3)


def _daemon(new_partitions: str = "earliest", cached=None) -> tuple[D.ShallowMirrorDaemon, LaneState]:
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "new_partitions": new_partitions}),
                                   worker_id="me")
    daemon.store = NS(cached=lambda pipeline, topic, partition: cached)
    state = LaneState("orders", 3, "orders", "orders-3", health=daemon._new_health())
    return daemon, state


@pytest.mark.timeout(10)
def test_a_lane_never_opened_without_checkpoint_is_assessed_from_the_log_start():
    daemon, state = _daemon()
    daemon._place_failed_lane(state, None)
    assert daemon.positions.snapshot() == ({TP: None}, {})


@pytest.mark.timeout(10)
def test_a_lane_never_opened_is_assessed_at_its_checkpoint_as_last_read():
    daemon, state = _daemon(cached=NS(position=250))
    daemon._place_failed_lane(state, None)
    assert daemon.positions.snapshot() == ({TP: 250}, {})


@pytest.mark.timeout(10)
def test_a_lane_never_opened_at_the_start_it_chose():
    daemon, state = _daemon()
    state.start = 40
    daemon._place_failed_lane(state, None)
    assert daemon.positions.snapshot() == ({TP: 40}, {})


@pytest.mark.timeout(10)
def test_a_lane_starting_at_the_latest_with_no_start_chosen_has_nothing_at_risk():
    daemon, state = _daemon("latest")
    daemon._place_failed_lane(state, None)
    assert daemon.positions.snapshot() == ({}, {})


@pytest.mark.timeout(10)
def test_a_known_position_wins_and_is_kept_through_a_reset():
    daemon, state = _daemon(cached=NS(position=1))
    daemon.positions.caught_up(TP, 900, 900)
    daemon._place_failed_lane(state, None)   # reset: the position reported before stays, now behind
    assert daemon.positions.snapshot() == ({TP: 900}, {})
    daemon._place_failed_lane(state, 950)    # its session's committed position
    assert daemon.positions.snapshot() == ({TP: 950}, {})


@pytest.mark.timeout(10)
def test_the_log_start_entry_yields_to_any_position_learned_later():
    positions = HeldPositions()
    positions.behind_from_log_start(TP)
    positions.behind_from_log_start(TP)
    assert positions.snapshot() == ({TP: None}, {}) and positions.position(TP) is None
    positions.behind(TP)                    # "keep what it had": still from the log start
    assert positions.snapshot() == ({TP: None}, {})
    positions.behind(TP, 12)                # opened at last: its position
    assert positions.snapshot() == ({TP: 12}, {})
    positions.behind_from_log_start(TP)     # a known position is never replaced by the log start
    assert positions.snapshot() == ({TP: 12}, {})
    positions.caught_up(TP, 30, 30)
    positions.behind_from_log_start(TP)
    assert positions.snapshot() == ({}, {TP: 30})


@pytest.mark.timeout(10)
def test_an_undecodable_checkpoint_places_the_lane_where_it_would_start_and_raises_nothing():
    daemon, state = _daemon()

    def cached(*_a):
        raise MirrorError("checkpoint format 99 is not supported")

    daemon.store = NS(cached=cached)
    daemon._place_failed_lane(state, None)  # inside _failed: must not raise over the lane's own error
    assert daemon.positions.snapshot() == ({TP: None}, {})


@pytest.mark.timeout(10)
def test_forgetting_a_lane_assessed_from_the_log_start_is_a_change():
    """HeldPositions' invariant: ``version`` moves with every change. A lane at the log start (None in ``_behind``)
    that is dropped is removed — and that removal must move the version like any other."""
    positions = HeldPositions()
    positions.behind_from_log_start(TP)
    before = positions.version
    positions.forget(TP)
    assert positions.snapshot() == ({}, {})
    assert positions.version != before, "a lane left the assessments without the version moving"
