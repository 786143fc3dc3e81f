"""Coalescing runs of small uncompressed batches (the ``coalesced`` deep case): records as consumers see them, the
exact offset map, the size bound, which batches join a run, and corrupt input named by its offset."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirror_core.codec import batch_deep
from mirror_core.codec.batch_coalesce import (
    coalesce,
    coalesce_items,
    coalesced_size_bound,
    compressed_body_cap,
    joins_run,
    split_runs,
)
from mirror_core.codec.batch_codec import Codec, PreparedBatch, parse_batch, walk_batches
from mirror_core.codec.batch_prepare import stamp_producer_in_place
from mirror_core.config.coalescing import DEFAULT_COALESCE_BYTES
from mirror_core.errors import CorruptBatchError
from tests.unit.codec.test_batch_codec import CODECS, CONTROL, LAT, _build_any, build, decoded, marker, patch

pytestmark = pytest.mark.unit

_bytes = st.one_of(st.none(), st.binary(max_size=40))
_record = st.tuples(st.integers(0, 10**13), _bytes, _bytes,
                    st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3))


def one_record(offset: int, ts: int, value: bytes = b"v", key: bytes | None = b"k") -> bytes:
    return build([(0, ts, key, value, [])], base_offset=offset)


def run_of(count: int, first: int = 100, ts: int = 1_700_000_000_000) -> list:
    return [parse_batch(one_record(first + i, ts + 3 * i, b"value-%d" % i)) for i in range(count)]


def target_records(prepared, base: int) -> list[tuple]:
    """What a consumer reads from the merged batch written at target offset ``base``."""
    data = bytearray(prepared.data)
    struct.pack_into(">q", data, 0, base)
    return decoded(bytes(data))


def source_records(views) -> list[tuple]:
    return [r for view in views for r in decoded(view.buffer.tobytes())]


def test_a_run_of_one_record_batches_becomes_one_batch_with_the_same_records_and_offsets():
    views = run_of(50)
    prepared = coalesce(views)
    assert (prepared.record_count, prepared.source_first_offset, prepared.source_next_offset) == (50, 100, 150)
    assert prepared.deep and not prepared.records_identical and prepared.source_offsets is None
    assert prepared.offset_runs() == [(100, 0, 50)]
    # written at target offset 100 (a fresh target): every record at its source offset, timestamps as they were
    assert target_records(prepared, 100) == source_records(views)
    merged = parse_batch(prepared.data)
    assert merged.records_count == 50 and not merged.compressed and not merged.log_append_time
    assert len(prepared.data) < sum(v.size for v in views) / 3  # 49 headers gone


def test_the_writer_can_stamp_a_merged_batch_like_any_other():
    prepared = coalesce(run_of(5))
    data = bytearray(prepared.data)
    stamp_producer_in_place(data, producer_id=7, producer_epoch=2, base_sequence=40, transactional=True)
    view = parse_batch(data)
    assert (view.producer_id, view.producer_epoch, view.base_sequence, view.transactional) == (7, 2, 40, True)
    assert [r[3] for r in decoded(bytes(data))] == [b"value-%d" % i for i in range(5)]


def test_log_append_time_batches_keep_what_consumers_saw_unless_told_otherwise():
    appended = [1_800_000_000_000 + i for i in range(3)]
    views = [parse_batch(patch(one_record(10 + i, 1_700_000_000_000 + i), set_bits=LAT, max_timestamp=ts))
             for i, ts in enumerate(appended)]
    assert [r[1] for r in target_records(coalesce(views), 10)] == appended
    created = coalesce(views, log_append_time_to_max=False)
    assert [r[1] for r in target_records(created, 10)] == [1_700_000_000_000 + i for i in range(3)]


def test_timestamps_going_backwards_and_far_apart_survive():
    stamps = [1_700_000_000_000, 1_600_000_000_000, 1_700_000_000_000 + 10**9, 0, 2**62]
    views = [parse_batch(one_record(i, ts)) for i, ts in enumerate(stamps)]
    merged = parse_batch(coalesce(views).data)
    assert [r[1] for r in target_records(coalesce(views), 0)] == stamps
    assert (merged.base_timestamp, merged.max_timestamp) == (stamps[0], max(stamps))


def test_which_batches_join_a_run():
    limit = DEFAULT_COALESCE_BYTES
    small = parse_batch(one_record(5, 1))
    assert joins_run(small, limit)
    assert joins_run(parse_batch(build(codec=Codec.LZ4, base_offset=5)), limit)            # compressed too
    assert not joins_run(parse_batch(marker()), limit)                                      # control
    holes = patch(build(base_offset=5), last_offset_delta=9)
    assert not joins_run(parse_batch(holes), limit)                                         # compaction holes
    assert not joins_run(small, limit, lo=6) and not joins_run(small, limit, hi=5)          # would be trimmed
    assert joins_run(small, limit, lo=5, hi=6)
    big = parse_batch(build([(0, 1, None, b"x" * (limit // 8), [])]))
    assert not joins_run(big, limit)                                                        # not small
    assert CONTROL  # (the marker's bit, for the reader)


def test_runs_end_at_gaps_at_batches_that_do_not_join_at_a_second_codec_and_at_the_limit():
    views = run_of(3, first=0) + run_of(2, first=4)      # offset 3 missing (a marker, aborted data)
    lz4 = parse_batch(build(codec=Codec.LZ4, base_offset=6))                     # 6-11
    plain = parse_batch(one_record(12, 5))        # uncompressed among lz4 ones: librdkafka's choice, joins them
    zstd = parse_batch(build(codec=Codec.ZSTD, base_offset=13))                  # 13-18: a second codec
    big = parse_batch(build([(0, 1, None, b"x" * 9000, [])], base_offset=19))
    alone = parse_batch(one_record(20, 5))
    items = split_runs([*views, lz4, plain, zstd, big, alone], DEFAULT_COALESCE_BYTES)
    assert [len(i) if isinstance(i, list) else "view" for i in items] == [3, 4, "view", "view", "view"]
    assert items[2] is zstd and items[3] is big and items[4] is alone  # a run of one is copied as it is
    merged = coalesce(items[1])
    assert parse_batch(merged.data).codec is Codec.LZ4 and merged.coalesced == 4
    assert target_records(merged, 4) == source_records(items[1])
    many = run_of(400, first=0)
    limit = 8 * 1024
    runs = split_runs(many, limit)
    assert sum(len(r) for r in runs) == 400 and all(isinstance(r, list) for r in runs)
    for run in runs:
        bound = 61 + sum(coalesced_size_bound(v) for v in run)
        assert bound <= limit and len(coalesce(run).data) <= bound


def test_a_corrupt_batch_in_a_run_is_named_by_its_offset():
    views = run_of(4)
    raw = bytearray(views[2].buffer.tobytes())
    raw[-1] ^= 0xFF
    views[2] = parse_batch(bytes(raw))
    with pytest.raises(CorruptBatchError) as err:
        coalesce(views)
    assert err.value.base_offset == 102 and "CRC" in str(err.value)
    # a record whose length runs past its batch (CRC resealed: the producer wrote it so)
    bad = bytearray(one_record(103, 1))
    bad[61] = 0x7E   # length 63 in a record of far fewer bytes
    with pytest.raises(CorruptBatchError) as err:
        coalesce([*run_of(3), parse_batch(patch(bytes(bad)))])
    assert err.value.base_offset == 103


def test_a_list_that_is_not_a_run_is_a_caller_error():
    with pytest.raises(ValueError, match="does not continue a run"):
        coalesce([*run_of(2, first=0), *run_of(2, first=5)])
    with pytest.raises(ValueError):
        coalesce([])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(_record, min_size=1, max_size=4), min_size=1, max_size=12),
       base=st.integers(0, 2**40), lat=st.lists(st.booleans(), min_size=12, max_size=12),
       preserve=st.booleans())
def test_property_merged_batch_reads_back_as_the_run_with_an_exact_offset_map(batches, base, lat, preserve):
    raw, expected, offset = [], [], base
    for i, records in enumerate(batches):
        batch = _build_any(list(enumerate(records)), Codec.NONE, offset)
        created = decoded(batch)   # the producers' create times
        if lat[i]:
            batch = patch(batch, set_bits=LAT, max_timestamp=10**12 + i)
        # as the copy treats LogAppendTime: the broker's time preserved, else the create times
        expected += decoded(batch) if lat[i] and preserve else created
        raw.append(batch)
        offset += len(records)
    views, _ = walk_batches(b"".join(raw))
    prepared = coalesce(views, log_append_time_to_max=preserve)
    assert target_records(prepared, base) == expected
    assert prepared.offset_runs() == [(base, 0, offset - base)]
    assert len(prepared.data) <= 61 + sum(coalesced_size_bound(v) for v in views)
    assert batch_deep.logical_digest(views, log_append_time_to_max=preserve) == \
        batch_deep.logical_digest([parse_batch(prepared.data)])


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Codec.NONE], ids=lambda c: c.name.lower())
def test_a_compressed_run_is_merged_with_its_own_codec_and_cut_by_its_decompressed_size(codec):
    """One-record lz4/zstd/... batches: merged with the same codec, records as they were; a run whose records
    decompress past the cap is cut into several merged batches, each within the limit (data that does not compress
    included)."""
    import os

    limit = 16 * 1024
    raw, offset = [], 1000
    for i in range(120):   # half of them mostly random: the merged body compresses little
        raw.append(build([(0, 1_700_000_000_000 + i, b"k%d" % i, os.urandom(200) + b"filler " * 30, [])],
                         codec=codec, base_offset=offset) if i % 2 else
                   build([(0, 1_700_000_000_000 + i, b"k%d" % i, b"compressible " * 20, [("h", b"v")])],
                         codec=codec, base_offset=offset))
        offset += 1
    views, _ = walk_batches(b"".join(raw))
    items = list(coalesce_items(views, limit))
    merged = [i for i in items if isinstance(i, PreparedBatch)]
    assert len(merged) >= 2 and all(isinstance(i, PreparedBatch) for i in items)
    assert sum(m.coalesced for m in merged) == 120
    assert all(len(m.data) <= limit and m.deep for m in merged)
    got = []
    for m in merged:
        view = parse_batch(m.data)
        assert view.codec is codec
        got += target_records(m, m.source_first_offset)
    assert got == source_records(views)
    assert compressed_body_cap(limit) * 7 // 6 + 61 + 256 <= limit


def test_coalesce_items_leaves_lone_batches_as_views_and_merges_runs():
    views = run_of(4, first=0) + [parse_batch(marker(base_offset=4))] + run_of(1, first=5) + run_of(3, first=6)
    items = list(coalesce_items(views, DEFAULT_COALESCE_BYTES))
    shapes = [i.coalesced if isinstance(i, PreparedBatch) else "view" for i in items]
    assert shapes == [4, "view", 4]   # the marker alone; offsets 5-8 are contiguous: one run of four


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(_record, min_size=1, max_size=3), min_size=1, max_size=14),
       codec=st.sampled_from(CODECS), base=st.integers(0, 2**40), limit=st.sampled_from([1024, 4096, 65536]),
       preserve=st.booleans())
def test_property_coalesce_items_keeps_every_record_and_the_limit_whatever_the_codec(batches, codec, base, limit,
                                                                                      preserve):
    raw, expected, offset = [], {}, base
    for records in batches:   # the builder may fall back to no codec for a batch: runs then break there
        batch = _build_any(list(enumerate(records)), codec, offset)
        for row in decoded(batch):
            expected[row[0]] = row
        raw.append(batch)
        offset += len(records)
    views, _ = walk_batches(b"".join(raw))
    items = list(coalesce_items(views, limit, log_append_time_to_max=preserve))
    spans = []
    for item in items:
        if isinstance(item, PreparedBatch):
            assert item.coalesced >= 2 and len(item.data) <= limit
            rows = target_records(item, item.source_first_offset)
            assert rows == [expected[row[0]] for row in rows]
            spans.append((item.source_first_offset, item.source_next_offset))
        else:
            spans.append((item.base_offset, item.next_offset))
    assert spans[0][0] == base and spans[-1][1] == offset
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans


# -- review findings (each test failed before its fix) ----------------------------------------------------------------

_LONG_MAX = (1 << 63) - 1


def _int64(value: int) -> int:
    return ((value + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


def _java_timestamps(data: bytes) -> list[int]:
    """Record timestamps as the Java consumer computes them: baseTimestamp + delta in 64-bit arithmetic."""
    from kafka.record.util import decode_varint

    view = parse_batch(data)
    section, pos, out = bytes(view.records_section), 0, []
    for _ in range(view.records_count):
        length, pos = decode_varint(section, pos)
        delta, _ = decode_varint(section, pos + 1)
        out.append(view.max_timestamp if view.log_append_time else _int64(view.base_timestamp + delta))
        pos += length
    return out


def _raw_one_record(offset: int, timestamp: int, *, base_timestamp: int | None = None) -> bytes:
    """A one-record batch with any 64-bit timestamp (kafka-python's builder refuses some), delta wrapped as Java."""
    from crc32c import crc32c

    from mirror_core.codec.batch_coalesce import _zigzag

    base = timestamp if base_timestamp is None else base_timestamp
    record = b"\x00" + _zigzag(_int64(timestamp - base)) + _zigzag(0) + _zigzag(1) + b"k" + _zigzag(1) + b"v" + \
        _zigzag(0)
    body = _zigzag(len(record)) + record
    out = bytearray(61) + body
    struct.pack_into(">qiibIhiqqqhii", out, 0, offset, len(out) - 12, 0, 2, 0, 0, 0, base,
                     max(base, timestamp), -1, -1, -1, 1)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def test_timestamps_at_the_ends_of_the_64_bit_range_survive_as_java_reads_them():
    """Review finding: deltas were computed in Python's unbounded integers, so -1 (an up-converted v0 record) next to
    Long.MAX_VALUE was written as a delta Java reads back as -2."""
    stamps = [-1, _LONG_MAX, 5, -(1 << 63)]
    views = [parse_batch(_raw_one_record(i, ts)) for i, ts in enumerate(stamps)]
    assert [_java_timestamps(v.buffer.tobytes())[0] for v in views] == stamps
    assert _java_timestamps(bytes(coalesce(views).data)) == stamps
    # a source batch whose own delta wraps (base -1, record Long.MAX_VALUE as Java computes it)
    wrapped = parse_batch(_raw_one_record(0, _LONG_MAX, base_timestamp=-1))
    assert _java_timestamps(bytes(coalesce([wrapped, parse_batch(_raw_one_record(1, 7))]).data)) == [_LONG_MAX, 7]


def test_a_compressed_batch_that_decompresses_large_is_left_alone_not_merged():
    """Review finding: a small compressed batch of very compressible data (40 KB of records in ~250 bytes) joined
    its neighbours' group and was decompressed and compressed again; now, once its size is known, it ends the group
    and is copied as it is, while the small ones around it are merged."""
    def one(offset: int, value: bytes) -> bytes:
        return build([(0, 1_700_000_000_000, b"k", value, [])], codec=Codec.LZ4, base_offset=offset)

    small = b"small value, compressible " * 8
    views, _ = walk_batches(b"".join([one(0, small), one(1, small), one(2, b"a" * 40_000), one(3, small),
                                      one(4, small)]))
    assert all(joins_run(v, DEFAULT_COALESCE_BYTES) for v in views)
    items = list(coalesce_items(views, DEFAULT_COALESCE_BYTES))
    assert [i.coalesced if isinstance(i, PreparedBatch) else i.base_offset for i in items] == [2, 2, 2]


def test_coalesce_sizes_outside_the_allowed_range_are_refused():
    from mirror_core.config.coalescing import checked_coalesce_bytes
    from mirror_core.errors import ConfigError

    assert checked_coalesce_bytes(0) == 0 and checked_coalesce_bytes(1 << 20) == 1 << 20
    for bad in (100, (1 << 20) + 1, 32 << 20, -5, True):
        with pytest.raises(ConfigError, match="must be 0 .off. or between 1024 and 1048576 bytes"):
            checked_coalesce_bytes(bad)


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Codec.NONE], ids=lambda c: c.name.lower())
def test_a_tiny_batch_of_a_huge_record_is_never_decompressed_whole(codec):
    """Second review: a 2 KB zstd batch of one 64 MiB record of zeros passed as small and was decompressed whole
    (128 MiB traced) before being found not small; decompression now stops at what a small batch may hold."""
    import tracemalloc

    from mirror_core.codec.batch_deep import decompress, decompress_at_most

    huge = parse_batch(build([(0, 1, b"k", b"\0" * (16 << 20), [])], codec=codec))
    small = parse_batch(build(codec=codec, base_offset=1))
    assert huge.size < 1 << 20
    tracemalloc.start()
    try:
        assert decompress_at_most(huge, 8192) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{peak} bytes held to learn the batch is not small"
    assert bytes(decompress_at_most(small, 8192)) == bytes(decompress(small))
    assert decompress_at_most(small, len(decompress(small)) - 1) is None
    items = list(coalesce_items([*run_of(3, first=-3), huge], DEFAULT_COALESCE_BYTES))
    assert items[-1] is huge and sum(i.coalesced for i in items if isinstance(i, PreparedBatch)) == 3
