"""Preparing a batch for the target: re-stamp its header (the *shallow* path) or hand it to the named deep cases.

Shoal copies record batches whole: the header is re-stamped for the target (base offset, leader epoch, producer
fields, transactional bit, attribute bits the target must not inherit) and its CRC resealed, while the records
section stays byte-identical, so a record at source offset ``b + d`` lands at target ``b' + d``.
:func:`prepare_for_target` decides, per batch, whether that is enough; the cases that must decode records are in
:mod:`mirror_core.codec.batch_deep`. The writer stamps its producer fields last (:func:`stamp_whole_batch`;
:func:`stamp_producer_in_place` for a batch inside a larger buffer). The batch layout is in
:mod:`mirror_core.codec.batch_codec`. Pure: no I/O.
"""

from __future__ import annotations

import struct

from mirror_core.codec.batch_codec import (
    ATTRIBUTES,
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    LOG_APPEND_TIME_BIT,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PRODUCER_FIELDS,
    PRODUCER_ID_OFFSET,
    RECORDS_OFFSET,
    TRANSACTIONAL_BIT,
    V2_HEADER,
    BatchKind,
    BatchView,
    PreparedBatch,
    batch_end,
    seal_crc,
    verify_crc,
)


def target_attributes(source_attributes: int, *, transactional: bool, clear_delete_horizon: bool = True,
                      clear_log_append_time: bool = False) -> int:
    attributes = source_attributes & ~TRANSACTIONAL_BIT
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if clear_delete_horizon:
        attributes &= ~DELETE_HORIZON_BIT
    if clear_log_append_time:
        attributes &= ~LOG_APPEND_TIME_BIT
    return attributes


def stamp_producer_in_place(buf: bytearray, pos: int = 0, *, producer_id: int, producer_epoch: int,
                            base_sequence: int, transactional: bool) -> None:
    """Write the producer fields of the v2 batch at ``buf[pos:]`` and reseal its CRC; no copy.

    Sets producerId, producerEpoch, baseSequence and the transactional bit; every other attribute bit, the
    baseOffset and the leader epoch stay as they are (:func:`prepare_for_target` already wrote the target's),
    and the records section is not touched.
    """
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    found = batch_end(memoryview(buf), pos)
    if found is None:
        raise ValueError(f"no complete batch at position {pos} of a {len(buf)}-byte buffer")
    size, magic = found
    if magic != 2:
        raise ValueError(f"cannot stamp producer fields into a magic-{magic} batch")
    _write_producer_fields(buf, pos, size, producer_id, producer_epoch, base_sequence, transactional)


def _write_producer_fields(buf, pos: int, size: int, producer_id: int, producer_epoch: int, base_sequence: int,
                           transactional: bool) -> None:
    """The stamp itself, of the checked v2 batch ``buf[pos:pos + size]``: the transactional bit (every other
    attribute bit kept), producerId, producerEpoch, baseSequence, and the CRC resealed."""
    (attributes,) = ATTRIBUTES.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    ATTRIBUTES.pack_into(buf, pos + ATTRIBUTES_OFFSET,
                         attributes | TRANSACTIONAL_BIT if transactional else attributes & ~TRANSACTIONAL_BIT)
    PRODUCER_FIELDS.pack_into(buf, pos + PRODUCER_ID_OFFSET, producer_id, producer_epoch, base_sequence)
    seal_crc(buf, pos, size)


BATCH_LENGTH = struct.Struct(">i")


def stamp_whole_batch(buf: bytearray | memoryview, *, producer_id: int, producer_epoch: int, base_sequence: int,
                      transactional: bool) -> None:
    """:func:`stamp_producer_in_place` of a buffer that is exactly one whole magic-2 batch, as every batch handed to
    the writer is (checked once when it was given, ``writer._check_ready``): the same bytes, without finding and
    checking the batch again on each (re)send; the one-record-batch copy stamps once per Produce request."""
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    # what _check_ready saw, checked again at the cost of one unpack: a buffer that is not exactly one v2 batch
    # (a caller that skipped the check) is refused here rather than sealed whole and refused by the broker
    if len(buf) < RECORDS_OFFSET or buf[MAGIC_OFFSET] != 2 or \
            BATCH_LENGTH.unpack_from(buf, BATCH_LENGTH_OFFSET)[0] + LOG_OVERHEAD != len(buf):
        raise ValueError(f"a {len(buf)}-byte buffer that is not exactly one magic-2 batch cannot be stamped whole")
    _write_producer_fields(buf, 0, len(buf), producer_id, producer_epoch, base_sequence, transactional)


def rewrite_header_into(view: BatchView, out: bytearray, pos: int = 0, *, producer_id: int = NO_PRODUCER_ID,
                        producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                        transactional: bool = False, base_offset: int = 0, partition_leader_epoch: int = -1,
                        clear_delete_horizon: bool = True, clear_log_append_time: bool = False) -> int:
    """Write the re-stamped copy of ``view`` into ``out`` at ``pos`` (``out`` grows if it ends before the
    batch does); return the position after it.

    Copies the batch once, packs one header, recomputes the CRC: no per-record work. The records section
    stays byte-identical. baseTimestamp is kept even when the delete-horizon bit is cleared: Kafka derives
    record timestamps as baseTimestamp + delta whether or not the bit is set (the cleaner wrote the deltas
    relative to the horizon), so the records keep their timestamps; only the target cleaner's horizon is
    dropped.
    """
    if view.magic != 2:
        raise ValueError(f"cannot shallow-rewrite a magic-{view.magic} batch at offset {view.base_offset}")
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    if pos > len(out):
        raise ValueError(f"position {pos} is past the end of a {len(out)}-byte buffer")
    end = pos + view.size
    out[pos:end] = view.buffer
    attributes = target_attributes(view.attributes, transactional=transactional,
                                   clear_delete_horizon=clear_delete_horizon,
                                   clear_log_append_time=clear_log_append_time)
    V2_HEADER.pack_into(out, pos, base_offset, view.batch_length, partition_leader_epoch, 2, 0, attributes,
                        view.last_offset_delta, view.base_timestamp, view.max_timestamp, producer_id,
                        producer_epoch, base_sequence, view.records_count)
    seal_crc(out, pos, view.size)
    return end


def rewrite_header_in_place(view: BatchView, *, producer_id: int = NO_PRODUCER_ID,
                            producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                            transactional: bool = False, base_offset: int = 0, partition_leader_epoch: int = -1,
                            clear_delete_horizon: bool = True, clear_log_append_time: bool = False) -> memoryview:
    """Re-stamp ``view``'s header in its own buffer (a writable view, e.g. into a fast-path Fetch frame) and
    return that buffer: the same result as :func:`rewrite_header` without copying the batch.

    The header is packed from ``view``'s parsed fields, not re-read from the buffer, so stamping the same view
    again gives the same bytes; but the buffer no longer holds the source's header afterwards (its CRC no longer
    matches ``view.crc``): only the owner of the buffer, done with the source bytes, may ask for this."""
    if view.magic != 2:
        raise ValueError(f"cannot shallow-rewrite a magic-{view.magic} batch at offset {view.base_offset}")
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    buf = view.buffer
    if buf.readonly:
        raise ValueError(f"the batch at offset {view.base_offset} is in a read-only buffer: rewrite a copy")
    attributes = target_attributes(view.attributes, transactional=transactional,
                                   clear_delete_horizon=clear_delete_horizon,
                                   clear_log_append_time=clear_log_append_time)
    V2_HEADER.pack_into(buf, 0, base_offset, view.batch_length, partition_leader_epoch, 2, 0, attributes,
                        view.last_offset_delta, view.base_timestamp, view.max_timestamp, producer_id,
                        producer_epoch, base_sequence, view.records_count)
    seal_crc(buf, 0, view.size)
    return buf


def rewrite_header(view: BatchView, *, producer_id: int = NO_PRODUCER_ID,
                   producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                   transactional: bool = False, base_offset: int = 0,
                   partition_leader_epoch: int = -1, clear_delete_horizon: bool = True,
                   clear_log_append_time: bool = False) -> bytearray:
    """A new v2 batch: ``view``'s records section byte-identical, header re-stamped (see
    :func:`rewrite_header_into`)."""
    out = bytearray(view.size)
    rewrite_header_into(view, out, 0, producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional, base_offset=base_offset,
                        partition_leader_epoch=partition_leader_epoch,
                        clear_delete_horizon=clear_delete_horizon,
                        clear_log_append_time=clear_log_append_time)
    return out


def usual_shallow(view: BatchView, preserve_log_append_time: bool,
                  exact_bounds: tuple[int | None, int | None] | None) -> bool:
    """Whether ``view`` is the usual batch :func:`prepare_for_target` rewrites shallowly, decided in one test (a
    magic-2 data batch with records, dense, no LogAppendTime to keep, inside the bounds). False also for some
    shallow batches: the full decision then runs (so this never decides differently; tested)."""
    attributes, count = view.attributes, view.records_count
    if view.magic != 2 or attributes & CONTROL_BIT or count <= 0 or view.last_offset_delta + 1 != count:
        return False
    if preserve_log_append_time and attributes & LOG_APPEND_TIME_BIT:
        return False
    if exact_bounds is None:
        return True
    lo, hi = exact_bounds
    return (lo is None or view.base_offset >= lo) and (hi is None or view.base_offset + count <= hi)


def _shallow(view: BatchView, in_place: bool, stamp: dict) -> PreparedBatch:
    """The shallow header rewrite of :func:`prepare_for_target` (in the fetched buffer when ``in_place`` allows)."""
    rewrite = rewrite_header_in_place if in_place and not view.buffer.readonly else rewrite_header
    data = rewrite(view, clear_log_append_time=True, **stamp)
    return PreparedBatch(data, view.records_count, view.base_offset, view.next_offset,
                         source_leader_epoch=view.partition_leader_epoch)


def prepare_for_target(view: BatchView, *, preserve_log_append_time: bool = True,
                       producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                       base_sequence: int = NO_SEQUENCE, transactional: bool = False,
                       exact_bounds: tuple[int | None, int | None] | None = None,
                       check_crc: bool = True, in_place: bool = False) -> PreparedBatch | None:
    """Decide how ``view`` reaches the target and do it; None means skip (control marker, empty batch, or
    nothing inside ``exact_bounds``).

    Shallow header rewrite unless a named case needs more: legacy magic, offset holes, a compressed
    LogAppendTime batch (when preserving what consumers saw), or a batch straddling ``exact_bounds`` =
    [start, end) are decoded (``deep=True``); a None bound is not trimmed (``(start, None)`` trims only the
    head below ``start``: a copy resuming inside a batch). An uncompressed LogAppendTime batch gets a cheap
    record-level timestamp rewrite. With ``preserve_log_append_time=False`` the LogAppendTime bit is simply cleared, so
    consumers of the target see the producers' create times. Raises :class:`CorruptBatchError` on a CRC
    mismatch when ``check_crc``.

    ``in_place``: a shallow batch whose buffer is writable (a fast-path Fetch frame) is re-stamped in that buffer
    (:func:`rewrite_header_in_place`) instead of a copy, and ``data`` is that view: for a caller that owns the
    fetched buffer and never reads its source bytes again. Read-only buffers and the deep cases get new buffers
    as without it.
    """
    if check_crc:
        verify_crc(view)
    stamp = {"producer_id": producer_id, "producer_epoch": producer_epoch, "base_sequence": base_sequence,
             "transactional": transactional}
    if usual_shallow(view, preserve_log_append_time, exact_bounds):   # one test for the usual batch
        return _shallow(view, in_place, stamp)
    kind = view.classify()
    if kind is BatchKind.CONTROL or kind is BatchKind.EMPTY:
        return None
    is_legacy = kind is BatchKind.LEGACY
    lo, hi = exact_bounds if exact_bounds is not None else (None, None)
    straddles = (lo is not None and view.base_offset < lo) or (hi is not None and view.next_offset > hi)
    rewrite_timestamps = preserve_log_append_time and view.log_append_time
    needs_reencode = is_legacy or straddles or view.has_offset_holes or rewrite_timestamps
    if not needs_reencode:
        return _shallow(view, in_place, stamp)

    from mirror_core.codec import batch_deep  # batch_deep builds on this module; only this path needs it
    # a legacy wrapper's offset field is its last offset, so its straddling is only known once decoded
    start, end = (lo, hi) if straddles or is_legacy else (None, None)
    prepared = batch_deep.reencode(view, start=start, end=end, log_append_time_to_max=rewrite_timestamps, **stamp)
    return None if prepared is None else prepared._replace(source_leader_epoch=view.partition_leader_epoch)
