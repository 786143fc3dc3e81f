"""Daemon membership through the pipeline's consumer group (mirror_core/daemon/membership.py), on real brokers.

- Three daemon processes share a pipeline through a KIP-848 group; one is SIGKILLed, one added later: every source
  partition is held by exactly one live process within the lowered session timeout, and the target stays exact
  under live load (independent reader).
- The upgrade: a lease-based daemon of the previous release (run from a git worktree of it) holds the lanes; a new
  group daemon joins under live load and writes none of them while the old one's leases live (and, seeing it, writes
  lease records of its own: ``lease_compat: auto``); the old one stops (SIGTERM) and the new one takes every lane
  and stops writing lease records; nobody was fenced, the target is exact.
- The classic protocol (cooperative-sticky) on the Kafka 3.9 broker: two members split the lanes, the survivor of a
  SIGKILL takes them all.

KIP-848 session timeouts are broker settings (minimum 45 s by default): the source here is a private single-node
broker of this module started with the sandbox's lowered ``group.consumer.min.*`` settings (the shared brokers may
predate them), and the pipeline sets its group's session timeout through ``group_session_timeout_ms``. The target is
the shared sandbox target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mirror_core.errors import MirrorError
from mirror_core.kafka.daemon_group import describe_group
from mirror_core.state.leases import now_ms
from tests.conftest import unavailable
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    ROOT,
    LoadProducer,
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)
from tests.kafka_helpers import KafkaTestCluster, private_broker

pytestmark = pytest.mark.timeout(240)

SESSION_MS = 4000
# the lease-based release the upgrade test starts from (main before the group membership)
LEASE_RELEASE = "18af6cc"


@pytest.fixture(scope="module")
def group_source(session_sandbox, tmp_path_factory):
    """A private Kafka 4 source broker with the sandbox's broker settings (lowered KIP-848 minimums included)."""
    session_sandbox.ensure("target")
    with private_broker("membership-source", tmp_path_factory) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def lease_reader(group_source, target_cluster):
    """Reads lease records through one open checkpoint store (its cache refreshes with only new records: the
    shared target's checkpoint topic holds every test's records)."""
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore
    from mirror_core.state.leases import LeaseStore

    with WireClient.for_cluster(target_cluster.config) as client:
        yield LeaseStore(CheckpointStore(target_cluster.config, client), target_cluster.config.confluent())


def lease_holders(leases, pipeline: str) -> dict[str, str]:
    """Lane → holder of every live lease record (a lease-based daemon's, or a group daemon's compat record)."""
    now = now_ms()
    return {lane: lease.holder for lane, lease in leases.read(pipeline).items() if lease.expires_ms > now}


def held_by_logs(daemons) -> dict[str, set[str]]:
    """Lane → the workers whose own log says they hold it now (the last ``lane_acquired`` not followed by a
    ``lane_dropped`` of the lane, per process run)."""
    holding: dict[str, set[str]] = {}
    for daemon in daemons:
        held: set[str] = set()
        for line in daemon.log_text().splitlines():
            if line.startswith("---- start"):
                held.clear()
            elif "event=lane_acquired lane=" in line:
                held.add(line.split("event=lane_acquired lane=", 1)[1].split()[0])
            elif "event=lane_dropped lane=" in line:
                held.discard(line.split("event=lane_dropped lane=", 1)[1].split()[0])
        for lane in held:
            holding.setdefault(lane, set()).add(daemon.worker_id)
    return holding


def one_holder_each(source: KafkaTestCluster, daemons, pipeline: str, topic: str, partitions: int,
                    live: set[str], *, balanced: bool = False) -> dict[int, str] | None:
    """Partition → holder when every partition is assigned by the group to exactly one of the ``live`` workers,
    each of them holds some, the group has exactly those members, and the live daemons' own logs agree (each lane
    held by that worker alone). ``balanced``: also wait until the assignors have finished moving partitions to a
    newcomer (shares differ by at most one) — they move them a few at a time, so a newcomer holding one is not yet
    the settled assignment."""
    try:
        group = describe_group(source.config, pipeline)
    except MirrorError:  # the coordinator is still starting (a fresh broker): not yet
        return None
    if {m.worker for m in group.members} != live:
        return None
    holders = group.holders()
    assigned = {p: holders.get((topic, p), []) for p in range(partitions)}
    if any(len(workers) != 1 for workers in assigned.values()):
        return None
    held = held_by_logs([d for d in daemons if d.worker_id in live])
    lanes = {p: held.get(f"dr.{topic}-{p}", set()) for p in range(partitions)}
    if any(lanes[p] != {assigned[p][0]} for p in range(partitions)):
        return None
    if {workers[0] for workers in assigned.values()} != live:  # a newcomer not given its share yet
        return None
    shares = Counter(workers[0] for workers in assigned.values()).values()
    if balanced and max(shares) - min(shares) > 1:
        return None
    return {p: workers[0] for p, workers in assigned.items()}


def acquired_at(daemons, lane: str, *, after: float) -> float:
    """The wall-clock time a daemon first logged ``lane_acquired`` for ``lane`` after ``after``."""
    times = []
    for daemon in daemons:
        for line in daemon.log_text().splitlines():
            if f"event=lane_acquired lane={lane} " in line:
                stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
                if stamp >= after:
                    times.append(stamp)
    assert times, f"nobody acquired {lane} after the kill"
    return min(times)


def shoal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "250"})


def group_pipeline(path: Path, sandbox, source: KafkaTestCluster, pipeline: str, prefix: str, **overrides) -> Path:
    return write_pipeline(path, sandbox, pipeline, include_prefix(prefix), source=dict(source.config.settings),
                          membership="group", group_session_timeout_ms=SESSION_MS, **overrides)


def test_three_daemons_one_killed_one_added_each_partition_held_once(
        sandbox, group_source, target_cluster, lease_reader, unique_name, tmp_path, daemon_factory):  # noqa: F811
    """... and with no lease-based daemon around, nothing is written per held lane: no lease record at all."""
    prefix = unique_name()
    topic, partitions = f"{prefix}.t", 6
    group_source.create_topic(topic, partitions=partitions)
    pipeline = f"group-{prefix.rsplit('.', 1)[-1]}"
    config = group_pipeline(tmp_path / "p.yaml", sandbox, group_source, pipeline, prefix)
    a, b, c = (daemon_factory(config, f"grp-{n}").start() for n in "abc")
    load = LoadProducer(group_source, [topic], rate=600, seed=71)
    load.start()
    split = wait_for(lambda: one_holder_each(group_source, (a, b, c), pipeline, topic, partitions,
                                             {"grp-a", "grp-b", "grp-c"}), 60, "each of 3 daemons holding lanes",
                     daemons=(a, b, c))
    assert sorted(Counter(split.values()).values()) == [2, 2, 2], split
    time.sleep(2)

    b.kill()
    killed = time.time()
    after_kill = wait_for(lambda: one_holder_each(group_source, (a, c), pipeline, topic, partitions,
                                                  {"grp-a", "grp-c"}), 40, "a and c holding every lane",
                          daemons=(a, c))
    assert set(after_kill.values()) == {"grp-a", "grp-c"}
    # when the survivors took b's lanes, from their own logs (the polls above read slower than that)
    orphans = [p for p, holder in split.items() if holder == "grp-b"]
    takeover_s = max(acquired_at((a, c), f"dr.{topic}-{p}", after=killed) for p in orphans) - killed
    # detection is the broker's session timeout; then a heartbeat to learn the new assignment
    assert takeover_s < SESSION_MS / 1000 + 5, f"lanes of the killed daemon held again after {takeover_s:.1f}s"

    d = daemon_factory(config, "grp-d").start()
    # settled, not the first step: the status below is compared with this split
    added = wait_for(lambda: one_holder_each(group_source, (a, c, d), pipeline, topic, partitions,
                                             {"grp-a", "grp-c", "grp-d"}, balanced=True), 40, "d sharing the lanes",
                     daemons=(a, c, d))
    assert "grp-d" in added.values()
    # `shoal mirror status` shows the same from the clusters alone: members, holder and lag per lane
    shown = shoal("mirror", "status", "--config", str(config))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"daemon group shoal.{pipeline}.daemons" in shown.stdout and "3 member(s)" in shown.stdout, shown.stdout
    for worker in ("grp-a", "grp-c", "grp-d"):
        assert f"  {worker} (" in shown.stdout, shown.stdout
    rows = json.loads(shoal("mirror", "status", "--config", str(config), "--json").stdout)
    assert {r["partition"]: r["holder"] for r in rows} == added
    assert all(isinstance(r["lag"], int) and r["lag"] >= 0 for r in rows), rows
    time.sleep(2)
    load.stop()
    wait_caught_up(group_source, target_cluster, pipeline, {topic: partitions}, daemons=(a, c, d))
    assert_exact(group_source, target_cluster, topic, f"dr.{topic}")
    for daemon in (a, c, d):
        rc, seconds = daemon.terminate()
        assert rc == 0 and seconds < 10, (daemon.worker_id, rc, seconds, daemon.tail())
    assert describe_group(group_source.config, pipeline).members == (), "every daemon left the group at SIGTERM"
    assert lease_reader.read(pipeline) == {}, "lease records written with no lease-based daemon around"
    print(f"killed daemon's lanes held again after {takeover_s:.1f}s (session timeout {SESSION_MS} ms)")


@pytest.fixture
def lease_release_checkout(tmp_path):
    """A git worktree of the lease-based release, to run its daemon as an operator's old process would be."""
    path = tmp_path / "shoal-old"
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), LEASE_RELEASE],
                          capture_output=True, text=True)
    if made.returncode != 0:
        unavailable(f"cannot check out the lease-based release {LEASE_RELEASE}: {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


class OldDaemon:
    """The previous release's daemon, from its own checkout (its own modules first on the path)."""

    def __init__(self, checkout: Path, config: Path, log: Path, worker_id: str):
        self.worker_id, self.log_path = worker_id, log
        from tests.integration.daemon.test_daemon import PYTHON

        with open(log, "ab") as out:
            self.proc = subprocess.Popen([PYTHON, "-m", "mirror_core.daemon", "--config", str(config),
                                          "--worker-id", worker_id], cwd=checkout, stdout=out,
                                         stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"})

    metrics_port = None   # not asked for /readyz: wait_for's failure message shows its log only

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


def test_upgrade_from_lease_daemon_without_a_stop(sandbox, group_source, target_cluster, lease_reader, unique_name,
                                                  tmp_path,
                                                  daemon_factory, lease_release_checkout):  # noqa: F811
    prefix = unique_name()
    topic, partitions = f"{prefix}.t", 4
    group_source.create_topic(topic, partitions=partitions)
    pipeline = f"upgrade-{prefix.rsplit('.', 1)[-1]}"
    # leases of 6 s, not write_pipeline's 3: a lease-based daemon whose loop stalls past its TTL (a loaded CI
    # machine) loses the lane to the other daemon and is fenced — lease behaviour, not what this test is about
    ttl_s = 6
    old_config = write_pipeline(tmp_path / "old.yaml", sandbox, pipeline, include_prefix(prefix),
                                source=dict(group_source.config.settings), lease_ttl_s=ttl_s)
    old = OldDaemon(lease_release_checkout, old_config, tmp_path / "old.log", "old-1")
    load = LoadProducer(group_source, [topic], rate=600, seed=72)
    load.start()
    try:
        wait_for(lambda: set(lease_holders(lease_reader, pipeline).values()) == {"old-1"}
                 and len(lease_holders(lease_reader, pipeline)) == partitions
                 and "event=copied" in old.log_text(), 60, "the old daemon holding and copying every lane",
                 daemons=(old,))
        new = daemon_factory(group_pipeline(tmp_path / "new.yaml", sandbox, group_source, pipeline, prefix,
                                            lease_ttl_s=ttl_s), "new-1").start()
        # the group assigns every partition to the only member; it waits for the old daemon's leases
        wait_for(lambda: new.log_text().count("event=lane_waits_for_lease") >= partitions, 40,
                 "the new daemon waiting for the old one's leases", daemons=(new, old))
        assert "event=lease_compat_records state=writing" in new.log_text(), "auto: an old daemon is seen"
        # the new daemon's membership heartbeat (compat) is counted by the old daemon's fair share: it gives lanes
        # back down to ceil(4 / 2) = 2, which the new daemon takes; the other two stay the old daemon's
        def split():
            holders = sorted(lease_holders(lease_reader, pipeline).values())
            return holders == ["new-1", "new-1", "old-1", "old-1"] and len(held_by_logs([new])) == partitions // 2
        wait_for(split, 40, "the old daemon giving lanes back down to its fair share", daemons=(new, old))
        assert old.stop() == 0, old.tail()
        wait_for(lambda: set(held_by_logs([new])) == {f"dr.{topic}-{p}" for p in range(partitions)}, 30,
                 "the new daemon holding every lane", daemons=(new,))
        # the old daemon is gone (it released its leases and its membership at SIGTERM): no more lease records
        wait_for(lambda: "event=lease_compat_records state=stopped" in new.log_text(), 30,
                 "the new daemon to stop writing lease records", daemons=(new,))
        time.sleep(ttl_s + 1)  # our last compat records expire within the lease TTL
        assert lease_holders(lease_reader, pipeline) == {}, "lease records still written with no old daemon"
        time.sleep(2)
        load.stop()
        wait_caught_up(group_source, target_cluster, pipeline, {topic: partitions}, daemons=(new,))
        assert_exact(group_source, target_cluster, topic, f"dr.{topic}")
        # nobody wrote a lane the other held: neither writer was ever fenced
        assert "reason=fenced" not in old.log_text(), old.tail()
        assert "reason=fenced" not in new.log_text(), new.tail()
        rc, _ = new.terminate()
        assert rc == 0
    finally:
        if load.is_alive():
            load.stop()
        old.stop()


def test_classic_protocol_on_a_kafka_3_source(sandbox, legacy_cluster, target_cluster, unique_name,
                                              tmp_path, daemon_factory):  # noqa: F811
    """Kafka 3.9 does not run KIP-848 groups by default: the daemons fall back to the classic protocol with the
    cooperative-sticky assignor (session timeout set by the client); two split the lanes, the survivor of a SIGKILL
    takes them all, the target is exact."""
    prefix = unique_name()
    topic, partitions = f"{prefix}.t", 4
    legacy_cluster.create_topic(topic, partitions=partitions)
    pipeline = f"classic-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            source=dict(legacy_cluster.config.settings), membership="group",
                            group_session_timeout_ms=6000)
    a, b = (daemon_factory(config, f"cls-{n}").start() for n in "ab")
    load = LoadProducer(legacy_cluster, [topic], rate=400, seed=73)
    load.start()
    split = wait_for(lambda: one_holder_each(legacy_cluster, (a, b), pipeline, topic, partitions,
                                             {"cls-a", "cls-b"}), 60, "a 2 + 2 split", daemons=(a, b))
    assert describe_group(legacy_cluster.config, pipeline).protocol == "classic"
    assert "protocol=classic" in a.log_text()
    b.kill()
    killed = time.time()
    wait_for(lambda: one_holder_each(legacy_cluster, (a,), pipeline, topic, partitions, {"cls-a"}), 40,
             "a holding every lane", daemons=(a,))
    takeover_s = max(acquired_at((a,), f"dr.{topic}-{p}", after=killed) for p, h in split.items() if h == "cls-b") \
        - killed
    assert takeover_s < 6 + 5, f"lanes of the killed daemon held again after {takeover_s:.1f}s"
    load.stop()
    wait_caught_up(legacy_cluster, target_cluster, pipeline, {topic: partitions}, daemons=(a,))
    assert_exact(legacy_cluster, target_cluster, topic, f"dr.{topic}")
    rc, _ = a.terminate()
    assert rc == 0, a.tail()


def test_a_paused_daemon_past_its_session_is_fenced_and_rejoins(
        sandbox, group_source, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    """A daemon frozen (SIGSTOP: a GC pause, a VM freeze) longer than the session timeout loses its partitions to
    the other one while its own revocation callback never ran; resumed, it finds its writers fenced or its
    assignment lost, drops those lanes, rejoins, and the target is still exact — safety is the lanes'
    transactional.id, not the callback."""
    prefix = unique_name()
    topic, partitions = f"{prefix}.t", 4
    group_source.create_topic(topic, partitions=partitions)
    pipeline = f"pause-{prefix.rsplit('.', 1)[-1]}"
    config = group_pipeline(tmp_path / "p.yaml", sandbox, group_source, pipeline, prefix)
    a, b = (daemon_factory(config, f"pz-{n}").start() for n in "ab")
    load = LoadProducer(group_source, [topic], rate=600, seed=74)
    load.start()
    wait_for(lambda: one_holder_each(group_source, (a, b), pipeline, topic, partitions, {"pz-a", "pz-b"}),
             60, "a 2 + 2 split", daemons=(a, b))
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: one_holder_each(group_source, (b,), pipeline, topic, partitions, {"pz-b"}), 40,
                 "b holding every lane while a is frozen", daemons=(b,))
        time.sleep(2)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: one_holder_each(group_source, (a, b), pipeline, topic, partitions, {"pz-a", "pz-b"}),
             60, "a back in the group with a share", daemons=(a, b))
    log_a = a.log_text()
    assert "event=group_assignment_lost" in log_a or "reason=fenced" in log_a, a.tail()
    load.stop()
    wait_caught_up(group_source, target_cluster, pipeline, {topic: partitions}, daemons=(a, b))
    assert_exact(group_source, target_cluster, topic, f"dr.{topic}")
    for daemon in (a, b):
        rc, _ = daemon.terminate()
        assert rc == 0, daemon.tail()


def test_a_group_that_never_forms_fails_readiness(sandbox, legacy_cluster, unique_name, tmp_path,
                                                  daemon_factory):  # noqa: F811
    """The consumer group protocol forced on a Kafka 3.9 broker (which does not run KIP-848 groups by default): the
    member never receives an assignment and librdkafka reports no error. The daemon must say so — an event naming
    the group, the cluster and what to check, ``shoal_group_joined`` at 0, ``/readyz`` 503 — instead of running
    silently with no lane (before the fix: /readyz 200, nothing logged, no metric moved)."""
    prefix = unique_name()
    topic = f"{prefix}.t"
    legacy_cluster.create_topic(topic, partitions=2)
    pipeline = f"nogroup-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            source=dict(legacy_cluster.config.settings), membership="group",
                            group_protocol="consumer", group_session_timeout_ms=2000, metrics_port=port)
    daemon = daemon_factory(config, "nogroup-a", metrics_port=port).start()

    def not_ready():
        try:
            status, body = daemon.get("/readyz")
        except OSError:
            return None
        return json.loads(body) if status == 503 else None

    report = wait_for(not_ready, 60, "/readyz failing for the group that never formed", daemons=(daemon,))
    group = f"shoal.{pipeline}.daemons"
    assert group in report["group"] and "consumer" in report["group"] and "Read on the group" in report["group"]
    assert daemon.metrics()[("shoal_group_joined", ())] == 0
    log = daemon.log_text()
    assert "event=group_not_joined" in log and group in log, daemon.tail()
    assert "event=lane_acquired" not in log
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()


@pytest.mark.timeout(90)
def test_classic_membership_assigns_new_partitions_within_the_refresh_interval(legacy_cluster, unique_name):
    """Classic protocol: partitions added to a subscribed topic are assigned once the group leader's librdkafka
    refreshes the topic's metadata — every 5 minutes by default. The membership consumer refreshes it at the rescan
    interval the daemon passes (2 s here), so the new partitions become lanes within seconds."""
    from mirror_core.daemon.membership import GroupMembership

    prefix = unique_name()
    topic = f"{prefix}.t"
    legacy_cluster.create_topic(topic, partitions=2)
    membership = GroupMembership(legacy_cluster.config, f"np-{prefix.rsplit('.', 1)[-1]}", "np-a",
                                 protocol="classic", revoke_timeout_s=5, classic_session_timeout_ms=6000,
                                 metadata_refresh_ms=2000)
    membership.subscribe([topic])
    membership.start()
    try:
        wait_for(lambda: len(membership.assigned()) == 2 or None, 30, "the first two partitions assigned")
        legacy_cluster.admin.add_partitions(topic, 4)
        grown = time.monotonic()
        wait_for(lambda: len(membership.assigned()) == 4 or None, 30, "the two new partitions assigned")
        assert time.monotonic() - grown < 30
        assert membership.assigned() == {(topic, p) for p in range(4)}
    finally:
        membership.close(5)
