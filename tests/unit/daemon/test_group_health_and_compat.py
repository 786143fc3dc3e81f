"""Review of issue 18 (branches i18-group, i18-outage, i18-scale): failing reproducers, no fixes.

1. A former holder's lane health record is cleared (tombstone) only at its NEXT group round, after the partition
   was given back: by then the new holder may have written its own record of the lane (same key), which the
   tombstone erases. The compat lease records already avoid exactly this (released before ``released()``); the
   health records do not. The Shoal page / ``shoal lanes status`` then show a retrying lane as copying until the
   new holder's next refresh (``HEALTH_REFRESH_S``, 30 s) — or for good, if the lane keeps failing with the same
   state and reason and the refresh is the only rewrite (it is rewritten after 30 s, so: up to 30 s).
2. The handoff's wait counts a lane as held once a group member has its partition assigned — also a lane the
   daemon will never take (halted in its checkpoint): the wait returns at once instead of timing out, while the
   previous lease-based wait (no lease for a lane no daemon holds) timed out.
"""

from __future__ import annotations

import json

import pytest

from mirror_core.state.lane_health_records import LaneHealthWriter, parse_health_records
from mirror_core.state.leases import now_ms
from tests.unit.daemon.test_daemon_membership import group_daemon


class SharedTopic:
    """The compacted checkpoint topic as readers see it: last value per key, a tombstone removes the key."""

    def __init__(self):
        self.values: dict[bytes, bytes] = {}

    def produce(self, records, *, what, timeout_s=30.0):
        for key, value, _name in records:
            if value is None:
                self.values.pop(key, None)
            else:
                self.values[key] = value

    def health(self, pipeline="p"):
        return parse_health_records(self.values.items(), pipeline)


def _daemon(worker, topic, assigned):
    daemon = group_daemon(lanes=("t-0",), lease_compat="off")
    daemon.worker_id = worker
    daemon.health_records = LaneHealthWriter(topic)
    daemon.membership.full = set(assigned)
    daemon._deleted_source_topics = lambda topics: set()
    return daemon


@pytest.mark.timeout(10)
def test_a_former_holders_health_clear_does_not_erase_the_new_holders_record():
    topic = SharedTopic()
    a = _daemon("A", topic, {("t", 0)})
    b = _daemon("B", topic, set())
    a._maintain_group()
    assert a.held == {"t-0"}
    a.lanes["t-0"].health.failed("unavailable", "target partition has no leader", now_ms())
    a._health_failed(a.lanes["t-0"])  # as the daemon\'s _failed tells its books
    a._maintain_group()
    assert topic.health()["t-0"].holder == "A"

    # the group moves the partition to B: A answers the revocation (lane closed, partition given back)
    a.membership.revoking_now = {("t", 0)}
    a.membership.generation += 1
    a._answer_revocations()
    a.membership.full, a.membership.revoking_now = set(), set()
    assert a.held == set()

    # B is assigned the partition, its lane fails the same way, its group round writes B's record
    b.membership.full = {("t", 0)}
    b.membership.generation += 1
    b._maintain_group()
    assert b.held == {"t-0"}
    b.lanes["t-0"].health.failed("unavailable", "target partition has no leader", now_ms())
    b._health_failed(b.lanes["t-0"])  # as the daemon\'s _failed tells its books
    b._maintain_group()
    assert topic.health()["t-0"].holder == "B"

    # A's next group round (within lease_ttl_s / 3) clears "its" record of the lane: the key is the lane's
    a._maintain_group()
    b._maintain_group()  # B's next round: same state and reason, not 30 s old — nothing rewritten
    live = topic.health().get("t-0")
    assert live is not None and live.holder == "B", (
        "B's lane is retrying, but its health record was erased by A's late tombstone (A clears at its next group "
        "round, after released(); the compat lease records are released before released() for this reason): "
        "readers show the lane as copying until B's 30 s refresh")


@pytest.mark.timeout(10)
def test_the_health_clear_of_a_revoked_lane_goes_out_before_the_partition_is_given_back():
    """The invariant the fix needs (as for compat lease records): nothing of ours about a lane is written after
    released() — the next holder may already write that key."""
    topic = SharedTopic()
    a = _daemon("A", topic, {("t", 0)})
    a._maintain_group()
    a.lanes["t-0"].health.failed("unavailable", "x", now_ms())
    a._health_failed(a.lanes["t-0"])  # as the daemon\'s _failed tells its books
    a._maintain_group()
    order = a.membership.events
    real = topic.produce
    topic.produce = lambda records, **kw: (order.append("health"), real(records, **kw))[1]
    order.clear()
    a.membership.revoking_now = {("t", 0)}
    a.membership.generation += 1
    a._answer_revocations()
    a.membership.full, a.membership.revoking_now = set(), set()
    a._maintain_group()
    assert order[:2] == ["health", "released"], f"order of A's writes and the release: {order}"


@pytest.mark.timeout(10)
def test_the_handoff_wait_does_not_count_a_halted_lane_as_held(monkeypatch):
    """A daemon never takes a lane halted in its checkpoint (_eligible skips stopped lanes), but the group still
    assigns its partition: lanes_without_daemon must not report it held. Before issue 18 (lease-based wait) no
    lease was ever written for such a lane and the wait timed out naming it."""
    import mirror_core.services.handoff as handoff
    import mirror_core.services.mirror_status as mirror_status
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.model.lane_holders import LaneHolders
    from mirror_core.model.lane_status import HALTED, PersistedLaneState
    from mirror_core.state.checkpoint import Checkpoint

    halted = Checkpoint("p", "t", 0, 10, "dr.t", 0, 10, "daemon", 2,
                        lane_state=PersistedLaneState(HALTED, "data_loss", "records deleted before copied",
                                                      now_ms(), 10, 20))

    class Store:
        def read_all(self, pipeline, whole_maps=True):
            return {("p", "t", 0): halted}

        def read_own(self, pipeline, topic, partition):
            return halted

    holders = LaneHolders({("t", 0): ["daemon-1"]}, {}, {}, now_ms())
    monkeypatch.setattr(mirror_status, "read_lane_holders", lambda *a, **k: (holders, None))
    missing = handoff.lanes_without_daemon(Store(), ClusterConfig("source", {"bootstrap.servers": "a:1"}), "p",
                                           {"dr.t-0": ("t", 0)})
    assert missing == ["dr.t-0"], "a halted lane no daemon will copy is counted as held by the group assignment"


def test_shared_topic_stub_matches_the_record_format():
    topic = SharedTopic()
    LaneHealthWriter(topic).write("p", "A", {"l": {"state": "retrying", "reason": "r", "message": "m",
                                                 "attempts": 1, "since_ms": 1}}, [], now_ms())
    assert json.loads(next(iter(topic.values)))["lane_health"] == ["p", "l", "A"]  # per writer
    assert topic.health()["l"].holder == "A"


def test_a_health_record_of_a_worker_that_no_longer_holds_the_lane_is_not_shown():
    """A holder killed (SIGKILL) or cut off from the source while its lane retried leaves a live record (90 s); the
    group has since given the partition to B, which copies fine. Readers (Shoal page, lanes status) still show
    A's 'retrying' for the lane, reported by A, though the group they read in the same look says B holds it."""
    from mirror_core.model.lane_holders import LaneHolders
    from mirror_core.state.lane_health_records import HealthRecord

    now = now_ms()
    stale = HealthRecord("dr.t-0", "A", "retrying", "unavailable", "source unreachable", 7, now - 60_000,
                         now - 20_000, now + 70_000)
    holders = LaneHolders({("t", 0): ["B"]}, {}, {"dr.t-0": stale}, now)
    assert holders.holder(("t", 0), "dr.t-0") == "B"
    assert holders.live_health("dr.t-0", ("t", 0)) is None, (
        "the lane is shown as retrying (reported by A) while the group assigns it to B")


def test_an_old_daemon_started_late_can_count_the_group_daemons_again():
    """docs/daemon-membership.md ('What auto does not cover'): an old daemon started after the group daemons stopped
    writing takes their lanes; they drop what it leased, start writing records again, "and the old daemon, counting
    the group daemons again, gives lanes back down to its fair share". The old daemon (18af6cc _maintain_leases)
    counts as others the holders of live lease records and membership heartbeats: its first round saw none, so its
    share was every eligible lane and it leased them all. The group daemons then hold nothing, write no record
    (write_many([])) and no heartbeat: the old daemon never counts them, never gives a lane back, and carries the
    whole pipeline alone until it is stopped."""
    daemon = group_daemon(lanes=("t-0", "t-1", "t-2", "t-3"))  # lease_compat: auto (the default)
    daemon._maintain_group()
    assert len(daemon.held) == 4 and daemon.leases.writes == []
    later = now_ms() + 15_000
    from mirror_core.state.leases import Lease
    daemon.leases.records = {lane: Lease("p", lane, "old-1", later) for lane in daemon.lanes}  # it leased them all
    daemon.leases.members = {"old-1": Lease("p", "__member__:old-1", "old-1", later)}
    daemon._maintain_group()
    daemon._maintain_group()
    assert daemon.held == set()
    named = {lease.holder for batch in daemon.leases.writes for lease in batch}
    assert "A" in named, ("no record written by the group daemon while the old one is seen: the old daemon's fair "
                          f"share stays every lane (writes: {daemon.leases.writes})")


def test_the_compat_heartbeat_counts_for_an_old_daemon_not_for_group_daemons_and_ends_with_compat():
    """The heartbeat the group daemon writes while an old daemon is seen is the old release's record
    (``__member__:<worker>``), so the old daemon's fair share (18af6cc _maintain_leases: holders of live leases and
    heartbeats other than itself) counts it; it is marked ``group``, so another group daemon does not take it for an
    old daemon (which would keep compat writing on for good); once no old daemon is seen it is tombstoned."""
    from mirror_core.state.leases import MEMBER_PREFIX, Lease, lease_based_daemon_seen

    daemon = group_daemon(lanes=("t-0", "t-1", "t-2", "t-3"))
    later = now_ms() + 15_000
    daemon.leases.records = {lane: Lease("p", lane, "old-1", later) for lane in daemon.lanes}
    daemon.leases.members = {"old-1": Lease("p", "__member__:old-1", "old-1", later)}
    daemon._maintain_group()
    heartbeats = [lease for batch in daemon.leases.writes for lease in batch if lease.lane.startswith(MEMBER_PREFIX)]
    assert heartbeats and heartbeats[-1].lane == MEMBER_PREFIX + "A" and heartbeats[-1].group
    now = now_ms()
    # the old daemon's count of others (its own formula): the group daemon is one of them now
    seen_by_old = {lease.holder for lease in [*daemon.leases.records.values(), heartbeats[-1]]
                   if lease.held_by_other("old-1", now)}
    assert seen_by_old == {"A"}
    assert lease_based_daemon_seen({}, {"A": heartbeats[-1]}, "B", now) is None  # another group daemon
    assert daemon.leases.released_members == []
    daemon.leases.records, daemon.leases.members = {}, {}  # the old daemon stopped (released its records)
    daemon._maintain_group()
    assert daemon.leases.released_members == ["A"]


def test_a_lost_assignment_with_the_source_unreachable_does_not_say_others_got_the_partitions():
    """Classic protocol: librdkafka's own session timer drops the assignment when no coordinator answers (SESSTMOUT);
    with the source down the coordinator is down too, so nobody was given the partitions."""
    import time

    from mirror_core.daemon.membership import lost_note
    from mirror_core.kafka.source_reachability import SourceReachability

    reachability = SourceReachability("source")
    assert "may have given them to others" in lost_note(reachability)
    reachability.unanswered(time.monotonic(), "every broker of the group's consumer is down")
    note = lost_note(reachability)
    assert "coordinator on the source was unreachable" in note and "gave them to others" not in note
