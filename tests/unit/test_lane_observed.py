"""A lane's state as the Shoal page sees it from checkpoints and leases (mirror_core.lane_status.observed_state,
lease_health)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mirror_core.lane_status import lease_health, observed_state

NOW = 1_000_000


@pytest.mark.parametrize("kw, state, why", [
    (dict(persisted_state="halted", lag=5, lease_live=True, owner="daemon", updated_ms=0), "halted", None),
    (dict(persisted_state=None, lag=0, lease_live=False, owner="daemon", updated_ms=0), "copying", None),
    (dict(persisted_state=None, lag=9, lease_live=True, owner="daemon", updated_ms=NOW - 10_000), "copying", None),
    (dict(persisted_state=None, lag=9, lease_live=False, owner="daemon", updated_ms=NOW - 400_000), "stalled",
     "no daemon holds the lane"),
    (dict(persisted_state=None, lag=9, lease_live=True, owner="daemon", updated_ms=NOW - 400_000), "stalled",
     "no checkpoint for 400s while 9 offsets behind"),
    (dict(persisted_state=None, lag=9, lease_live=False, owner="backfill:r1", updated_ms=NOW - 400_000), "stalled",
     "owned by backfill:r1"),
])
def test_a_lane_with_data_waiting_and_no_progress_is_stalled(kw, state, why):
    got, detail = observed_state(**kw, now_ms=NOW, stall_after_s=300)
    assert got == state
    assert (detail is None) if why is None else (why in detail)


def test_lease_health_names_each_holder_and_expired_leases():
    leases = {"a": SimpleNamespace(holder="w1", expires_ms=NOW + 5_000),
              "b": SimpleNamespace(holder="w2", expires_ms=NOW - 30_000)}
    assert lease_health(leases, NOW) == [
        "w1: holds 1 lane(s), leases renewed (next expiry in 5s)",
        "w2: holds 0 lane(s), 1 lease(s) EXPIRED (oldest 30s ago): that daemon is gone or stuck"]
    assert "no daemon has taken a lane" in lease_health({}, NOW)[0]


def test_lease_health_tells_group_members_from_lease_based_daemons_during_an_upgrade():
    leases = {"a": SimpleNamespace(holder="new-1", expires_ms=NOW + 5_000, group=True),
              "b": SimpleNamespace(holder="old-1", expires_ms=NOW + 5_000, group=False)}
    assert lease_health(leases, NOW) == [
        "new-1 (group member): holds 1 lane(s), leases renewed (next expiry in 5s)",
        "old-1 (lease-based): holds 1 lane(s), leases renewed (next expiry in 5s)"]
