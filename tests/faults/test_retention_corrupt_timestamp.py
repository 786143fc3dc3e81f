"""A batch whose max timestamp changed on the source's disk must not tell the retention verdict that data about to
be deleted is safe.

The verdict's time deadline comes from the timestamps of the batches at the mirror position (a Fetch probe:
``retention_inputs.probe_position``). The probe read them without checking the batch's CRC, so one flipped high bit
of ``maxTimestamp`` (stored on the broker's disk; the broker deletes by the largest timestamp it computed when the
batch was appended, which the flip does not change) put the deadline centuries away: ``SAFE`` for records the
broker deletes within minutes — the warning Shoal promises before retention deletes what was not copied, silently
gone. The probe now checks every batch it reads, so the assessment fails naming the cluster, topic, partition and
offset instead — and the daemon's watch, which assesses many lanes at once, leaves that partition out with an error
and still assesses the others (one damaged partition must not blind it to every other lane).

The source is a private broker, so its log segment can be edited in place (the broker serves fetches from the
segment file through the page cache)."""

from __future__ import annotations

import logging
import struct
import time

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.errors import CorruptBatchError
from mirror_core.model.retention import Status
from mirror_core.model.retention_policy import RetentionPolicy
from mirror_core.services.deadlines import assess_positions
from tests.faults.disk_edits import edit_stored_batch
from tests.kafka_helpers import private_broker

RETENTION_MS = 3_600_000          # one hour
AGE_MS = RETENTION_MS - 600_000   # the records are 50 minutes old: the broker deletes them in ~10 minutes
MAX_TIMESTAMP_AT = 35             # maxTimestamp: bytes 35-42 of a v2 batch, under the CRC


@pytest.fixture(scope="module")
def disk_source(session_sandbox, tmp_path_factory):
    session_sandbox.ensure("target")
    with private_broker("corrupt-timestamp-source", tmp_path_factory) as cluster:
        yield cluster


def _raise_max_timestamp(cluster, topic: str, base_offset: int, partition: int = 0) -> None:
    """Set bit 44 of the stored maxTimestamp of the batch at ``base_offset`` (+~557 years; CRC left as it was)."""
    edit_stored_batch(cluster, topic, base_offset, MAX_TIMESTAMP_AT, 8,
                      lambda old: struct.pack(">q", struct.unpack(">q", old)[0] | (1 << 44)), partition)


def _old_records(cluster, topic: str, partitions: int = 1) -> None:
    """Ten records 50 minutes old in each partition, under retention.ms of one hour."""
    cluster.create_topic(topic, partitions=partitions, config={"retention.ms": str(RETENTION_MS)})
    stamp = int(time.time() * 1000) - AGE_MS
    for partition in range(partitions):
        for first in (0, 5):
            cluster.produce(topic, [(b"k%d" % i, b"v%d" % i, None, stamp) for i in range(first, first + 5)],
                            partition=partition, **{"linger.ms": 0})


def test_a_flipped_max_timestamp_does_not_make_data_about_to_be_deleted_look_safe(disk_source, target_cluster,
                                                                                   unique_name):
    topic = unique_name("old")
    _old_records(disk_source, topic)
    policy = RetentionPolicy(throughput_bytes_per_s=1e6)   # no round-trip probe of a target: the verdict alone

    before = assess_positions(disk_source.config, {topic: [0]}, {(topic, 0): 0}, policy).statuses
    assert [s.status for s in before] != [Status.SAFE], before   # the test's premise: ten minutes left is a risk

    _raise_max_timestamp(disk_source, topic, 0)
    with pytest.raises(CorruptBatchError) as raised:
        after = assess_positions(disk_source.config, {topic: [0]}, {(topic, 0): 0}, policy).statuses
        pytest.fail(f"assessed from the corrupt timestamp: {after}")
    message = str(raised.value)
    assert "'corrupt-timestamp-source'" in message and f"{topic}-0:" in message and "offset 0" in message, message
    assert "CRC" in message, message


def test_the_daemons_watch_leaves_the_damaged_partition_out_and_still_warns_about_the_others(disk_source, unique_name,
                                                                                           caplog):
    topic = unique_name("watched")
    _old_records(disk_source, topic, partitions=2)
    _raise_max_timestamp(disk_source, topic, 0, partition=0)
    target = ClusterConfig("target", dict(disk_source.config.settings))   # only its round trip would be used
    watch = RetentionWatch(disk_source.config, target, DaemonMetrics(), interval_s=60, fetch_bytes=1 << 20,
                           policy=RetentionPolicy(throughput_bytes_per_s=1e6, fetch_bytes=1 << 20))
    watch.positions.behind((topic, 0), 0)
    watch.positions.behind((topic, 1), 0)

    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        statuses = watch.assess_once()

    assert [(s.topic, s.partition) for s in statuses] == [(topic, 1)]
    assert statuses[0].status is not Status.SAFE, statuses[0]   # the healthy partition's risk is still told
    skipped = [r.getMessage() for r in caplog.records if "event=retention_skipped" in r.getMessage()]
    assert len(skipped) == 1 and f"topic={topic} partition=0 reason=corrupt_batch" in skipped[0], skipped
    assert "offset 0" in skipped[0] and "CRC" in skipped[0], skipped
    assert watch.metrics.registry.get_sample_value("shoal_retention_status", {
        "topic": topic, "partition": "0", "status": "SAFE"}) is None   # no verdict shown for it, least of all SAFE
