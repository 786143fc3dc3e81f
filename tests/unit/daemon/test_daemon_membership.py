"""The membership's decisions and its revocation hand-shake, without a broker (the group itself is exercised on
real brokers in tests/integration/daemon/test_daemon_group.py). The hand-shake is driven through its callbacks with a
recording stand-in for the consumer: what matters here is *when* the partitions are given up."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TopicPartition

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import daemon_group_id as group_id
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon.group_settings import choose_protocol, consumer_settings
from mirror_core.daemon.membership import GroupMembership
from mirror_core.errors import ConfigError
from mirror_core.state.leases import Lease

SOURCE = ClusterConfig("source", {"bootstrap.servers": "127.0.0.1:1"})


class RecordingConsumer:
    def __init__(self):
        self.calls: list[tuple[str, list[tuple[str, int]], float]] = []

    def _record(self, what, tps):
        self.calls.append((what, [(tp.topic, tp.partition) for tp in tps], time.monotonic()))

    def incremental_assign(self, tps):
        self._record("assign", tps)

    def pause(self, tps):
        self._record("pause", tps)

    def incremental_unassign(self, tps):
        self._record("unassign", tps)


def membership(revoke_timeout_s: float = 5.0) -> GroupMembership:
    return GroupMembership(SOURCE, "p1", "w1", protocol="consumer", revoke_timeout_s=revoke_timeout_s)


def test_protocol_follows_the_broker_version_unless_chosen():
    assert choose_protocol("auto", (4, 0)) == "consumer"
    assert choose_protocol("auto", (3, 9)) == "classic"
    assert choose_protocol("auto", None) == "classic"
    assert choose_protocol("classic", (4, 2)) == "classic"
    with pytest.raises(ConfigError, match="group_protocol 'range'"):
        choose_protocol("range", (4, 0))


def test_the_group_never_commits_and_classic_uses_cooperative_sticky():
    kip848 = consumer_settings(SOURCE, "orders-dr", "w1", "consumer")
    assert kip848["group.id"] == group_id("orders-dr") == "shoal.orders-dr.daemons"
    assert kip848["enable.auto.commit"] is False and kip848["enable.auto.offset.store"] is False
    assert kip848["group.protocol"] == "consumer" and kip848["client.id"] == "w1"
    assert "session.timeout.ms" not in kip848 and "partition.assignment.strategy" not in kip848  # broker-side
    classic = consumer_settings(SOURCE, "orders-dr", "w1", "classic", classic_session_timeout_ms=6000)
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert classic["session.timeout.ms"] == 6000 and classic["heartbeat.interval.ms"] < 6000


def test_assigned_partitions_are_paused_in_the_same_callback():
    m, consumer = membership(), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert [c[:2] for c in consumer.calls] == [("assign", [("t", 0), ("t", 1)]), ("pause", [("t", 0), ("t", 1)])]
    assert m.assigned() == {("t", 0), ("t", 1)}


def test_revocation_waits_for_the_loop_to_release_the_lanes():
    m, consumer = membership(), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    callback = threading.Thread(target=m._on_revoke, args=(consumer, [TopicPartition("t", 1)]))
    callback.start()
    time.sleep(0.3)
    assert callback.is_alive(), "the callback gave the partition up before the loop released it"
    assert m.revoking() == {("t", 1)} and m.assigned() == {("t", 0)}  # the loop stops copying it now
    released_at = time.monotonic()
    m.released([("t", 1)])
    callback.join(2)
    assert not callback.is_alive()
    what, parts, at = consumer.calls[-1]
    assert (what, parts) == ("unassign", [("t", 1)]) and at >= released_at
    assert m.revoking() == frozenset() and m.view().assigned == {("t", 0)}


def test_revocation_gives_up_after_its_timeout():
    m, consumer = membership(revoke_timeout_s=0.5), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0)])
    started = time.monotonic()
    m._on_revoke(consumer, [TopicPartition("t", 0)])  # nobody releases it
    assert 0.5 <= time.monotonic() - started < 2.0
    assert consumer.calls[-1][:2] == ("unassign", [("t", 0)])
    assert m.assigned() == frozenset() and m.revoking() == frozenset()


def test_a_lost_assignment_is_dropped_without_waiting():
    m, consumer = membership(revoke_timeout_s=5.0), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0)])
    started = time.monotonic()
    m._on_lost(consumer, [TopicPartition("t", 0)])
    assert time.monotonic() - started < 0.5 and m.assigned() == frozenset()


def test_revocation_timeout_must_stay_below_the_rebalance_timeout():
    with pytest.raises(ConfigError, match="revoke_timeout_s"):
        GroupMembership(SOURCE, "p1", "w1", protocol="consumer", revoke_timeout_s=200)


def test_group_daemons_are_blocked_only_by_live_leases_of_lease_based_daemons():
    now = 1_000_000
    assert Lease("p", "l", "old-1", now + 5000).blocks_group_daemon("new-1", now)
    assert not Lease("p", "l", "old-1", now - 1).blocks_group_daemon("new-1", now)  # expired
    assert not Lease("p", "l", "new-2", now + 5000, group=True).blocks_group_daemon("new-1", now)  # the group decides
    assert not Lease("p", "l", "new-1", now + 5000).blocks_group_daemon("new-1", now)  # our own


def test_pipeline_membership_settings_are_validated():
    base = {"pipeline": "p", "source": {"bootstrap.servers": "a:1"}, "target": {"bootstrap.servers": "b:1"},
            "include": "x"}
    config = pipeline_config_from_mapping(base)
    assert (config.membership, config.group_protocol, config.lease_compat) == ("group", "auto", "auto")
    with pytest.raises(ConfigError, match="membership 'zookeeper'"):
        pipeline_config_from_mapping({**base, "membership": "zookeeper"})
    with pytest.raises(ConfigError, match="lease_compat 'sometimes'"):
        pipeline_config_from_mapping({**base, "lease_compat": "sometimes"})
    # the true/false of the previous release keep their meaning (and YAML reads an unquoted `off` as false)
    assert pipeline_config_from_mapping({**base, "lease_compat": True}).lease_compat == "always"
    assert pipeline_config_from_mapping({**base, "lease_compat": False}).lease_compat == "off"
    with pytest.raises(ConfigError, match="revoke_timeout_s"):
        pipeline_config_from_mapping({**base, "revoke_timeout_s": 600})


def test_a_pipeline_file_still_saying_membership_leases_is_refused_with_the_upgrade(tmp_path):
    """The lease-based mode is gone: its pipeline file gets an error naming the file and the pipeline, saying the
    mode was removed and how to upgrade — not a daemon that silently runs something else."""
    from mirror_core.config.pipeline_file import load_pipeline_config

    path = tmp_path / "orders.yaml"
    path.write_text("pipeline: orders-dr\nsource: {bootstrap.servers: 'a:1'}\ntarget: {bootstrap.servers: 'b:1'}\n"
                    "include: orders\nmembership: leases\n")
    with pytest.raises(ConfigError) as raised:
        load_pipeline_config(path)
    message = str(raised.value)
    assert str(path) in message and "'orders-dr'" in message and "removed" in message
    assert "start the new daemon" in message and "lease records" in message


# ---- the review fixes (issue 18 review): the daemon's side, with a stand-in membership --------------------------
class StubMembership:
    """What the daemon loop reads of a GroupMembership, set by the test."""

    protocol, group, error = "consumer", "shoal.p.daemons", None

    def __init__(self, assigned=frozenset()):
        self.full = set(assigned)         # assigned, revoking included (view().assigned)
        self.revoking_now: set = set()
        self.generation = 1
        self.alive = True
        self.joined = True
        self.unjoined_s = 0.0
        self.released_calls: list[tuple[set, int | None]] = []
        self.events: list[str] = []

    def assigned(self):
        return frozenset(self.full - self.revoking_now)

    def revoking(self):
        return frozenset(self.revoking_now)

    def released(self, parts, *, as_of=None):
        self.events.append("released")
        self.released_calls.append((set(parts), as_of))

    def view(self):
        from mirror_core.daemon.membership import MembershipView
        return MembershipView(self.protocol, self.group, self.joined, frozenset(self.full),
                              frozenset(self.revoking_now), 0.0)

    def unjoined_for_s(self):
        return self.unjoined_s


class RecordingLeases:
    def __init__(self, membership=None, records=None):
        self.records = records or {}
        self.members: dict[str, Lease] = {}  # membership heartbeats of lease-based daemons
        self.writes: list[list[Lease]] = []
        self.released_members: list[str] = []  # membership heartbeats tombstoned
        self.membership = membership

    def read(self, pipeline):
        return dict(self.records)

    def read_with_members(self, pipeline, **_kw):
        return dict(self.records), dict(self.members)

    def write_many(self, leases):
        if self.membership is not None:
            self.membership.events.append("leases")
        self.writes.append(list(leases))

    def release_member(self, pipeline, holder):
        self.released_members.append(holder)


def group_daemon(lanes=("t-0", "t-1"), **overrides):
    from mirror_core.daemon.lane_state import LaneState
    from mirror_core.daemon.loop import ShallowMirrorDaemon

    cfg = pipeline_config_from_mapping({"pipeline": "p", "source": {"bootstrap.servers": "a:1"},
                                        "target": {"bootstrap.servers": "b:1"}, "include": "t", "metrics_port": 0,
                                        "lease_ttl_s": 3, **overrides})
    daemon = ShallowMirrorDaemon(cfg, worker_id="A")
    for lane in lanes:
        topic, part = lane.rsplit("-", 1)
        daemon.lanes[lane] = LaneState(topic, int(part), topic, lane)
    daemon._eligible = lambda: sorted(daemon.lanes)
    daemon.membership = StubMembership({(daemon.lanes[ln].topic, daemon.lanes[ln].partition) for ln in lanes})
    daemon.leases = RecordingLeases(daemon.membership)
    daemon.health_records = RecordingHealth()
    return daemon


class RecordingHealth:
    def __init__(self):
        self.writes: list[tuple[dict, list]] = []

    def write(self, pipeline, holder, writes, clears, now_ms):
        self.writes.append((dict(writes), list(clears)))


def test_released_does_not_satisfy_a_later_revocation_of_the_same_partition():
    """The loop read the revocations at generation g; the revocation it answers completed (timeout), the partition
    came back and is being revoked again: the loop's released() of the first must not complete the second (its
    lane may be mid-transaction). Before: released() took any partition currently revoking."""
    m, consumer = membership(), RecordingConsumer()
    m._on_assign(consumer, [TopicPartition("t", 0)])
    seen_at = m.generation  # the loop reads the generation, then revoking() (empty now: a revocation comes next)
    callback = threading.Thread(target=m._on_revoke, args=(consumer, [TopicPartition("t", 0)]))
    callback.start()
    time.sleep(0.2)
    m.released([("t", 0)], as_of=seen_at)
    callback.join(0.5)
    assert callback.is_alive(), "a release read before the revocation began completed it"
    m.released([("t", 0)], as_of=m.generation)
    callback.join(2)
    assert not callback.is_alive()


def test_unjoined_time_counts_from_a_non_empty_subscription_until_an_assignment():
    class SubscribingConsumer(RecordingConsumer):
        def subscribe(self, topics, **_callbacks):
            self.topics = topics

    m, consumer = membership(), SubscribingConsumer()
    assert m.unjoined_for_s() == 0.0
    m.subscribe(["t"])
    m._apply_subscription(consumer)
    time.sleep(0.2)
    assert m.unjoined_for_s() >= 0.2
    m._on_assign(consumer, [])  # an empty assignment is still a joined group
    assert m.unjoined_for_s() == 0.0 and m.view().joined


def test_the_classic_member_refreshes_metadata_at_the_rescan_interval():
    settings = consumer_settings(SOURCE, "p", "w1", "classic", metadata_refresh_ms=10_000)
    assert settings["topic.metadata.refresh.interval.ms"] == 10_000
    # an hour's rescan interval: librdkafka's own 5 minutes at most
    hourly = consumer_settings(SOURCE, "p", "w1", "classic", metadata_refresh_ms=3_600_000)
    assert hourly["topic.metadata.refresh.interval.ms"] == 300_000


def test_the_consumer_protocol_member_keeps_librdkafkas_metadata_refresh():
    """With an hour-long refresh interval a KIP-848 member never applied the broker's assignment (the daemon with
    rescan_interval_s 3600 held no lane: tests/faults/test_daemon_one_lane_commit_fails.py timed out)."""
    settings = consumer_settings(SOURCE, "p", "w1", "consumer", metadata_refresh_ms=3_600_000)
    assert "topic.metadata.refresh.interval.ms" not in settings


def test_an_unjoined_group_is_reported_and_fails_readiness():
    daemon = group_daemon()
    daemon._group_topics = ["t"]
    daemon.membership.joined, daemon.membership.unjoined_s = False, 10.0
    daemon._check_group_formed()
    assert daemon.metrics.readiness()[0]  # 10 s < 3 × the 45 s default session: not yet
    daemon.membership.unjoined_s = 3 * 45 + 1
    daemon._check_group_formed()
    ready, body = daemon.metrics.readiness()
    assert not ready and "shoal.p.daemons" in body["group"] and "'source'" in body["group"]
    assert daemon.metrics.registry.get_sample_value("shoal_group_joined") == 0
    daemon.membership.joined, daemon.membership.unjoined_s = True, 0.0
    daemon._check_group_formed()
    assert daemon.metrics.readiness()[0]
    assert daemon.metrics.registry.get_sample_value("shoal_group_joined") == 1


def test_a_fenced_lane_is_not_reacquired_from_the_same_assignment():
    """A member the broker expired but cut off from the coordinator keeps its stale assignment: after a fenced drop
    it must not take the lane again (fencing the new holder back) until the assignment changes or a backoff passes.
    Before: the next _maintain_group re-added it at once."""
    from mirror_core.errors import ProducerFencedError

    daemon = group_daemon(lease_compat=False)
    daemon._maintain_group()
    assert daemon.held == {"t-0", "t-1"}
    daemon._failed(daemon.lanes["t-0"], ProducerFencedError("target", "shoal.p.t-0", "PRODUCER_FENCED"))
    assert daemon.held == {"t-1"}
    daemon._maintain_group()
    assert daemon.held == {"t-1"}, "re-acquired from the same (possibly stale) assignment"
    daemon._fenced["t-0"] = (*daemon._fenced["t-0"][:2], time.monotonic() - 1)  # the backoff passed
    daemon._maintain_group()
    assert daemon.held == {"t-0", "t-1"}
    daemon._failed(daemon.lanes["t-0"], ProducerFencedError("target", "shoal.p.t-0", "PRODUCER_FENCED"))
    assert daemon._fenced["t-0"][1] == 2  # fenced twice in a row: a longer wait
    daemon.membership.generation += 1  # the assignment changed: taken at once
    daemon._maintain_group()
    assert daemon.held == {"t-0", "t-1"}


def test_fencings_far_apart_do_not_add_up_while_back_and_forth_ones_still_back_off():
    """The fenced backoff doubles with each fencing *in a row*. A lone member's generation never changes, so before,
    fencings days apart (the lane copying in between) added up until every new one cost the cap (300 s of a silent
    lane). A fencing more than the cap after the lane was let back now starts a new row; one soon after it (two
    processes fencing each other back, each committing a little in between) still doubles the wait."""
    from mirror_core.daemon.fences import FENCED_BACKOFF_CAP_S
    from mirror_core.errors import ProducerFencedError

    daemon = group_daemon(lease_compat=False)
    daemon._maintain_group()

    def fence() -> int:
        daemon._failed(daemon.lanes["t-0"], ProducerFencedError("target", "shoal.p.t-0", "PRODUCER_FENCED"))
        return daemon._fenced["t-0"][1]

    def let_back(ago_s: float) -> None:  # the backoff passed ``ago_s`` ago and the lane was taken again
        daemon._fenced["t-0"] = (*daemon._fenced["t-0"][:2], time.monotonic() - ago_s)
        daemon._maintain_group()
        assert daemon.held == {"t-0", "t-1"}

    assert fence() == 1
    let_back(1)
    assert fence() == 2, "fenced again soon after it was let back: a longer wait"
    for _ in range(3):  # days apart: each the shortest wait again
        let_back(FENCED_BACKOFF_CAP_S + 60)
        assert fence() == 1


def test_lease_records_are_renewed_in_one_batch():
    daemon = group_daemon(lanes=tuple(f"t-{p}" for p in range(50)), lease_compat="always")
    daemon._maintain_group()
    daemon._maintain_group()
    assert [len(batch) for batch in daemon.leases.writes] == [51, 51]  # 50 lanes and our membership heartbeat


def test_auto_compat_writes_lease_records_only_while_a_lease_based_daemon_is_seen():
    """lease_compat: auto (the default). No lease-based daemon in the records: nothing is written per held lane.
    One appears (its membership heartbeat, before it holds any lane; or a live lease without the group mark): our
    lanes' records are written, in one batch, so it keeps off them. It goes (its records expire): writing stops."""
    from mirror_core.state.leases import now_ms

    daemon = group_daemon(lanes=tuple(f"t-{p}" for p in range(20)))
    daemon._maintain_group()
    daemon._maintain_group()
    assert len(daemon.held) == 20 and daemon.leases.writes == [], "records written with no old daemon around"
    daemon.leases.members = {"old-1": Lease("p", "__member__:old-1", "old-1", now_ms() + 5_000)}
    daemon._maintain_group()
    assert [len(batch) for batch in daemon.leases.writes] == [21]  # 20 lanes and our membership heartbeat
    assert all(lease.group and lease.holder == "A" for lease in daemon.leases.writes[0])
    assert daemon.leases.writes[0][0].lane == "__member__:A"
    daemon.leases.members = {}
    daemon.leases.records = {"x-9": Lease("p", "x-9", "old-1", now_ms() + 5_000)}  # it holds a lane we do not
    daemon._maintain_group()
    assert len(daemon.leases.writes) == 2
    daemon.leases.records = {"x-9": Lease("p", "x-9", "old-1", now_ms() - 1)}  # expired: the old daemon is gone
    daemon._maintain_group()
    daemon._maintain_group()
    assert len(daemon.leases.writes) == 2 and daemon.leases.released_members == ["A"]  # heartbeat tombstoned
    # "off" never writes, even with an old daemon around — and still keeps off the lanes it holds
    off = group_daemon(lease_compat="off")
    off.leases.records = {"t-0": Lease("p", "t-0", "old-1", now_ms() + 5_000)}
    off._maintain_group()
    assert off.leases.writes == [] and off.held == {"t-1"}


def test_health_records_are_written_when_a_lane_state_changes_not_per_round():
    """A held lane that starts retrying gets a health record at the next group round; rounds while nothing changes
    write nothing; a new reason is written at once; copying again clears it (tombstone); copying lanes never cost
    a write."""
    daemon = group_daemon(lanes=tuple(f"t-{p}" for p in range(10)), lease_compat="off")
    for _ in range(3):
        daemon._maintain_group()
    assert daemon.health_records.writes == []
    health = daemon.lanes["t-3"].health

    def fail(reason: str, message: str, at_ms: int) -> None:  # as the daemon's _failed records a lane's failure
        health.failed(reason, message, at_ms)
        daemon._health_failed(daemon.lanes["t-3"])

    fail("unavailable", "the target went away", 1_000)
    daemon._maintain_group()
    daemon._maintain_group()
    assert len(daemon.health_records.writes) == 1
    written, cleared = daemon.health_records.writes[0]
    assert list(written) == ["t-3"] and written["t-3"]["state"] == "retrying" and cleared == []
    fail("unavailable", "still away", 2_000)  # another attempt, same state and reason: not at once
    daemon._maintain_group()
    assert len(daemon.health_records.writes) == 1
    fail("transaction_timeout", "timed out", 3_000)
    daemon._maintain_group()
    assert daemon.health_records.writes[-1][0]["t-3"]["reason"] == "transaction_timeout"
    health.succeeded()
    daemon._maintain_group()
    assert daemon.health_records.writes[-1] == ({}, ["t-3"])
    daemon._maintain_group()
    assert len(daemon.health_records.writes) == 3, "a cleared record written again"


def test_lease_records_are_released_before_the_revocation_completes_and_only_while_ours():
    """Our record of a revoked lane is released while the partition is still ours (before released(): no other
    group daemon has written the lane's record yet); a lane the group already moved (lost) keeps its record until
    it expires — a release then could erase the next holder's. Before: released() came first, then a read-then-
    write release of whatever record said us."""
    from mirror_core.state.leases import now_ms

    daemon = group_daemon(lanes=("t-0", "t-1"), lease_compat="always")
    daemon._maintain_group()
    expires = now_ms() + 10_000
    daemon.leases.records = {lane: Lease("p", lane, "A", expires, group=True) for lane in ("t-0", "t-1")}
    daemon.membership.revoking_now = {("t", 0)}  # being revoked: still ours until released()
    daemon.membership.full.discard(("t", 1))     # lost: the group gave it to someone else already
    daemon.membership.generation += 1
    daemon.membership.events.clear()
    daemon._answer_revocations()
    assert daemon.held == set()
    assert daemon.membership.events == ["leases", "released"]
    assert [(lease.lane, lease.expires_ms) for lease in daemon.leases.writes[-1]] == [("t-0", 0)]
    assert daemon.membership.released_calls[-1] == ({("t", 0)}, daemon.membership.generation)


def test_deleted_topics_are_confirmed_once_for_all_their_revoked_lanes(monkeypatch):
    """Revoked lanes of a deleted source topic: one confirmation wait for the topic, not DELETION_CONFIRM_S per
    lane (the revocation callback is waiting meanwhile)."""
    from mirror_core.daemon import lane_failures

    daemon = group_daemon(lanes=tuple(f"t-{p}" for p in range(6)), lease_compat=False)
    daemon._maintain_group()
    sleeps, lookups = [], []
    monkeypatch.setattr(lane_failures.time, "sleep", lambda s: sleeps.append(s))
    daemon._topics_missing_on_source = lambda topics: lookups.append(set(topics)) or set(topics)
    daemon._source_topic_missing = lambda topic: pytest.fail("a per-lane deletion check")
    halted = []
    daemon._halt = lambda state, exc, reason, **kw: (halted.append(state.lane), daemon._drop(state.lane, reason))
    daemon.membership.full.clear()
    daemon.membership.generation += 1
    daemon._answer_revocations()
    assert sleeps == [lane_failures.DELETION_CONFIRM_S] and len(lookups) == 2
    assert sorted(halted) == sorted(daemon.lanes) and daemon.held == set()


def test_lanes_count_as_idle_again_after_a_pool_tick():
    """_close_lane touches a writer only while no lane work runs elsewhere: the flag the pool's tick clears must be
    set again once the tick returns (before: it stayed False, so shutdown never aborted an open transaction)."""
    daemon = group_daemon(lease_compat=False)
    seen = []
    daemon._maintain_group = lambda: seen.append(daemon._lanes_idle)
    daemon._group_changed.set()
    daemon._leases_busy()
    assert seen == [False] and daemon._lanes_idle is True


def test_a_failing_rejoin_is_retried_with_a_backoff_not_raised():
    daemon = group_daemon(lease_compat=False)
    daemon.membership.alive = False
    calls = []

    def join():
        calls.append(time.monotonic())
        raise RuntimeError("source unreachable")

    daemon._join_group = join
    daemon._leases_if_due()   # does not raise
    daemon._leases_if_due()   # backing off: no second attempt at once
    assert len(calls) == 1
    daemon._next_join = 0.0
    daemon._leases_if_due()
    assert len(calls) == 2 and daemon._next_join - time.monotonic() > 1.0  # doubled


def test_a_lane_whose_deleted_source_topic_left_the_assignment_halts_or_retires_instead_of_being_dropped():
    """The group can drop a deleted topic's partitions from the assignment between two revocation answers; the next
    group round then found the lane 'not assigned' and dropped it — no halt, no named range (the CI run of
    2026-11-23: test_a_source_topic_deleted_under_a_running_daemon_halts_naming_the_range_or_retires timed out).
    It now halts or retires as a held lane does."""
    daemon = group_daemon(lanes=("t-0", "u-0"), lease_compat="off")
    daemon._persist = lambda state, persisted: True  # the halt's record on the target: not what is tested here
    daemon._maintain_group()
    assert daemon.held == {"t-0", "u-0"}
    daemon.lanes["t-0"].last_stable = 50  # it had seen offsets it never copied
    daemon.membership.full = {("u", 0)}   # t's partition left the assignment without a revocation answered
    daemon._deleted_source_topics = lambda topics: {"t"} & set(topics)
    daemon._maintain_group()
    assert daemon.held == {"u-0"}
    health = daemon.lanes["t-0"].health
    assert (health.state, health.reason, health.range_end) == ("halted", "source_deleted", 50), health
    daemon.membership.full = set()        # a partition that merely moved to another member is only dropped
    daemon._deleted_source_topics = lambda topics: set()
    daemon._maintain_group()
    assert daemon.held == set() and daemon.lanes["u-0"].health.state == "copying"


def test_an_unchanged_group_round_applies_nothing_and_a_change_is_still_applied():
    """An idle daemon's group round (every lease_ttl_s / 3): the same eligible lanes, assignment, lease blocks and
    fenced lanes as last time — the held set is not recomputed lane by lane; any of them changing is applied."""
    daemon = group_daemon(lanes=tuple(f"t-{p}" for p in range(20)), lease_compat="off")
    applied = []
    real = daemon._hold_wanted
    daemon._hold_wanted = lambda *a: (applied.append(1), real(*a))
    daemon._maintain_group()
    assert len(applied) == 1 and len(daemon.held) == 20
    for _ in range(3):
        daemon._maintain_group()
    assert len(applied) == 1
    daemon.membership.full.discard(("t", 4))      # the group took a partition away
    daemon.membership.generation += 1
    daemon._maintain_group()
    assert len(applied) == 2 and "t-4" not in daemon.held and len(daemon.held) == 19
    daemon._drop("t-5", "fenced: another process opened it")   # dropped by the loop: the held set moved
    daemon._maintain_group()
    assert len(applied) == 3 and "t-5" in daemon.held, "eligible and assigned: acquired again"
