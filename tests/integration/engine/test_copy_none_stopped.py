"""A failed ``shoal copy --mode none`` (no checkpoints) tells the operator where each partition got and how to
resume each one exactly: real brokers, the CLI in its own process.

The failure is one the target really refuses: the target topic accepts timestamps at most a day old, and partition
1 of the source carries, mid-way, a record ten days old (its own batch). Preflight reads the first timestamps only,
so the copy starts; partition 0 completes, partition 1 stops at that record."""

from __future__ import annotations

import re
import time

import pytest

from tests.copy_helpers import shoal

DAY_MS = 86_400_000


@pytest.mark.timeout(180)
def test_a_failed_mode_none_copy_prints_each_partitions_next_offset_and_resume_commands(
        source_cluster, target_cluster, unique_name):
    topic, target_topic = unique_name(), unique_name("dr")
    source_cluster.create_topic(topic, partitions=2)
    source_cluster.produce(topic, [(b"a%d" % i, b"zero %d" % i) for i in range(200)], partition=0)
    source_cluster.produce(topic, [(b"b%d" % i, b"one %d" % i) for i in range(100)], partition=1)
    old = int(time.time() * 1000) - 10 * DAY_MS
    source_cluster.produce(topic, [(b"old", b"ten days old", [], old)], partition=1)
    source_cluster.produce(topic, [(b"c%d" % i, b"one more %d" % i) for i in range(50)], partition=1)
    target_cluster.create_topic(target_topic, partitions=2,
                                config={"message.timestamp.before.max.ms": str(DAY_MS)})

    done = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                 target_topic, "--mode", "none")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out
    assert "copy stopped" in done.stdout, out
    rows = {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in
            re.finditer(r"│\s*(\d+)\s*│\s*\[\d+, \d+\)\s*│\s*(\d+)\s*│\s*\d+\s*│\s*(complete|stopped|FAILED)", out)}
    assert rows[0] == (200, "complete"), out
    assert rows[1] == (100, "FAILED"), out       # the ten-day-old record's offset: everything before it is there

    # the target holds exactly what the report says, so resuming there misses nothing and repeats nothing
    landed = target_cluster.read_all(target_topic)
    assert sum(1 for r in landed if r.partition == 1) == 100
    assert sum(1 for r in landed if r.partition == 0) == 200
    resume = re.search(r"resume \S+-1: (shoal copy .*)", out)
    assert resume is not None, out
    assert "--partitions 1 --from 100 --to 151 --mode none" in resume.group(1)
    assert not re.search(r"resume \S+-0:", out), "a complete partition needs no resume"
