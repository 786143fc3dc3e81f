"""The landing rule tells the lane's own undecided transaction from another producer's (CI at 1dfbb92 and again
this session: after the target broker restarted with a commit in progress, a restarted daemon's InitProducerId
returned while the lane's previous transaction was still open on the target partition; the rule took it for another
producer's and halted the lane for good, though the transaction was the lane's own and about to be decided). The
lane's own is asked of the partition leader by DescribeProducers: its writer's producer id at an older epoch."""

from __future__ import annotations

import uuid
from types import SimpleNamespace as NS

from confluent_kafka import Producer

from mirror_core.engine.resume_landing import own_open_transaction
from mirror_core.kafka.active_producers import active_producers
from mirror_core.kafka.wire_client import WireClient


def _open_producer(client: WireClient, topic: str) -> tuple[int, int, int]:
    """(producer id, epoch, first offset) of the one transaction open on ``topic``-0."""
    (active,) = [p for p in active_producers(client, topic, 0) if p.open_transaction_at >= 0]
    return active.producer_id, active.producer_epoch, active.open_transaction_at


def test_the_lanes_own_open_transaction_is_told_from_another_producers(target_cluster, unique_name):
    topic = unique_name()
    target_cluster.create_topic(topic)
    target_cluster.produce(topic, [(b"k", b"committed")])
    open_txn = Producer(target_cluster.config.confluent(**{
        "transactional.id": f"own-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": 60000}))
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    open_txn.produce(topic, key=b"k", value=b"open", partition=0)
    open_txn.flush(30)
    try:
        with WireClient.for_cluster(target_cluster.config) as client:
            pid, epoch, open_at = _open_producer(client, topic)
            assert open_at == 1

            def session(producer_id: int, producer_epoch: int):
                return NS(writer=NS(producer_id=producer_id, producer_epoch=producer_epoch),
                          owner=NS(target=client), target_topic=topic, target_partition=0)

            # the lane's writer after InitProducerId: the same producer id, a newer epoch
            assert own_open_transaction(session(pid, epoch + 1), open_at) == (pid, epoch)
            # another producer's transaction, or one not at the offset the landing found open: not the lane's
            assert own_open_transaction(session(pid + 1, epoch + 1), open_at) is None
            assert own_open_transaction(session(pid, epoch + 1), open_at + 1) is None
            # the same epoch is the writer's own transaction in progress, not an earlier one
            assert own_open_transaction(session(pid, epoch), open_at) is None
            # no producer id yet: nothing to compare
            assert own_open_transaction(session(-1, -1), open_at) is None
    finally:
        open_txn.abort_transaction(30)
