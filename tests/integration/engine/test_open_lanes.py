"""``CheckpointedCopier.open_lanes`` (how ``shoal copy`` opens its lanes) against real brokers: every lane resumes
exactly where opening it alone would (position, its epoch, topic ids), an open transaction a former holder left is
decided before the checkpoints are read, and the source is asked once per step for all lanes, not once per lane
(over a 200 ms link each source request is a round trip before the first byte)."""

from __future__ import annotations

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import default_lane, lane_transactional_id
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from tests.kafka_helpers import count_requests

PARTITIONS = 4


def _copier(source, target, store, topic: str, mode: DeliveryMode) -> CheckpointedCopier:
    return CheckpointedCopier(source, target, store, pipeline=f"open-lanes.{topic}", mode=mode,
                              options=CopyOptions(max_inflight_bytes=1 << 20),
                              policy=CommitPolicy(commit_bytes=1 << 20))


@pytest.mark.parametrize("mode", [DeliveryMode.EXACTLY_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_lanes_opened_together_resume_as_each_alone(source_cluster, target_cluster, unique_name, mode):
    topic, ranges = _topic(source_cluster, target_cluster, unique_name())
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        first = _copier(source, target, store, topic, mode)
        for p, session in enumerate(first.open_lanes(ranges[:3])):   # lane 3 never copied: no checkpoint
            session.copy(0, 10 + 5 * p)
        # a former holder of lane 0 left data in an open transaction (exactly-once): the next open must abort it
        # before reading the checkpoints, and resume at the committed position, not past the open data
        if mode is DeliveryMode.EXACTLY_ONCE:
            _leave_open_transaction(target_cluster, lane_transactional_id(first.pipeline, default_lane(topic, 0)),
                                    topic)
        alone = [_copier(source, target, store, topic, mode).open_lane(topic, p, topic, p)
                 for p in range(PARTITIONS)]
        expected = [(s.position, s.position_epoch, s.source_topic_id, s.target_topic_id) for s in alone]
        assert [e[0] for e in expected] == [10, 15, 20, None]

        source.leader_for(topic, 0)                          # metadata known before counting
        sent = count_requests(source)
        together = _copier(source, target, store, topic, mode).open_lanes(ranges)
        assert [(s.position, s.position_epoch, s.source_topic_id, s.target_topic_id) for s in together] == expected
        assert sent.count("OffsetForLeaderEpochRequest") <= 1, sent   # one leader: one request for 3 resumed lanes
        assert sent.count("MetadataRequest") <= 1, sent                # the topic id: one answer for every lane
        results = [s.copy(s.position or 0, r.end) for s, r in zip(together, ranges, strict=True)]
        assert [r.records for r in results] == [30, 26, 22, 43]


def test_a_lane_the_daemon_owns_refuses_the_copy_before_any_lane_is_fenced(source_cluster, target_cluster,
                                                                            unique_name):
    """``shoal copy`` pointed at a daemon's pipeline: the lane the daemon owns refuses the copy, and no lane is
    fenced first — the daemon's open transaction on another lane still commits (before, every lane opened ahead of
    the refused one was fenced, and with all lanes fenced before the checks, every lane would be)."""
    from mirror_core.config.names import DAEMON_OWNER
    from mirror_core.errors import DaemonOwnsLaneError

    topic, ranges = _topic(source_cluster, target_cluster, unique_name())
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        pipeline = f"open-lanes.{topic}"
        daemon = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.EXACTLY_ONCE,
                                    owner=DAEMON_OWNER, owner_epoch=1, options=CopyOptions(max_inflight_bytes=1 << 20),
                                    policy=CommitPolicy(commit_bytes=1 << 20))
        daemon.copy(PartitionRange(topic, 2, 0, 10, topic, 2))          # the daemon copied into lane 2
        open_txn = _leave_open_transaction(target_cluster, lane_transactional_id(pipeline, default_lane(topic, 0)),
                                           topic)                        # and holds lane 0 mid-transaction

        with pytest.raises(DaemonOwnsLaneError, match=rf"{topic}-2"):
            _copier(source, target, store, topic, DeliveryMode.EXACTLY_ONCE).open_lanes(ranges)
        _assert_not_fenced(open_txn, "before refusing lane 2")


def _topic(source_cluster, target_cluster, name: str) -> tuple[str, list[PartitionRange]]:
    """The source topic (see :func:`_fill`), its target twin and one range per partition over all of it."""
    topic = source_cluster.create_topic(name, PARTITIONS)
    target_cluster.create_topic(topic, PARTITIONS)
    _fill(source_cluster, topic)
    return topic, [PartitionRange(topic, p, 0, 40 + p, topic, p) for p in range(PARTITIONS)]


def _fill(cluster, topic: str) -> None:
    """Partition p: batches of 5 records, the last one 5 + p (40 + p records), so copies can stop at 10, 15, 20."""
    from confluent_kafka import Producer

    producer = Producer(cluster.config.confluent(**{"enable.idempotence": True, "linger.ms": 0}))
    for p in range(PARTITIONS):
        for lo, hi in [(i, i + 5) for i in range(0, 35, 5)] + [(35, 40 + p)]:
            for j in range(lo, hi):
                producer.produce(topic, key=b"k", value=b"v%d" % j, partition=p)
            assert producer.flush(10) == 0


def _leave_open_transaction(cluster, transactional_id: str, topic: str):
    """A former holder of the lane (its transactional.id) that wrote to the lane's partition and never decided."""
    from confluent_kafka import Producer

    producer = Producer(cluster.config.confluent(**{"transactional.id": transactional_id}))
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"open", value=b"never decided", partition=0)
    producer.flush(10)
    return producer


def test_a_recreated_target_refuses_the_copy_before_any_lane_is_fenced(source_cluster, target_cluster, unique_name):
    """The target topic was deleted and recreated after a first run: its checkpoints name the old topic id, so
    the copy is refused (TopicRecreatedError naming the target) — and, since the checkpoints show it, before any
    lane is fenced: another holder's open transaction on a lane still commits."""
    from mirror_core.errors import TopicRecreatedError

    topic, ranges = _topic(source_cluster, target_cluster, unique_name())
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        for session in _copier(source, target, store, topic, DeliveryMode.EXACTLY_ONCE).open_lanes(ranges[2:]):
            session.copy(0, 10)                                       # lanes 2 and 3 pinned the target's id
        target_cluster.recreate_topic(topic, PARTITIONS)
        pipeline = f"open-lanes.{topic}"
        open_txn = _leave_open_transaction(target_cluster, lane_transactional_id(pipeline, default_lane(topic, 0)),
                                           topic)                      # another holder, mid-transaction on lane 0
        with pytest.raises(TopicRecreatedError, match=rf"{topic}.*target"):
            _copier(source, target, store, topic, DeliveryMode.EXACTLY_ONCE).open_lanes(ranges)
        _assert_not_fenced(open_txn, "before refusing the recreated target")


def _assert_not_fenced(open_txn, when: str) -> None:
    """The other holder's transaction on lane 0 still commits: the copy did not fence lane 0 ``when``."""
    from confluent_kafka import KafkaException

    try:
        open_txn.commit_transaction(10)
    except KafkaException as exc:   # pragma: no cover - the failure these tests exist for
        pytest.fail(f"the copy fenced lane 0 {when}: {exc}")
