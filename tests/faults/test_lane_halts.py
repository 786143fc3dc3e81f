"""Lanes never stall silently (issue #13): a batch the target refuses and topic config sync cannot repair halts its
lane — with the reason and offsets in /metrics, /readyz and the log, persisted so a restart does not reopen it —
while the other lanes keep copying, and the operator's ``shoal lanes resume`` continues it exactly; a refusal sync
can repair is repaired and the lane continues; a source topic deleted under a running daemon halts the lane that
had not copied everything, naming the range, and retires the one that had.

Every comparison uses the independent reader (``KafkaTestCluster.read_all``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error

from mirror_core.kafka.topic_config_sync import ConfigChange, apply_config_changes
from mirror_core.kafka.topics import TopicAdmin
from mirror_core.state.ledger import read_ledger
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    QUICK_GROUP,
    ROOT,
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    quick_group_source,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

BIG = 1_500_000      # one record this large: above 1 MiB, below 2 MB
SMALL_LIMIT, LARGE_LIMIT = "1048588", "2000000"
BIG_PRODUCER = {"message.max.bytes": 3_000_000, "compression.type": "none"}


def _set_limit(cluster, topic: str, value: str) -> None:
    apply_config_changes(cluster.config, topic, [ConfigChange("max.message.bytes", None, value)])


def _small(n: int, tag: str) -> list[tuple]:
    return [(b"k%d" % i, b"%s-%d" % (tag.encode(), i)) for i in range(n)]


def _lane(daemon, topic: str, partition: int) -> tuple[int, dict | None]:
    try:
        status, body = daemon.get("/readyz")
    except urllib.error.URLError:  # not listening yet
        return 0, None
    if status == 404:  # a daemon without readiness
        return status, None
    lanes = {(lane["topic"], lane["partition"]): lane for lane in json.loads(body)["lanes"]}
    return status, lanes.get((topic, partition))


def _shoal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())


def test_a_refusal_sync_cannot_repair_halts_the_lane_until_the_operator_resumes_it(
        sandbox, quick_group_source, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    source_cluster = quick_group_source
    prefix = unique_name()
    halting, repaired = f"{prefix}.halt", f"{prefix}.repair"
    # the big record was accepted under a raised source limit that was lowered again afterwards: the target is
    # created with the source's (lowered) limit, so sync finds nothing to widen and the target refuses the batch
    source_cluster.create_topic(halting, partitions=2, config={"max.message.bytes": LARGE_LIMIT})
    source_cluster.produce(halting, _small(5, "a"), partition=0)
    source_cluster.produce(halting, [(b"big", b"x" * BIG)], partition=0, **BIG_PRODUCER)
    source_cluster.produce(halting, _small(5, "b"), partition=0)
    source_cluster.produce(halting, _small(10, "c"), partition=1)
    _set_limit(source_cluster, halting, SMALL_LIMIT)
    source_cluster.create_topic(repaired, partitions=1, config={"max.message.bytes": LARGE_LIMIT})
    source_cluster.produce(repaired, _small(5, "r"), partition=0)

    pipeline = f"halt-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port,
                            config_sync_interval_s=3600, stall_after_s=30, **QUICK_GROUP)  # killed, restarted
    daemon = daemon_factory(config, "halt-1", port).start()

    # halted: reason and offsets in /readyz, /metrics and the log
    status, lane = wait_for(lambda: (lambda s, lane: (s, lane) if lane and lane["state"] == "halted" else None)(
        *_lane(daemon, halting, 0)), 60, "the refused lane to halt", daemons=(daemon,))
    assert status == 503
    # position: the committed checkpoint (the small records before the big one may share its aborted round);
    # range_end: the source offset of the refused batch
    assert (lane["reason"], lane["range_end"]) == ("batch_rejected", 5) and lane["position"] in (0, 5), lane
    assert "MESSAGE_SIZE_TOO_LARGE" in lane["message"]
    metrics = daemon.metrics()
    labels = (("partition", "0"), ("pipeline", pipeline), ("topic", halting))
    assert metrics[("shoal_lane_state", (*labels[:1], *labels[1:2], ("reason", "batch_rejected"),
                                         ("state", "halted"), labels[2]))] == 1
    assert metrics[("shoal_lane_halt_offset", (("bound", "position"), *labels))] == lane["position"]
    assert metrics[("shoal_lane_halt_offset", (("bound", "range_end"), *labels))] == 5
    log = daemon.log_text()
    assert f"event=lane_halted topic={halting} partition=0" in log and "reason=batch_rejected" in log
    assert daemon.get("/healthz")[0] == 200  # liveness is not readiness

    # a refusal sync can repair: the target's limit lowered below the source's is raised again, the lane continues
    wait_caught_up(source_cluster, target_cluster, pipeline, {repaired: 1}, daemons=(daemon,))
    _set_limit(target_cluster, f"dr.{repaired}", SMALL_LIMIT)
    source_cluster.produce(repaired, [(b"big", b"y" * BIG)], partition=0, **BIG_PRODUCER)
    source_cluster.produce(repaired, _small(5, "s"), partition=0)
    wait_caught_up(source_cluster, target_cluster, pipeline, {repaired: 1}, daemons=(daemon,))
    assert_exact(source_cluster, target_cluster, repaired, f"dr.{repaired}")
    assert "event=config_repaired" in daemon.log_text()
    assert TopicAdmin(target_cluster.config).configs(f"dr.{repaired}")["max.message.bytes"] == LARGE_LIMIT

    # the other lane of the halted topic keeps copying
    source_cluster.produce(halting, _small(7, "d"), partition=1)
    wait_for(lambda: _copied_to(target_cluster, f"dr.{halting}", 1) == 17, 60, "partition 1 to keep copying",
             daemons=(daemon,))

    # a restart does not reopen the halted lane: its state came back from the checkpoint
    daemon.kill()
    daemon.start()
    status, lane = wait_for(lambda: (lambda s, lane: (s, lane) if lane and lane["state"] == "halted" else None)(
        *_lane(daemon, halting, 0)), 60, "the halt to be read back after a restart", daemons=(daemon,))
    assert status == 503 and lane["reason"] == "batch_rejected"
    cli = _shoal("lanes", "status", "--target", "target", "--pipeline", pipeline, "--json")
    assert cli.returncode == 1, cli.stdout + cli.stderr  # a halted lane: scripts can alert on the exit code
    rows = {(r["topic"], r["partition"]): r for r in json.loads(cli.stdout)}
    assert (rows[(halting, 0)]["state"], rows[(halting, 0)]["reason"]) == ("halted", "batch_rejected")
    live = _shoal("mirror", "status", "--config", str(config), "--json")  # persisted states + the daemon's /readyz
    assert live.returncode == 1, live.stdout + live.stderr
    states = {(r["topic"], r["partition"]): (r["state"], r["reason"]) for r in json.loads(live.stdout)}
    assert states[(halting, 0)] == ("halted", "batch_rejected") and states[(halting, 1)] == ("copying", "none")
    time.sleep(2)
    assert f"event=lane_opened topic={halting} partition=0" not in daemon.log_text().split("---- start")[-1]

    # the operator fixes the cause and resumes: the lane continues exactly where it stopped
    _set_limit(target_cluster, f"dr.{halting}", LARGE_LIMIT)
    ledger = tmp_path / "ledger"
    done = _shoal("lanes", "resume", "--target", "target", "--pipeline", pipeline, "--topic", halting,
                  "--partition", "0", "--ledger-dir", str(ledger))
    assert done.returncode == 0, done.stdout + done.stderr
    wait_caught_up(source_cluster, target_cluster, pipeline, {halting: 2}, daemons=(daemon,))
    assert_exact(source_cluster, target_cluster, halting, f"dr.{halting}")
    wait_for(lambda: daemon.get("/readyz")[0] == 200, 30, "/readyz to be ready again", daemons=(daemon,))
    (row,) = read_ledger(ledger)
    assert (row.status, row.source_topic, row.source_partition) == ("resumed", halting, 0)
    assert "batch_rejected" in row.error


def _copied_to(cluster, topic: str, partition: int) -> int:
    return sum(1 for r in cluster.read_all(topic) if r.partition == partition)


def test_a_source_topic_deleted_under_a_running_daemon_halts_naming_the_range_or_retires(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    done_topic, busy_topic = f"{prefix}.done", f"{prefix}.busy"
    source_cluster.create_topic(done_topic, partitions=1)
    source_cluster.produce(done_topic, _small(20, "done"), partition=0)
    source_cluster.create_topic(busy_topic, partitions=1)
    backlog = 6000
    source_cluster.produce(busy_topic, [(b"k", b"v%06d" % i + b"." * 2000) for i in range(backlog)], partition=0,
                           **{"linger.ms": 50, "batch.size": 16384})
    pipeline = f"gone-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    # small fetches: the busy lane needs many rounds, so deleting its topic leaves a named range uncopied
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port,
                            partition_fetch_max_bytes=32768, fetch_max_bytes=65536, config_sync_interval_s=3600)
    daemon = daemon_factory(config, "gone-1", port).start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {done_topic: 1}, daemons=(daemon,))
    wait_for(lambda: f"event=copied topic={busy_topic}" in daemon.log_text(), 60, "the busy lane to copy",
             daemons=(daemon,))
    admin = TopicAdmin(source_cluster.config)
    admin.delete(busy_topic)
    admin.delete(done_topic)

    def stopped(topic):
        return (lambda s, lane: lane if lane and lane["state"] in ("halted", "retired") else None)(
            *_lane(daemon, topic, 0))

    busy = wait_for(lambda: stopped(busy_topic), 60, "the busy lane to halt", daemons=(daemon,))
    done = wait_for(lambda: stopped(done_topic), 60, "the finished lane to retire", daemons=(daemon,))
    assert (busy["state"], busy["reason"], busy["range_end"]) == ("halted", "source_deleted", backlog), busy
    assert 0 < busy["position"] < backlog
    assert f"[{busy['position']}, {backlog})" in busy["message"]
    assert (done["state"], done["reason"], done["position"]) == ("retired", "source_deleted", 20), done
    assert daemon.get("/readyz")[0] == 503  # the halted lane; the retired one alone would not block

    # both states are on the target, and accepting the named loss retires the halted lane, recorded in the ledger
    rows = {r["topic"]: r for r in json.loads(
        _shoal("lanes", "status", "--target", "target", "--pipeline", pipeline, "--json").stdout)}
    assert (rows[busy_topic]["state"], rows[done_topic]["state"]) == ("halted", "retired")
    ledger = tmp_path / "ledger"
    accepted = _shoal("lanes", "resume", "--target", "target", "--pipeline", pipeline, "--topic", busy_topic,
                      "--partition", "0", "--accept-loss", "--ledger-dir", str(ledger))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    (row,) = read_ledger(ledger)
    assert (row.status, row.planned_start, row.planned_end) == ("lost", busy["position"], backlog)
    wait_for(lambda: daemon.get("/readyz")[0] == 200, 30, "/readyz to be ready once the loss is accepted",
             daemons=(daemon,))
