"""Source log truncation, the pure parts: the fetcher's last fetched epoch (every batch it moves past counts), the
DivergingEpoch answer in both decoders becoming SourceTruncatedError with the diverged range, the
OffsetsForLeaderEpoch decision, the epoch a copy hands to its checkpoint, and group sync declining in the range."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, FetchResponse

from mirror_core.codec.batch_codec import PARTITION_LEADER_EPOCH_OFFSET, walk_batches
from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.codec.fetch_messages import EpochEndOffset, FetchTopicSpec, decode_fetch_response
from mirror_core.codec.kafka_primitives import uvarint
from mirror_core.engine.copier import CopyResult, FetchedOnce, _advance_end
from mirror_core.errors import SourceTruncatedError
from mirror_core.kafka.epochs import EpochEnd, check_truncation
from mirror_core.kafka.fetch_requests import kafka_python_fetch_request
from mirror_core.kafka.fetcher import FetchResult, RawBatchFetcher
from mirror_core.model.group_translation import translation_refusal
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import Checkpoint
from tests.unit.kafka.test_kafka_wire_pure import make_batch

pytestmark = pytest.mark.unit


def with_epoch(batch: bytes, epoch: int) -> bytes:
    """The batch with another partitionLeaderEpoch (outside the CRC, so it stays valid)."""
    out = bytearray(batch)
    struct.pack_into(">i", out, PARTITION_LEADER_EPOCH_OFFSET, epoch)
    return bytes(out)


def _fetcher(start: int, end: int | None = None, **kwargs) -> RawBatchFetcher:
    return RawBatchFetcher(SimpleNamespace(cluster_name="source"), "t", 0, start, end, **kwargs)


def _response(*raw: bytes, aborted=None, diverging=None):
    return SimpleNamespace(records=b"".join(raw), aborted_transactions=aborted, high_watermark=99,
                           last_stable_offset=99, log_start_offset=0, error_code=0, diverging_epoch=diverging)


# -- LastFetchedEpoch ------------------------------------------------------------------------------------------

def test_the_last_fetched_epoch_is_the_one_of_the_batch_just_below_the_position_markers_and_aborted_ones_too():
    fetcher = _fetcher(0)
    result = fetcher._accept(_response(
        with_epoch(make_batch(0, 2), 3),
        with_epoch(make_batch(2, 2, producer_id=7, transactional=True), 4),     # aborted: dropped, still counted
        with_epoch(make_batch(4, control=0, producer_id=7), 5),                   # its marker: never copied
        aborted=[SimpleNamespace(producer_id=7, first_offset=2)]))
    assert [b.base_offset for b in result.batches] == [0]
    assert fetcher.position == result.next_offset == 5
    assert fetcher.last_epoch == result.last_epoch == 5
    assert fetcher.spec(9).last_fetched_epoch == 5


def test_the_callers_epoch_is_sent_until_a_batch_moves_the_position():
    fetcher = _fetcher(10, last_epoch=4)
    assert fetcher.spec(0).last_fetched_epoch == 4
    fetcher._accept(_response(with_epoch(make_batch(8, 2), 2)))     # wholly below the position: not moved past
    assert (fetcher.position, fetcher.last_epoch) == (10, 4)
    fetcher._accept(_response(with_epoch(make_batch(10, 3), 6)))
    assert (fetcher.position, fetcher.last_epoch) == (13, 6)


def test_a_fetcher_without_an_epoch_sends_minus_one():
    assert _fetcher(0).spec(0).last_fetched_epoch == -1


def test_a_batch_past_the_range_end_does_not_give_its_epoch():
    fetcher = _fetcher(0, end=5, last_epoch=1)
    fetcher._accept(_response(with_epoch(make_batch(0, 3), 2), with_epoch(make_batch(5, 2), 3)))
    assert (fetcher.position, fetcher.last_epoch) == (5, 2)


@given(epoch=st.integers(-1, 2**31 - 1))
def test_kafka_pythons_request_carries_the_epoch(epoch):
    """(The hand-encoded request is byte-identical to this one: tests/unit/kafka/test_wire_fastpath.py.)"""
    fetcher = _fetcher(7, last_epoch=epoch)
    request = kafka_python_fetch_request([FetchTopicSpec("t", None, [fetcher.spec(1)])], max_wait_ms=1,
                                         max_bytes=1, isolation=1)
    request.API_VERSION = 12
    decoded = FetchRequest.decode(bytes(request.encode()), version=12)
    assert decoded.topics[0].partitions[0].last_fetched_epoch == epoch


# -- DivergingEpoch -----------------------------------------------------------------------------------------

def _diverging_response(epoch: int, end_offset: int, version: int) -> bytes:
    T = FetchResponse.FetchableTopicResponse
    P = T.PartitionData
    part = P(partition_index=0, error_code=0, high_watermark=60, last_stable_offset=60, log_start_offset=0,
             records=b"", diverging_epoch=P.EpochEndOffset(epoch=epoch, end_offset=end_offset))
    response = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0,
                             responses=[T(topic="t", topic_id=None, partitions=[part])])
    return bytes(response.encode(version=version))


@pytest.mark.parametrize("decoder", ["kafka-python", "fast path"])
def test_a_diverging_epoch_halts_naming_what_the_target_holds_that_the_source_lost(decoder):
    encoded = _diverging_response(0, 20, 12)
    if decoder == "kafka-python":
        data = FetchResponse.decode(encoded, version=12).responses[0].partitions[0]
    else:
        data = decode_fetch_response(12, memoryview(encoded)).responses[0].partitions[0]
    fetcher = _fetcher(40, last_epoch=0)
    with pytest.raises(SourceTruncatedError) as info:
        fetcher.handle(data)
    error = info.value
    assert (error.cluster, error.topic, error.partition, error.diverged_range) == ("source", "t", 0, (20, 40))
    assert "[20, 40)" in str(error) and "different records from 20 on" in str(error)
    assert fetcher.position == 40                      # nothing was accepted


@given(epoch=st.integers(-1, 2**31 - 1), end_offset=st.integers(-1, 2**62), version=st.integers(12, 18))
def test_the_fast_path_reads_diverging_epoch_like_kafka_python(epoch, end_offset, version):
    encoded = _diverging_response(epoch, end_offset, version)
    theirs = FetchResponse.decode(encoded, version=version).responses[0].partitions[0].diverging_epoch
    ours = decode_fetch_response(version, memoryview(encoded)).responses[0].partitions[0].diverging_epoch
    assert tuple(ours) == (theirs.epoch, theirs.end_offset)


def test_an_unknown_tagged_field_beside_diverging_epoch_is_skipped():
    frame = (struct.pack(">ihi", 0, 0, 0) + uvarint(2) + uvarint(2) + b"t" + uvarint(2)
             + struct.pack(">ihqqq", 0, 0, 9, 9, 0) + uvarint(0) + struct.pack(">i", -1) + uvarint(1)
             + uvarint(2)                                        # two tagged fields
             + uvarint(7) + uvarint(3) + b"xyz"                  # an unknown tag
             + uvarint(0) + uvarint(13) + struct.pack(">iq", 4, 17) + b"\x00"   # DivergingEpoch
             + b"\x00" + b"\x00")
    part = decode_fetch_response(12, memoryview(frame)).responses[0].partitions[0]
    assert part.diverging_epoch == (4, 17) and part.high_watermark == 9


# -- OffsetsForLeaderEpoch decision ----------------------------------------------------------------------------

@given(position=st.integers(1, 2**40), end=st.integers(0, 2**40), epoch=st.integers(0, 1000))
def test_a_position_is_valid_exactly_when_its_epoch_ends_at_or_after_it(position, end, epoch):
    answer = EpochEnd(epoch, end)
    if end >= position:
        check_truncation("c", "t", 0, position, epoch, answer)
    else:
        with pytest.raises(SourceTruncatedError) as info:
            check_truncation("c", "t", 0, position, epoch, answer)
        assert info.value.diverged_range == (end, position)


def test_a_source_that_knows_no_epoch_up_to_ours_is_a_truncation_at_an_unknown_point():
    with pytest.raises(SourceTruncatedError) as info:
        check_truncation("c", "t", 0, 40, 3, EpochEnd(-1, -1))
    assert info.value.diverged_range == (None, 40)
    assert "knows no leader epoch up to 3" in str(info.value)


# -- the epoch a copy hands to its checkpoint -----------------------------------------------------------------

def test_the_copy_end_takes_the_epoch_of_the_batch_just_below_it():
    result = CopyResult(PartitionRange("t", 0, 10, 50, "u", 0), source_start=10, source_end=10)
    _advance_end(result, 10, -1)
    assert result.source_end_epoch is None                 # nothing known yet
    _advance_end(result, 10, 2)
    assert (result.source_end, result.source_end_epoch) == (10, 2)
    _advance_end(result, 20, 3)
    _advance_end(result, 15, 9)                            # behind: ignored
    assert (result.source_end, result.source_end_epoch) == (20, 3)


def test_a_prepared_batch_keeps_its_source_epoch_on_both_paths():
    view = walk_batches(with_epoch(make_batch(0, 3), 7))[0][0]
    assert prepare_for_target(view).source_leader_epoch == 7
    assert prepare_for_target(view, exact_bounds=(1, 2)).source_leader_epoch == 7     # trimmed: the deep path


def test_fetched_once_gives_the_epoch_of_its_result():
    once = FetchedOnce(FetchResult([], 30, 30, 30, 0, last_epoch=5), 20)
    once.fetch()
    assert (once.position, once.last_epoch, once.done) == (30, 5, True)


# -- group sync --------------------------------------------------------------------------------------------

def test_group_offsets_from_the_diverged_start_on_are_not_translated():
    offset_map = OffsetMap.from_runs([OffsetRun(0, 40, 0)], start=0, position=40, target_next=40)
    cp = Checkpoint(pipeline="p", topic="t", partition=0, position=40, target_topic="u", target_partition=0,
                    target_next=40, owner="copy", owner_epoch=0, offset_map=offset_map, position_epoch=0)
    assert translation_refusal(cp, 19, (20, 40)) is None
    assert "[20, 40)" in translation_refusal(cp, 20, (20, 40))
    assert translation_refusal(cp, 39, (20, 40)) is not None
    assert translation_refusal(cp, 5, (None, 40)) is not None      # unknown point: nothing below is trusted
    assert translation_refusal(cp, 39) is None


def test_the_daemons_shared_fetch_keeps_a_diverging_partition_to_itself_as_a_halting_error():
    """(broker_fetch dispatches each partition's part to its fetcher: a truncated one fails alone, not retriable.)"""
    from mirror_core.kafka.broker_fetch import PartitionOutcome, _dispatch

    truncated, healthy = _fetcher(40, last_epoch=0), RawBatchFetcher(SimpleNamespace(cluster_name="source"), "t", 1, 0)
    response = SimpleNamespace(responses=[SimpleNamespace(topic="t", topic_id=None, partitions=[
        SimpleNamespace(partition_index=0, **vars(_response(diverging=EpochEndOffset(0, 20)))),
        SimpleNamespace(partition_index=1, **vars(_response(with_epoch(make_batch(0, 2), 1))))])])
    outcomes = [PartitionOutcome(), PartitionOutcome()]
    _dispatch(response, [(0, truncated), (1, healthy)], outcomes)
    assert isinstance(outcomes[0].error, SourceTruncatedError) and not outcomes[0].retriable
    assert outcomes[0].error.diverged_range == (20, 40)
    assert outcomes[1].error is None and healthy.position == 2 and healthy.last_epoch == 1
