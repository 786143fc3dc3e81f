"""Coalescing runs of small batches into one batch: the named deep case ``coalesced``, off by default.

Why: a v2 Produce request carries exactly one batch per partition, idempotence allows five requests in flight, and a
broker serves one request per connection at a time, so a partition of one-record batches (producers with
``linger.ms=0``) copies one record per request however fast Shoal is. Coalescing turns a run of such batches into
one batch of at most ``limit`` bytes, so the copy pays one request per run. It re-encodes records (and, for a
compressed run, decompresses and compresses again with the run's codec), which the shallow path never does
(DESIGN §3.7), hence opt-in (``CopyOptions.coalesce_bytes``, ``shoal copy --coalesce-small-batches``) and counted
like every deep case (``deep_batches``; ``PreparedBatch.coalesced`` and ``CopyResult.coalesced_batches`` count the
source batches merged).

What it keeps (DESIGN §3.1, §3.6): every record's key, value, headers and attributes byte for byte (each record's
*tail* is copied verbatim), every record's timestamp as consumers see it (a LogAppendTime batch's records carry its
``maxTimestamp`` when that is preserved, as in :mod:`mirror_core.codec.batch_deep`), the codec (a run's batches
share one compression codec, or none; uncompressed batches among compressed ones are the producer's choice when
compressing did not pay, as librdkafka does per batch, and join them), and the exact offset
map: a run is a contiguous stretch of source offsets (each batch dense, each starting where the one before ended),
so the merged batch's record ``i`` is source offset ``first + i`` and lands at target ``b' + i``. What changes: batch
boundaries, each record's offset delta and timestamp delta (hence its length prefix), and the header (one
baseTimestamp, CreateTime). Verification compares records as consumers see them (:mod:`mirror_core.kafka.verify`),
so it holds; the copy's records digest covers the merged sections as written.

Which batches join a run (:func:`joins_run`): magic 2, data (no control batch), dense (no compaction holes), inside
the copy's bounds (never a batch the caller would trim), and small: at least :data:`SMALL_PER_RUN` of them fit in
``limit``. A run ends at the first batch that does not join, at an offset gap (markers, aborted or deleted data in
between), where a second compression codec meets the run's, or before the merged batch could pass ``limit``
bytes; a run of one batch is not
re-encoded (the caller copies it shallow, as without coalescing). Every batch's CRC is verified before its records
are read.

Size bound: re-encoding adds at most :data:`RECORD_GROWTH` bytes to a record (its timestamp delta may grow from 1 to
10 bytes, its offset delta from 1 to 5, its length prefix by 1) and drops every header but the first, so an
uncompressed run is cut by :func:`coalesced_size_bound` before it could pass ``limit``. A compressed run is cut as
its batches are decompressed, once the records would pass :func:`compressed_body_cap`: the uncompressed size whose
worst-case expansion under any Kafka codec (snappy's 7/6 plus its block headers is the largest) still fits in
``limit``. Preflight asks the target's ``max.message.bytes`` for ``limit``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mirror_core.codec.batch_codec import (
    CODEC_MASK,
    CONTROL_BIT,
    RECORDS_OFFSET,
    V2_HEADER,
    BatchView,
    Codec,
    PreparedBatch,
    seal_crc,
    verify_crc,
)
from mirror_core.codec.batch_deep import compress, decompress, decompress_at_most, int64, v2_record_fields
from mirror_core.codec.kafka_primitives import uvarint

SMALL_PER_RUN = 8                    # a batch is small when at least this many of its size fit in the limit
RECORD_GROWTH = 16                   # bytes re-encoding may add to one record (at most 14: 9 + 4 + 1)
_COMPRESSION_SLACK = 256             # frame and block headers of a compressed body (lz4, snappy/xerial, gzip, zstd)


def coalesced_size_bound(view: BatchView) -> int:
    """Bytes an uncompressed ``view`` can add to a merged batch at most (its records, each grown by
    :data:`RECORD_GROWTH`); for a compressed one, the same figure over its compressed section (a first guess only:
    :func:`coalesce_items` cuts compressed runs by their decompressed size)."""
    return view.size - RECORDS_OFFSET + RECORD_GROWTH * view.records_count


def compressed_body_cap(limit: int) -> int:
    """Uncompressed records a compressed merged batch may hold: compressed by any Kafka codec, even data that does not
    compress (snappy: at most 7/6 of the input plus block headers), they stay within ``limit`` with the header."""
    return (limit - RECORDS_OFFSET - _COMPRESSION_SLACK) * 6 // 7


def joins_run(view: BatchView, limit: int, lo: int | None = None, hi: int | None = None) -> bool:
    """Whether ``view`` may be merged with its neighbours (see the module docstring); ``[lo, hi)`` are the copy's
    trimming bounds (None: not trimmed on that side)."""
    return (view.magic == 2 and not view.attributes & CONTROL_BIT and view.records_count > 0
            and view.last_offset_delta + 1 == view.records_count
            and (lo is None or view.base_offset >= lo) and (hi is None or view.next_offset <= hi)
            and SMALL_PER_RUN * (RECORDS_OFFSET + coalesced_size_bound(view)) <= limit)


def split_runs(views: Sequence[BatchView], limit: int, lo: int | None = None,
               hi: int | None = None) -> list[BatchView | list[BatchView]]:
    """``views`` in order with every run of two or more joining batches replaced by a list of them (uncompressed
    batches and batches of at most one compression codec); an uncompressed list's :func:`coalesced_size_bound` total
    plus one header stays within ``limit`` (a list holding compressed batches is cut by :func:`coalesce_items`)."""
    out: list[BatchView | list[BatchView]] = []
    run: list[BatchView] = []
    run_bytes = 0
    run_codec = 0   # the run's compression codec (0: none so far)
    for view in views:
        if joins_run(view, limit, lo, hi):
            grows = coalesced_size_bound(view)
            codec = view.attributes & CODEC_MASK
            # an uncompressed run is cut here by its exact bound; a compressed one as it is decompressed
            # (coalesce_items), its compressed sizes saying little about its records'
            if run and (view.base_offset != run[-1].next_offset or (codec and run_codec and codec != run_codec)
                        or (not codec and not run_codec and RECORDS_OFFSET + run_bytes + grows > limit)):
                out.append(run if len(run) > 1 else run[0])
                run, run_bytes, run_codec = [], 0, 0
            run.append(view)
            run_bytes += grows
            run_codec = run_codec or codec
            continue
        if run:
            out.append(run if len(run) > 1 else run[0])
            run, run_bytes, run_codec = [], 0, 0
        out.append(view)
    if run:
        out.append(run if len(run) > 1 else run[0])
    return out


def coalesce_items(views: Sequence[BatchView], limit: int, lo: int | None = None, hi: int | None = None, *,
                   log_append_time_to_max: bool = True) -> Iterator[BatchView | PreparedBatch]:
    """``views`` in order with every run merged into a :class:`PreparedBatch` of at most ``limit`` bytes (its
    ``coalesced`` says how many batches it holds); the batches left alone stay views, for the caller's shallow path.
    A generator: each merged batch is built when the caller asks for it, so a caller that writes and drops its
    batches holds one merged batch beyond them, never an answer's worth (DESIGN §3.8). Raises
    :class:`CorruptBatchError` naming the source offset of a batch that fails its CRC or does not parse."""
    for item in split_runs(views, limit, lo, hi):
        if item.__class__ is not list:
            yield item
        elif not any(view.compressed for view in item):
            yield coalesce(item, log_append_time_to_max=log_append_time_to_max)
        else:
            yield from _merge_compressed(item, limit, log_append_time_to_max)


def _merge_compressed(run: list[BatchView], limit: int,
                      log_append_time_to_max: bool) -> Iterator[BatchView | PreparedBatch]:
    """Merge a compressed run into batches whose decompressed records stay within :func:`compressed_body_cap`.
    Learning a compressed batch's size means decompressing it, never past ``1 / SMALL_PER_RUN`` of the cap
    (:func:`~mirror_core.codec.batch_deep.decompress_at_most`): one that turns out not small ends the group and is
    copied as it is; that bounded decompression is the only work spent on a batch that is not merged."""
    cap = compressed_body_cap(limit)
    group: list[tuple[BatchView, memoryview]] = []
    body = 0
    for view in run:
        verify_crc(view)
        section = decompress_at_most(view, cap // SMALL_PER_RUN)   # never more: one record may be 64 MiB of zeros
        grows = 0 if section is None else len(section) + RECORD_GROWTH * view.records_count
        if section is None or SMALL_PER_RUN * grows > cap:   # not small after all: alone, as it is
            yield from _close(group, limit, log_append_time_to_max)
            group, body = [], 0
            yield view
            continue
        if group and body + grows > cap:
            yield from _close(group, limit, log_append_time_to_max)
            group, body = [], 0
        group.append((view, section))
        body += grows
    yield from _close(group, limit, log_append_time_to_max)


def _close(group: list[tuple[BatchView, memoryview]], limit: int,
           log_append_time_to_max: bool) -> Iterator[BatchView | PreparedBatch]:
    if len(group) == 1:
        yield group[0][0]   # alone: copied as it is
        return
    if not group:
        return
    merged = _encode(group, log_append_time_to_max)
    if len(merged.data) > limit:   # cannot happen within compressed_body_cap; if it did, copy them as they are
        yield from (view for view, _ in group)
        return
    yield merged


def coalesce(views: Sequence[BatchView], *, log_append_time_to_max: bool = True) -> PreparedBatch:
    """One dense v2 batch (baseOffset 0, CreateTime, the run's codec, no producer fields: the writer stamps them)
    holding the records of ``views`` in order; ``views`` must be a run (each joins, at most one compression codec,
    each starting where the one before ended). Raises :class:`CorruptBatchError` naming the source offset of a batch
    whose CRC or records do not parse; ``ValueError`` for a list that is not a run (a caller's bug)."""
    if not views:
        raise ValueError("coalesce needs at least one batch")
    sections = []
    for view in views:
        verify_crc(view)
        sections.append((view, decompress(view)))
    return _encode(sections, log_append_time_to_max)


def _encode(sections: Sequence[tuple[BatchView, memoryview]], log_append_time_to_max: bool) -> PreparedBatch:
    first = sections[0][0]
    codec = next((view.attributes & CODEC_MASK for view, _ in sections if view.attributes & CODEC_MASK), 0)
    base_ts = None
    max_ts = None
    count = 0
    body = bytearray(0 if codec else RECORDS_OFFSET)   # uncompressed: the records follow the header in place
    expected = first.base_offset
    for view, data in sections:
        if view.base_offset != expected or view.magic != 2 or view.attributes & CONTROL_BIT or \
                view.last_offset_delta + 1 != view.records_count or view.attributes & CODEC_MASK not in (0, codec):
            raise ValueError(f"the batch at offset {view.base_offset} does not continue a run at {expected}")
        expected = view.next_offset
        for _delta, timestamp, attributes, tail in v2_record_fields(view, data, log_append_time_to_max):
            if base_ts is None:
                base_ts = max_ts = timestamp
            elif timestamp > max_ts:
                max_ts = timestamp
            head = bytearray((attributes,))
            head += _zigzag(int64(timestamp - base_ts))   # as Java reads it: base + delta wraps back to it
            head += _zigzag(count)
            body += _zigzag(len(head) + len(tail))
            body += head
            body += tail
            count += 1
    if codec:
        out = bytearray(RECORDS_OFFSET)
        out += compress(Codec(codec), body)
    else:
        out = body
    V2_HEADER.pack_into(out, 0, 0, len(out) - 12, -1, 2, 0, codec, count - 1, base_ts, max_ts, -1, -1, -1, count)
    seal_crc(out, 0, len(out))
    return PreparedBatch(out, count, first.base_offset, expected, deep=True, records_identical=False,
                         source_leader_epoch=sections[-1][0].partition_leader_epoch, coalesced=len(sections))


def _encode_zigzag(value: int) -> bytes:
    """``value`` (signed 64-bit) as a zig-zag varint."""
    return uvarint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


_TABLE_SIZE = 8192   # offset deltas of a 64 KiB run and most timestamp deltas: looked up, not computed
_ZIGZAG_TABLE = [_encode_zigzag(n) for n in range(_TABLE_SIZE)]


def _zigzag(value: int) -> bytes:
    """``value`` as a zig-zag varint (signed 64-bit)."""
    return _ZIGZAG_TABLE[value] if 0 <= value < _TABLE_SIZE else _encode_zigzag(value)
