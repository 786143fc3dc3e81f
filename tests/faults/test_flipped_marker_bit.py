"""A data batch whose control bit flipped on the source's disk (bit rot, a bad disk, a bad copy of a log segment)
reads as a commit/abort marker. Markers are dropped unread, so before this test such a batch vanished from the
copy: the checkpoint moved past its offsets and the offset map jumped them, with no error (a silent skip, DESIGN
§3.2). Kafka's own consumer checks every batch's CRC before it looks at its control bit (``check.crcs``); Shoal
now checks the CRC of every batch it drops unread, so the copy halts naming the cluster, topic, partition and
offset, and nothing past the batch is committed.

The source is a private broker, so its log segment can be edited in place: the broker serves fetches from the
segment file (through the page cache), so the flipped bit is what a reader gets."""

from __future__ import annotations

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
from tests.faults.disk_edits import edit_stored_batch, first_segment
from tests.kafka_helpers import private_broker

BATCH = 5   # records per produced batch: batches at offsets 0, 5 and 10


@pytest.fixture(scope="module")
def disk_source(session_sandbox, tmp_path_factory):
    session_sandbox.ensure("target")
    with private_broker("flipped-bit-source", tmp_path_factory) as cluster:
        yield cluster


def _flip_bit(cluster, topic: str, base_offset: int, at: int, bit: int) -> None:
    """Set ``bit`` of byte ``at`` of the stored batch at ``base_offset`` in the partition's segment file (its CRC
    left as it was)."""
    edit_stored_batch(cluster, topic, base_offset, at, 1, lambda old: bytes([old[0] | bit]))


def _flip_control_bit(cluster, topic: str, base_offset: int) -> None:
    _flip_bit(cluster, topic, base_offset, 22, 0x20)   # attributes: bytes 21-22 of the batch, big-endian


def _copy_three_batches(disk_source, target_cluster, topic: str, flip) -> tuple:
    """Three batches of an idempotent producer (offsets 0, 5, 10; keys of 11 bytes), ``flip`` applied to the
    segment, then ``shoal copy``'s engine at-least-once over [0, 15) with a commit per batch. Returns (the error it
    raised or None, the checkpoint, the records on the target)."""
    return _copy_batches(disk_source, target_cluster, topic, flip, batches=3)


def _copy_batches(disk_source, target_cluster, topic: str, flip, *, batches: int, fetch_batches: float | None = None
                  ) -> tuple:
    """``batches`` batches of an idempotent producer (offsets 0, 5, 10, ...), ``flip`` applied to the segment, then
    ``shoal copy``'s engine at-least-once over all of them with a commit per batch (``fetch_batches``: fetches of
    that many batches' bytes; default 4 MiB). Returns (the error it raised or None, the checkpoint, the records on
    the target)."""
    target_topic = f"dr.{topic}"
    pipeline = f"p.{topic}"
    disk_source.create_topic(topic)
    target_cluster.create_topic(target_topic)
    for first in range(0, batches * BATCH, BATCH):
        disk_source.produce(topic, [(b"order-%05d" % i, b"v%d" % i) for i in range(first, first + BATCH)],
                            partition=0, **{"linger.ms": 0})
    size = walk_batches(first_segment(disk_source, topic).read_bytes())[0][0].size
    flip()
    options = CopyOptions() if fetch_batches is None else CopyOptions(fetch_max_bytes=int(fetch_batches * size))
    error = None
    with WireClient.for_cluster(disk_source.config) as source, WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode("at-least-once"),
                                    options=options, policy=CommitPolicy(commit_bytes=1))   # a commit per batch
        ranges = [PartitionRange(topic, 0, 0, batches * BATCH, target_topic, 0)]
        writers = [lane_share_writer(session, rng) for session, rng in zip(copier.open_lanes(ranges), ranges,
                                                                               strict=True)]
        try:
            ConcurrentCopy(source, options, writers, ranges).run()
        except CorruptBatchError as exc:
            error = exc
        checkpoint = store.read(pipeline, topic, 0)
    return error, checkpoint, target_cluster.read_all(target_topic, timeout_s=10)


def test_a_batch_whose_control_bit_flipped_on_the_source_halts_the_copy_instead_of_vanishing(
        disk_source, target_cluster, unique_name):
    topic = unique_name("flipped")
    error, checkpoint, landed = _copy_three_batches(disk_source, target_cluster, topic,
                                                    lambda: _flip_control_bit(disk_source, topic, BATCH))
    assert error is not None, f"the copy finished: {len(landed)} records landed, checkpoint {checkpoint}"
    message = str(error)
    assert "'flipped-bit-source'" in message and f"{topic}-0:" in message, message   # cluster, topic-partition
    assert "offset 5" in message and "CRC" in message, message
    # nothing at or past the flipped batch was committed, and the target holds at most what came before it
    assert checkpoint is None or checkpoint.position <= BATCH, checkpoint
    assert [r.key for r in landed] == [b"order-%05d" % i for i in range(len(landed))] and len(landed) <= BATCH


def test_a_batch_moved_past_the_range_end_by_a_flipped_base_offset_halts_the_copy(
        disk_source, target_cluster, unique_name):
    """baseOffset is outside the CRC. Bit 4 of the middle batch's base offset set: it reads as offsets 21..25,
    past the range's end (15), and the copy used to take the answer as "went past the end": the first batch
    copied, the position moved to 15, offsets 5..14 skipped without an error. The last batch now begins below
    the end of the one before it: a corrupt answer, refused."""
    topic = unique_name("moved")
    error, checkpoint, landed = _copy_three_batches(
        disk_source, target_cluster, topic, lambda: _flip_bit(disk_source, topic, BATCH, 7, 0x10))
    assert error is not None, f"the copy finished: {len(landed)} records landed, checkpoint {checkpoint}"
    message = str(error)
    assert "'flipped-bit-source'" in message and f"{topic}-0:" in message and "offset 10" in message, message
    assert checkpoint is None or checkpoint.position <= BATCH, checkpoint
    assert [r.key for r in landed] == [b"order-%05d" % i for i in range(len(landed))] and len(landed) <= BATCH


def test_an_answers_last_batch_moved_up_by_a_flipped_base_offset_halts_at_the_next_answer(
        disk_source, target_cluster, unique_name):
    """The last batch of an answer has no batch after it in that answer to be checked against. Bit 4 of the
    second batch's base offset set: [5, 10) reads as [21, 26), the answer ends there (fetches of two batches), the
    position moves to 26 and offsets 10..20 were skipped without an error. The next answer, from 26, begins with
    the batch holding 26 — [25, 30), below 26 — which no log can hold after a batch ending at 26: the copy halts
    naming it (what was committed before the halt is told to be compared with the source)."""
    topic = unique_name("moved-last")
    error, checkpoint, landed = _copy_batches(disk_source, target_cluster, topic,
                                              lambda: _flip_bit(disk_source, topic, BATCH, 7, 0x10), batches=8,
                                              fetch_batches=2.5)   # two whole batches and a cut-off third
    assert error is not None, f"the copy finished: {len(landed)} records landed, checkpoint {checkpoint}"
    message = str(error)
    assert "'flipped-bit-source'" in message and f"{topic}-0:" in message, message
    assert "offset 25" in message and "below offset 26" in message and "shoal verify" in message, message
    assert checkpoint is None or checkpoint.position <= 26, checkpoint   # nothing past the damaged batch's claim
