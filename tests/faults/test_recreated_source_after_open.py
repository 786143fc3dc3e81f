"""A source topic deleted and recreated (same name, new data) after ``shoal copy`` opened its lanes and before its
first fetch: the lanes resumed from checkpoints pinned to the old topic's id, so the copy must stop with
TopicRecreatedError naming the cluster and topic — never fetch the new topic's records at the old positions and
append them to the target as if they continued the old log (a silent mix of two topics).

Before the fix the concurrent copy's fetchers did not carry the topic id their session pinned at resume: each
pinned whatever id its first leader look-up saw — the recreated topic's — and copied it."""

from __future__ import annotations

import time

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.concurrent_copy import ConcurrentCopy, lane_share_writer
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import TopicRecreatedError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore

PARTITIONS = 2


def _produce(cluster, topic: str, tag: bytes, count: int) -> None:
    for p in range(PARTITIONS):
        for start in range(0, count, 10):   # batches of 10: a first copy can stop at 10
            cluster.produce(topic, [(b"k", b"%s-%d" % (tag, i)) for i in range(start, start + 10)], partition=p)


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_source_recreated_between_open_and_first_fetch_stops_the_copy(source_cluster, target_cluster, unique_name,
                                                                      mode):
    topic = source_cluster.create_topic(unique_name(), PARTITIONS)
    target_cluster.create_topic(topic, PARTITIONS)
    _produce(source_cluster, topic, b"old", 30)
    options = CopyOptions(max_inflight_bytes=1 << 20)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()

        def copier() -> CheckpointedCopier:
            return CheckpointedCopier(source, target, store, pipeline=f"recreated.{topic}", mode=mode,
                                      options=options, policy=CommitPolicy(commit_bytes=1 << 20))

        ranges = [PartitionRange(topic, p, 0, 30, topic, p) for p in range(PARTITIONS)]
        for session in copier().open_lanes(ranges):
            session.copy(0, 10)                                   # a first run stopped at offset 10
        sessions = copier().open_lanes(ranges)                    # a rerun: resumed at 10, topic id pinned
        assert [s.position for s in sessions] == [10] * PARTITIONS

        source_cluster.admin.delete(topic)                        # meanwhile: deleted and recreated, new data
        deadline = time.monotonic() + 30
        while True:
            try:
                source_cluster.create_topic(topic, PARTITIONS)
                break
            except Exception:  # noqa: BLE001 - the deletion is still being applied
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        _produce(source_cluster, topic, b"new", 30)
        landed_before = target_cluster.read_all(topic)

        copy = ConcurrentCopy(source, options, [lane_share_writer(s, r) for s, r in zip(sessions, ranges,
                                                                                         strict=True)], ranges)
        with pytest.raises(TopicRecreatedError, match=topic):
            copy.run()
    landed = target_cluster.read_all(topic)
    new = [r for r in landed if r.value and r.value.startswith(b"new-")]
    assert not new and len(landed) == len(landed_before), \
        f"{len(new)} records of the recreated topic reached the target, e.g. {new[:1]}"
