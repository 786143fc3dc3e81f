"""Reviewer's probes of the event-kept lane health (issue #18, branch i18-rounds-3): what the events must not let
grow, and what a lane given up must not keep showing."""

from __future__ import annotations

import kafka.errors as Errors
import pytest

from mirror_core.model.lane_status import COPYING, STALLED
from mirror_core.state.leases import now_ms
from tests.unit.daemon.test_daemon_idle_rounds import _lane_states, held_daemon, set_clock

LANES = 20


@pytest.fixture
def daemon():
    return held_daemon(LANES)


def _fail(daemon, lane: str) -> None:
    daemon._failed(daemon.lanes[lane], Errors.KafkaConnectionError("flaky target"))


@pytest.mark.timeout(10)
def test_a_flapping_lane_does_not_grow_the_stall_heap(daemon, monkeypatch):
    """A lane that fails and recovers over and over (a flaky target partition) starts a new run of failures each
    time: each run's due time is pushed, and the superseded ones stay in the heap until their time comes —
    stall_after_s later (300 s by default, a day if configured). The heap must stay bounded by the lanes, not grow
    with the failure rate times stall_after_s."""
    clock = {"ms": now_ms()}
    set_clock(monkeypatch, lambda: clock["ms"])
    daemon._publish_round_states([])
    state = daemon.lanes["orders-3"]
    for _ in range(2000):  # 200 s of a lane failing and recovering every 100 ms: within stall_after_s (300 s)
        _fail(daemon, "orders-3")
        state.health.succeeded()          # its next round's news: copying again
        daemon._publish_round_states([state])
        clock["ms"] += 100
    assert _lane_states(daemon)["orders-3"] == COPYING
    assert len(daemon._stall_times) <= 2 * LANES + 64, f"{len(daemon._stall_times)} entries for one flapping lane"
    _fail(daemon, "orders-3")             # and the stall by time alone still comes
    clock["ms"] += int(daemon.config.stall_after_s * 1000) + 1
    daemon._publish_pending_states()
    assert _lane_states(daemon)["orders-3"] == STALLED


@pytest.mark.timeout(10)
def test_a_lane_given_up_while_retrying_does_not_turn_stalled_here(daemon, monkeypatch):
    """A lane retrying (a flaky target) is revoked by the group and copies fine at its next holder. This process
    no longer holds it: its /readyz must not turn ``stalled`` (not ready) stall_after_s later for a lane it does not
    copy — an operator would restart a healthy daemon, and the holder's own health says copying."""
    clock = {"ms": now_ms()}
    set_clock(monkeypatch, lambda: clock["ms"])
    daemon._publish_round_states([])
    _fail(daemon, "orders-5")
    daemon._drop("orders-5", "revoked by the group")
    clock["ms"] += int(daemon.config.stall_after_s * 1000) + 1
    daemon._publish_pending_states()
    daemon._next_health_walk = 0.0        # and the full walk's check agrees
    daemon._publish_pending_states()
    assert _lane_states(daemon).get("orders-5") != STALLED
    assert daemon.metrics.readiness()[0], daemon.metrics.readiness()[1]["not_ready_lanes"]


@pytest.mark.timeout(10)
def test_a_lane_reacquired_long_after_it_was_given_up_while_retrying_writes_no_stalled_record(daemon, monkeypatch):
    """The same lane coming back to this process (the group moves it back an hour later): it has not failed here
    since, so no health record may say it is stalled — ``shoal mirror status`` and the UI read those records from
    any machine — and /readyz must not show it stalled before it even opened."""
    from types import SimpleNamespace as NS

    written = []
    daemon.health_records = NS(write=lambda pipeline, holder, writes, clears, now: written.append(
        (dict(writes), sorted(clears))))
    clock = {"ms": now_ms()}
    set_clock(monkeypatch, lambda: clock["ms"])
    daemon._publish_round_states([])
    _fail(daemon, "orders-6")
    daemon._write_health_records(clock["ms"])
    assert list(written[-1][0]) == ["orders-6"]
    daemon._drop("orders-6", "revoked by the group")
    daemon._write_health_records(clock["ms"])
    assert written[-1][1] == ["orders-6"], "given up: its record cleared"
    clock["ms"] += 3_600_000
    daemon.held.add("orders-6")           # acquired again; opening
    daemon._publish_pending_states()
    daemon._write_health_records(clock["ms"])
    assert all("orders-6" not in writes for writes, _ in written[2:]), written[2:]
    assert _lane_states(daemon)["orders-6"] != STALLED


@pytest.mark.timeout(10)
def test_an_unexpected_lane_error_is_logged_with_its_own_traceback(daemon, caplog):
    """A lane error nobody expected (not a Shoal or Kafka error: a bug) is logged with its traceback. ``_failed``
    runs outside the ``except`` that caught it, so ``exc_info=True`` logged "NoneType: None" (found by review)."""
    import logging

    def buggy_copy():
        raise ValueError("a bug in a lane's copy")

    try:
        buggy_copy()
    except ValueError as caught:
        error = caught
    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        daemon._failed(daemon.lanes["orders-3"], error)
    [record] = [r for r in caplog.records if "event=lane_error" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[1] is error
    assert "buggy_copy" in caplog.text
