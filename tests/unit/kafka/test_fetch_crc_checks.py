"""Which batches a fetch answer hands over unchecked (``RawBatchFetcher.check_crcs``, the Java consumer's
``check.crcs``). A reader that decodes records — the checkpoint store, the landing check's target records, first
timestamps — gets only batches whose CRC matches: a checkpoint value with one bit changed on the disk (a digit of
its position) would otherwise resume the lane at another offset without an error. A copy opts out: it checks every
batch it writes when it prepares it. Pure."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.errors import CorruptBatchError
from mirror_core.kafka.fetcher import RawBatchFetcher
from tests.unit.kafka.test_kafka_wire_pure import make_batch

pytestmark = pytest.mark.unit


class _Client:
    cluster_name = "target"


def _answer(*batches: bytes, aborted=None) -> SimpleNamespace:
    records = b"".join(batches)
    return SimpleNamespace(records=records, aborted_transactions=aborted, high_watermark=20, last_stable_offset=20,
                           log_start_offset=0, error_code=0)


def _value_byte_flipped(base: int, count: int, **kw) -> bytes:
    raw = bytearray(make_batch(base, count, **kw))
    raw[-1] ^= 0x01          # the last record's last byte (its value or headers): under the CRC, outside the header
    return bytes(raw)


# the one-pass walk (no aborted transaction listed), the general rules (one listed), and a raw log reader
WALKS = {"one-pass walk": ({}, None), "general rules": ({}, [SimpleNamespace(producer_id=9, first_offset=0)]),
         "every batch": ({"every_batch": True}, None)}


@pytest.mark.parametrize("walk", WALKS)
def test_a_reader_is_never_handed_a_batch_whose_bytes_changed(walk):
    kwargs, aborted = WALKS[walk]
    data = _answer(make_batch(10, 2), _value_byte_flipped(12, 3), make_batch(15, 1), aborted=aborted)
    fetcher = RawBatchFetcher(_Client(), "shoal-checkpoints", 0, 10, 20, **kwargs)
    with pytest.raises(CorruptBatchError, match="offset 12.*CRC-32C mismatch"):
        fetcher._accept(data)
    assert fetcher.position == 10 and fetcher.last_epoch == -1   # nothing moved: a retry reads it again


def test_a_raw_log_reader_is_never_handed_a_marker_whose_bytes_changed():
    marker = bytearray(make_batch(12, 1, producer_id=7, transactional=True, control=1))
    marker[-1] ^= 0x01
    data = _answer(make_batch(10, 2), bytes(marker))
    fetcher = RawBatchFetcher(_Client(), "shoal-checkpoints", 0, 10, 20, every_batch=True)
    with pytest.raises(CorruptBatchError, match="offset 12"):
        fetcher._accept(data)


@pytest.mark.parametrize("walk", ["one-pass walk", "general rules"])
def test_a_copy_takes_the_batch_unchecked_and_its_preparation_refuses_it(walk):
    """``check_crcs=False`` (``shoal copy``, backfill units, the daemon): the batch is passed on, and the copier's
    ``prepare_for_target`` — which every batch it writes goes through — is what refuses it."""
    _, aborted = WALKS[walk]
    data = _answer(make_batch(10, 2), _value_byte_flipped(12, 3), aborted=aborted)
    fetcher = RawBatchFetcher(_Client(), "orders", 0, 10, 20, check_crcs=False)
    result = fetcher._accept(data)
    assert [b.base_offset for b in result.batches] == [10, 12] and fetcher.position == 15
    with pytest.raises(CorruptBatchError, match="offset 12"):
        prepare_for_target(result.batches[1])


def test_intact_batches_pass_the_check_on_every_walk():
    for kwargs, aborted in WALKS.values():
        data = _answer(make_batch(10, 2), make_batch(12, 3, producer_id=7), make_batch(15, 1), aborted=aborted)
        fetcher = RawBatchFetcher(_Client(), "shoal-checkpoints", 0, 10, 20, **kwargs)
        assert [b.base_offset for b in fetcher._accept(data).batches] == [10, 12, 15] and fetcher.position == 16


# ---- baseOffset lies outside the CRC: across answers ----------------------------------------------------------------

def _moved(base: int, count: int, to: int) -> bytes:
    raw = bytearray(make_batch(base, count))
    struct.pack_into(">q", raw, 0, to)   # the CRC still matches: baseOffset is not under it
    return bytes(raw)


@pytest.mark.parametrize("walk", WALKS)
def test_an_answer_beginning_below_where_the_batch_before_it_ended_halts_the_fetch(walk):
    """The previous answer's last batch [10, 15) read as [26, 31) (bit 4 of its base offset): the position moved to
    31 and offsets 15..30 would be skipped for good. The next answer, from 31, begins with the batch holding 31
    ([30, 35)), below 31: in a log, batches never overlap, so one of the two baseOffsets is damaged."""
    kwargs, aborted = WALKS[walk]
    fetcher = RawBatchFetcher(_Client(), "orders", 0, 0, None, check_crcs=False, **kwargs)
    fetcher._accept(_answer(make_batch(0, 10), _moved(10, 5, 26), aborted=aborted))
    assert fetcher.position == 31
    with pytest.raises(CorruptBatchError, match=r"offset 30.*below offset 31.*as \[26, 31\)"):
        fetcher._accept(_answer(make_batch(30, 5), aborted=aborted))
    assert fetcher.position == 31


@pytest.mark.parametrize("walk", WALKS)
def test_answers_that_continue_at_or_past_the_batch_end_pass(walk):
    """A compaction gap (the next batch begins past the position) and the usual continuation pass; so does a first
    answer whose batch straddles a position the caller chose (a resume inside a batch)."""
    kwargs, aborted = WALKS[walk]
    fetcher = RawBatchFetcher(_Client(), "orders", 0, 12, None, **kwargs)
    fetcher._accept(_answer(make_batch(10, 5), aborted=aborted))            # straddles 12: the caller's position
    fetcher._accept(_answer(make_batch(15, 5), aborted=aborted))            # continues at 15
    fetcher._accept(_answer(make_batch(40, 2), aborted=aborted))            # a gap: compacted away
    assert fetcher.position == 42


def test_a_range_end_inside_a_batch_is_not_a_batch_end():
    """A position moved to a range end (the answer went past it) is not where a batch ended: the next range's
    fetcher is another one, and this one's next answer may hold the straddling batch again."""
    fetcher = RawBatchFetcher(_Client(), "orders", 0, 0, 12, check_crcs=False)
    fetcher._accept(_answer(make_batch(0, 10), make_batch(10, 5), make_batch(15, 5)))
    assert fetcher.position == 15 and fetcher._ended_batch == (10, 15)
    fetcher = RawBatchFetcher(_Client(), "orders", 0, 0, 10, check_crcs=False)
    fetcher._accept(_answer(make_batch(0, 8), make_batch(12, 3)))    # a gap, then a batch past the end
    assert fetcher.position == 10 and fetcher._ended_batch is None
