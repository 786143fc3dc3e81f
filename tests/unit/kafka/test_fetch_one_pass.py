"""The one-pass walk of the usual fetch answer (:func:`walk_v2_data`, ``RawBatchFetcher._accept_plain``) against the
general rules it stands in for (``_accept_general``: :func:`walk_batches`, :func:`select_committed`,
:func:`batches_reaching_below`): over generated answers — control and transactional batches, gaps, a range end
anywhere, a cut-off tail, and the unusual ones (legacy or unknown magic, overlapping or backward offsets, a negative
lastOffsetDelta) — the fast path gives the same batches, position and epoch, or steps aside. Pure."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mirror_core.errors import MirrorError
from mirror_core.kafka.fetcher import RawBatchFetcher, kept_bytes_of
from tests.unit.kafka.test_kafka_wire_pure import make_batch

pytestmark = pytest.mark.unit


class _Client:
    cluster_name = "source"


def _batch(base: int, count: int, *, epoch: int, control: bool, transactional: bool, delta: int | None,
           magic: int) -> bytes:
    raw = bytearray(make_batch(base, count, producer_id=7 if transactional or control else -1,
                               transactional=transactional, control=1 if control else None))
    struct.pack_into(">i", raw, 12, epoch)
    if delta is not None:
        struct.pack_into(">i", raw, 23, delta)
    raw[16] = magic
    return bytes(raw)


batch_specs = st.lists(st.fixed_dictionaries({
    "gap": st.sampled_from([0, 0, 0, 1, 4]),
    "count": st.integers(1, 3),
    "epoch": st.integers(-2, 3),   # -2: what no broker sends, the rules still read as unknown
    "control": st.booleans(),
    "transactional": st.booleans(),
}), min_size=0, max_size=8)

# "flipped-control": a data batch whose control bit flipped on the source's disk (its CRC no longer matches); the
# rest step the fast path aside
oddities = st.sampled_from([None] * 6 + ["legacy", "magic3", "overlap", "negative-delta", "short", "flipped-control",
                                         "flipped-control"])


def _answer(specs, first: int, oddity, odd_at: int, tail: int):
    parts, base = [], first
    for i, spec in enumerate(specs):
        base += spec["gap"]
        odd = oddity if i == odd_at % max(1, len(specs)) else None
        at = base - 2 if odd == "overlap" and i else base
        raw = _batch(at, spec["count"], epoch=spec["epoch"], control=spec["control"],
                     transactional=spec["transactional"], delta=-2 if odd == "negative-delta" else None,
                     magic={"legacy": 1, "magic3": 3}.get(odd, 2))
        if odd == "short":
            raw = raw[:8] + struct.pack(">i", 20) + raw[12:]
        if odd == "flipped-control":
            raw = raw[:22] + bytes([raw[22] | 0x20]) + raw[23:]   # attributes' low byte; the CRC left as it was
        parts.append(raw)
        base = at + (1 if spec["control"] else spec["count"])
    if tail:
        cut = _batch(base, 2, epoch=0, control=False, transactional=False, delta=None, magic=2)
        parts.append(cut[:min(tail, len(cut) - 1)])
    return b"".join(parts)


def _outcome(fetcher, accept, data, section):
    try:
        result = accept(fetcher, data, section)
    except MirrorError as exc:  # CorruptBatchError, FetchError: the general rules' refusals
        return ("raised", type(exc).__name__, str(exc))
    if result is None:
        return None
    return ([(b.base_offset, bytes(b.buffer), b[1:]) for b in result.batches], result.next_offset,
            result.last_epoch, result.frame_bytes, fetcher.position, fetcher.last_epoch, kept_bytes_of(result))


_PLAIN = {"gap": 0, "epoch": 1, "control": False, "transactional": False}


@settings(max_examples=800, deadline=None)
@given(batch_specs, st.integers(0, 50), oddities, st.integers(0, 7), st.sampled_from([0, 0, 5, 30, 200]),
       st.integers(-3, 40), st.one_of(st.none(), st.integers(0, 12), st.integers(0, 60)), st.integers(-1, 2))
# a batch beginning exactly at the end; an answer going backwards (a batch inside the one before it)
@example([{**_PLAIN, "count": 3}, {**_PLAIN, "count": 2}], 10, None, 0, 0, 0, 3, -1)
@example([{**_PLAIN, "count": 3}, {**_PLAIN, "count": 1}], 10, "overlap", 1, 0, 0, None, -1)
def test_the_one_pass_walk_takes_what_the_general_rules_take(specs, first, oddity, odd_at, tail, position_delta, end,
                                                              epoch_before):
    records = _answer(specs, first, oddity, odd_at, tail)
    position = max(0, first + position_delta)
    if end is not None:
        end = position + end
    data = SimpleNamespace(records=records, aborted_transactions=None, high_watermark=999, last_stable_offset=999,
                           log_start_offset=0)

    def fetcher():
        return RawBatchFetcher(_Client(), "t", 0, position, end, last_epoch=epoch_before)

    plain_fetcher, general_fetcher = fetcher(), fetcher()
    section = memoryview(records)
    plain = _outcome(plain_fetcher, RawBatchFetcher._accept_plain, data, section)
    general = _outcome(general_fetcher, RawBatchFetcher._accept_general, data, section)
    if plain is None:
        # stepping aside is allowed only for an answer that is not the usual one
        usual = oddity in (None, "flipped-control") and not (tail and not specs)
        assert not usual, (specs, first, tail, position, end)
        return
    assert plain == general   # the same batches, position and epoch, or the same refusal (a corrupt marker)
    if plain[0] != "raised":   # the bytes the walk counted are the kept views' sizes (the memory budget's figure)
        assert plain[-1] == sum(len(raw) for _, raw, _ in plain[0])
    assert plain_fetcher.position == general_fetcher.position


def test_the_fetcher_takes_the_one_pass_walk_only_for_an_answer_without_aborted_transactions():
    records = make_batch(10, 2) + make_batch(12, 1, producer_id=7, transactional=True) + make_batch(13, 1)
    aborted = [SimpleNamespace(producer_id=7, first_offset=12)]
    for listed, expected in ((None, [10, 12, 13]), (aborted, [10, 13])):
        data = SimpleNamespace(records=records, aborted_transactions=listed, high_watermark=14,
                               last_stable_offset=14, log_start_offset=0, error_code=0)
        fetcher = RawBatchFetcher(_Client(), "t", 0, 10, 20)
        result = fetcher._accept(data)
        assert [b.base_offset for b in result.batches] == expected and fetcher.position == 14


def test_a_marker_or_aborted_batch_whose_bytes_changed_halts_the_fetch_instead_of_vanishing():
    """Batches dropped unread (a marker, aborted data) are checked first: one whose bytes no longer match its CRC —
    a data batch whose control or transactional bit flipped on the source's disk — is a CorruptBatchError naming
    its offset, on both walks, never a batch quietly left out of the copy."""
    from mirror_core.errors import CorruptBatchError

    flipped = bytearray(make_batch(12, 3, producer_id=7))
    flipped[22] |= 0x20          # the control bit, CRC left as it was
    aborted = bytearray(make_batch(12, 3, producer_id=7, transactional=True))
    aborted[30] ^= 0x01          # a header byte under the CRC (lastOffsetDelta's neighbour: the base timestamp)
    cases = [(bytes(flipped), None), (bytes(aborted), [SimpleNamespace(producer_id=7, first_offset=12)])]
    for corrupt, listed in cases:
        records = make_batch(10, 2) + corrupt + make_batch(15, 1)
        data = SimpleNamespace(records=records, aborted_transactions=listed, high_watermark=16, last_stable_offset=16,
                               log_start_offset=0, error_code=0)
        fetcher = RawBatchFetcher(_Client(), "t", 0, 10, 20)
        with pytest.raises(CorruptBatchError, match="offset 12"):
            fetcher._accept(data)
        assert fetcher.position == 10   # nothing moved past it


def _bare_marker(base: int, producer_id: int = 7) -> bytes:
    """A control batch as the log cleaner keeps one whose transaction left no data (``writeEmptyHeader``): the
    61-byte header alone, recordsCount 0, the control and transactional bits, a valid CRC."""
    import crc32c

    after_crc = struct.pack(">hiqqqhii", 0x30, 0, 1000, 1000, producer_id, 0, -1, 0)
    return struct.pack(">qiibI", base, 4 + 1 + 4 + len(after_crc), 0, 2, crc32c.crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("listed", [None, [SimpleNamespace(producer_id=9, first_offset=10)]],
                         ids=["one-pass walk", "general rules"])
@pytest.mark.parametrize("end", [20, 12], ids=["marker inside the range", "marker at the end"])
def test_a_marker_the_cleaner_kept_without_its_record_is_passed_over_not_refused(listed, end):
    """The Java consumer reads a control batch without records as no abort; refusing it would halt every copy of a
    compacted transactional topic (Streams changelogs) for good. Found by review of the CRC checks."""
    records = make_batch(10, 2) + _bare_marker(12) + make_batch(13, 2)
    data = SimpleNamespace(records=records, aborted_transactions=listed, high_watermark=15, last_stable_offset=15,
                           log_start_offset=0, error_code=0)
    fetcher = RawBatchFetcher(_Client(), "t", 0, 10, end)
    result = fetcher._accept(data)
    assert [b.base_offset for b in result.batches] == ([10, 13] if end == 20 else [10])
    assert fetcher.position == (15 if end == 20 else 12)


def test_a_batch_moved_below_the_one_before_it_by_a_flipped_base_offset_halts_the_fetch():
    """baseOffset is outside the CRC: a flipped bit there moves a batch. One that now begins below the end of the
    batch before it (or makes the next one do so) is refused on both walks, naming the offset, instead of being
    skipped past the range end or mapped to the wrong offsets."""
    from mirror_core.errors import CorruptBatchError

    for moved_to, at in ((21, 10), (4, 4)):   # the middle batch (5..9) moved up past the end, or down into the first
        middle = bytearray(make_batch(5, 5))
        struct.pack_into(">q", middle, 0, moved_to)
        records = make_batch(0, 5) + bytes(middle) + make_batch(10, 5)
        for listed in (None, [SimpleNamespace(producer_id=9, first_offset=0)]):
            data = SimpleNamespace(records=records, aborted_transactions=listed, high_watermark=15,
                                   last_stable_offset=15, log_start_offset=0, error_code=0)
            fetcher = RawBatchFetcher(_Client(), "t", 0, 0, 20)
            with pytest.raises(CorruptBatchError, match=f"offset {at}"):
                fetcher._accept(data)
            assert fetcher.position == 0
