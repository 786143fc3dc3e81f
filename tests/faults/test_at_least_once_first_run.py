"""Hole: an at-least-once lane wrote its first checkpoint only after its first commit window. A first run stopped
(crash, SIGKILL, fenced by a second daemon) before that left copies on the target that nobody could judge: the
next run, finding no checkpoint, copied the same records again from the start and reported nothing. Now a lane
with no checkpoint writes one before its first batch (where the copy starts, where it will land), so the next run
resumes there and its landing rule reports the first run's copies as at-least-once duplicates."""

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


class _Stopped(Exception):
    """The first run's process dying after its first acknowledged write."""


def _copier(source, target, store, pipeline: str) -> CheckpointedCopier:
    # no commit before the end of the range; one batch per fetch, each written on its own
    policy = CommitPolicy(commit_bytes=64 * 1024 * 1024, commit_interval_ms=120_000)
    options = CopyOptions(fetch_max_bytes=1, max_inflight_bytes=1)
    return CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.AT_LEAST_ONCE,
                              policy=policy, options=options)


def _stop_after_first_write(result) -> None:
    if result.records:
        raise _Stopped


@pytest.mark.parametrize("start", [0, 10], ids=["batch-start", "mid-batch"])
def test_an_at_least_once_first_run_stopped_before_its_first_commit_leaves_only_reported_duplicates(
        source_cluster, target_cluster, unique_name, caplog, start):
    """``mid-batch``: the range starts inside the first batch (a timestamp start, a DeleteRecords log start); the
    retry of the same range must resume where the first run began, not refuse a skip below its start."""
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic)
    target_cluster.create_topic(target_topic)
    for first in range(0, RECORDS, 40):  # five batches
        source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(first, first + 40)])
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        rng = PartitionRange(topic, 0, start, RECORDS, target_topic, 0)
        with pytest.raises(_Stopped):
            _copier(source, target, store, pipeline).copy(rng, _stop_after_first_write)
        first_run = len(target_cluster.read_all(target_topic))
        assert 0 < first_run < RECORDS - start, f"the first run wrote {first_run} records before it stopped"

        # the restarted process: a new writer of the lane (fencing the first), resuming from what is stored
        session = _copier(source, target, store, pipeline).open_lane(topic, 0, target_topic, 0)
        with caplog.at_level(logging.WARNING, logger="mirror_core.engine.resume_landing"):
            result = session.copy(start, RECORDS)
    assert result.source_end == RECORDS
    values = [r.value for r in target_cluster.read_all(target_topic)]
    expected = [b"v%d" % i for i in range(start, start + first_run)] + [b"v%d" % i for i in range(start, RECORDS)]
    assert values == expected, "the target is not the first run's copies followed by the whole source"
    assert session.duplicates_reported == first_run, \
        f"{first_run} records were copied twice, {session.duplicates_reported} reported"
    assert f"at-least-once resume found {first_run} record(s)" in caplog.text


def test_a_resumed_holder_stopped_before_its_first_commit_does_not_get_its_duplicates_reported_twice(
        source_cluster, target_cluster, unique_name, caplog):
    """Hole: a resumed at-least-once holder that found (and reported) a crashed run's copies at its first landing,
    then stopped before its first commit, left the lane's checkpoint where it was: the next holder resumed there too
    and reported the same copies again with the second run's own — more duplicates reported than the target holds
    (a daemon losing a lane right after taking it over, twice, in tests/faults/test_at_least_once_fencing.py). Now
    the flush whose landing found duplicates is checkpointed at once, so a later holder judges only what came after.
    """
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic)
    target_cluster.create_topic(target_topic)
    for first in range(0, RECORDS, 40):  # five batches
        source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(first, first + 40)])
    reported = 0
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        rng = PartitionRange(topic, 0, 0, RECORDS, target_topic, 0)
        with pytest.raises(_Stopped):  # the first run: copies of its first batch, no commit
            _copier(source, target, store, pipeline).copy(rng, _stop_after_first_write)
        # the second holder: judges (and reports) the first run's copies, writes its first batch, stops
        second = _copier(source, target, store, pipeline).open_lane(topic, 0, target_topic, 0)
        with pytest.raises(_Stopped):
            second.copy(0, RECORDS, _stop_after_first_write)
        reported += second.duplicates_reported
        third = _copier(source, target, store, pipeline).open_lane(topic, 0, target_topic, 0)
        result = third.copy(0, RECORDS)
        reported += third.duplicates_reported
    assert result.source_end == RECORDS
    on_target = len(target_cluster.read_all(target_topic))
    assert reported > 0, "the second holder found the first run's copies"
    assert reported == on_target - RECORDS, \
        f"the target holds {on_target - RECORDS} duplicate record(s); the holders reported {reported}"
