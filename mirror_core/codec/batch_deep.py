"""Record-level re-encoding for the named deep cases of the copy path.

The shallow path (:mod:`mirror_core.codec.batch_codec`) never looks inside a batch. Four cases must: a compacted
batch with offset holes (the target wants ``lastOffsetDelta + 1 == recordsCount``), a LogAppendTime batch
whose consumer-visible timestamp must survive on a CreateTime target, a legacy magic 0/1 message set, and a
batch trimmed to exact range bounds. Each decodes the records (decompressing if needed), writes them densely
with offset deltas ``0..n-1`` into a fresh v2 batch with the source's codec, and reports which source offset
each record came from.

Records are carried as wire bytes, not decoded objects: a v2 record's key, value and headers are copied
verbatim (``tail`` below), so nothing is re-interpreted (not even header keys that are not valid UTF-8);
only the length, timestamp delta and offset delta in front of them are rewritten. Legacy messages are
decoded by kafka-python's ``LegacyRecordBatch`` and their key and value encoded into the same tail form.

v2 record (varint = zig-zag LEB128)::

    length varint · attributes i8 · timestampDelta varlong · offsetDelta varint · tail = key, value, headers
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import kafka.codec as kcodec
from kafka.errors import KafkaError
from kafka.record.legacy_records import LegacyRecordBatch
from kafka.record.util import decode_varint, encode_varint

from mirror_core.codec.batch_codec import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORDS_OFFSET,
    TRANSACTIONAL_BIT,
    V2_HEADER,
    BatchView,
    Codec,
    PreparedBatch,
    seal_crc,
)
from mirror_core.errors import CorruptBatchError, MirrorError

_CODECS = {
    Codec.GZIP: ("gzip", kcodec.has_gzip, lambda: kcodec.gzip_encode, lambda: kcodec.gzip_decode),
    Codec.SNAPPY: ("snappy", kcodec.has_snappy, lambda: kcodec.snappy_encode, lambda: kcodec.snappy_decode),
    Codec.LZ4: ("lz4", kcodec.has_lz4, lambda: kcodec.lz4_encode, lambda: kcodec.lz4_decode),
    Codec.ZSTD: ("zstd", kcodec.has_zstd, lambda: kcodec.zstd_encode, lambda: kcodec.zstd_decode),
}


class SourceRecord(NamedTuple):
    """One record as consumers of the source see it: its offset, its visible timestamp, and its wire tail."""

    offset: int
    timestamp: int
    attributes: int
    tail: bytes | memoryview  # key, value, headers exactly as encoded in a v2 record


def _codec_functions(codec: Codec):
    name, available, encode, decode = _CODECS[codec]
    if not available():
        raise MirrorError(f"the {name} codec needs its Python library installed to re-encode this batch")
    return encode(), decode()


def compress(codec: Codec, data: bytes | bytearray) -> bytes:
    return bytes(data) if codec is Codec.NONE else _codec_functions(codec)[0](bytes(data))


def decompress(view: BatchView) -> memoryview:
    """The uncompressed records section of a v2 batch."""
    if not view.compressed:
        return view.records_section
    try:
        return memoryview(_codec_functions(view.codec)[1](view.records_section.tobytes()))
    except MirrorError:
        raise
    except Exception as exc:  # each codec library raises its own error type
        raise CorruptBatchError(view.base_offset,
                                f"{view.codec.name} records section does not decompress: {exc}") from exc


def decompress_at_most(view: BatchView, limit: int) -> memoryview | None:
    """The uncompressed records section of a v2 batch if it is at most ``limit`` bytes, else None, never holding
    much more than ``limit`` bytes of it: a tiny batch may decompress to many megabytes (one record of zeros), and a
    caller that only wants small batches must not pay for learning that one is not. Corrupt data raises
    :class:`CorruptBatchError` naming the batch's offset, as :func:`decompress` does."""
    if not view.compressed:
        section = view.records_section
        return section if len(section) <= limit else None
    _codec_functions(view.codec)   # the codec's library is installed (MirrorError names it otherwise)
    data = view.records_section.tobytes()
    try:
        out = _BOUNDED[view.codec](data, limit + 1)
    except Exception as exc:  # each codec library raises its own error type
        raise CorruptBatchError(view.base_offset,
                                f"{view.codec.name} records section does not decompress: {exc}") from exc
    return None if out is None or len(out) > limit else memoryview(out)


def _gzip_at_most(data: bytes, most: int) -> bytes:
    out = bytearray()
    while data and len(out) < most:   # one gzip member after another, as GzipFile reads them
        member = zlib.decompressobj(wbits=31)
        out += member.decompress(data, most - len(out))
        if member.unconsumed_tail:    # stopped at ``most``
            break
        if not member.eof:
            raise ValueError("gzip stream ends inside a member")
        data = member.unused_data
    return bytes(out)


def _lz4_at_most(data: bytes, most: int) -> bytes:
    import lz4.frame

    out = bytearray()
    while data and len(out) < most:   # frame after frame
        frame = lz4.frame.LZ4FrameDecompressor()
        out += frame.decompress(data, max_length=most - len(out))
        if not frame.eof:
            if frame.needs_input:
                raise ValueError("lz4 frame ends early")
            break                     # stopped at ``most``
        data = frame.unused_data
    return bytes(out)


def _zstd_at_most(data: bytes, most: int) -> bytes:
    import io

    import zstandard

    out = bytearray()
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        while len(out) < most:
            chunk = reader.read(most - len(out))
            if not chunk:
                break
            out += chunk
    return bytes(out)


def _snappy_at_most(data: bytes, most: int) -> bytes | None:
    """Snappy (raw, or kafka-python's and Java's xerial framing of blocks): every block announces its uncompressed
    length first, so a batch over ``most`` is known before anything is decompressed."""
    blocks = []
    if data[:8] == b"\x82SNAPPY\x00":   # xerial: a 16-byte header, then (length i32, raw snappy block)*
        pos = 16
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            if size < 0 or pos + 4 + size > len(data):
                raise ValueError(f"xerial snappy block of {size} bytes at {pos} runs past the section")
            blocks.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
    else:
        blocks.append(data)
    total = 0
    for block in blocks:
        length, shift, pos = 0, 0, 0
        while True:   # the block's preamble: its uncompressed length, an unsigned LEB128 varint
            byte = block[pos]
            length |= (byte & 0x7F) << shift
            pos += 1
            if byte < 0x80:
                break
            shift += 7
            if shift > 35:
                raise ValueError("snappy length preamble longer than 5 bytes")
        total += length
        if total > most:
            return None
    return kcodec.snappy_decode(data)


_BOUNDED = {Codec.GZIP: _gzip_at_most, Codec.LZ4: _lz4_at_most, Codec.ZSTD: _zstd_at_most,
            Codec.SNAPPY: _snappy_at_most}


def int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as Java's ``long`` arithmetic leaves it."""
    return ((value + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


def zigzag_at(buf, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` (as inside records): (value, position after it); one byte without a loop."""
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    raw, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = buf[pos]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def v2_record_fields(view: BatchView, data, log_append_time_to_max: bool) -> Iterator[tuple[int, int, int, object]]:
    """(offset delta, visible timestamp, attributes, tail) of each record of the v2 batch ``view`` whose uncompressed
    records section is ``data``. The timestamp is what a Java consumer computes: baseTimestamp + delta in 64-bit
    arithmetic (``maxTimestamp`` for a LogAppendTime batch when ``log_append_time_to_max``). Raises
    :class:`CorruptBatchError` naming the batch's offset when a record does not parse or bytes are left over."""
    visible_max = log_append_time_to_max and view.log_append_time
    base_ts, max_ts, end_of_section = view.base_timestamp, view.max_timestamp, len(data)
    pos = count = 0
    try:
        for _ in range(view.records_count):
            length, pos = zigzag_at(data, pos)
            end = pos + length
            attributes = data[pos]
            ts_delta, inner = zigzag_at(data, pos + 1)
            offset_delta, inner = zigzag_at(data, inner)
            if length < 0 or end > end_of_section or inner > end:
                raise ValueError(f"record length {length} does not fit its fields")
            yield offset_delta, max_ts if visible_max else int64(base_ts + ts_delta), attributes, data[inner:end]
            pos = end
            count += 1
    except (IndexError, ValueError) as exc:
        raise CorruptBatchError(view.base_offset, f"malformed record #{count}: {exc}") from exc
    if pos != end_of_section:
        raise CorruptBatchError(view.base_offset,
                                f"{end_of_section - pos} bytes left after {view.records_count} records")


def _v2_records(view: BatchView, log_append_time_to_max: bool) -> list[SourceRecord]:
    base_offset = view.base_offset
    return [SourceRecord(base_offset + delta, timestamp, attributes, tail)
            for delta, timestamp, attributes, tail in v2_record_fields(view, decompress(view), log_append_time_to_max)]


def _legacy_tail(key: bytes | None, value: bytes | None) -> bytearray:
    """A pre-v2 message's key and value as a v2 record's tail (no headers before magic 2)."""
    return bytearray(encode_record_tail(key, value))


def _legacy_records(view: BatchView) -> list[SourceRecord]:
    try:
        batch = LegacyRecordBatch(view.buffer.tobytes(), view.magic)
        return [SourceRecord(r.offset, -1 if r.timestamp is None else r.timestamp, 0,
                             _legacy_tail(r.key, r.value)) for r in batch]
    except (AssertionError, KafkaError, struct.error, ValueError) as exc:
        raise CorruptBatchError(view.base_offset, f"malformed magic-{view.magic} message set: {exc}") from exc


def read_records(view: BatchView, *, log_append_time_to_max: bool = True) -> list[SourceRecord]:
    """The records of ``view`` with the timestamps its consumers see (LogAppendTime: ``maxTimestamp``, unless
    ``log_append_time_to_max`` is False; legacy messages always as kafka-python reports them)."""
    return _legacy_records(view) if view.magic < 2 else _v2_records(view, log_append_time_to_max)


def encode_batch(records: list[SourceRecord], codec: Codec, *, producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                 transactional: bool = False) -> bytearray:
    """A dense v2 batch (baseOffset 0, offset deltas 0..n-1, CreateTime) holding ``records`` in order."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0].timestamp
    max_ts = max(r.timestamp for r in records)
    body = bytearray()
    for delta, record in enumerate(records):
        entry = bytearray((record.attributes,))
        encode_varint(record.timestamp - base_ts, entry.append)
        encode_varint(delta, entry.append)
        entry += record.tail
        encode_varint(len(entry), body.append)
        body += entry
    out = bytearray(RECORDS_OFFSET)
    out += compress(codec, body) if codec is not Codec.NONE else body
    attributes = int(codec) | (TRANSACTIONAL_BIT if transactional else 0)
    V2_HEADER.pack_into(out, 0, 0, len(out) - 12, -1, 2, 0, attributes, len(records) - 1, base_ts, max_ts,
                        producer_id, producer_epoch, base_sequence, len(records))
    seal_crc(out, 0, len(out))
    return out


def reencode(view: BatchView, *, start: int | None = None, end: int | None = None,
             log_append_time_to_max: bool = True, producer_id: int = NO_PRODUCER_ID,
             producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
             transactional: bool = False) -> PreparedBatch | None:
    """Re-encode ``view`` densely, keeping only offsets in [start, end) when given; None if nothing is kept.

    ``deep`` is set unless the batch was uncompressed v2 without holes and untrimmed (the cheap LogAppendTime
    timestamp rewrite). ``source_offsets`` is given only where the kept offsets are not contiguous.
    """
    records = read_records(view, log_append_time_to_max=log_append_time_to_max)
    trimmed = start is not None or end is not None
    if trimmed:
        lo = start if start is not None else -(1 << 63)
        hi = end if end is not None else view.next_offset
        records = [r for r in records if lo <= r.offset < hi]
    if not records:
        return None
    data = encode_batch(records, view.codec, producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional)
    first = min(view.base_offset, records[0].offset)
    following = view.next_offset
    if trimmed:
        first = max(first, start) if start is not None else first
        following = min(following, end) if end is not None else following
    deep = view.compressed or view.magic < 2 or view.has_offset_holes or trimmed
    return _prepared(data, records, first, following, deep)


def _prepared(data: bytearray, records: list[SourceRecord], first: int, following: int,
              deep: bool) -> PreparedBatch:
    contiguous = records[0].offset == first and records[-1].offset == first + len(records) - 1
    return PreparedBatch(data, len(records), first, following, deep=deep, records_identical=False,
                         source_offsets=None if contiguous else tuple(r.offset for r in records))


def reencode_dense(view: BatchView, **stamp) -> PreparedBatch | None:
    """Deep case (a): close compaction holes (offset deltas 0..n-1), keeping key, value, headers, timestamps.
    ``stamp``: producer_id, producer_epoch, base_sequence, transactional, log_append_time_to_max."""
    return reencode(view, **stamp)


def rewrite_log_append_time(view: BatchView, **stamp) -> PreparedBatch | None:
    """Case (b): every record gets the batch's maxTimestamp (baseTimestamp = max, deltas 0), bit cleared.
    Cheap (not deep) when uncompressed; deep when compressed."""
    return reencode(view, log_append_time_to_max=True, **stamp)


def convert_legacy(view: BatchView, **stamp) -> PreparedBatch | None:
    """Deep case (c): a magic 0/1 message (or compressed wrapper) as one v2 batch with the same codec."""
    return reencode(view, **stamp)


def convert_legacy_run(views: Sequence[BatchView], *, producer_id: int = NO_PRODUCER_ID,
                       producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                       transactional: bool = False) -> PreparedBatch | None:
    """Deep case (c) for consecutive legacy entries, in one v2 batch with the first entry's codec.

    An uncompressed magic 0/1 message set holds one message per entry; converting entry by entry would send
    one single-record batch per Produce. The caller bounds the run's size (target ``max.message.bytes``).
    """
    if any(v.magic >= 2 for v in views):
        raise ValueError("convert_legacy_run takes magic 0/1 entries only")
    records = [record for view in views for record in _legacy_records(view)]
    if not records:
        return None
    data = encode_batch(records, views[0].codec, producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional)
    return _prepared(data, records, records[0].offset, views[-1].next_offset, deep=True)


def trim(view: BatchView, start: int, end: int, **stamp) -> PreparedBatch | None:
    """Deep case (d): only the records with source offsets in [start, end); None if there are none."""
    return reencode(view, start=start, end=end, **stamp)


def logical_digest(views: Iterable[BatchView], *, log_append_time_to_max: bool = True,
                   digest_size: int = 16) -> str:
    """BLAKE2b over (visible timestamp, key/value/headers bytes) of every record, in order: equal for a source
    range and its re-encoded target, whatever the offsets, codec or batch boundaries. Control and empty
    batches carry no data and are skipped (aborted transactions are the caller's to filter out first)."""
    digest = hashlib.blake2b(digest_size=digest_size)
    for view in views:
        if view.magic >= 2 and (view.control or view.records_count == 0):
            continue
        for record in read_records(view, log_append_time_to_max=log_append_time_to_max):
            digest.update(struct.pack(">qI", record.timestamp, len(record.tail)))
            digest.update(record.tail)
    return digest.hexdigest()


def encode_record_tail(key: bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, bytes | None]] = ()) -> bytes:
    """The key/value/headers part of a v2 record (what :class:`SourceRecord` calls its tail)."""
    out = bytearray()
    for field in (key, value):
        if field is None:
            encode_varint(-1, out.append)
        else:
            encode_varint(len(field), out.append)
            out += field
    encode_varint(len(headers), out.append)
    for name, header_value in headers:
        raw = name.encode()
        encode_varint(len(raw), out.append)
        out += raw
        if header_value is None:
            encode_varint(-1, out.append)
        else:
            encode_varint(len(header_value), out.append)
            out += header_value
    return bytes(out)


def decode_record_tail(tail: bytes | memoryview) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """Inverse of :func:`encode_record_tail`: (key, value, headers)."""
    data = bytes(tail)

    def field(pos: int) -> tuple[bytes | None, int]:
        length, pos = decode_varint(data, pos)
        if length < 0:
            return None, pos
        return data[pos:pos + length], pos + length

    key, pos = field(0)
    value, pos = field(pos)
    count, pos = decode_varint(data, pos)
    headers = []
    for _ in range(count):
        name, pos = field(pos)
        header_value, pos = field(pos)
        headers.append(((name or b"").decode(), header_value))
    return key, value, headers
