"""The copier re-stamps batches in the fetched answer instead of copying them (issue 14, CPU per GB), without
holding more than before: after a flush inside an answer, that answer's remaining batches are copied, so an answer
stays alive only while all of its batches wait to be written (DESIGN §3.8; what may_prefetch counts)."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from mirror_core.batch_codec import parse_batch, prepare_for_target, records_digest, walk_batches
from mirror_core.copier import CopyOptions, FetchedOnce, PartitionRange, RangeCopier
from mirror_core.fetcher import FetchResult

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class _Cluster:
    cluster_name = "unit"


class _RecordingWriter:
    """Acknowledges every batch at the next target offset and records what it was handed, as it was handed."""

    def __init__(self):
        self.written: list[tuple[bytes, object]] = []  # (bytes at write time, the buffer object)
        self.next = 0

    def write(self, outgoing):
        bases = []
        for batch in outgoing:
            self.written.append((bytes(batch.data), batch.data))
            bases.append(self.next)
            self.next += parse_batch(batch.data).records_count
        return bases


def _frame(batches: int, records: int = 20) -> bytearray:
    out, offset = bytearray(), 100
    for _ in range(batches):
        builder = DefaultRecordBatchBuilder(2, 0, False, 7, 1, offset, 1 << 30)
        for d in range(records):
            builder.append(d, 1_700_000_000_000 + d, b"k%d" % (offset + d), b"v" * 200, [])
        batch = builder.build()
        struct.pack_into(">q", batch, 0, offset)
        out += batch
        offset += records
    return out


def test_batches_are_written_from_the_answer_itself_until_a_flush_inside_it():
    frame = _frame(10)
    pristine = bytes(frame)
    views, _ = walk_batches(frame)
    size = views[0].size
    result = FetchResult(views, views[-1].next_offset, views[-1].next_offset, views[-1].next_offset, 0)
    writer = _RecordingWriter()
    # a write window of 3.5 batches: the first flush comes after the 4th batch, inside the answer
    copier = RangeCopier(_Cluster(), _Cluster(), writer, CopyOptions(max_inflight_bytes=size * 7 // 2))
    rng = PartitionRange("src", 0, 100, views[-1].next_offset, "dst", 0)
    copied = copier.copy(rng, fetcher=FetchedOnce(result, 100))

    expected = [bytes(prepare_for_target(view).data) for view in walk_batches(pristine)[0]]
    assert [data for data, _ in writer.written] == expected  # the same bytes as the copying path
    for data, _ in writer.written:
        assert DefaultRecordBatch(data).validate_crc()
    buffers = [buffer for _, buffer in writer.written]
    assert all(isinstance(b, memoryview) and b.obj is frame for b in buffers[:4])  # no copy before the flush
    assert all(isinstance(b, bytearray) for b in buffers[4:])  # copied after it: the answer is not kept alive
    assert copied.records == 200 and copied.source_end == views[-1].next_offset
    assert copied.records_digest == records_digest(walk_batches(pristine)[0])


def test_an_answer_without_a_flush_inside_is_written_without_copies():
    frame = _frame(6)
    views, _ = walk_batches(frame)
    result = FetchResult(views, views[-1].next_offset, views[-1].next_offset, views[-1].next_offset, 0)
    writer = _RecordingWriter()
    copier = RangeCopier(_Cluster(), _Cluster(), writer, CopyOptions(max_inflight_bytes=1 << 20))
    copier.copy(PartitionRange("src", 0, 100, views[-1].next_offset, "dst", 0), fetcher=FetchedOnce(result, 100))
    assert len(writer.written) == 6
    assert all(isinstance(b, memoryview) and b.obj is frame for _, b in writer.written)
