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
    """The abort's answer, and what the writer's own judgement (``fenced_or_timed_out``: a newer writer's
    InitProducerId or the coordinator's abort of our transaction past its timeout) makes of a fence."""

    def __init__(self, abort_error: BaseException | None, *, timed_out: bool = False):
        self.in_transaction = True
        self.abort_error = abort_error
        self.timed_out = timed_out
        self.aborts = 0
        self.judged = 0

    def fenced_or_timed_out(self, fenced):
        self.judged += 1
        return MirrorError("the coordinator aborted the transaction on its timeout") if self.timed_out else fenced

    def abort_transaction(self, *, give_up_after_s=None):
        self.aborts += 1
        if self.abort_error is not None:
            raise self.abort_error
        self.in_transaction = False


def fence(abort_error=None, *, exactly_once=True, timed_out=False) -> LaneFence:
    lane = LaneFence.__new__(LaneFence)
    lane.exactly_once = exactly_once
    lane.writer = Writer(abort_error, timed_out=timed_out)
    lane.owner = NS(target=NS(cluster_name="target"))
    lane.target_topic, lane.target_partition = "dr.orders", 0
    return lane


FENCED = ProducerFencedError("target", "transactional.id 'shoal.p.dr.orders-0'", "InvalidProducerEpochError")
END_TXN_FAILED = MirrorError("EndTxn for transactional.id 'shoal.p.dr.orders-0' on cluster 'target' failed: "
                             "UnknownError")


def test_a_retried_error_gives_way_to_the_fence_the_abort_found():
    lane = fence(FENCED)
    assert lane._after_failed_copy(END_TXN_FAILED) is FENCED
    assert (lane.writer.aborts, lane.writer.judged) == (1, 1)


def test_a_transaction_the_coordinator_aborted_on_its_timeout_is_no_fence():
    """Review: the coordinator's own timeout abort bumps the epoch too, so the abort's answer looks the same; a
    backfill unit whose source was away past the transaction timeout must report the source, and be retried."""
    unavailable = MirrorError("source partition unavailable for 120 s")
    assert fence(FENCED, timed_out=True)._after_failed_copy(unavailable) is unavailable


def test_an_invalid_transaction_state_after_a_lost_commit_answer_is_no_fence():
    """Review: a commit that landed though its answer was lost leaves the abort INVALID_TXN_STATE."""
    state = ProducerFencedError("target", "transactional.id 'shoal.p.dr.orders-0'", "InvalidTxnStateError")
    lane = fence(state)
    assert lane._after_failed_copy(END_TXN_FAILED) is END_TXN_FAILED and lane.writer.judged == 0


def test_an_interrupt_stays_the_one_raised():
    interrupt = KeyboardInterrupt()
    assert fence(FENCED)._after_failed_copy(interrupt) is interrupt


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
