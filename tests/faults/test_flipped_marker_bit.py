"""A data batch whose control bit flipped on the source's disk (bit rot, a bad disk, a bad copy of a log segment)
reads as a commit/abort marker. Markers are dropped unread, so before this test such a batch vanished from the
copy: the checkpoint moved past its offsets and the offset map jumped them, with no error (a silent skip, DESIGN
§3.2). Kafka's own consumer checks every batch's CRC before it looks at its control bit (``check.crcs``); Shoal
now checks the CRC of every batch it drops unread, so the copy halts naming the cluster, topic, partition and
offset, and nothing past the batch is committed.

The source is a private broker, so its log segment can be edited in place: the broker serves fetches from the
segment file (through the page cache), so the flipped bit is what a reader gets."""

from __future__ import annotations

import os

import pytest

from mirror_core.codec.batch_codec import walk_batches
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.concurrent_copy import ConcurrentCopy, lane_share_writer
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import CorruptBatchError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from tests.kafka_helpers import private_broker

BATCH = 5   # records per produced batch: batches at offsets 0, 5 and 10


@pytest.fixture(scope="module")
def disk_source(session_sandbox, tmp_path_factory):
    session_sandbox.ensure("target")
    with private_broker("flipped-bit-source", tmp_path_factory) as cluster:
        yield cluster


def _flip_control_bit(cluster, topic: str, base_offset: int) -> None:
    """Set the control bit of the stored batch at ``base_offset`` in the partition's segment file, CRC unchanged."""
    segment = cluster.broker.data_dir / f"{topic}-0" / "00000000000000000000.log"
    with open(segment, "r+b") as f:
        data = f.read()
        position = 0
        for view in walk_batches(data)[0]:
            if view.base_offset == base_offset:
                attributes_low_byte = position + 22   # attributes: bytes 21-22 of the batch, big-endian
                f.seek(attributes_low_byte)
                f.write(bytes([data[attributes_low_byte] | 0x20]))
                f.flush()
                os.fsync(f.fileno())
                return
            position += view.size
    raise AssertionError(f"no batch at offset {base_offset} in {segment}")


def test_a_batch_whose_control_bit_flipped_on_the_source_halts_the_copy_instead_of_vanishing(
        disk_source, target_cluster, unique_name):
    topic = unique_name("flipped")
    target_topic = f"dr.{topic}"
    pipeline = f"p.{topic}"
    disk_source.create_topic(topic)
    target_cluster.create_topic(target_topic)
    for first in (0, BATCH, 2 * BATCH):   # an idempotent producer (a producer id on every batch), keys of 11 bytes
        disk_source.produce(topic, [(b"order-%05d" % i, b"v%d" % i) for i in range(first, first + BATCH)],
                            partition=0, **{"linger.ms": 0})
    _flip_control_bit(disk_source, topic, BATCH)

    options = CopyOptions()
    with WireClient.for_cluster(disk_source.config) as source, WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode("at-least-once"),
                                    options=options, policy=CommitPolicy(commit_bytes=1))   # a commit per batch
        ranges = [PartitionRange(topic, 0, 0, 3 * BATCH, target_topic, 0)]
        writers = [lane_share_writer(session, rng) for session, rng in zip(copier.open_lanes(ranges), ranges,
                                                                               strict=True)]
        with pytest.raises(CorruptBatchError) as caught:
            ConcurrentCopy(source, options, writers, ranges).run()
        checkpoint = store.read(pipeline, topic, 0)

    message = str(caught.value)
    assert "'flipped-bit-source'" in message and f"{topic}-0:" in message, message   # cluster, topic-partition
    assert "offset 5" in message and "CRC" in message, message
    # nothing at or past the flipped batch was committed, and the target holds at most what came before it
    assert checkpoint is None or checkpoint.position <= BATCH, checkpoint
    landed = target_cluster.read_all(target_topic, timeout_s=10)
    assert [r.key for r in landed] == [b"order-%05d" % i for i in range(len(landed))] and len(landed) <= BATCH
