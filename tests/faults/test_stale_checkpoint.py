"""Hole: a lane read its checkpoint only up to the last stable offset of its ``__shoal_checkpoints`` partition, so
another producer's transaction left open there hid every checkpoint committed after it began: the lane resumed
from an older position and copied a range twice, in exactly-once mode. Now the lane, once InitProducerId has
decided its own transactions, reads its own key past the LSO."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import CheckpointStore, checkpoint_key, checkpoint_partition
from tests.copy_helpers import shoal


def _open_foreign_transaction(target_cluster, partition: int) -> Producer:
    """Another producer's transaction on one checkpoint partition, left open (it would time out after 60 s)."""
    producer = Producer(target_cluster.config.confluent(**{
        "transactional.id": f"foreign-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": 60000}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(CHECKPOINT_TOPIC, key=b'"someone-else"', value=b"{}", partition=partition)
    producer.flush(30)
    return producer


def test_an_open_foreign_transaction_on_the_checkpoint_partition_does_not_make_a_lane_copy_twice(
        source_cluster, target_cluster, unique_name):
    topic = unique_name()
    pipeline = f"p.{topic}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(40)])
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(40, 100)])
    with WireClient.for_cluster(target_cluster.config) as client:
        CheckpointStore(target_cluster.config, client).ensure_topic()
    foreign = _open_foreign_transaction(target_cluster, checkpoint_partition(checkpoint_key(pipeline, topic, 0)))
    try:
        args = ("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                f"dr.{topic}", "--pipeline", pipeline)
        first = shoal(*args, "--to", "40")
        assert first.returncode == 0, first.stderr
        assert len(target_cluster.read_all(f"dr.{topic}")) == 40
        second = shoal(*args)  # resumes: its checkpoint at 40 sits behind the foreign open transaction
        assert second.returncode == 0, second.stderr
        values = [r.value for r in target_cluster.read_all(f"dr.{topic}")]
        assert values == [b"v%d" % i for i in range(100)], f"{len(values)} records on the target for 100 copied"
    finally:
        foreign.abort_transaction(30)
