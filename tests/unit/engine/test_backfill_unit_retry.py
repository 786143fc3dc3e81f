"""A backfill unit that fails with an error Shoal calls retriable (the target restarting, the lane's own earlier
transaction not yet decided, brokers disagreeing about the target topic) is tried again from the lane's checkpoint
after a backoff, a bounded number of times; an error no retry cures is reported at once. Before, the first retriable
failure marked the unit failed and every later unit of its lane "not attempted"."""

from __future__ import annotations

import pytest

from mirror_core.engine.backfill import copy_unit, failure_text
from mirror_core.errors import (
    CoordinatorUnavailableError,
    DataLossError,
    PartitionUnavailableError,
    TargetTopicUnsettledError,
)
from mirror_core.model.ranges import PartitionRange

RNG = PartitionRange("orders", 3, 100, 200, "dr.orders", 3)


class Copier:
    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = []

    def copy(self, rng, lane=None):
        self.calls.append((rng, lane))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_a_retriable_failure_is_tried_again_from_the_checkpoint():
    waits = []
    copier = Copier(TargetTopicUnsettledError("target", "dr.orders", 3),
                    PartitionUnavailableError("target", "dr.orders", 3, "NotLeaderOrFollowerError"), "copied")
    assert copy_unit(copier, RNG, "lane-3", backoff_s=(1.0, 2.0, 3.0), sleep=waits.append) == "copied"
    assert waits == [1.0, 2.0] and copier.calls == [(RNG, "lane-3")] * 3


def test_retries_are_bounded_and_the_ledger_text_says_how_often_it_was_tried():
    waits = []
    errors = [PartitionUnavailableError("target", "dr.orders", 3, "broker down") for _ in range(4)]
    with pytest.raises(PartitionUnavailableError) as raised:
        copy_unit(Copier(*errors), RNG, "lane-3", backoff_s=(1.0, 2.0, 3.0), sleep=waits.append)
    assert waits == [1.0, 2.0, 3.0]
    text = failure_text(raised.value)
    assert "dr.orders-3 is unavailable: broker down" in text and "tried 4 times" in text


def test_an_error_no_retry_cures_is_reported_at_once():
    waits = []
    loss = DataLossError("source", "orders", 3, 100, 150)
    with pytest.raises(DataLossError) as raised:
        copy_unit(Copier(loss, "never"), RNG, "lane-3", backoff_s=(1.0,), sleep=waits.append)
    assert waits == [] and failure_text(raised.value) == str(loss)


def test_a_lane_whose_first_unit_meets_a_retriable_error_copies_all_its_units(monkeypatch):
    """run_lane as a Spark task runs it: before the fix the first unit was 'failed' and the second 'not attempted'."""
    from types import SimpleNamespace as NS

    import mirror_core.engine.backfill as B
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.state.ledger import STATUS_OK

    class Client:
        @staticmethod
        def for_cluster(_config):
            return Client()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def result(start, end):
        return NS(source_start=start, source_end=end, first_target_offset=start, next_target_offset=end,
                  records=end - start, batches=1, bytes=10, deep_batches=0, records_digest="d")

    copier = Copier(TargetTopicUnsettledError("target", "dr.orders", 3), result(100, 200), result(200, 300))
    monkeypatch.setattr(B, "WireClient", Client)
    monkeypatch.setattr(B, "CheckpointStore", lambda *a, **k: None)
    monkeypatch.setattr(B, "CheckpointedCopier", lambda *a, **k: copier)
    monkeypatch.setattr(B, "UNIT_RETRY_BACKOFF_S", (0.0,))
    monkeypatch.setattr(B.copy_unit, "__kwdefaults__", {"backoff_s": (0.0,), "sleep": lambda _s: None})
    units = tuple({"unit_id": f"u{i}", "lane": "dr.orders-3", "topic": "orders", "partition": 3, "start": start,
                   "end": start + 100, "target_topic": "dr.orders", "target_partition": 3}
                  for i, start in enumerate((100, 200)))
    cluster = ClusterConfig("c", {"bootstrap.servers": "127.0.0.1:1"})
    job = B.LaneJob(run_id="r", pipeline="p", mode="exactly-once", exact_bounds=True, throttle_bytes_per_s=None,
                    source=cluster, target=cluster, units=units)
    rows = B.run_lane(job)
    assert [(row.unit_id, row.status, row.error) for row in rows] == [("u0", STATUS_OK, None), ("u1", STATUS_OK, None)]


def test_a_retriable_kafka_error_is_retried_too_and_a_fatal_one_is_not():
    import kafka.errors as Errors

    waits = []
    copier = Copier(Errors.KafkaConnectionError("target restarting"), "copied")
    assert copy_unit(copier, RNG, "lane-3", backoff_s=(1.0,), sleep=waits.append) == "copied" and waits == [1.0]
    with pytest.raises(Errors.TopicAuthorizationFailedError):
        copy_unit(Copier(Errors.TopicAuthorizationFailedError(), "never"), RNG, "lane-3", backoff_s=(1.0,),
                  sleep=waits.append)
    assert waits == [1.0]


def test_coordinator_unavailable_says_how_long_it_waited_or_that_the_window_was_spent():
    """A target outage inside a transaction can spend the transaction's retry window on the writes; the coordinator
    call then gets one try, and its error says so instead of "answered in 0 s" (seen in
    tests/faults/test_backfill_target_outage.py)."""
    waited = CoordinatorUnavailableError("dst", "shoal.p.lane-0", "EndTxn", "KafkaConnectionError", 12.4)
    spent = CoordinatorUnavailableError("dst", "shoal.p.lane-0", "AddPartitionsToTxn", "KafkaConnectionError", 0.0)
    assert "no transaction coordinator answered in 12 s (KafkaConnectionError)" in str(waited)
    assert "in 0 s" not in str(spent)
    assert "answered within what was left of the transaction's retry window (KafkaConnectionError)" in str(spent)
    assert spent.retriable and "cluster 'dst'" in str(spent)
