"""What a lane raises when its copy failed and the abort of its open transaction found the writer fenced.

Seen on Kafka 4.4 (tests/integration/daemon/test_daemon.py::test_backfill_then_handoff_under_load_seam_is_clean,
now and then): a daemon lane's commit raced a late backfill's InitProducerId; the coordinator answered the EndTxn
with UNKNOWN_SERVER_ERROR ("transition to ONGOING while it already a pending state PREPARE_EPOCH_FENCE"), only the
abort that followed said the writer was fenced, and the lane reported the EndTxn error and was retried — reopened,
fencing back whoever had taken it — instead of being dropped as fenced."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from mirror_core.engine.lane_fence import LaneFence
from mirror_core.errors import DataLossError, MirrorError, ProducerFencedError


class Writer:
    def __init__(self, abort_error: BaseException | None):
        self.in_transaction = True
        self.abort_error = abort_error
        self.aborts = 0

    def abort_transaction(self, *, give_up_after_s=None):
        self.aborts += 1
        if self.abort_error is not None:
            raise self.abort_error
        self.in_transaction = False


def fence(abort_error=None, *, exactly_once=True) -> LaneFence:
    lane = LaneFence.__new__(LaneFence)
    lane.exactly_once = exactly_once
    lane.writer = Writer(abort_error)
    lane.owner = NS(target=NS(cluster_name="target"))
    lane.target_topic, lane.target_partition = "dr.orders", 0
    return lane


FENCED = ProducerFencedError("target", "transactional.id 'shoal.p.dr.orders-0'", "InvalidProducerEpochError")
END_TXN_FAILED = MirrorError("EndTxn for transactional.id 'shoal.p.dr.orders-0' on cluster 'target' failed: "
                             "UnknownError")


def test_a_retried_error_gives_way_to_the_fence_the_abort_found():
    lane = fence(FENCED)
    assert lane._after_failed_copy(END_TXN_FAILED) is FENCED
    assert lane.writer.aborts == 1


@pytest.mark.parametrize("abort_error", [None, MirrorError("coordinator away")], ids=["aborted", "abort-failed"])
def test_the_copy_s_own_error_stays_when_the_abort_says_nothing_of_a_fence(abort_error):
    lane = fence(abort_error)
    assert lane._after_failed_copy(END_TXN_FAILED) is END_TXN_FAILED


def test_an_error_that_halts_the_lane_stays_the_one_raised():
    halt = DataLossError("source", "orders", 0, 10, 20)
    assert fence(FENCED)._after_failed_copy(halt) is halt


def test_nothing_is_aborted_outside_a_transaction():
    lane = fence(FENCED, exactly_once=False)
    assert lane._after_failed_copy(END_TXN_FAILED) is END_TXN_FAILED and lane.writer.aborts == 0
