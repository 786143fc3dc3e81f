"""Batch codec: walking, CRC, shallow header rewrite, the deep cases and the per-batch policy.

Batches are built with kafka-python's own builders and checked with its own reader (``DefaultRecordBatch``),
so the codec is tested against an independent implementation of the wire format, for every compression codec.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kcodec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from mirror_core.codec import batch_deep
from mirror_core.codec.batch_codec import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchKind,
    BatchView,
    Codec,
    control_type,
    iter_batches,
    parse_batch,
    verify_crc,
    walk_batches,
)
from mirror_core.codec.batch_prepare import (
    prepare_for_target,
    rewrite_header,
    rewrite_header_in_place,
    rewrite_header_into,
    stamp_producer_in_place,
    stamp_whole_batch,
    usual_shallow,
)
from mirror_core.codec.records_digest import RecordsDigest, records_digest
from mirror_core.errors import CorruptBatchError

pytestmark = pytest.mark.unit

CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
# Every codec library is a pinned requirement: a missing one is a failure here, never a skip.
assert kcodec.has_gzip() and kcodec.has_snappy() and kcodec.has_lz4() and kcodec.has_zstd()
codecs = pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in CODECS])
COMPRESSED = [c for c in CODECS if c is not Codec.NONE]
HEADER = struct.Struct(">qiibIhiqqqhii")
LAT, TXN, CONTROL, HORIZON = 0x08, 0x10, 0x20, 0x40

# a record: (offset delta, timestamp, key, value, headers)
RECORDS = [(d, 1_700_000_000_000 + 7 * d, b"key-%d" % d if d % 3 else None, b"value-%d-" % d * 20,
            [("trace", b"t%d" % d), ("none", None)] if d % 2 else []) for d in range(6)]


def build(records=RECORDS, codec=Codec.NONE, *, base_offset=0, transactional=False, producer=(-1, -1, -1)):
    """A v2 batch from kafka-python's builder, moved to ``base_offset`` (outside the CRC)."""
    pid, epoch, seq = producer if not transactional or producer[0] >= 0 else (42, 3, 0)
    builder = DefaultRecordBatchBuilder(2, int(codec), transactional, pid, epoch, seq, 1 << 30)
    for delta, ts, key, value, headers in records:
        assert builder.append(delta, ts, key, value, headers) is not None
    out = builder.build()
    assert out[22] & 0x07 == codec, "test data must compress, or the builder falls back to no codec"
    struct.pack_into(">q", out, 0, base_offset)
    return bytes(out)


def patch(batch: bytes, **fields) -> bytes:
    """Set header fields (and attribute bits via ``set_bits``/``clear_bits``) and reseal the CRC."""
    names = ["base_offset", "batch_length", "leader_epoch", "magic", "crc", "attributes", "last_offset_delta",
             "base_timestamp", "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "count"]
    header = dict(zip(names, HEADER.unpack_from(batch), strict=True))
    header["attributes"] = (header["attributes"] | fields.pop("set_bits", 0)) & ~fields.pop("clear_bits", 0)
    header.update(fields)
    out = bytearray(batch)
    HEADER.pack_into(out, 0, *header.values())
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def decoded(batch: bytes) -> list[tuple]:
    """(offset, timestamp, key, value, headers) as kafka-python's consumer-side reader sees them."""
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in reader]


def dense(rows: list[tuple], base: int = 0) -> list[tuple]:
    """``rows`` renumbered densely from ``base``: what the target holds after a re-encode."""
    return [(base + i, *row[1:]) for i, row in enumerate(rows)]


def legacy(magic: int, codec: Codec, records, base_offset: int) -> bytes:
    builder = LegacyRecordBatchBuilder(magic, int(codec), 1 << 30)
    for delta, ts, key, value, _ in records:
        inner = delta if (codec and magic == 1) else base_offset + delta
        builder.append(inner, ts, key, value)
    out = builder.build()
    if codec:  # a compressed wrapper carries the last inner offset (outside the legacy CRC)
        struct.pack_into(">q", out, 0, base_offset + records[-1][0])
    return bytes(out)


# --- walking ---------------------------------------------------------------------------------------------


@codecs
def test_walk_finds_concatenated_batches_without_copying_and_reports_truncated_tail(codec):
    batches = [build(codec=codec, base_offset=base) for base in (100, 106, 112)]
    buf = bytearray(b"".join(batches))
    views, tail = walk_batches(memoryview(buf)[:-7])
    assert [v.base_offset for v in views] == [100, 106]
    assert tail == len(batches[2]) - 7
    assert all(v.buffer.obj is buf for v in views)  # slices of the fetched buffer, not copies
    whole, tail = walk_batches(buf)
    assert tail == 0 and [v.next_offset for v in whole] == [106, 112, 118]
    assert [v.base_offset for v in iter_batches(buf[:-7])] == [100, 106]
    assert bytes(whole[1].buffer) == batches[1]


@pytest.mark.parametrize("cut", [1, 12, 16, 17, 60])
def test_walk_reports_a_tail_cut_inside_the_header(cut):
    batch = build()
    views, tail = walk_batches(batch + batch[:cut])
    assert len(views) == 1 and tail == cut


def test_walk_rejects_impossible_length_and_magic():
    bad_length = bytearray(build(base_offset=9))
    struct.pack_into(">i", bad_length, 8, 10)
    with pytest.raises(CorruptBatchError, match="offset 9"):
        walk_batches(bad_length)
    bad_magic = bytearray(build(base_offset=9))
    bad_magic[16] = 7
    with pytest.raises(CorruptBatchError, match="magic 7"):
        walk_batches(bad_magic)


@codecs
def test_header_fields_match_kafka_python(codec):
    batch = build(codec=codec, base_offset=5000, transactional=True)
    view = parse_batch(batch)
    ref = DefaultRecordBatch(batch)
    assert (view.base_offset, view.magic, view.crc, view.last_offset_delta, view.base_timestamp,
            view.max_timestamp, view.producer_id, view.producer_epoch, view.base_sequence,
            view.records_count) == (
        ref.base_offset, ref.magic, ref.crc, ref.last_offset_delta, ref.first_timestamp, ref.max_timestamp,
        ref.producer_id, ref.producer_epoch, ref.base_sequence, ref.records_count)
    assert view.size == len(batch) == ref.size_in_bytes
    assert view.next_offset == ref.next_offset == 5006
    assert view.codec is codec and view.compressed == (codec is not Codec.NONE)
    assert view.transactional and not view.control and not view.log_append_time
    assert bytes(view.records_section) == batch[61:]
    assert view.classify() is BatchKind.DATA and not view.has_offset_holes


# --- CRC ---------------------------------------------------------------------------------------------------


@codecs
def test_any_flipped_byte_under_the_crc_raises_naming_the_offset(codec):
    batch = build(RECORDS[:2], codec, base_offset=777)
    verify_crc(parse_batch(batch))
    for pos in range(21, len(batch)):
        flipped = bytearray(batch)
        flipped[pos] ^= 0x01
        with pytest.raises(CorruptBatchError, match="offset 777") as err:
            verify_crc(parse_batch(flipped))
        assert err.value.base_offset == 777


def test_crc_field_itself_and_batches_through_the_policy():
    batch = bytearray(build(base_offset=3))
    batch[20] ^= 0xFF
    with pytest.raises(CorruptBatchError):
        prepare_for_target(parse_batch(batch))
    assert prepare_for_target(parse_batch(batch), check_crc=False) is not None


def test_legacy_crc_is_checked():
    entry = bytearray(legacy(1, Codec.NONE, RECORDS[:1], 40))
    verify_crc(parse_batch(entry))
    entry[-1] ^= 0x01
    with pytest.raises(CorruptBatchError, match="offset 40"):
        verify_crc(parse_batch(entry))


# --- shallow rewrite ---------------------------------------------------------------------------------------


@codecs
@pytest.mark.parametrize("transactional", [False, True])
def test_shallow_rewrite_keeps_records_byte_identical_and_passes_kafka_crc(codec, transactional):
    source = build(codec=codec, base_offset=1234, transactional=True)
    view = parse_batch(source)
    producer = dict(producer_id=9001, producer_epoch=4, base_sequence=17) if transactional else {}
    out = rewrite_header(view, transactional=transactional, **producer)
    ref = DefaultRecordBatch(bytes(out))
    assert ref.validate_crc()
    assert ref.base_offset == 0 and ref.leader_epoch == -1 and ref.is_transactional == transactional
    expected_producer = (9001, 4, 17) if transactional else (-1, -1, -1)
    assert (ref.producer_id, ref.producer_epoch, ref.base_sequence) == expected_producer
    assert bytes(out[61:]) == source[61:]
    assert decoded(bytes(out)) == dense(decoded(source))
    target = parse_batch(out)
    assert records_digest([view]) == records_digest([target])


def test_rewrite_header_into_writes_at_an_offset_of_a_shared_buffer():
    views, _ = walk_batches(build(base_offset=10) + build(base_offset=16))
    out = bytearray(sum(v.size for v in views) + 3)
    pos = 3
    for v in views:
        pos = rewrite_header_into(v, out, pos, base_offset=0)
    assert pos == len(out)
    written, tail = walk_batches(out[3:])
    assert tail == 0
    assert [bytes(w.records_section) for w in written] == [bytes(v.records_section) for v in views]
    assert all(DefaultRecordBatch(bytes(w.buffer)).validate_crc() for w in written)


def test_rewrite_header_into_appends_to_a_growing_buffer():
    views, _ = walk_batches(build(base_offset=10) + build(base_offset=16))
    out = bytearray(b"xyz")
    for v in views:
        assert rewrite_header_into(v, out, len(out)) == len(out)
    written, tail = walk_batches(memoryview(out)[3:])
    assert tail == 0 and [w.records_count for w in written] == [6, 6]
    with pytest.raises(ValueError, match="past the end"):
        rewrite_header_into(views[0], bytearray(), 5)


def test_rewrite_refuses_transactional_without_producer_id():
    with pytest.raises(ValueError, match="producer id"):
        rewrite_header(parse_batch(build()), transactional=True)


# --- producer stamping ------------------------------------------------------------------------------------


@codecs
@pytest.mark.parametrize("was_txn, txn", [(False, False), (False, True), (True, False), (True, True)])
def test_stamp_in_place_sets_producer_fields_and_keeps_everything_else(codec, was_txn, txn):
    source = patch(build(codec=codec, base_offset=77, transactional=was_txn), set_bits=LAT | HORIZON,
                   leader_epoch=5)
    buf = bytearray(source)
    stamp_producer_in_place(buf, producer_id=9001, producer_epoch=4, base_sequence=17, transactional=txn)
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.validate_crc()
    assert (ref.producer_id, ref.producer_epoch, ref.base_sequence, ref.is_transactional) == (9001, 4, 17, txn)
    before, after = parse_batch(source), parse_batch(buf)
    assert after.attributes & ~TXN == before.attributes & ~TXN  # codec, LogAppendTime, delete horizon kept
    unchanged = ("base_offset", "batch_length", "partition_leader_epoch", "magic", "last_offset_delta",
                 "base_timestamp", "max_timestamp", "records_count")
    assert [getattr(after, f) for f in unchanged] == [getattr(before, f) for f in unchanged]
    assert bytes(after.records_section) == bytes(before.records_section)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(codec=st.sampled_from(CODECS), was_txn=st.booleans(), txn=st.booleans(), bits=st.sampled_from([0, LAT, HORIZON]),
       producer_id=st.integers(0, 2**63 - 1), epoch=st.integers(0, 2**15 - 1), sequence=st.integers(0, 2**31 - 1),
       in_view=st.booleans())
def test_stamp_whole_batch_gives_the_bytes_of_stamp_in_place(codec, was_txn, txn, bits, producer_id, epoch, sequence,
                                                              in_view):
    """The writer's stamp of a whole batch (no search for the batch) writes exactly what the general stamp writes,
    into a bytearray or a writable view into a larger buffer (a batch re-stamped in its Fetch frame)."""
    source = patch(build(codec=codec, base_offset=77, transactional=was_txn), set_bits=bits, leader_epoch=5)
    expected = bytearray(source)
    stamp_producer_in_place(expected, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                            transactional=txn)
    frame = bytearray(b"\xee" * 9 + source + b"\xee" * 5)
    buf = memoryview(frame)[9:9 + len(source)] if in_view else bytearray(source)
    stamp_whole_batch(buf, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, transactional=txn)
    assert bytes(buf) == bytes(expected)
    assert bytes(frame[:9]) == b"\xee" * 9 and bytes(frame[-5:]) == b"\xee" * 5   # nothing outside the batch


@pytest.mark.parametrize("buf", [
    pytest.param(lambda: build() + build(base_offset=6), id="two batches"),
    pytest.param(lambda: build()[:-1], id="cut short"),
    pytest.param(lambda: bytes(40), id="shorter than a header"),
    pytest.param(lambda: patch(build(), magic=1), id="magic 1"),
])
def test_stamp_whole_batch_refuses_a_buffer_that_is_not_exactly_one_v2_batch(buf):
    """A caller that skipped the writer's check gets a clear error, not a batch sealed whole and refused by the
    broker as corrupt."""
    data = bytearray(buf())
    before = bytes(data)
    with pytest.raises(ValueError, match="not exactly one magic-2 batch"):
        stamp_whole_batch(data, producer_id=5, producer_epoch=0, base_sequence=0, transactional=False)
    assert bytes(data) == before


def test_stamp_whole_batch_refuses_a_transactional_batch_without_a_producer_id():
    with pytest.raises(ValueError, match="producer id"):
        stamp_whole_batch(bytearray(build()), producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=True)


@codecs
def test_prepared_then_stamped_batch_reads_back_the_source_records(codec):
    source = build(codec=codec, base_offset=1234)
    prepared = prepare_for_target(parse_batch(source))
    stamp_producer_in_place(prepared.data, producer_id=7, producer_epoch=0, base_sequence=2**31 - 1,
                            transactional=True)
    ref = DefaultRecordBatch(bytes(prepared.data))
    assert ref.validate_crc() and ref.base_offset == 0 and ref.leader_epoch == -1
    assert (ref.producer_id, ref.base_sequence, ref.is_transactional) == (7, 2**31 - 1, True)
    assert decoded(bytes(prepared.data)) == dense(decoded(source))


def test_stamp_in_place_touches_only_the_batch_at_its_position():
    first, second = build(base_offset=10), build(base_offset=16)
    buf = bytearray(first + second)
    stamp_producer_in_place(buf, len(first), producer_id=3, producer_epoch=1, base_sequence=6, transactional=False)
    assert bytes(buf[:len(first)]) == first
    views, tail = walk_batches(buf)
    assert tail == 0 and views[1].producer_id == 3 and views[1].base_sequence == 6
    verify_crc(views[1])


def test_stamp_in_place_refuses_what_it_cannot_stamp():
    with pytest.raises(ValueError, match="producer id"):
        stamp_producer_in_place(bytearray(build()), producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                transactional=True)
    with pytest.raises(ValueError, match="no complete batch"):
        stamp_producer_in_place(bytearray(build()[:-1]), producer_id=1, producer_epoch=0, base_sequence=0,
                                transactional=False)
    with pytest.raises(ValueError, match="magic-1"):
        stamp_producer_in_place(bytearray(legacy(1, Codec.NONE, RECORDS[:1], 0)), producer_id=1,
                                producer_epoch=0, base_sequence=0, transactional=False)


def test_delete_horizon_is_cleared_and_record_timestamps_survive():
    source = patch(build(base_offset=50), set_bits=HORIZON)  # baseTimestamp = horizon, deltas relative to it
    view = parse_batch(source)
    assert view.delete_horizon
    prepared = prepare_for_target(view)
    target = parse_batch(prepared.data)
    assert not target.delete_horizon and target.base_timestamp == view.base_timestamp
    assert not prepared.deep and prepared.records_identical
    assert decoded(bytes(prepared.data)) == dense(decoded(source))


# --- classification and the policy -------------------------------------------------------------------------


def test_control_batches_are_skipped():
    marker = patch(build([(0, 1, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])], transactional=True),
                   set_bits=CONTROL)
    view = parse_batch(marker)
    assert view.control and view.transactional and view.classify() is BatchKind.CONTROL
    assert prepare_for_target(view) is None


def marker(kind: int = CONTROL_COMMIT, *, base_offset: int = 40, key: bytes | None = None) -> bytes:
    """A control batch with one marker record (key: version 0, ``kind``) as a transaction coordinator writes it."""
    key = struct.pack(">hh", 0, kind) if key is None else key
    batch = build([(0, 1, key, struct.pack(">hi", 0, 0), [])], base_offset=base_offset, transactional=True)
    return patch(batch, set_bits=CONTROL)


def test_control_type_reads_commit_and_abort():
    assert control_type(parse_batch(marker(CONTROL_COMMIT))) == 1
    assert control_type(parse_batch(marker(CONTROL_ABORT))) == 0


def _cut_records(batch: bytes, keep: int) -> bytes:
    return patch(batch[:61 + keep], batch_length=61 + keep - 12)


@pytest.mark.parametrize("garbage", [
    pytest.param(lambda: marker(key=b"\x00\x01"), id="short-key"),
    pytest.param(lambda: patch(build([(0, 1, None, b"v", [])], base_offset=40, transactional=True),
                               set_bits=CONTROL), id="null-key"),
    pytest.param(lambda: marker()[:61] + b"\xff" * (len(marker()) - 61), id="varint-runs-on"),
    pytest.param(lambda: _cut_records(marker(), 3), id="records-cut"),
    pytest.param(lambda: _cut_records(marker(), 0), id="no-records"),
    pytest.param(lambda: patch(marker(), set_bits=int(Codec.GZIP)), id="compressed"),
])
def test_control_type_of_garbage_raises_naming_the_offset(garbage):
    with pytest.raises(CorruptBatchError, match="offset 40"):
        control_type(parse_batch(garbage()))


def test_control_type_of_a_data_batch_is_a_caller_error():
    with pytest.raises(ValueError, match="not a control batch"):
        control_type(parse_batch(build(base_offset=40)))


def test_empty_batches_left_by_the_cleaner_are_skipped():
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    empty = patch(bytes(builder.build()), base_offset=30, last_offset_delta=4)
    view = parse_batch(empty)
    assert view.classify() is BatchKind.EMPTY and view.next_offset == 35
    assert prepare_for_target(view) is None


@codecs
def test_plain_batch_goes_shallow_with_one_offset_run(codec):
    view = parse_batch(build(codec=codec, base_offset=700))
    prepared = prepare_for_target(view, producer_id=5, producer_epoch=0, base_sequence=60)
    assert prepared is not None and not prepared.deep and prepared.records_identical
    assert prepared.record_count == 6 and prepared.source_offsets is None
    assert (prepared.source_first_offset, prepared.source_next_offset) == (700, 706)
    assert prepared.offset_runs() == [(700, 0, 6)]
    assert DefaultRecordBatch(bytes(prepared.data)).base_sequence == 60


@codecs
@pytest.mark.parametrize("kept, last", [([0, 2, 5], 5), ([3, 4, 5], 5), ([0, 1, 2], 4), ([1, 2, 4], 6)],
                         ids=["middle", "start", "end", "everywhere"])
def test_offset_holes_are_reencoded_densely_keeping_records(codec, kept, last):
    source = patch(build([RECORDS[d] for d in kept], codec, base_offset=1000), last_offset_delta=last)
    view = parse_batch(source)
    assert view.has_offset_holes and view.classify() is BatchKind.DATA
    prepared = prepare_for_target(view)
    assert prepared.deep and not prepared.records_identical
    target = parse_batch(prepared.data)
    assert target.last_offset_delta + 1 == target.records_count == len(kept)
    assert target.codec is codec and target.base_offset == 0
    assert decoded(bytes(prepared.data)) == dense(decoded(source))
    contiguous_from_base = kept == list(range(len(kept)))
    assert prepared.source_offsets == (None if contiguous_from_base else tuple(1000 + d for d in kept))
    assert (prepared.source_first_offset, prepared.source_next_offset) == (1000, 1000 + last + 1)
    direct = batch_deep.reencode_dense(view)
    assert bytes(direct.data) == bytes(prepared.data)


@codecs
def test_hole_at_start_is_mapped_to_the_first_kept_record(codec):
    source = patch(build([RECORDS[d] for d in (2, 3, 5)], codec, base_offset=0), base_offset=100)
    view = parse_batch(source)
    prepared = prepare_for_target(view)
    assert prepared.deep and prepared.source_offsets == (102, 103, 105)
    assert prepared.offset_runs() == [(102, 0, 2), (105, 2, 1)]
    assert (prepared.source_first_offset, prepared.source_next_offset) == (100, 106)
    assert batch_deep.logical_digest([view]) == batch_deep.logical_digest([parse_batch(prepared.data)])


@codecs
def test_log_append_time_batch_keeps_what_consumers_saw(codec):
    append_time = 1_800_000_000_000
    source = patch(build(codec=codec, base_offset=20), set_bits=LAT, max_timestamp=append_time)
    view = parse_batch(source)
    assert view.log_append_time
    seen = decoded(source)
    assert {r[1] for r in seen} == {append_time}
    prepared = prepare_for_target(view)
    target = parse_batch(prepared.data)
    assert not target.log_append_time
    assert target.base_timestamp == target.max_timestamp == append_time
    assert decoded(bytes(prepared.data)) == dense(seen)
    assert prepared.deep == (codec is not Codec.NONE)  # uncompressed: a cheap record-level rewrite
    assert not prepared.records_identical and prepared.source_offsets is None


def test_log_append_time_not_preserved_is_a_shallow_bit_clear():
    source = patch(build(base_offset=20), set_bits=LAT, max_timestamp=1_800_000_000_000)
    prepared = prepare_for_target(parse_batch(source), preserve_log_append_time=False)
    assert not prepared.deep and prepared.records_identical
    assert [r[1] for r in decoded(bytes(prepared.data))] == [r[1] for r in RECORDS]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4],
                         ids=lambda c: c.name.lower())
def test_legacy_message_sets_become_v2(magic, codec):
    rows = [(d, ts, key, value, []) for d, ts, key, value, _ in RECORDS]
    buf = legacy(magic, codec, rows, 300)
    views, tail = walk_batches(buf)
    assert tail == 0 and all(v.classify() is BatchKind.LEGACY for v in views)
    assert len(views) == (1 if codec else len(rows))
    assert views[-1].next_offset == 306
    prepared = [prepare_for_target(v) for v in views]
    assert all(p.deep for p in prepared)
    got = [r for p in prepared for r in decoded(bytes(p.data))]
    assert [(r[2], r[3], r[1]) for r in got] == [(k, v, -1 if magic == 0 else t) for _, t, k, v, _ in rows]
    assert [o for p in prepared for o in range(p.source_first_offset, p.source_next_offset)] == list(
        range(300, 306))
    assert all(parse_batch(p.data).codec is codec for p in prepared)


def test_a_run_of_uncompressed_legacy_messages_becomes_one_v2_batch():
    rows = [(d, ts, key, value, []) for d, ts, key, value, _ in RECORDS]
    views, _ = walk_batches(legacy(1, Codec.NONE, rows, 300))
    prepared = batch_deep.convert_legacy_run(views, producer_id=7, producer_epoch=0, base_sequence=0)
    assert prepared.deep and prepared.record_count == 6 and prepared.offset_runs() == [(300, 0, 6)]
    assert (prepared.source_first_offset, prepared.source_next_offset) == (300, 306)
    assert decoded(bytes(prepared.data)) == [(d, t, k, v, []) for d, t, k, v, _ in rows]


@codecs
@pytest.mark.parametrize("bounds, kept", [((1002, 1004), [2, 3]), ((900, 1001), [0]), ((1005, 2000), [5]),
                                          ((1000, 1006), [0, 1, 2, 3, 4, 5]), ((1006, 1010), [])])
def test_trim_keeps_records_inside_exact_bounds(codec, bounds, kept):
    source = build(codec=codec, base_offset=1000)
    view = parse_batch(source)
    prepared = prepare_for_target(view, exact_bounds=bounds)
    direct = batch_deep.trim(view, *bounds)
    if not kept:
        assert prepared is None and direct is None
        return
    whole = bounds == (1000, 1006)
    assert prepared.deep != whole and direct.deep
    if not whole:
        assert bytes(direct.data) == bytes(prepared.data)
    assert decoded(bytes(direct.data)) == decoded(bytes(prepared.data))
    got = decoded(bytes(prepared.data))
    assert got == dense([decoded(source)[d] for d in kept])
    assert prepared.source_first_offset == max(1000, bounds[0])
    assert prepared.source_next_offset == min(1006, bounds[1])
    assert prepared.offset_runs() == [(1000 + kept[0], 0, len(kept))]


def test_batch_inside_exact_bounds_stays_shallow():
    prepared = prepare_for_target(parse_batch(build(base_offset=10)), exact_bounds=(10, 16))
    assert not prepared.deep and prepared.records_identical


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name.lower())
def test_corrupt_compressed_section_fails_the_deep_path_naming_the_offset(codec):
    source = bytearray(patch(build(codec=codec, base_offset=0), last_offset_delta=9))
    source[61:] = b"\x00" * (len(source) - 61)
    source = patch(bytes(source), base_offset=88)  # a valid CRC over garbage
    with pytest.raises(CorruptBatchError, match="offset 88"):
        prepare_for_target(parse_batch(source))


# --- properties --------------------------------------------------------------------------------------------

_bytes = st.one_of(st.none(), st.binary(max_size=40))
_record = st.tuples(st.integers(0, 10**13), _bytes, _bytes,
                    st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3))
_available_codecs = st.sampled_from(CODECS)


def _build_any(rows, codec, base_offset=0):
    builder = DefaultRecordBatchBuilder(2, int(codec), False, -1, -1, -1, 1 << 30)
    for delta, (ts, key, value, headers) in rows:
        builder.append(delta, ts, key, value, headers)
    out = builder.build()  # may fall back to no codec when the data does not compress: fine here
    struct.pack_into(">q", out, 0, base_offset)
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(_record, min_size=1, max_size=12), codec=_available_codecs,
       base=st.integers(0, 2**40), pid=st.integers(0, 2**40), seq=st.integers(0, 2**30))
def test_property_shallow_rewrite_decodes_to_the_same_records(records, codec, base, pid, seq):
    source = _build_any(list(enumerate(records)), codec, base)
    prepared = prepare_for_target(parse_batch(source), producer_id=pid, producer_epoch=1, base_sequence=seq)
    assert not prepared.deep and bytes(prepared.data[61:]) == source[61:]
    assert decoded(bytes(prepared.data)) == dense(decoded(source))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(_record, min_size=1, max_size=12), codec=_available_codecs,
       gaps=st.lists(st.integers(1, 4), min_size=12, max_size=12), base=st.integers(0, 2**40))
def test_property_holes_reencode_densely_with_exact_offset_map(records, codec, gaps, base):
    deltas = [sum(gaps[:i]) - gaps[0] for i in range(1, len(records) + 1)]
    source = _build_any(list(zip(deltas, records, strict=True)), codec, base)
    view = parse_batch(source)
    prepared = prepare_for_target(view)
    target = decoded(bytes(prepared.data))
    assert target == dense(decoded(source))
    offsets = prepared.source_offsets or tuple(range(prepared.source_first_offset,
                                                     prepared.source_first_offset + prepared.record_count))
    assert offsets == tuple(base + d for d in deltas)
    assert prepared.deep == view.has_offset_holes


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6), cut=st.integers(0, 10**6))
def test_property_walk_splits_at_batch_boundaries(sizes, cut):
    batches, base = [], 0
    for n in sizes:
        batches.append(build(RECORDS[:n], base_offset=base))
        base += n
    buf = b"".join(batches)
    cut = cut % (len(buf) + 1)
    views, tail = walk_batches(buf[:cut])
    ends = [sum(len(b) for b in batches[:i + 1]) for i in range(len(batches))]
    complete = [e for e in ends if e <= cut]
    assert len(views) == len(complete)
    assert tail == cut - (complete[-1] if complete else 0)
    assert [bytes(v.buffer) for v in views] == batches[:len(views)]


# --- resuming inside a batch, legacy wrappers at a bound ----------------------------------------------------


@codecs
@pytest.mark.parametrize("resume_at, kept", [(1001, [1, 2, 3, 4, 5]), (1004, [4, 5]), (1005, [5])])
def test_head_only_bound_trims_below_a_resume_position(codec, resume_at, kept):
    source = build(codec=codec, base_offset=1000)
    prepared = prepare_for_target(parse_batch(source), exact_bounds=(resume_at, None))
    assert prepared.deep, "trimming is a named deep case"
    assert decoded(bytes(prepared.data)) == dense([decoded(source)[d] for d in kept])
    assert (prepared.source_first_offset, prepared.source_next_offset) == (resume_at, 1006)
    assert prepared.offset_runs() == [(resume_at, 0, len(kept))]


@codecs
def test_head_only_bound_leaves_a_batch_at_or_after_it_shallow(codec):
    prepared = prepare_for_target(parse_batch(build(codec=codec, base_offset=1000)), exact_bounds=(1000, None))
    assert not prepared.deep and prepared.records_identical
    assert (prepared.source_first_offset, prepared.source_next_offset) == (1000, 1006)


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", COMPRESSED[:3], ids=lambda c: c.name.lower())
@pytest.mark.parametrize("bound", [301, 303, 305])
def test_legacy_wrapper_straddling_a_bound_splits_between_the_two_ranges(magic, codec, bound):
    rows = [(d, ts, key, value, []) for d, ts, key, value, _ in RECORDS]
    view = parse_batch(legacy(magic, codec, rows, 300))
    assert view.base_offset == 305, "a compressed wrapper's offset field is its last inner offset"
    whole = batch_deep.read_records(view)
    before = prepare_for_target(view, exact_bounds=(0, bound))
    after_exact = prepare_for_target(view, exact_bounds=(bound, 400))
    after_resumed = prepare_for_target(view, exact_bounds=(bound, None))
    assert (before.source_first_offset, before.source_next_offset) == (300, bound)
    for after in (after_exact, after_resumed):
        assert (after.source_first_offset, after.source_next_offset) == (bound, 306)
        assert before.deep and after.deep
        got = decoded(bytes(before.data)) + decoded(bytes(after.data))
        assert [(r[2], r[3]) for r in got] == [(k, v) for _, _, k, v, _ in rows]
    assert before.offset_runs() + after_exact.offset_runs() == [(300, 0, bound - 300), (bound, 0, 306 - bound)]
    assert len(whole) == 6


# -- in place: a batch re-stamped inside the fetched frame (issue 14, CPU per GB) ----------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.tuples(st.lists(_record, min_size=1, max_size=6), _available_codecs,
                                  st.sampled_from([0, LAT, TXN, HORIZON])), min_size=1, max_size=4),
       pid=st.integers(-1, 2**40), seq=st.integers(0, 2**30), txn=st.booleans(), keep_lat=st.booleans())
def test_property_in_place_equals_the_copy_and_touches_only_its_batch(batches, pid, seq, txn, keep_lat):
    """A frame of several batches (as a Fetch response holds them): preparing each in place gives exactly the
    bytes the copying path gives, writes nothing outside that batch, and leaves a valid batch (CRC included)."""
    txn = txn and pid >= 0
    frame = bytearray()
    base = 1000
    for rows, codec, bits in batches:
        one = _build_any(list(enumerate(rows)), codec, base)
        frame += patch(one, set_bits=bits) if bits else one
        base += len(rows)
    original = bytes(frame)
    views, tail = walk_batches(frame)
    assert len(views) == len(batches) and tail == 0
    stamp = dict(producer_id=pid if pid >= 0 or not txn else 1, producer_epoch=2 if pid >= 0 else -1,
                 base_sequence=seq if pid >= 0 else -1, transactional=txn, preserve_log_append_time=keep_lat)
    pos = 0
    for view in views:
        copied = prepare_for_target(parse_batch(original[pos:pos + view.size]), **stamp)
        in_place = prepare_for_target(view, in_place=True, **stamp)
        assert (copied is None) == (in_place is None)
        if copied is not None:
            assert bytes(in_place.data) == bytes(copied.data)
            assert in_place.deep == copied.deep and in_place.record_count == copied.record_count
            assert (in_place.source_first_offset, in_place.source_next_offset) == \
                (copied.source_first_offset, copied.source_next_offset)
            verify_crc(parse_batch(in_place.data))
            header_only = not in_place.deep and in_place.records_identical
            assert isinstance(in_place.data, memoryview) == header_only
            if header_only:  # the shallow header rewrite: the result *is* the frame's bytes, no copy
                assert in_place.data.obj is frame
                assert bytes(frame[pos:pos + view.size]) == bytes(copied.data)
        # nothing after this batch was touched yet; a batch that needed new bytes (deep, timestamps rewritten,
        # skipped) leaves its source bytes as they were
        assert frame[pos + view.size:] == original[pos + view.size:]
        if copied is None or not isinstance(in_place.data, memoryview):
            assert frame[pos:pos + view.size] == original[pos:pos + view.size]
        pos += view.size


def test_in_place_on_a_read_only_buffer_copies_and_leaves_the_source_alone():
    source = build(base_offset=77)
    prepared = prepare_for_target(parse_batch(source), in_place=True, producer_id=5, producer_epoch=0,
                                  base_sequence=0)
    assert isinstance(prepared.data, bytearray)
    assert bytes(prepared.data) == bytes(prepare_for_target(parse_batch(source), producer_id=5, producer_epoch=0,
                                                            base_sequence=0).data)
    with pytest.raises(ValueError, match="read-only"):
        rewrite_header_in_place(parse_batch(source))


def test_in_place_without_the_flag_never_writes_into_the_fetched_buffer():
    frame = bytearray(build(codec=Codec.LZ4, base_offset=500))
    before = bytes(frame)
    prepared = prepare_for_target(parse_batch(frame), producer_id=3, producer_epoch=0, base_sequence=0)
    assert frame == before and isinstance(prepared.data, bytearray)


def test_a_corrupt_batch_is_refused_before_anything_is_written_in_place():
    frame = bytearray(build(base_offset=900))
    frame[-1] ^= 0x01
    before = bytes(frame)
    with pytest.raises(CorruptBatchError, match="900"):
        prepare_for_target(parse_batch(frame), in_place=True)
    assert frame == before


def test_stamping_an_in_place_batch_through_the_writer_buffer_type():
    """The writer stamps what the copier hands it; a view into the frame is stamped in the frame."""
    from mirror_core.kafka.writer import OutgoingBatch

    frame = bytearray(build(base_offset=40))
    prepared = prepare_for_target(parse_batch(frame), in_place=True)
    batch = OutgoingBatch("t", 0, prepared.data, 40)
    assert batch.data is prepared.data  # not copied
    stamp_producer_in_place(batch.data, producer_id=77, producer_epoch=1, base_sequence=9, transactional=True)
    ref = DefaultRecordBatch(bytes(frame))
    assert ref.validate_crc() and (ref.producer_id, ref.base_sequence, ref.is_transactional) == (77, 9, True)
    assert OutgoingBatch("t", 0, memoryview(bytes(frame)), 40).data is not None  # read-only: copied
    assert isinstance(OutgoingBatch("t", 0, memoryview(bytes(frame)), 40).data, bytearray)


# -- the records digest ----------------------------------------------------------------------------------------------

def test_records_digest_covers_every_records_byte_and_no_header_byte():
    a, b = build(base_offset=10), build(RECORDS[:3], codec=Codec.LZ4, base_offset=16)
    reference = records_digest([parse_batch(a), parse_batch(b)])
    assert len(reference) == 32 and int(reference, 16) >= 0
    restamped = rewrite_header(parse_batch(a), producer_id=1, producer_epoch=2, base_sequence=3, transactional=True)
    assert records_digest([parse_batch(restamped), parse_batch(b)]) == reference
    for i in range(61, len(a)):
        changed = bytearray(a)
        changed[i] ^= 0x40
        assert records_digest([bytes(changed[61:]), parse_batch(b)]) != reference, i
    # section boundaries count: the same bytes split differently are a different digest
    assert records_digest([a[61:] + b[61:]]) != reference
    assert records_digest([]) != records_digest([b""])
    running = RecordsDigest()
    for section in (a[61:], memoryview(b)[61:]):
        running.add(section)
    assert running.hexdigest() == reference


@settings(max_examples=500, deadline=None)
@given(magic=st.sampled_from([0, 1, 2, 2, 2]), attributes=st.integers(0, 0x7F), base=st.integers(0, 1000),
       count=st.integers(-1, 4), last_delta=st.integers(0, 4), preserve=st.booleans(),
       bounds=st.one_of(st.none(), st.tuples(st.one_of(st.none(), st.integers(0, 1005)),
                                            st.one_of(st.none(), st.integers(0, 1010)))))
def test_the_one_test_for_the_usual_batch_never_decides_otherwise_than_the_rules(magic, attributes, base, count,
                                                                                 last_delta, preserve, bounds):
    """prepare_for_target takes a batch for a plain header rewrite in one test (usual_shallow) before its full
    decision: whenever that test says yes, the rules say the same (a data batch with records, dense, no
    LogAppendTime to keep, not straddling a bound); and for a magic-2 data batch the rules call shallow, it says yes."""
    view = BatchView(memoryview(bytearray(70)), base, 58, 0, magic, 0, attributes, last_delta, 0, 0, -1, -1, -1, count)
    lo, hi = bounds if bounds is not None else (None, None)
    straddles = (lo is not None and view.base_offset < lo) or (hi is not None and view.next_offset > hi)
    rules_shallow = (view.classify() is BatchKind.DATA and not straddles and not view.has_offset_holes
                     and not (preserve and view.log_append_time))
    assert usual_shallow(view, preserve, bounds) == rules_shallow
