"""Hole: a daemon round started its landing check afresh, so another producer writing to a mirrored target
partition between rounds went unnoticed (the offset map silently shifted), and a target topic recreated under a
running daemon ended in an endless ValueError loop. Now every round's first batch must land where the checkpoint
says the target ends, and the target topic id is pinned: both halt the lane, naming the offsets."""

from __future__ import annotations

import re
import time

from tests.integration.daemon.test_daemon import checkpoints, daemon_factory, free_port, wait_caught_up, write_pipeline

__all__ = ["daemon_factory"]  # the fixture, imported for pytest


def _wait_for_halt(daemon, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in daemon.log_text().splitlines():
            if "lane_halted" in line:
                return line
        assert daemon.alive, daemon.tail()
        time.sleep(0.5)
    raise AssertionError(f"the lane never halted:\n{daemon.tail()}")


def _halted_gauge(daemon) -> float:
    return daemon.metrics()[("shoal_lanes_halted", ())]


def _start(sandbox, daemon_factory, tmp_path, pipeline: str, topic: str, mode: str):
    port = free_port()
    config = write_pipeline(tmp_path / "pipeline.yaml", sandbox, pipeline, re.escape(topic), mode=mode,
                            metrics_port=port)
    return daemon_factory(config, "w1", port).start()


def test_a_foreign_producer_on_a_mirrored_partition_halts_the_lane(sandbox, source_cluster, target_cluster,
                                                                   unique_name, tmp_path, daemon_factory):
    topic = unique_name()
    pipeline = f"p.{topic}"[:200]
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    daemon = _start(sandbox, daemon_factory, tmp_path, pipeline, topic, "exactly-once")
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))
    target_next = checkpoints(target_cluster, pipeline)[(topic, 0)].target_next

    target_cluster.produce(f"dr.{topic}", [(b"intruder", b"x%d" % i) for i in range(3)], partition=0)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50, 80)])
    line = _wait_for_halt(daemon)
    assert "foreign_write" in line and f"target ends at {target_next}" in line, line
    assert "dr." + topic in line and "landed at" in line
    assert _halted_gauge(daemon) == 1
    time.sleep(2)  # halted for good: no retry loop, nothing more written
    values = [r.value for r in target_cluster.read_all(f"dr.{topic}")]
    assert values == [b"v%d" % i for i in range(50)] + [b"x0", b"x1", b"x2"]
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == 50
    assert daemon.alive


def test_a_target_topic_recreated_under_a_running_daemon_halts_the_lane(sandbox, source_cluster, target_cluster,
                                                                       unique_name, tmp_path, daemon_factory):
    topic = unique_name()
    pipeline = f"p.{topic}"[:200]
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    daemon = _start(sandbox, daemon_factory, tmp_path, pipeline, topic, "at-least-once")
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))

    target_cluster.admin.recreate(f"dr.{topic}", 1)  # returns once the broker serves the new topic id
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50, 80)])
    line = _wait_for_halt(daemon)
    assert ("topic_recreated" in line or "foreign_write" in line) and f"dr.{topic}" in line, line
    assert _halted_gauge(daemon) == 1
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == 50
    assert daemon.alive
