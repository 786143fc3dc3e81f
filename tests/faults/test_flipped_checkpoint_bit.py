"""A checkpoint whose stored bytes changed on the target's disk (bit rot, a bad disk, a bad copy of a log segment).

The checkpoint value is JSON: one flipped bit turns ``"position":20`` into ``"position":21``. Shoal's checkpoint
reader decoded the records it fetched without checking their CRC, so a lane resumed at 21 — its target offset still
20, so the landing check agreed — and source offset 20 was never copied, with no error (a silent skip, DESIGN §3).
Kafka's own consumer checks every batch's CRC before reading it (``check.crcs``); Shoal's readers of records now do
too, so the copy halts naming the cluster, the checkpoint topic's partition and the offset, and writes nothing.

The target is a private broker, so the checkpoint topic's log segment can be edited in place: the broker serves
fetches from the segment file (through the page cache), so the flipped bit is what a reader gets."""

from __future__ import annotations

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.errors import CorruptBatchError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from tests.faults.disk_edits import overwrite
from tests.kafka_helpers import private_broker

BATCH = 10   # records per produced batch


@pytest.fixture(scope="module")
def disk_target(session_sandbox, tmp_path_factory):
    session_sandbox.ensure("source")
    with private_broker("flipped-checkpoint-target", tmp_path_factory) as cluster:
        yield cluster


def _flip_position_digit(cluster, checkpoint_topic: str, pipeline: str, position: int) -> tuple[int, int]:
    """Flip bit 0 of the last digit of ``"position":<position>`` in the newest checkpoint of ``pipeline`` stored
    in ``checkpoint_topic``'s segment files (its CRC left as it was). Returns (partition, the file offset)."""
    needle = b'"position":%d,' % position
    found = None
    for directory in sorted(cluster.broker.data_dir.glob(f"{checkpoint_topic}-*")):
        for segment in sorted(directory.glob("*.log")):
            data = segment.read_bytes()
            at = data.rfind(needle)
            while at >= 0 and pipeline.encode() not in data[max(0, at - 400):at + 400]:
                at = data.rfind(needle, 0, at)
            if at >= 0:
                found = (segment, int(directory.name.rsplit("-", 1)[1]), at + len(needle) - 2)
    assert found is not None, f"no checkpoint of {pipeline} at {position} in {checkpoint_topic}"
    segment, partition, digit = found
    overwrite(segment, digit, bytes([segment.read_bytes()[digit] ^ 0x01]))
    return partition, digit


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_a_checkpoint_whose_bytes_changed_on_disk_halts_the_lane_instead_of_moving_its_position(
        source_cluster, disk_target, unique_name, mode):
    topic = unique_name("cp-flip")
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic)
    disk_target.create_topic(target_topic)
    for first in range(0, 3 * BATCH, BATCH):
        source_cluster.produce(topic, [(b"order-%05d" % i, b"v%d" % i) for i in range(first, first + BATCH)],
                               partition=0, **{"linger.ms": 0})
    ranges = {end: PartitionRange(topic, 0, 0, end, target_topic, 0) for end in (2 * BATCH, 3 * BATCH)}

    def copier(source, target):
        # a fresh store (nothing cached from the first run) on a checkpoint topic of this test's own: a damaged
        # batch stops every read of its checkpoint partition, whichever lane it belonged to
        store = CheckpointStore(disk_target.config, target, topic=f"{topic}.checkpoints")
        store.ensure_topic()
        return store, CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode(mode),
                                         policy=CommitPolicy(commit_bytes=1 << 20))

    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(disk_target.config) as target:
        store, first = copier(source, target)
        assert first.copy(ranges[2 * BATCH]).source_end == 2 * BATCH
        partition, _ = _flip_position_digit(disk_target, store.topic, pipeline, 2 * BATCH)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(disk_target.config) as target:
        store, again = copier(source, target)
        with pytest.raises(CorruptBatchError) as raised:
            result = again.copy(ranges[3 * BATCH])
            pytest.fail(f"the copy resumed at {result.source_start} and finished at {result.source_end}")
    message = str(raised.value)
    assert "'flipped-checkpoint-target'" in message and f"{store.topic}-{partition}:" in message, message
    assert "CRC" in message and "offset " in message and "intact replica" in message, message   # what to do
    landed = disk_target.read_all(target_topic, timeout_s=10)
    assert [r.key for r in landed] == [b"order-%05d" % i for i in range(2 * BATCH)]   # nothing more, nothing skipped
