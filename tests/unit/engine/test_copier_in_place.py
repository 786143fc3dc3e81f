"""The copier re-stamps batches in the fetched answer instead of copying them (issue 14, CPU per GB), without
holding more than before: after a flush inside an answer, that answer's remaining batches are copied, so an answer
stays alive only while all of its batches wait to be written (DESIGN §3.8; what may_prefetch counts)."""

from __future__ import annotations

import struct
import tracemalloc
from types import SimpleNamespace

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from mirror_core.codec.batch_codec import parse_batch, walk_batches
from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.codec.records_digest import records_digest
from mirror_core.engine.copier import CopyOptions, FetchedOnce, RangeCopier
from mirror_core.kafka.fetcher import FetchResult, RawBatchFetcher
from mirror_core.model.ranges import PartitionRange

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


@pytest.mark.parametrize("coalesce_bytes", [0, 64 * 1024], ids=["shallow", "coalescing"])
def test_a_kept_batch_whose_bytes_changed_halts_the_copy_naming_where_it_is(coalesce_bytes):
    """A copy's fetcher leaves the CRC to the preparation (``check_crcs=False``): its refusal names the cluster,
    topic, partition and offset as the fetcher's would (DESIGN §3.2), and nothing at or past the batch is written."""
    from mirror_core.errors import CorruptBatchError

    frame = _frame(10, records=1)
    views, _ = walk_batches(frame)
    frame[views[4].size * 4 + views[4].size - 1] ^= 0x01   # the 5th batch's last byte (offset 104), CRC left as it was
    views, _ = walk_batches(frame)
    result = FetchResult(views, views[-1].next_offset, views[-1].next_offset, views[-1].next_offset, 0)
    writer = _RecordingWriter()
    copier = RangeCopier(_Cluster(), _Cluster(), writer, CopyOptions(coalesce_bytes=coalesce_bytes))
    with pytest.raises(CorruptBatchError) as raised:
        copier.copy(PartitionRange("src", 0, 100, views[-1].next_offset, "dst", 0), fetcher=FetchedOnce(result, 100))
    assert "offset 104 in cluster 'unit' src-0:" in str(raised.value) and "CRC" in str(raised.value)
    assert len(writer.written) <= 4   # at most the batches before it


# ---- memory: what pending in-place batches keep alive is counted (DESIGN §3.8; review of issue 14) ----------------

ABORTING_PRODUCER = 42


def _one_record_batch(offset: int, value_size: int, *, aborted: bool = False) -> bytearray:
    producer = ABORTING_PRODUCER if aborted else -1
    builder = DefaultRecordBatchBuilder(2, 0, aborted, producer, 0 if aborted else -1, offset if aborted else -1,
                                        1 << 30)
    builder.append(0, 1_700_000_000_000, None, b"x" * value_size, [])
    batch = builder.build()
    struct.pack_into(">q", batch, 0, offset)
    return batch


class _FramedFetcher(RawBatchFetcher):
    """The real fetcher's answer handling (READ_COMMITTED filtering, position, ``frame_bytes``) over answers built
    here, each a fresh writable frame as the fast path gives them: ``aborted`` batches of one aborted transaction
    of ``big`` bytes each, then ``kept`` committed batches of ``small`` bytes each, then a cut-off batch head of
    ``tail`` bytes."""

    def __init__(self, answers: int, *, aborted: int, big: int, kept: int, small: int, tail: int = 0):
        self.per_answer = aborted + kept
        super().__init__(_Cluster(), "src", 0, 0, answers * self.per_answer)
        self.shape = (aborted, big, kept, small, tail)

    def _fetch_once(self, resent: bool = False):
        aborted, big, kept, small, tail = self.shape
        frame, first = bytearray(), self.position
        for i in range(aborted):
            frame += _one_record_batch(first + i, big, aborted=True)
        for i in range(aborted, aborted + kept):
            frame += _one_record_batch(first + i, small)
        frame += _one_record_batch(first + self.per_answer, big)[:tail]
        end = first + self.per_answer
        txns = [SimpleNamespace(producer_id=ABORTING_PRODUCER, first_offset=first)] if aborted else []
        return self.handle(SimpleNamespace(
            error_code=0, records=memoryview(frame), aborted_transactions=txns, high_watermark=end,
            last_stable_offset=end, log_start_offset=0, diverging_epoch=None))


class _CountingWriter:
    """Acknowledges densely; keeps only what the assertions need (so it holds no memory of its own)."""

    def __init__(self):
        self.next, self.batches, self.in_place = 0, 0, 0

    def write(self, outgoing):
        bases = []
        for batch in outgoing:
            assert DefaultRecordBatch(bytes(batch.data)).validate_crc()
            self.batches += 1
            self.in_place += isinstance(batch.data, memoryview)
            bases.append(self.next)
            self.next += parse_batch(batch.data).records_count
        return bases


def _peak_copy(fetcher: _FramedFetcher, opts: CopyOptions):
    writer = _CountingWriter()
    copier = RangeCopier(_Cluster(), _Cluster(), writer, opts)
    tracemalloc.start()
    try:
        result = copier.copy(PartitionRange("src", 0, 0, fetcher.end, "dst", 0), fetcher=fetcher)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, writer, peak


def test_answers_mostly_dropped_do_not_pile_up_behind_pending_batches():
    """The reviewer's case: each ~1 MiB answer is an aborted transaction plus one ~100-byte committed batch. Before
    the fix every answer stayed alive behind its one pending in-place batch (only 100 bytes counted): peak ~42 MiB
    against a 10 MiB budget."""
    opts = CopyOptions(fetch_max_bytes=1 << 20, max_inflight_bytes=8 << 20, overlap=False)  # no broker to prefetch from
    fetcher = _FramedFetcher(40, aborted=9, big=110_000, kept=1, small=100)
    result, writer, peak = _peak_copy(fetcher, opts)
    assert result.records == 40 and writer.batches == 40 and result.source_end == fetcher.end
    assert peak <= opts.budget_bytes, f"peak {peak / 2**20:.1f} MiB > budget {opts.budget_bytes / 2**20:.1f} MiB"


def test_answers_half_kept_are_written_in_place_and_counted_whole():
    """Answers half kept (5 committed batches, then aborted data and a cut-off tail): still re-stamped in place
    (the CPU win), but each counts whole while pending, so the held answers stay within the write window. Before
    the fix only the kept half was counted: twice the window's answers were held (peak above the budget)."""
    opts = CopyOptions(fetch_max_bytes=1 << 20, max_inflight_bytes=4 << 20, overlap=False)
    fetcher = _FramedFetcher(24, aborted=4, big=100_000, kept=5, small=100_000, tail=100_000)
    result, writer, peak = _peak_copy(fetcher, opts)
    assert result.records == 24 * 5 and result.source_end == fetcher.end
    assert writer.in_place >= writer.batches // 2, "half-kept answers should still be written without copies"
    assert peak <= opts.budget_bytes, f"peak {peak / 2**20:.1f} MiB > budget {opts.budget_bytes / 2**20:.1f} MiB"


class _StreamingWriter(_RecordingWriter):
    """:class:`_RecordingWriter` that also takes a write batch by batch (``BatchWriter.stream``'s shape)."""

    def stream(self):
        writer = self

        class _Stream:
            def __init__(self):
                self.given = []

            def __len__(self):
                return len(self.given)

            def add(self, batch):
                self.given.append(batch)

            def finish(self):
                return writer.write(self.given)

            def settle(self):
                return None

            def drop(self):
                pass

        return _Stream()


@pytest.mark.parametrize("window_batches", [1, 3.5, 100])
def test_a_streamed_copy_digests_what_it_wrote_as_a_listed_write_does(window_batches):
    """The digest of a streamed write is taken as each batch is given (not at the flush): the same digest, over
    the same records in the same order, whatever the flushes."""
    digests = []
    for writer in (_RecordingWriter(), _StreamingWriter()):
        frame = _frame(10)
        pristine = bytes(frame)
        views, _ = walk_batches(frame)
        result = FetchResult(views, views[-1].next_offset, views[-1].next_offset, views[-1].next_offset, 0)
        copier = RangeCopier(_Cluster(), _Cluster(), writer,
                             CopyOptions(max_inflight_bytes=int(views[0].size * window_batches)))
        copied = copier.copy(PartitionRange("src", 0, 100, views[-1].next_offset, "dst", 0),
                             fetcher=FetchedOnce(result, 100))
        assert copied.records == 200 and len(writer.written) == 10
        digests.append(copied.records_digest)
    assert digests[0] == digests[1] == records_digest(walk_batches(pristine)[0])
