"""Raw record-batch codec: walk, check and re-stamp Kafka record batches without touching their records.

Shoal copies record batches whole. This module reads batch headers out of a fetched buffer, checks CRCs, and
holds what a batch becomes for the target (:class:`PreparedBatch`). Writing the header a target broker will
accept, leaving the records section byte-identical (the *shallow* path), and the policy that decides per batch
whether the shallow path is enough are in :mod:`mirror_core.codec.batch_prepare`; the named deep cases that must
decode records live in :mod:`mirror_core.codec.batch_deep`; the digest of what was copied in
:mod:`mirror_core.codec.records_digest`. Pure: no I/O, no network code.

RecordBatch v2 (magic 2), big-endian::

    offset  field                  type  note
         0  baseOffset             i64   rewritten freely (outside the CRC)
         8  batchLength            i32   size - 12
        12  partitionLeaderEpoch   i32   rewritten freely (outside the CRC)
        16  magic                  i8    2
        17  crc                    u32   CRC-32C over bytes 21..end
        21  attributes             i16   bits 0-2 codec, 3 LogAppendTime, 4 transactional, 5 control,
                                         6 delete horizon (baseTimestamp then holds the horizon)
        23  lastOffsetDelta        i32
        27  baseTimestamp          i64
        35  maxTimestamp           i64
        43  producerId             i64
        51  producerEpoch          i16
        53  baseSequence           i32
        57  recordsCount           i32
        61  records                ...   compressed as one block when codec != 0

Legacy message sets (magic 0/1) share the first 17 bytes' meaning for walking purposes::

         0  offset  i64   (a compressed wrapper carries its last inner offset)
         8  size    i32   size - 12
        12  crc     u32   CRC-32 (not C) over bytes 16..end
        16  magic   i8    0 or 1
        17  attributes i8, then (magic 1) timestamp i64 @18, then key and value

A control batch (never compressed) holds one record whose key is the marker::

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint | keyLength varint |
    key: version i16, type i16 (0 ABORT, 1 COMMIT) | value ...

Invariant of the shallow path: the records section (bytes 61..end) of a rewritten batch is byte-identical to
the source's, so a record at source offset ``b + d`` lands at target ``b' + d``.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from mirror_core.errors import CorruptBatchError

BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORDS_OFFSET = 61

LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
LEGACY_CRC_OFFSET = 12
LEGACY_ATTRIBUTES_OFFSET = 17
LEGACY_TIMESTAMP_OFFSET = 18
LEGACY_MIN_SIZE = 26  # v0 with null key and value
assert V2_HEADER.size == RECORDS_OFFSET

CODEC_MASK = 0x07
LOG_APPEND_TIME_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at PRODUCER_ID_OFFSET
ATTRIBUTES = struct.Struct(">h")
CONTROL_KEY = struct.Struct(">hh")  # version, type

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_EMPTY = -1  # a control batch the log cleaner kept as a bare header (no record): it marks nothing

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class BatchKind(enum.Enum):
    DATA = "data"
    CONTROL = "control"  # commit/abort markers: cannot be produced, skipped (offset gap)
    EMPTY = "empty"  # recordsCount 0, left by the log cleaner: rejected by the target, skipped
    LEGACY = "legacy"  # magic 0/1: re-encoded to v2 (deep)


class BatchView(NamedTuple):
    """One batch inside a fetched buffer: its bytes (a memoryview, not a copy) and its parsed header.

    For LEGACY entries the v2-only fields hold neutral values: ``base_offset`` is the entry's offset field
    (the *last* inner offset of a compressed wrapper), ``last_offset_delta`` is 0 so ``next_offset`` is
    right, ``base_timestamp``/``max_timestamp`` are the v1 timestamp (-1 for v0), and ``records_count`` is 1
    for a plain message and -1 (unknown until decoded) for a compressed wrapper.
    """

    buffer: memoryview
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def records_section(self) -> memoryview:
        """Bytes 61..end of a v2 batch (compressed if the codec says so); empty for legacy entries."""
        return self.buffer[RECORDS_OFFSET:] if self.magic >= 2 else self.buffer[0:0]

    @property
    def codec(self) -> Codec:
        try:
            return Codec(self.attributes & CODEC_MASK)
        except ValueError:
            raise CorruptBatchError(self.base_offset,
                                    f"unknown compression codec {self.attributes & CODEC_MASK}") from None

    @property
    def compressed(self) -> bool:
        return bool(self.attributes & CODEC_MASK)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & LOG_APPEND_TIME_BIT) and self.magic >= 1

    @property
    def transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & DELETE_HORIZON_BIT)

    @property
    def legacy(self) -> bool:
        return self.magic < 2

    @property
    def has_offset_holes(self) -> bool:
        """Compaction removed records inside the batch; the target rejects it unless re-encoded densely."""
        return self.magic >= 2 and self.last_offset_delta + 1 != self.records_count

    def classify(self) -> BatchKind:
        if self.magic < 2:
            return BatchKind.LEGACY
        if self.attributes & CONTROL_BIT:
            return BatchKind.CONTROL
        if self.records_count == 0:
            return BatchKind.EMPTY
        return BatchKind.DATA


def _view_at(mv: memoryview, pos: int, size: int, magic: int) -> BatchView:
    if magic == 2:
        return BatchView(mv[pos:pos + size], *V2_HEADER.unpack_from(mv, pos))
    offset, length, crc = struct.unpack_from(">qiI", mv, pos)
    attributes = mv[pos + LEGACY_ATTRIBUTES_OFFSET]
    timestamp = struct.unpack_from(">q", mv, pos + LEGACY_TIMESTAMP_OFFSET)[0] if magic == 1 else -1
    count = -1 if attributes & CODEC_MASK else 1
    return BatchView(mv[pos:pos + size], offset, length, -1, magic, crc, attributes, 0,
                     timestamp, timestamp, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, count)


def batch_end(mv: memoryview, pos: int) -> tuple[int, int] | None:
    """(size, magic) of the batch at ``pos``, or None if the buffer ends inside it (a truncated tail)."""
    remaining = len(mv) - pos
    if remaining <= MAGIC_OFFSET:
        return None
    offset, length = struct.unpack_from(">qi", mv, pos)
    magic = mv[pos + MAGIC_OFFSET]
    if magic > 2:
        raise CorruptBatchError(offset, f"unknown magic {magic}")
    minimum = RECORDS_OFFSET if magic == 2 else LEGACY_MIN_SIZE
    if length + LOG_OVERHEAD < minimum:
        raise CorruptBatchError(offset, f"batch length {length} is below the magic-{magic} minimum")
    size = length + LOG_OVERHEAD
    return None if size > remaining else (size, magic)


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def walk_batches(buf: bytes | bytearray | memoryview) -> tuple[list[BatchView], int]:
    """All complete batches in ``buf`` and the number of trailing bytes of a truncated last batch.

    A fetch response is cut at its max bytes, so a partial last batch is normal: it is reported, not raised;
    the caller refetches from the last view's ``next_offset``. A structurally impossible header raises
    :class:`CorruptBatchError`.
    """
    mv = _byte_view(buf)
    views = []
    pos = 0
    while (found := batch_end(mv, pos)) is not None:
        size, magic = found
        views.append(_view_at(mv, pos, size, magic))
        pos += size
    return views, len(mv) - pos


_OFFSET_AND_LENGTH = struct.Struct(">qi")


def walk_v2_data(buf: bytes | bytearray | memoryview, start: int,
                 end: int | None) -> tuple[list[BatchView], int, BatchView | None, bool, int, int] | None:
    """A fetch answer of magic-2 batches in one pass (the usual answer): ``(data, data_bytes, last, past, walked,
    tail)``.

    ``data``: the batches that are not control batches, begin below ``end`` (None: no end) and end after
    ``start``, in order, and their bytes together; ``last``: the last batch that begins below ``end``, control or
    not (None: none);
    ``past``: a whole batch beginning at or after ``end`` was found (no view is built from there on);
    ``walked``: the whole batches found; ``tail``: the bytes of a last batch cut off.
    What :func:`walk_batches` finds, filtered the way a reader of the range filters it, without building a view
    of anything past ``end``. A control batch below ``end`` is dropped only once its CRC is checked
    (:class:`CorruptBatchError` otherwise, as the general rules raise); its marker type is not read here (no
    aborted transaction is listed, so it decides nothing), where the general rules read it and refuse a marker
    whose record cannot be read: a broker writes none such, so the two differ only on bytes no broker wrote.
    None when any batch is not magic 2, its length is below the v2 minimum or a batch begins below the end of the
    one before it: the caller then takes the general walk, which raises for what is corrupt. Batches come in
    offset order without overlapping, so ``data``'s last batch ends furthest."""
    mv = _byte_view(buf)
    n = len(mv)
    new, header, head = tuple.__new__, V2_HEADER.unpack_from, _OFFSET_AND_LENGTH.unpack_from
    data: list[BatchView] = []
    data_bytes = 0
    last = None
    past = False
    walked = pos = 0
    reached = -1   # the next offset after the last batch read (batches of a log never overlap)
    while n - pos > MAGIC_OFFSET:
        if mv[pos + MAGIC_OFFSET] != 2:
            return None
        base, length = head(mv, pos)
        size = length + LOG_OVERHEAD
        if size < RECORDS_OFFSET:
            return None
        if size > n - pos:
            break
        walked += 1
        if base < reached:
            return None   # overlapping or going backwards: not a log's answer, the general walk decides
        fields = header(mv, pos)
        # fields 5 and 6: attributes, lastOffsetDelta (V2_HEADER's order, BatchView's)
        if fields[6] < 0:
            return None   # a negative lastOffsetDelta: the general walk decides
        reached = base + fields[6] + 1
        if past or (end is not None and base >= end):
            past = True   # stepped over, never kept: it begins at or after the end and after every batch before
        else:
            last = new(BatchView, (mv[pos:pos + size], *fields))
            if fields[5] & CONTROL_BIT:
                # dropped unread, so checked as select_committed checks it: a data batch whose control bit
                # flipped must halt the copy (CorruptBatchError), not vanish as a marker would
                verify_crc(last)
            elif reached > start:
                data.append(last)
                data_bytes += size
        pos += size
    return data, data_bytes, last, past, walked, n - pos


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[BatchView]:
    """Complete batches in ``buf``, lazily; a truncated tail ends the iteration (see :func:`walk_batches`)."""
    mv = _byte_view(buf)
    pos = 0
    while (found := batch_end(mv, pos)) is not None:
        size, magic = found
        yield _view_at(mv, pos, size, magic)
        pos += size


def parse_batch(buf: bytes | bytearray | memoryview) -> BatchView:
    """The single complete batch that fills ``buf`` exactly."""
    mv = _byte_view(buf)
    found = batch_end(mv, 0)
    if found is not None and found[0] == len(mv):       # the usual case, without walk_batches' list
        return _view_at(mv, 0, *found)
    views, tail = walk_batches(mv)
    if len(views) != 1 or tail:
        raise ValueError(f"expected exactly one complete batch, found {len(views)} and {tail} trailing bytes")
    return views[0]


def verify_crc(view: BatchView) -> None:
    """Raise :class:`CorruptBatchError` naming the base offset unless the stored CRC matches the bytes."""
    if view.magic >= 2:
        actual = crc32c(view.buffer[ATTRIBUTES_OFFSET:])
    else:
        actual = zlib.crc32(view.buffer[MAGIC_OFFSET:]) & 0xFFFFFFFF
    if actual != view.crc:
        kind = "CRC-32C" if view.magic >= 2 else "CRC-32"
        raise CorruptBatchError(view.base_offset, f"{kind} mismatch: stored {view.crc:#010x}, computed "
                                f"{actual:#010x} over {view.size} bytes (magic {view.magic})")


def seal_crc(out: bytearray | memoryview, pos: int, size: int) -> None:
    """Recompute and store the CRC-32C of the v2 batch ``out[pos:pos + size]``.

    A full recompute over bytes 21..end, by the ``crc32c`` wheel's C code (SSE4.2 instructions where the CPU has
    them: ~0.05 CPU-s per GB per pass on the benchmark machine). Why not an incremental update from the source
    CRC (CRC-32C is affine, so the new CRC is the old one XOR the CRC of the changed header bytes shifted past the
    unchanged tail): the shift past the tail costs O(log n) carry-less multiplications in Python, slower per batch
    than the C recompute of a 256 KiB batch; and the source CRC is verified in full anyway (DESIGN §3.2: a corrupt
    batch halts the partition naming its offset, which needs the verification before we reseal, since the target
    broker can only check the CRC we write)."""
    crc = crc32c(memoryview(out)[pos + ATTRIBUTES_OFFSET:pos + size])
    struct.pack_into(">I", out, pos + CRC_OFFSET, crc)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A zig-zag varint (as inside records) at ``pos``: (value, position after it)."""
    raw = 0
    for shift in range(0, 64, 7):
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    raise ValueError("varint longer than 10 bytes")


def control_type(view: BatchView) -> int:
    """The marker type of a control batch (:data:`CONTROL_ABORT`, :data:`CONTROL_COMMIT`, or a newer one),
    read from its first record's key; :data:`CONTROL_EMPTY` for a marker the log cleaner kept without its record
    (``DefaultRecordBatch.writeEmptyHeader``: the Java consumer reads it as no abort); :class:`CorruptBatchError`
    naming the offset if it cannot be read."""
    if not view.control:
        raise ValueError(f"the batch at offset {view.base_offset} is not a control batch")
    if view.records_count == 0 and view.size == RECORDS_OFFSET:
        return CONTROL_EMPTY
    if view.compressed:
        raise CorruptBatchError(view.base_offset, f"control batch compressed with {view.codec.name}")
    records = view.records_section
    try:
        length, pos = _read_varint(records, 0)
        end = pos + length
        _, pos = _read_varint(records, pos + 1)  # skip attributes; timestamp delta
        _, pos = _read_varint(records, pos)  # offset delta
        key_length, pos = _read_varint(records, pos)
        if key_length < CONTROL_KEY.size or pos + key_length > min(end, len(records)):
            raise ValueError(f"control key of {key_length} bytes in a record of {length}")
        _version, kind = CONTROL_KEY.unpack_from(records, pos)
    except (IndexError, ValueError, struct.error) as exc:
        raise CorruptBatchError(view.base_offset, f"unreadable control record: {exc}") from None
    return kind


class PreparedBatch(NamedTuple):
    """A batch ready for the target and the source offsets it carries (immutable; a NamedTuple like
    :class:`BatchView`, made once per batch: a frozen dataclass cost four times as much to build).

    Invariant: target record ``i`` (offset delta ``i``; the batch is dense) came from source offset
    ``source_offsets[i]``, or from ``source_first_offset + i`` when ``source_offsets`` is None (the shallow
    and cheap paths, which never materialise per-record lists). ``[source_first_offset,
    source_next_offset)`` is the source span this batch accounts for: a checkpoint may advance to
    ``source_next_offset`` once it is acked.
    """

    data: bytearray | memoryview  # a memoryview: rewritten in place in the fetched buffer (``in_place``)
    record_count: int
    source_first_offset: int
    source_next_offset: int
    deep: bool = False  # records were decompressed/decoded: a named deep case, counted in deep_batches
    records_identical: bool = True  # records section byte-identical to the source's (shallow header rewrite)
    source_offsets: tuple[int, ...] | None = None
    source_leader_epoch: int = -1  # the source batch's partitionLeaderEpoch (-1: legacy), the epoch of its span
    coalesced: int = 0  # source batches merged into this one (mirror_core.codec.batch_coalesce); 0: not a merge

    def offset_runs(self) -> list[tuple[int, int, int]]:
        """(source_offset, target_delta, length) runs of constant shift, for the offset map."""
        if self.source_offsets is None:
            return [(self.source_first_offset, 0, self.record_count)]
        runs: list[tuple[int, int, int]] = []
        for delta, offset in enumerate(self.source_offsets):
            if runs and runs[-1][0] + runs[-1][2] == offset:
                start, first_delta, length = runs[-1]
                runs[-1] = (start, first_delta, length + 1)
            else:
                runs.append((offset, delta, 1))
        return runs
