"""A source topic deleted and recreated (same name, new data) after ``shoal copy`` opened its lanes and before its
first fetch: the lanes resumed from checkpoints pinned to the old topic's id, so the copy must stop with
TopicRecreatedError naming the cluster and topic — never fetch the new topic's records at the old positions and
append them to the target as if they continued the old log (a silent mix of two topics).

Before the fix the concurrent copy's fetchers did not carry the topic id their session pinned at resume: each
pinned whatever id its first leader look-up saw — the recreated topic's — and copied it."""

from __future__ import annotations

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

        source_cluster.recreate_topic(topic, PARTITIONS)              # meanwhile: deleted and recreated, new data
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



@pytest.mark.parametrize("mode", ["exactly-once", "none"])
def test_source_recreated_while_preflight_runs_stops_shoal_copy(source_cluster, target_cluster, unique_name,
                                                                 monkeypatch, mode):
    """``shoal copy`` resolved its ranges against the old topic (offsets 0–30); the topic is deleted and recreated
    with 40 new records while preflight runs (seconds over a long link). A first run has no checkpoint to compare,
    and mode ``none`` none at all: the copy must still refuse the new topic (TopicRecreatedError naming it), not
    copy its offsets 0–30 as the range and silently drop the rest. Before the fix both modes copied 30 new
    records."""
    import io

    from rich.console import Console

    import mirror_core.services.preflight as preflight
    from mirror_core.cli.copy_command import CopyCommand, run_copy
    from mirror_core.config.positions import PositionSpec

    topic = source_cluster.create_topic(unique_name(), PARTITIONS)
    _produce(source_cluster, topic, b"old", 30)
    real_preflight = preflight.run_preflight

    def recreated_meanwhile(*args, **kwargs):
        source_cluster.recreate_topic(topic, PARTITIONS)
        _produce(source_cluster, topic, b"new", 40)
        return real_preflight(*args, **kwargs)

    monkeypatch.setattr(preflight, "run_preflight", recreated_meanwhile)
    cmd = CopyCommand(source=source_cluster.config, target=target_cluster.config, topic=topic,
                      target_topic=f"dr.{topic}", partitions=None, start=PositionSpec("earliest"),
                      end=PositionSpec("latest"), options=CopyOptions(), mode=mode)
    with pytest.raises(TopicRecreatedError, match=topic):
        run_copy(cmd, Console(file=io.StringIO()))
    landed = target_cluster.read_all(f"dr.{topic}")
    assert not landed, f"{len(landed)} records of the recreated topic reached the target, e.g. {landed[:1]}"
