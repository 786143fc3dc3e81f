"""Which batches a fetch answer hands over unchecked (``RawBatchFetcher.check_crcs``, the Java consumer's
``check.crcs``). A reader that decodes records — the checkpoint store, the landing check's target records, first
timestamps — gets only batches whose CRC matches: a checkpoint value with one bit changed on the disk (a digit of
its position) would otherwise resume the lane at another offset without an error. A copy opts out: it checks every
batch it writes when it prepares it. Pure."""

from __future__ import annotations

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
