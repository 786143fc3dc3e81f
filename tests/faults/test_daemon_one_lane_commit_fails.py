"""One lane's commit fails while the other lanes commit in the same rounds (the daemon commits its lanes side by
side on its lane workers): a failure of one lane touches no other lane.

The failure is real: the target topic of one lane is deleted and created again under the running daemon, so that
lane's next copy finds a target topic that is not the one its offsets live in (its first batch lands below the
checkpoint's target offset, or the topic id changed) and the lane halts naming it, with nothing committed into the
new topic. Data produced to every partition at the same moment lands exactly for all the other lanes, data and
checkpoints."""

from __future__ import annotations

import pytest

from mirror_core.kafka.topics import TopicAdmin
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    assert_exact,
    checkpoints,
    daemon_factory,
    include_prefix,
    source_ends,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

PARTITIONS = 8


@pytest.mark.timeout(240)
def test_one_lane_fails_its_commit_while_the_others_commit(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    busy, lone = f"{prefix}.busy", f"{prefix}.lone"
    source_cluster.create_topic(busy, partitions=PARTITIONS)
    source_cluster.create_topic(lone)

    def produce(tag: bytes) -> None:
        for p in range(PARTITIONS):
            source_cluster.produce(busy, [(b"%s%d-%d" % (tag, p, i), b"v" * 200) for i in range(50)], partition=p)
        source_cluster.produce(lone, [(b"%s-%d" % (tag, i), b"w" * 200) for i in range(50)])

    produce(b"a")
    pipeline = f"olf-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), commit_workers=4,
                            rescan_interval_s=3600, config_sync_interval_s=3600)
    daemon = daemon_factory(config, "olf-1").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {busy: PARTITIONS, lone: 1}, daemons=(daemon,))
    lone_position = checkpoints(target_cluster, pipeline)[(lone, 0)].position

    admin = TopicAdmin(target_cluster.config)
    admin.delete(f"dr.{lone}")
    wait_for(lambda: f"dr.{lone}" not in admin.list_topics(), 30, "the target topic's deletion")
    admin.create(f"dr.{lone}", 1, None)
    produce(b"b")

    wait_caught_up(source_cluster, target_cluster, pipeline, {busy: PARTITIONS}, daemons=(daemon,))
    wait_for(lambda: "event=lane_halted" in daemon.log_text(), 60, "the failed lane's halt", daemons=(daemon,))
    halted = [line for line in daemon.log_text().splitlines() if "event=lane_halted" in line]
    assert len(halted) == 1 and f"topic={lone} " in halted[0], halted
    # the landing check (first batch below the checkpoint's target offset) or the topic-id check before the commit
    assert "reason=foreign_write" in halted[0] or "reason=topic_recreated" in halted[0], halted
    assert f"dr.{lone}" in halted[0], "the halt names the recreated target topic"
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()

    assert_exact(source_cluster, target_cluster, busy, f"dr.{busy}")
    ends = source_ends(source_cluster, busy, PARTITIONS)
    cps = checkpoints(target_cluster, pipeline)
    assert {p: cps[(busy, p)].position for p in range(PARTITIONS)} == ends, "every other lane's checkpoint landed"
    assert cps[(lone, 0)].position == lone_position, "the failed lane committed nothing past its failure"
    assert cps[(lone, 0)].lane_state is not None and cps[(lone, 0)].lane_state.state == "halted"
    assert target_cluster.read_all(f"dr.{lone}") == [], "nothing was committed into the recreated topic"
