"""A transactional writer keeps its coordinator between calls, and forgets it when the coordinator moved.

AddPartitionsToTxn v0-3 has no top-level error: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE come per partition. A
writer that kept asking the old broker (alive, but no longer the coordinator) stalled the lane until its retry
window ran out."""
from __future__ import annotations

from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest

from mirror_core.kafka.writer import BatchWriter


class MovingCoordinatorClient:
    """Answers like a target whose transaction coordinator is ``coordinator``; any other broker says "not me"."""

    cluster_name = "target"

    def __init__(self, not_me: type[Errors.KafkaError]):
        self.coordinator = 1
        self.not_me = not_me
        self.sent: list[tuple[int, str]] = []

    def find_coordinator(self, key, key_type=None):
        return self.coordinator

    def send(self, node, request, **_):
        name = type(request).__name__
        self.sent.append((node, name))
        if name.startswith("InitProducerId"):
            return NS(error_code=0, producer_id=7, producer_epoch=0)
        if name.startswith("AddPartitionsToTxn"):
            code = 0 if node == self.coordinator else self.not_me.errno
            return NS(error_code=0, results_by_topic_v3_and_below=[
                NS(results_by_partition=[NS(partition_error_code=code)])])
        raise AssertionError(name)


@pytest.mark.parametrize("not_me", [Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError])
@pytest.mark.timeout(20)
def test_add_partitions_follows_a_moved_coordinator(not_me):
    client = MovingCoordinatorClient(not_me)
    writer = BatchWriter(client, transactional_id="shoal.p.t-0", retry_timeout_s=3.0, transaction_timeout_ms=60_000)
    writer.init_producer_id()  # coordinator 1 found and kept
    client.coordinator = 2  # the __transaction_state partition's leader moved; broker 1 is still up
    writer.begin_transaction()
    writer._add_partitions([("t", 0)])  # before the fix: 3 s of asking broker 1, then MirrorError
    adds = [node for node, name in client.sent if name.startswith("AddPartitionsToTxn")]
    assert adds[-1] == 2 and adds.count(1) == 1, adds
