"""Hole: at-least-once lanes began holding their lane's transactional.id (to be fenced by the broker), so a target
whose transaction coordinator never answers — its ``__transaction_state`` topic can never be created, here because
``transaction.state.log.replication.factor`` is above its broker count — stopped at-least-once copies that need no
transaction at all: every lane open failed after its retries with a bare "coordinator unavailable", for ever. Now
an at-least-once lane falls back to the idempotent writer with its owner check (the documented best effort) and
copies; exactly-once ends with a retriable error that names the cluster and what to check.

The target is a private single-node KRaft broker of this module, configured that way; the source is the sandbox's.
"""

from __future__ import annotations

import logging

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.errors import CoordinatorUnavailableError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import CheckpointStore

POLICY = CommitPolicy(write_retry_s=3.0)  # how long a lane open waits for the coordinator before deciding



def test_at_least_once_copies_to_a_target_whose_transaction_coordinator_never_answers(
        source_cluster, no_coordinator_target, unique_name, caplog):
    topic = unique_name()
    target_topic = f"dr.{topic}"
    source_cluster.create_topic(topic)
    no_coordinator_target.create_topic(target_topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(no_coordinator_target.config) as target:
        store = CheckpointStore(no_coordinator_target.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=f"p.{topic}", policy=POLICY,
                                    mode=DeliveryMode.AT_LEAST_ONCE)
        with caplog.at_level(logging.WARNING, logger="mirror_core.engine.lane_fence"):
            session = copier.open_lane(topic, 0, target_topic, 0)
        assert not session.fenced_by_broker
        assert "no transaction coordinator answered" in caplog.text and "best effort" in caplog.text
        result = session.copy(0, 50)
        assert result.source_end == 50
        assert [r.value for r in no_coordinator_target.read_all(target_topic)] == [b"v%d" % i for i in range(50)]

        exactly_once = CheckpointedCopier(source, target, store, pipeline=f"p2.{topic}", policy=POLICY)
        with pytest.raises(CoordinatorUnavailableError) as refused:
            exactly_once.open_lane(topic, 0, target_topic, 0)
    assert refused.value.retriable
    assert "cluster 'no-coordinator'" in str(refused.value) and "__transaction_state" in str(refused.value)
