"""A lane held up by a source transaction left open (no error anywhere) turns ``stalled`` once the hold outlasts
``open_transaction_alert_s`` — by time alone, since under fetch sessions an unchanged partition is left out of the
standing round's answers — and copies again when the transaction is decided. Answers go through the round's own
books (``_share_fetched`` for an answer with nothing new, ``_copied`` for a committed share). The real-broker case
is tests/faults/test_source_open_transaction.py."""

from __future__ import annotations

import time
from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest

from mirror_core.daemon import lane_health
from mirror_core.kafka.broker_fetch import PartitionOutcome
from mirror_core.model.lane_status import COPYING, SOURCE_TRANSACTION_OPEN, STALLED, LaneHealth
from mirror_core.state.lane_health_records import live_health
from tests.unit.daemon.test_daemon_idle_rounds import held_daemon, set_clock

ALERT_MS = 900_000  # the pipeline default open_transaction_alert_s, 900 s


class Clock:
    def __init__(self):
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clocked(monkeypatch):
    clock = Clock()
    set_clock(monkeypatch, clock)
    daemon = held_daemon(3)
    daemon._publish_lane_states()                          # every lane shown once
    daemon._next_health_walk = time.monotonic() + 3600     # no full walk: the due-time heap alone must do it
    return daemon, clock


def fetched(stable: int, high: int):
    return NS(last_stable_offset=stable, high_watermark=high)


def idle(daemon, state, position: int, stable: int, high: int) -> None:
    """An answer with nothing new for the lane at ``position``."""
    state.fetcher = NS(position=position)
    assert daemon._share_fetched(state, position, PartitionOutcome(fetched(stable, high), None)) is None
    daemon._health_dirty.add(state.lane)  # the round marks the lanes its answer named (_publish_round_states)


def copied(daemon, state, start: int, end: int, stable: int, high: int) -> None:
    """A share ``[start, end)`` copied and committed, its answer reporting ``stable`` / ``high``."""
    state.fetcher, state.session = NS(position=end), NS(position=end)
    result = NS(records=end - start, bytes=0, batches=1, deep_batches=0, newest_timestamp_ms=None,
                source_start=start, source_end=end, first_target_offset=start, next_target_offset=end)
    daemon._copied(state, fetched(stable, high), result)
    daemon._health_dirty.add(state.lane)


def shown(daemon, lane: str) -> dict:
    return next(entry for entry in daemon.metrics.readiness()[1]["lanes"] if entry["lane"] == lane)


@pytest.mark.timeout(10)
def test_held_longer_than_the_bound_the_lane_stalls_with_no_further_answer_and_recovers(clocked):
    daemon, clock = clocked
    state = daemon.lanes["orders-1"]
    idle(daemon, state, 10, 10, 31)                          # caught up to the LSO, the high watermark past it
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == COPYING    # a transaction may be open for a while: normal

    clock.ms += ALERT_MS - 1000
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == COPYING

    clock.ms += 2000                                          # past the bound, and no answer names the partition
    daemon._publish_due_states()
    lane = shown(daemon, "orders-1")
    assert (lane["state"], lane["reason"], lane["position"]) == (STALLED, SOURCE_TRANSACTION_OPEN, 10)
    assert "cluster 'source'" in lane["message"] and "last stable offset at 10" in lane["message"] and \
        "abort --topic orders --partition 1 --start-offset 10" in lane["message"]
    assert daemon.metrics.readiness()[0] is False
    assert "orders-1" in daemon._health_watch                 # a health record for lanes status and the page

    idle(daemon, state, 10, 10, 40)                           # still held: stays stalled
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == STALLED

    copied(daemon, state, 10, 41, 41, 41)                     # decided: the records behind it copied
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == COPYING and state.hold is None
    assert daemon.metrics.readiness()[0] is True


@pytest.mark.timeout(10)
def test_a_copy_that_reaches_a_held_offset_notes_the_hold_though_no_answer_follows(clocked):
    """Review finding: the answer that brings the lane to the LSO is a copy; after it, with the high watermark
    unchanged, the broker never names the partition again, so no idle answer would ever note the hold."""
    daemon, clock = clocked
    state = daemon.lanes["orders-0"]
    copied(daemon, state, 0, 10, 10, 31)                      # e.g. a daemon started after the transaction began
    clock.ms += ALERT_MS + 1000
    daemon._publish_due_states()
    assert (shown(daemon, "orders-0")["state"], shown(daemon, "orders-0")["reason"]) == \
        (STALLED, SOURCE_TRANSACTION_OPEN)


@pytest.mark.timeout(10)
def test_a_failure_during_the_alarm_does_not_replace_it_once_fetches_work_again(clocked, monkeypatch):
    """Review finding: a leader change while stalled behind the transaction turned the lane ``retrying``, and a good
    idle answer at the same offset then kept it so, to turn ``stalled`` later for the broker error."""
    daemon, clock = clocked
    state = daemon.lanes["orders-1"]
    idle(daemon, state, 10, 10, 31)
    clock.ms += ALERT_MS + 1000
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["reason"] == SOURCE_TRANSACTION_OPEN
    events = []
    monkeypatch.setattr(lane_health, "event", lambda name, *a, **kw: events.append(name))
    state.fetcher = NS(position=10)
    daemon._failed(state, Errors.NotLeaderForPartitionError("leader moved"), fetching=True)
    daemon._publish_due_states()
    # second review: the lane has not moved since the hold began, so it stays stalled (with the failure's reason)
    # instead of flapping to retrying and ready while the transaction still hangs
    assert (shown(daemon, "orders-1")["state"], daemon.metrics.readiness()[0]) == (STALLED, False)
    clock.ms += 1000
    idle(daemon, state, 10, 10, 31)                           # the new leader answers: still held
    daemon._publish_due_states()
    lane = shown(daemon, "orders-1")
    assert (lane["state"], lane["reason"]) == (STALLED, SOURCE_TRANSACTION_OPEN)
    assert "source_transaction_open" not in events, "the same hold announced twice"


@pytest.mark.timeout(10)
def test_a_short_failure_before_the_alarm_does_not_cost_the_hold_its_due_time(clocked):
    """Second review: a failure's due time took the lane's one slot in the heap; once the lane copied again the
    hold's own due time was gone, and only the 30 s walk (held off here) would have raised the alarm."""
    daemon, clock = clocked
    state = daemon.lanes["orders-1"]
    idle(daemon, state, 10, 10, 31)
    clock.ms += 100_000
    state.fetcher = NS(position=10)
    daemon._failed(state, Errors.NotLeaderForPartitionError("leader moved"), fetching=True)
    clock.ms += 1000
    idle(daemon, state, 10, 10, 31)                           # good again, still held
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == COPYING
    clock.ms += 301_000                                       # the failure's due time (stall_after_s) passes
    daemon._publish_due_states()
    assert shown(daemon, "orders-1")["state"] == COPYING
    clock.ms = state.hold.since_ms + ALERT_MS + 1000
    daemon._publish_due_states()
    assert (shown(daemon, "orders-1")["state"], shown(daemon, "orders-1")["reason"]) == \
        (STALLED, SOURCE_TRANSACTION_OPEN)


@pytest.mark.timeout(10)
def test_a_last_stable_offset_that_moves_is_no_hold_and_a_lane_behind_it_is_not_held(clocked):
    daemon, clock = clocked
    moving, behind = daemon.lanes["orders-0"], daemon.lanes["orders-2"]
    idle(daemon, moving, 10, 10, 31)
    idle(daemon, behind, 5, 10, 31)                           # not caught up to the LSO: it has data to copy
    assert behind.hold is None
    clock.ms += ALERT_MS // 2
    copied(daemon, moving, 10, 12, 12, 35)                    # transactions come and go: a new hold, timed anew
    clock.ms += ALERT_MS // 2 + 1000                          # past the first hold's due time, not the second's
    daemon._publish_due_states()
    assert shown(daemon, "orders-0")["state"] == COPYING
    clock.ms += ALERT_MS // 2
    daemon._publish_due_states()
    assert (shown(daemon, "orders-0")["state"], moving.hold.offset) == (STALLED, 12)


@pytest.mark.timeout(10)
def test_a_dropped_lane_forgets_its_hold(clocked):
    daemon, clock = clocked
    state = daemon.lanes["orders-1"]
    idle(daemon, state, 10, 10, 31)
    clock.ms += ALERT_MS + 1000
    daemon._publish_due_states()
    assert state.health.state == STALLED
    daemon._drop("orders-1", "revoked")
    assert state.hold is None and state.health.state == COPYING


@pytest.mark.timeout(10)
def test_the_health_record_keeps_the_whole_abort_command_for_a_long_topic_name(clocked):
    daemon, clock = clocked
    topic = "orders." + "x" * 240                             # Kafka allows 249 characters
    state = daemon.lanes["orders-1"]
    state.topic = topic
    idle(daemon, state, 10, 10, 31)
    clock.ms += ALERT_MS + 1000
    daemon._publish_due_states()
    record = live_health(state.health)
    command = f"abort --topic {topic} --partition 1 --start-offset 10"
    assert command in record["message"], record["message"]


def test_a_failure_after_a_hold_keeps_the_time_since_the_lane_last_moved():
    health = LaneHealth(stall_after_s=300)
    health.held_up(SOURCE_TRANSACTION_OPEN, "held", 1_000, position=10)
    assert (health.state, health.attempts) == (STALLED, 0)
    health.failed("unavailable", "broker down", 1_000 + 400_000, position=10)
    assert (health.state, health.reason, health.since_ms, health.attempts) == (STALLED, "unavailable", 1_000, 1)


def test_a_hold_shorter_than_stall_after_s_stays_stalled_when_refreshed():
    """Found by the fault test: the held-up state was re-judged by ``stall_after_s`` (300 s) at the next refresh
    and shown ``retrying`` when the hold's own bound (here 3 s) is shorter."""
    health = LaneHealth(stall_after_s=300)
    health.held_up(SOURCE_TRANSACTION_OPEN, "held", 1_000_000, position=10)
    health.refresh(1_000_000 + 4_000)
    assert health.state == STALLED
