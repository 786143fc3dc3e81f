"""Hole (found by the coalescing review): an at-least-once copy of a LogAppendTime source with
``--producer-timestamps`` (``preserve_log_append_time=False``: the target keeps the producers' create times) that
stopped between a write and its checkpoint could not be resumed. The landing rule compared the copies found on the
target (create times) with the source's records read with the broker's append times, saw foreign records, and
halted the lane with ForeignWriteError: a false stall, with nothing wrong on the target. Now the source is read with
the timestamps the copy writes."""

from __future__ import annotations

import logging

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore

RECORDS = 200
CREATED = 1_700_000_000_000   # every record's create time; the broker stamps its own append time


class _Stopped(Exception):
    """The first run's process dying after its first acknowledged write."""


def _copier(source, target, store, pipeline: str, *, producer_timestamps: bool = True) -> CheckpointedCopier:
    policy = CommitPolicy(commit_bytes=64 * 1024 * 1024, commit_interval_ms=120_000)  # no commit before the end
    options = CopyOptions(fetch_max_bytes=1, max_inflight_bytes=1, preserve_log_append_time=not producer_timestamps)
    return CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.AT_LEAST_ONCE,
                              policy=policy, options=options)


def _stop_after_first_write(result) -> None:
    if result.records:
        raise _Stopped


@pytest.mark.parametrize(("first", "then"), [(True, True), (True, False), (False, True)],
                         ids=["producer-times", "producer-times-then-broker-times", "broker-times-then-producer-times"])
def test_an_at_least_once_resume_with_producer_timestamps_reports_duplicates_instead_of_halting(
        source_cluster, target_cluster, unique_name, caplog, first, then):
    """``first``/``then``: whether the crashed run and the resuming one keep the producers' create times. The
    second review found the mixed pairs halting too (a ``shoal copy --producer-timestamps`` that crashed, then a
    daemon or backfill, which keep the broker's times, resuming the lane): the landing rule now also tries the
    other choice before calling the records foreign."""
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic, config={"message.timestamp.type": "LogAppendTime"})
    target_cluster.create_topic(target_topic)
    for first in range(0, RECORDS, 40):  # five batches, each record with its own create time
        source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i, [], CREATED) for i in range(first, first + 40)])
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        with pytest.raises(_Stopped):
            _copier(source, target, store, pipeline, producer_timestamps=first).copy(
                PartitionRange(topic, 0, 0, RECORDS, target_topic, 0), _stop_after_first_write)
        first_run = len(target_cluster.read_all(target_topic))
        assert 0 < first_run < RECORDS
        session = _copier(source, target, store, pipeline, producer_timestamps=then).open_lane(topic, 0, target_topic,
                                                                                             0)
        with caplog.at_level(logging.WARNING, logger="mirror_core.engine.resume_landing"):
            result = session.copy(0, RECORDS)
    assert result.source_end == RECORDS
    copied = target_cluster.read_all(target_topic)
    if first and then:
        assert {r.timestamp for r in copied} == {CREATED}, "the producers' create times were not kept"
    assert [r.value for r in copied] == [b"v%d" % i for i in range(first_run)] + [b"v%d" % i for i in range(RECORDS)]
    assert session.duplicates_reported == first_run
    assert f"at-least-once resume found {first_run} record(s)" in caplog.text
