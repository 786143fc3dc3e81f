"""A backfill of a partition the daemon started itself (DESIGN §3.4: a backfill and a daemon worker own whole lanes
and fence each other by the lane's transactional.id).

The daemon stores a new partition's start as the lane's first checkpoint (owner ``daemon``) before it copies. A
later backfill of the partition's history, while the daemon has copied nothing into it yet, takes the lane over:
its InitProducerId fences the daemon's writer, it copies from its own start, and the daemon leaves the lane alone
until ``shoal handoff`` gives it back — then the target is the source, record for record. Once the daemon has copied
data into a lane, a backfill is refused with an error that names the daemon as the owner and the offset it reached
(not the misleading "it was handed off").
"""

from __future__ import annotations

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.engine.checkpointed import CheckpointedCopier
from mirror_core.errors import DaemonOwnsLaneError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.handoff import hand_off
from mirror_core.state.checkpoint import CheckpointStore
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    checkpoints,
    daemon_factory,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)


@pytest.mark.timeout(240)
def test_a_backfill_takes_over_an_untouched_daemon_lane_and_is_refused_clearly_once_the_daemon_copied(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic, partitions=2)
    history = {p: [(b"h%d-%d" % (p, i), b"old %d" % i) for i in range(150)] for p in range(2)}
    for p, records in history.items():
        source_cluster.produce(topic, records, partition=p)
    pipeline = f"bad-{prefix.rsplit('.', 1)[-1]}"
    # the daemon sees the partitions as new and starts them at their end (history left to a backfill)
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), new_partitions="latest")
    daemon = daemon_factory(config, "bad-1").start()
    wait_for(lambda: len(checkpoints(target_cluster, pipeline)) == 2, 60, "the daemon's first checkpoints",
             daemons=(daemon,))
    first = checkpoints(target_cluster, pipeline)
    assert all(first[(topic, p)].owner == DAEMON_OWNER and first[(topic, p)].position == 150 for p in range(2))
    # partition 1 gets data the daemon copies; partition 0 stays as the daemon started it
    source_cluster.produce(topic, [(b"n1-%d" % i, b"new %d" % i) for i in range(40)], partition=1)
    wait_for(lambda: checkpoints(target_cluster, pipeline)[(topic, 1)].position == 190, 60,
             "the daemon's copy of partition 1", daemons=(daemon,))

    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        backfill = CheckpointedCopier(source, target, CheckpointStore(target_cluster.config, target),
                                      pipeline=pipeline, owner="backfill:run-1", owner_epoch=0,
                                      policy=CommitPolicy(1 << 20, 200))
        result = backfill.copy(PartitionRange(topic, 0, 0, 150, target_topic, 0))
        assert result.records == 150
        with pytest.raises(DaemonOwnsLaneError) as refused:
            backfill.copy(PartitionRange(topic, 1, 0, 150, target_topic, 1))
    message = str(refused.value)
    assert f"{topic}-1" in message and "'daemon'" in message and "190" in message, message
    assert "handed off" not in message.replace("nobody handed it off", ""), message

    taken = checkpoints(target_cluster, pipeline)[(topic, 0)]
    assert (taken.owner, taken.position) == ("backfill:run-1", 150)
    # the daemon leaves the taken lane alone: data arriving now is not copied until the handoff
    source_cluster.produce(topic, [(b"n0-%d" % i, b"new %d" % i) for i in range(30)], partition=0)
    wait_for(lambda: "event=lane_dropped lane=" + f"{target_topic}-0" in daemon.log_text(), 60,
             "the daemon dropping the taken lane", daemons=(daemon,))
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].owner == "backfill:run-1"

    hand_off(target_cluster.config, pipeline, topic, [0], wait_for_daemon_s=30, source=source_cluster.config)
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 2}, daemons=(daemon,))
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()

    source = [(r.partition, r.content()) for r in source_cluster.read_all(topic)]
    target = [(r.partition, r.content()) for r in target_cluster.read_all(target_topic)]
    expected_p0 = [c for p, c in source if p == 0]
    assert [c for p, c in target if p == 0] == expected_p0, "partition 0: history, then the daemon's data, exact"
    assert len(expected_p0) == 180
    # partition 1: only what the daemon copied from its start (the refused backfill wrote nothing)
    assert [c for p, c in target if p == 1] == [c for p, c in source if p == 1][150:]
