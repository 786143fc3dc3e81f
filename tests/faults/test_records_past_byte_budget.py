"""Records larger than a check's byte budget (DESIGN.md §3.2 no silent skip, §3.3 order, §3.4 fencing).

Two checks look for committed records on the target with a byte budget: the backfill's takeover of a daemon's
data-less first checkpoint ("did the daemon write past the landing its checkpoint names?") and the landing rule
("what lies between the checkpoint's target offset and where the copy lands?"). A budget overrun once came back as
an empty list, which both read as "no records": a backfill took over a lane an at-least-once daemon had already
written a record larger than the backfill's ``commit_bytes`` into (its record then sat below the backfill's history:
reordered, and later duplicated), and foreign records larger than two commit windows passed the landing rule
silently. Also here: an exactly-once backfill's takeover fences an at-least-once daemon's idempotent writer on the
data partition before it looks, so no daemon write lands between the look and the backfill's first checkpoint.
"""

from __future__ import annotations

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.errors import DaemonOwnsLaneError, ForeignWriteError, ProducerFencedError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore


class Crash(Exception):
    pass


def _crash():
    raise Crash("the daemon dies after its data was acknowledged, before its checkpoint")


def _setup(source_cluster, target_cluster, unique_name, tag):
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic, partitions=1)
    target_cluster.create_topic(target_topic, partitions=1)
    return topic, target_topic, f"{tag}-{prefix.rsplit('.', 1)[-1]}"


@pytest.mark.parametrize("value_bytes", [100, 4000], ids=["small", "larger-than-backfill-budget"])
@pytest.mark.timeout(120)
def test_a_backfill_does_not_take_over_a_lane_the_daemon_wrote_a_big_record_into(
        sandbox, source_cluster, target_cluster, unique_name, value_bytes):
    topic, target_topic, pipeline = _setup(source_cluster, target_cluster, unique_name, "tk")
    source_cluster.produce(topic, [(b"h%d" % i, b"old %d" % i) for i in range(20)], partition=0)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        daemon = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.AT_LEAST_ONCE,
                                    owner=DAEMON_OWNER, owner_epoch=1, policy=CommitPolicy(4 << 20, 60_000))
        lane = daemon.open_lane(topic, 0, target_topic, 0)
        lane.write_first_checkpoint(20)  # the daemon's first checkpoint ("latest")
        source_cluster.produce(topic, [(b"new", b"x" * value_bytes)], partition=0)  # offset 20
        with pytest.raises(Crash):
            lane.copy(20, 21, before_commit=_crash)  # data acknowledged, checkpoint never written
    assert [r.key for r in target_cluster.read_all(target_topic)] == [b"new"]

    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        backfill = CheckpointedCopier(source, target, CheckpointStore(target_cluster.config, target),
                                      pipeline=pipeline, mode=DeliveryMode.AT_LEAST_ONCE,
                                      owner="backfill:run-1", owner_epoch=0, policy=CommitPolicy(1024, 200))
        with pytest.raises(DaemonOwnsLaneError):
            backfill.copy(PartitionRange(topic, 0, 0, 20, target_topic, 0))
    assert [r.key for r in target_cluster.read_all(target_topic)] == [b"new"], "the backfill wrote below the daemon"


@pytest.mark.parametrize("mode", [DeliveryMode.AT_LEAST_ONCE, DeliveryMode.EXACTLY_ONCE])
@pytest.mark.parametrize("foreign_value", [100, 3000], ids=["small", "larger-than-two-windows"])
@pytest.mark.timeout(120)
def test_foreign_records_between_checkpoint_and_landing_halt_the_lane(
        sandbox, source_cluster, target_cluster, unique_name, foreign_value, mode):
    topic, target_topic, pipeline = _setup(source_cluster, target_cluster, unique_name, "ls")
    source_cluster.produce(topic, [(b"k%d" % i, b"v %d" % i) for i in range(5)], partition=0)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=mode, owner="copy",
                                    policy=CommitPolicy(1024, 60_000))
        lane = copier.open_lane(topic, 0, target_topic, 0)
        lane.copy(0, 5)
        # a foreign writer appends to the target partition between the checkpoint and the next landing
        count = 2 if mode is DeliveryMode.AT_LEAST_ONCE else 1
        target_cluster.produce(target_topic, [(b"foreign", b"f" * foreign_value)] * count, partition=0)
        source_cluster.produce(topic, [(b"k%d" % i, b"v %d" % i) for i in range(5, 10)], partition=0)
        with pytest.raises(ForeignWriteError) as raised:
            lane.copy(5, 10)
        assert store.read(pipeline, topic, 0).position == 5, "the checkpoint moved past the foreign records"
    assert target_topic in str(raised.value) and "between" in str(raised.value)
    if mode is DeliveryMode.EXACTLY_ONCE:  # the halted copy's transaction is aborted
        assert [r.key for r in target_cluster.read_all(target_topic)] == [b"k%d" % i for i in range(5)] + [b"foreign"]


@pytest.mark.timeout(120)
def test_an_exactly_once_takeover_fences_an_at_least_once_daemon_on_the_data_partition(
        sandbox, source_cluster, target_cluster, unique_name):
    topic, target_topic, pipeline = _setup(source_cluster, target_cluster, unique_name, "mx")
    source_cluster.produce(topic, [(b"h%d" % i, b"old %d" % i) for i in range(20)], partition=0)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        daemon = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.AT_LEAST_ONCE,
                                    owner=DAEMON_OWNER, owner_epoch=1, policy=CommitPolicy(4 << 20, 60_000))
        daemon_lane = daemon.open_lane(topic, 0, target_topic, 0)
        daemon_lane.write_first_checkpoint(20)
        backfill = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.EXACTLY_ONCE,
                                      owner="backfill:run-1", owner_epoch=0, policy=CommitPolicy(1 << 20, 200))
        backfill_lane = backfill.open_lane(topic, 0, target_topic, 0)
        assert backfill_lane.taken_over is not None
        # the daemon, not yet aware, writes its next record between the takeover's look and the backfill's start
        source_cluster.produce(topic, [(b"new", b"daemon's")], partition=0)
        with pytest.raises(ProducerFencedError):
            daemon_lane.copy(20, 21)
        backfill_lane.copy(0, 20)
    assert [r.key for r in target_cluster.read_all(target_topic)] == [b"h%d" % i for i in range(20)]
