"""Hole 5 of issue #12: a checkpoint inside a source batch, continued without exact bounds.

An ``--exact-bounds`` copy that ends inside a multi-record batch leaves its checkpoint there. Whatever continues
the partition — ``shoal handoff`` and the daemon, or a second plain ``shoal copy`` — must copy exactly the rest of
that batch (the trim deep case) and everything after it: no record twice, none missing, and no lane that retries
for ever because the offset map's runs overlap.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.copy_helpers import raw_batches
from tests.integration.cli.test_copy_cli import shoal
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    PYTHON,
    ROOT,
    assert_exact,
    checkpoints,
    daemon_factory,
    include_prefix,
    wait_caught_up,
    write_pipeline,
)

BATCHES, PER_BATCH = 3, 10
BOUND = PER_BATCH + PER_BATCH // 2  # inside the second batch

codecs = pytest.mark.parametrize("codec", ["none", "lz4"])
modes = pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])


def source_with_multi_record_batches(source_cluster, topic: str, codec: str) -> None:
    source_cluster.create_topic(topic)
    for b in range(BATCHES):  # one flush per batch: PER_BATCH records each
        source_cluster.produce(topic, [(b"k%d" % i, b"v-%d-%d" % (b, i) * 8) for i in range(PER_BATCH)],
                               partition=0, **{"linger.ms": 200, "compression.type": codec})
    bases = [(v.base_offset, v.next_offset) for v in raw_batches(source_cluster, topic)]
    assert any(lo < BOUND < hi for lo, hi in bases), f"the bound must fall inside a batch: {bases}"


def copy_to_bound(topic: str, target_topic: str, pipeline: str, mode: str) -> None:
    first = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                  target_topic, "--pipeline", pipeline, "--mode", mode, "--exact-bounds", "--from", "0",
                  "--to", str(BOUND))
    assert first.returncode == 0, first.stdout + first.stderr


@codecs
@modes
def test_handoff_and_daemon_continue_inside_a_batch(sandbox, source_cluster, target_cluster, unique_name, tmp_path,
                                                    daemon_factory, codec, mode):  # noqa: F811
    prefix = unique_name()
    topic, pipeline = f"{prefix}.t", f"mid-{prefix.rsplit('.', 1)[-1]}"
    target_topic = f"dr.{topic}"
    source_with_multi_record_batches(source_cluster, topic, codec)
    copy_to_bound(topic, target_topic, pipeline, mode)
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == BOUND

    handoff = subprocess.run([PYTHON, "-m", "mirror_core.cli", "handoff", "--target", "target", "--pipeline",
                              pipeline, "--topic", topic], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert handoff.returncode == 0, handoff.stdout + handoff.stderr
    daemon = daemon_factory(write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                                           mode=mode), "mid-1").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, timeout_s=30, daemons=(daemon,))
    time.sleep(1)  # a lane that failed after its write would have logged it by now
    log = daemon.log_text()
    assert "event=lane_error" not in log and "event=lane_halted" not in log, daemon.tail()
    assert_exact(source_cluster, target_cluster, topic, target_topic)
    assert "event=copied" in log and daemon.alive


@codecs
@modes
def test_a_second_copy_continues_inside_a_batch(source_cluster, target_cluster, unique_name, codec, mode):
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"mid-{topic.rsplit('.', 1)[-1]}"
    source_with_multi_record_batches(source_cluster, topic, codec)
    copy_to_bound(topic, target_topic, pipeline, mode)
    second = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                   target_topic, "--pipeline", pipeline, "--mode", mode)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(1 deep)" in second.stdout, "trimming the straddling batch is a counted deep case"
    assert_exact(source_cluster, target_cluster, topic, target_topic)
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == BATCHES * PER_BATCH
