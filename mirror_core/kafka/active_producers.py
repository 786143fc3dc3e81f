"""DescribeProducers (KIP-664): the producers a partition leader holds state for, and the transaction each has open.

The one place Shoal builds and sends it. Used by the landing rule to tell a lane's own undecided transaction (its
writer's producer id at an older epoch) from another producer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.admin import DescribeProducersRequest

from mirror_core.kafka.wire_client import WireClient


@dataclass(frozen=True)
class ActiveProducer:
    producer_id: int
    producer_epoch: int
    open_transaction_at: int  # first offset of its open transaction on the partition; -1: none open


def active_producers(client: WireClient, topic: str, partition: int) -> list[ActiveProducer]:
    """The leader's active producers of ``topic``-``partition``; a broker error code is raised as kafka-python's
    error (callers that cannot tell treat it as no answer)."""
    leader, _epoch = client.leader_for(topic, partition)
    response = client.send(leader, DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(
        name=topic, partition_indexes=[partition])]))
    for answer in response.topics:
        for part in answer.partitions:
            if answer.name != topic or part.partition_index != partition:
                continue
            if part.error_code:
                raise Errors.for_code(part.error_code)()
            return [ActiveProducer(p.producer_id, p.producer_epoch, p.current_txn_start_offset)
                    for p in part.active_producers]
    raise Errors.UnknownTopicOrPartitionError(f"DescribeProducers did not answer for {topic}-{partition}")
