"""An at-least-once lane renews its broker fence (an empty aborted transaction over its target and checkpoint
partitions) every ``refence_interval_s``, so the coordinator never forgets the lane's transactional.id while the
lane lives (at-least-once writes are not transactions and would not keep it alive). Renewals leave abort markers
in the target partition between copies: the copies stay exact, the markers are allowed for, and a writer whose
lane was taken fails its renewal instead of writing on."""

from __future__ import annotations

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.errors import ProducerFencedError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import CheckpointStore


def test_renewed_fences_keep_an_at_least_once_lane_exact_and_fence_a_former_holder(
        source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic)
    target_cluster.create_topic(target_topic)
    policy = CommitPolicy(refence_interval_s=0.0)  # renew before every copy
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()

        def copier():
            return CheckpointedCopier(source, target, store, pipeline=pipeline, policy=policy,
                                      mode=DeliveryMode.AT_LEAST_ONCE)

        session = copier().open_lane(topic, 0, target_topic, 0)
        end = 0
        for round_ in range(3):
            source_cluster.produce(topic, [(b"k", b"r%d-%d" % (round_, i)) for i in range(20)])
            end += 20
            assert session.copy(0, end).source_end == end
        assert session.fences == 4, "one fence at open and one renewal before each of the three copies"
        values = [r.value for r in target_cluster.read_all(target_topic)]
        assert values == [b"r%d-%d" % (r, i) for r in range(3) for i in range(20)]
        # every fence left one abort marker in the target partition, and nothing else is there
        assert list_offsets(target, target_topic, 0, "latest") == 60 + 4

        successor = copier().open_lane(topic, 0, target_topic, 0)  # takes the lane over, fencing `session`
        source_cluster.produce(topic, [(b"k", b"late")])
        with pytest.raises(ProducerFencedError):
            session.copy(0, end + 1)
        assert successor.copy(0, end + 1).source_end == end + 1
    assert [r.value for r in target_cluster.read_all(target_topic)][-2:] == [b"r2-19", b"late"]
