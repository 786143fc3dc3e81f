"""A lane's state and its holders as readers outside the daemon see them (the Shoal page, the handoff's wait,
``shoal lanes status``): mirror_core.model.lane_status.observed_state and mirror_core.model.lane_holders — the daemon
group's assignment, live leases of lease-based daemons during an upgrade, health records; a group that could not be read
is "unknown", never "no daemon"."""

from __future__ import annotations

import pytest

from mirror_core.kafka.daemon_group import GroupDescription, GroupMember
from mirror_core.model.lane_holders import LaneHolders, daemon_health, lanes_without_daemon
from mirror_core.model.lane_status import observed_state
from mirror_core.state.lane_health_records import HealthRecord
from mirror_core.state.leases import Lease

NOW = 1_000_000


@pytest.mark.parametrize("kw, state, why", [
    (dict(persisted_state="halted", lag=5, held=True, owner="daemon", updated_ms=0), "halted", None),
    (dict(persisted_state=None, lag=0, held=False, owner="daemon", updated_ms=0), "copying", None),
    (dict(persisted_state=None, lag=9, held=True, owner="daemon", updated_ms=NOW - 10_000), "copying", None),
    (dict(persisted_state=None, lag=9, held=False, owner="daemon", updated_ms=NOW - 400_000), "stalled",
     "no daemon holds the lane"),
    (dict(persisted_state=None, lag=9, held=True, owner="daemon", updated_ms=NOW - 400_000), "stalled",
     "no checkpoint for 400s while 9 offsets behind"),
    (dict(persisted_state=None, lag=9, held=None, owner="daemon", updated_ms=NOW - 400_000), "stalled",
     "the daemon group could not be read"),
    (dict(persisted_state=None, lag=9, held=False, owner="backfill:r1", updated_ms=NOW - 400_000), "stalled",
     "owned by backfill:r1"),
])
def test_a_lane_with_data_waiting_and_no_progress_is_stalled(kw, state, why):
    got, detail = observed_state(**kw, now_ms=NOW, stall_after_s=300)
    assert got == state
    assert (detail is None) if why is None else (why in detail)
    if kw["held"] is None:
        assert "no daemon holds" not in detail


GROUP = GroupDescription("shoal.p.daemons", "consumer", "stable", (
    GroupMember("daemon-a", "m1", "/10.0.0.5", (("t", 0), ("t", 1))),
    GroupMember("daemon-b", "m2", "/10.0.0.6", (("t", 2),))))
LANES = {f"dr.t-{p}": ("t", p) for p in range(4)}


def test_lanes_are_held_by_the_group_assignment_or_an_old_daemons_live_lease():
    leases = {"dr.t-3": Lease("p", "dr.t-3", "old-1", NOW + 5_000),                  # an upgrade in progress
              "dr.t-2": Lease("p", "dr.t-2", "daemon-b", NOW + 5_000, group=True)}   # compat record: not counted
    holders = LaneHolders(GROUP.holders(), leases, {}, NOW)
    assert [holders.holder(part, lane) for lane, part in LANES.items()] == [
        "daemon-a", "daemon-a", "daemon-b", "old-1 (lease)"]
    assert lanes_without_daemon(holders, LANES) == []
    gone = LaneHolders(GROUP.holders(), {"dr.t-3": Lease("p", "dr.t-3", "old-1", NOW - 1)}, {}, NOW)
    assert lanes_without_daemon(gone, LANES) == ["dr.t-3"] and gone.held(("t", 3), "dr.t-3") is False


def test_an_unreadable_group_makes_holding_unknown_not_absent():
    holders = LaneHolders(None, {"dr.t-3": Lease("p", "dr.t-3", "old-1", NOW + 5_000)}, {}, NOW, "source down")
    assert holders.held(("t", 0), "dr.t-0") is None
    assert holders.held(("t", 3), "dr.t-3") is True  # a live lease still says so
    assert lanes_without_daemon(holders, LANES) == ["dr.t-0", "dr.t-1", "dr.t-2"]


def test_only_live_health_records_are_taken():
    record = HealthRecord("dr.t-0", "daemon-a", "retrying", "unavailable", "down", 3, NOW - 9_000, NOW - 9_000,
                          NOW + 1)
    group = {("t", 0): ["daemon-a"]}
    holders = LaneHolders(group, {}, {"dr.t-0": record}, NOW)
    assert holders.live_health("dr.t-0", ("t", 0)) is record
    assert LaneHolders(group, {}, {"dr.t-0": record}, NOW + 1).live_health("dr.t-0", ("t", 0)) is None
    # the record of a worker the group no longer assigns the partition to says nothing of the lane
    assert LaneHolders({("t", 0): ["daemon-b"]}, {}, {"dr.t-0": [record]}, NOW).live_health("dr.t-0", ("t", 0)) \
        is None


def test_daemon_health_names_the_members_and_old_daemons_during_an_upgrade():
    leases = {"x": Lease("p", "x", "old-1", NOW + 5_000), "y": Lease("p", "y", "old-2", NOW - 5_000),
              "z": Lease("p", "z", "daemon-a", NOW + 5_000, group=True)}
    assert daemon_health(GROUP, None, leases, NOW) == [
        "daemon group shoal.p.daemons: 2 member(s), protocol consumer, state stable",
        "daemon-a (/10.0.0.5): holds 2 partition(s)",
        "daemon-b (/10.0.0.6): holds 1 partition(s)",
        "old-1 (lease-based daemon of an older release): holds 1 lane(s) by lease, next expiry in 5s — an upgrade "
        "in progress; group daemons keep off those lanes until it stops"]
    empty = GroupDescription("shoal.p.daemons", "consumer", "empty", ())
    assert "no daemon runs" in daemon_health(empty, None, {}, NOW)[0]


def test_daemon_health_says_an_unreadable_group_is_unknown_not_no_daemon():
    (line,) = daemon_health(None, "cluster 'source': could not describe the daemon group", {}, NOW)
    assert "not readable" in line and "unknown" in line and "could not describe" in line
    assert "no daemon runs" not in line
