"""The copier's decisions, without a broker (issue #17): what a fetched answer's batches mean for what lands on
the target and for the position a checkpoint would store — transactions committed and aborted, their markers,
offsets compacted away, a batch straddling the range end, a source with nothing more to give, the write window,
the prefetch, a target that does not answer where the copy expects. The source is a log of real v2 batches
answered through the real fetcher's handling (:mod:`tests.unit.engine.source_stand_ins`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mirror_core.engine.copier as copier_module
from mirror_core.engine.copier import CopyOptions, RangeCopier
from mirror_core.errors import MirrorError
from mirror_core.model.ranges import PartitionRange
from tests.unit.engine.source_stand_ins import Cluster, LogFetcher, RecordingWriter, SourceLog, StreamingWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Listener:
    """A flush listener (what a checkpointing lane is): keeps the position and target end it was told each time,
    and says ``markers`` transaction markers were added after every flush that was not the last."""

    def __init__(self, writer: RecordingWriter | None = None, markers: int = 0):
        self.writer, self.markers = writer, markers
        self.told: list[tuple[int, int | None, bool]] = []  # (source_end, next_target_offset, final)
        self.written_when_told: list[list[int]] = []

    def flushed(self, result, *, final: bool) -> int:
        self.told.append((result.source_end, result.next_target_offset, final))
        if self.writer is not None:
            self.written_when_told.append(list(self.writer.source_offsets))
            if not final:
                self.writer.next += self.markers  # the commit's marker lands on the target partition
        return 0 if final else self.markers


def copy(log: SourceLog, start: int, end: int, *, writer: RecordingWriter | None = None, per_answer: int = 2,
         listener: Listener | None = None, progress=None, **options):
    writer = writer or RecordingWriter()
    fetcher = LogFetcher(log, start, end, per_answer=per_answer)
    options.setdefault("overlap", False)
    copier = RangeCopier(Cluster("src"), Cluster("dst"), writer, CopyOptions(**options), listener=listener)
    result = copier.copy(PartitionRange("orders", 3, start, end, "dr.orders", 3), progress, fetcher=fetcher)
    return result, writer, fetcher


# -- transactions and markers ---------------------------------------------------------------------------------------

def transactional_log() -> SourceLog:
    log = SourceLog()
    log.data(3)                     # 0-2
    log.txn(7, 2)                   # 3-4, committed
    log.txn(8, 2)                   # 5-6, aborted
    log.commit(7)                   # 7
    log.abort(8)                    # 8
    log.data(2)                     # 9-10
    return log


def test_aborted_transactions_and_markers_never_reach_the_target_and_committed_data_lands_densely():
    log = transactional_log()
    result, writer, _ = copy(log, 0, log.next)
    assert writer.source_offsets == [0, 1, 2, 3, 4, 9, 10] == log.committed
    assert [r.target_offset for r in writer.landed] == list(range(7))
    assert (result.source_end, result.records) == (11, 7)


def test_a_range_of_only_aborted_data_and_markers_writes_nothing_yet_moves_the_position_past_it():
    """Offsets that need no copy count as copied: the next range (or the checkpoint) starts after them, or the
    lane would fetch them again forever."""
    log = transactional_log()
    listener = Listener()
    result, writer, _ = copy(log, 5, 9, listener=listener)
    assert writer.landed == []
    assert result.source_end == 9 and result.records == 0
    assert listener.told == [(9, None, True)]


def test_a_committed_transaction_is_copied_whole_even_when_its_marker_comes_in_a_later_answer():
    log = SourceLog()
    log.txn(7, 2)
    log.txn(7, 2)
    log.commit(7)
    result, writer, _ = copy(log, 0, log.next, per_answer=1)
    assert writer.source_offsets == [0, 1, 2, 3] and result.source_end == 5


# -- compaction holes -----------------------------------------------------------------------------------------------

def test_offsets_compacted_away_are_skipped_and_the_records_after_them_land_contiguously():
    log = SourceLog(start=100)
    log.data(2)                      # 100-101
    log.skip(5)                      # 102-106 compacted away between batches
    log.data(deltas=[0, 3, 4])       # 107, 110, 111: holes inside the batch
    log.data(1)                      # 112
    result, writer, _ = copy(log, 100, log.next)
    assert writer.source_offsets == [100, 101, 107, 110, 111, 112]
    assert [r.target_offset for r in writer.landed] == list(range(6))
    assert result.source_end == 113
    # the offset map says where each source offset landed: a consumer group at 110 resumes at target offset 3
    runs = [(run.source_start, run.source_end, run.target_start) for run in result.offset_runs]
    landing = {s: t + (s - run_s) for run_s, run_e, t in runs for s in range(run_s, run_e)}
    assert {s: landing[s] for s in (100, 101, 107, 110, 111, 112)} == {100: 0, 101: 1, 107: 2, 110: 3, 111: 4,
                                                                          112: 5}


# -- the range end ------------------------------------------------------------------------------------------------

def straddling_log() -> SourceLog:
    log = SourceLog()
    log.data(4)     # 0-3
    log.data(4)     # 4-7: straddles an end at 6
    log.data(4)     # 8-11: past it
    return log


def test_a_batch_straddling_the_end_is_copied_whole_and_the_actual_end_reported():
    result, writer, _ = copy(straddling_log(), 0, 6)
    assert writer.source_offsets == list(range(8))
    assert result.source_end == 8  # the next range starts here, not at 6 (6 and 7 are on the target already)


def test_exact_bounds_trim_a_batch_straddling_the_end_and_stop_at_the_end():
    result, writer, _ = copy(straddling_log(), 0, 6, exact_bounds=True)
    assert writer.source_offsets == list(range(6))
    assert (result.source_end, result.deep_batches) == (6, 1)


def test_a_batch_starting_at_the_end_belongs_to_the_next_range():
    result, writer, _ = copy(straddling_log(), 0, 8, per_answer=3)
    assert writer.source_offsets == list(range(8)) and result.source_end == 8


# -- a source with nothing more to give -----------------------------------------------------------------------------

def test_a_range_past_the_last_stable_offset_halts_naming_the_partition_and_both_offsets():
    log = SourceLog()
    log.data(3)
    with pytest.raises(MirrorError) as info:
        copy(log, 0, 10, stall_timeout_s=0.0, max_inflight_bytes=1)
    message = str(info.value)
    assert "cluster 'src' orders-3" in message and "ends at 10" in message
    assert "last stable offset is 3" in message


def test_a_range_past_the_last_stable_offset_halts_even_while_its_last_batches_wait_in_the_write_window():
    """The same wrong range, with the fetched tail smaller than the write window: the copy must still halt, not
    fetch the empty end of the partition forever (the stand-in fetcher fails the test after 200 answers)."""
    log = SourceLog()
    log.data(3)
    with pytest.raises(MirrorError, match="last stable offset is 3"):
        copy(log, 0, 10, stall_timeout_s=0.0)


def test_a_range_past_the_last_stable_offset_halts_when_its_fetched_part_needs_no_copy():
    """The offsets fetched were an aborted transaction and its marker: nothing to write, yet the position moved
    up to the last stable offset, and a copy asking for more than the source holds halts."""
    log = SourceLog()
    log.data(2)
    log.txn(8, 2)
    log.abort(8)
    with pytest.raises(MirrorError, match="ends at 10 but the partition's last stable offset is 5"):
        copy(log, 2, 10, stall_timeout_s=0.0)


def test_an_empty_answer_while_the_source_has_more_is_waited_for_not_a_halt():
    """Nothing arrived, but the last stable offset is above the position (a leader answering empty after its
    wait, a throttled fetch): data is coming, so the copy asks again; the stall check is only for a source that
    has nothing more to give."""
    log = SourceLog()
    log.data(2)
    log.data(2)

    class SlowLeader(LogFetcher):
        def _fetch_once(self, resent=False):
            if self.answers < 3:
                self.answers += 1
                empty = self.log.answer(self.position, 0)
                return self.handle(empty)
            return super()._fetch_once(resent)

    writer = RecordingWriter()
    copier = RangeCopier(Cluster("src"), Cluster("dst"), writer, CopyOptions(overlap=False, stall_timeout_s=0.0))
    result = copier.copy(PartitionRange("orders", 3, 0, 4, "dr.orders", 3), fetcher=SlowLeader(log, 0, 4))
    assert writer.source_offsets == [0, 1, 2, 3] and result.source_end == 4


def test_an_open_transaction_holding_the_last_stable_offset_at_the_position_is_a_stall():
    log = SourceLog()
    log.data(2)
    log.txn(9, 1)
    with pytest.raises(MirrorError, match=r"orders-3: the range ends at 4 but the partition's last stable offset "
                                          r"is 2 \(high watermark 3\)"):
        copy(log, 0, 4, stall_timeout_s=0.0, max_inflight_bytes=1)


# -- the write window and what a checkpoint would be told ------------------------------------------------------------

def test_batches_are_written_whenever_the_window_fills_and_each_flush_is_told_only_what_was_written():
    log = SourceLog()
    for _ in range(7):
        log.data(2)
    batch_size = len(log.batches[0][2])
    writer = RecordingWriter()
    listener = Listener(writer)
    result, _, _ = copy(log, 0, log.next, writer=writer, listener=listener, per_answer=7,
                        max_inflight_bytes=batch_size * 3)
    assert writer.calls == [3, 3, 1]
    assert writer.source_offsets == list(range(14))
    # every position a checkpoint is told lies just past what the target holds at that moment
    for (position, target_next, _), written in zip(listener.told, listener.written_when_told, strict=True):
        assert position == written[-1] + 1 and target_next == len(written)
    assert [told[0] for told in listener.told] == [6, 12, 14, 14]
    assert result.source_end == 14


def test_with_overlap_each_batch_goes_to_the_write_stream_and_the_flushes_are_the_same():
    """Overlap on a writer that streams: every prepared batch is given to the open stream as it is prepared, the
    stream is finished where a whole write would have been made, and the checkpoints are told the same."""
    log = SourceLog()
    for _ in range(7):
        log.data(2)
    batch_size = len(log.batches[0][2])
    writer = StreamingWriter()
    listener = Listener(writer)
    result, _, _ = copy(log, 0, log.next, writer=writer, listener=listener, per_answer=7,
                        max_inflight_bytes=batch_size * 3, overlap=True)
    assert writer.calls == writer.added == [3, 3, 1] and writer.settled == 0
    assert writer.source_offsets == list(range(14))
    assert [told[0] for told in listener.told] == [6, 12, 14, 14]
    assert result.source_end == 14


def test_a_copy_that_halts_with_batches_in_the_write_stream_settles_it():
    """The copy fails while batches wait in the open stream (some may be in flight): the stream is given up, its
    answers taken, nothing more sent; the halt is what the caller sees, and nothing is counted as written."""
    log = SourceLog()
    log.data(3)
    writer = StreamingWriter()
    with pytest.raises(MirrorError, match="last stable offset is 3"):
        copy(log, 0, 10, writer=writer, stall_timeout_s=0.0, overlap=True)
    assert writer.settled == 1 and writer.added == [1] and writer.open is None
    assert writer.calls == [] and writer.landed == []


def test_a_writer_without_streams_gets_whole_writes_with_overlap_on():
    log = SourceLog()
    for _ in range(4):
        log.data(2)
    _, writer, _ = copy(log, 0, 8, overlap=True, per_answer=4)
    assert writer.source_offsets == list(range(8)) and writer.calls == [4]


# -- prefetch (overlap) -------------------------------------------------------------------------------------------

def test_the_next_fetch_is_sent_as_soon_as_an_answer_is_taken_while_the_budget_allows():
    log = SourceLog()
    for _ in range(6):
        log.data(2)
    _, writer, fetcher = copy(log, 0, 12, overlap=True)
    assert fetcher.sent == [4, 8]  # after each answer but the last (the range is done then)
    assert writer.source_offsets == list(range(12))


def test_no_fetch_is_sent_ahead_when_one_more_answer_would_not_fit_in_the_buffer_budget():
    log = SourceLog()
    for _ in range(6):
        log.data(2)
    _, writer, fetcher = copy(log, 0, 12, overlap=True, fetch_max_bytes=1000, buffer_budget_bytes=1000)
    assert fetcher.sent == []
    assert writer.source_offsets == list(range(12))


def test_with_overlap_off_no_fetch_is_ever_sent_ahead():
    log = SourceLog()
    for _ in range(6):
        log.data(2)
    _, writer, fetcher = copy(log, 0, 12, overlap=False)
    assert fetcher.sent == [] and writer.source_offsets == list(range(12))


def test_a_failed_write_leaves_no_fetch_outstanding():
    log = SourceLog()
    for _ in range(6):
        log.data(2)
    batch_size = len(log.batches[0][2])
    writer = RecordingWriter(fail_on=1)
    fetcher = LogFetcher(log, 0, 12)
    copier = RangeCopier(Cluster("src"), Cluster("dst"), writer, CopyOptions(max_inflight_bytes=batch_size))
    with pytest.raises(ConnectionError):
        copier.copy(PartitionRange("orders", 3, 0, 12, "dr.orders", 3), fetcher=fetcher)
    assert fetcher.sent and not fetcher.prefetching
    assert fetcher.position == 4  # the answer taken before the failure; the one sent ahead was never read


# -- where the target puts the batches ------------------------------------------------------------------------------

def five_batches() -> tuple[SourceLog, int]:
    log = SourceLog()
    for _ in range(5):
        log.data(2)
    return log, len(log.batches[0][2])


def test_a_batch_landing_past_where_the_copy_expects_halts_naming_the_target_and_both_offsets():
    log, size = five_batches()
    writer = RecordingWriter(gaps={1: 3})  # another writer's 3 records before our second write
    with pytest.raises(MirrorError) as info:
        copy(log, 0, 10, writer=writer, max_inflight_bytes=size)
    message = str(info.value)
    assert "cluster 'dst' dr.orders-3" in message
    assert "source offset 2 landed at 5, expected 2" in message


def test_a_commit_marker_between_flushes_is_allowed_for():
    log, size = five_batches()
    writer = RecordingWriter()
    result, _, _ = copy(log, 0, 10, writer=writer, max_inflight_bytes=size, listener=Listener(writer, markers=1))
    assert writer.source_offsets == list(range(10))
    assert [r.target_offset for r in writer.landed] == [0, 1, 3, 4, 6, 7, 9, 10, 12, 13]
    assert result.next_target_offset == 14


def test_a_duplicate_acknowledgement_without_an_offset_is_taken_where_expected_but_not_for_a_first_batch():
    log, size = five_batches()
    result, _, _ = copy(log, 0, 10, writer=RecordingWriter(ack_unknown={2}), max_inflight_bytes=size)
    assert (result.first_target_offset, result.next_target_offset) == (0, 10)
    with pytest.raises(MirrorError, match="'dst' dr.orders-3: first batch acknowledged without an offset"):
        copy(log, 0, 10, writer=RecordingWriter(ack_unknown={0}), max_inflight_bytes=size)


def test_an_empty_range_fetches_nothing_and_is_still_final():
    log, _ = five_batches()
    listener = Listener()
    result, writer, fetcher = copy(log, 4, 4, listener=listener)
    assert fetcher.answers == 0 and writer.landed == []
    assert (result.source_end, listener.told) == (4, [(4, None, True)])


# -- the position never moves backwards, never past what was written ---------------------------------------------

@st.composite
def logs(draw):
    log = SourceLog(start=draw(st.integers(0, 50)))
    producers = iter(range(100, 200))
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["data", "holes", "skip", "commit", "abort"]))
        if kind == "data":
            log.data(draw(st.integers(1, 4)))
        elif kind == "holes":
            log.data(deltas=sorted(draw(st.sets(st.integers(0, 6), min_size=1))))
        elif kind == "skip":
            log.skip(draw(st.integers(1, 5)))
            log.data(1)
        else:
            producer = next(producers)
            for _ in range(draw(st.integers(1, 2))):
                log.txn(producer, draw(st.integers(1, 3)))
            log.commit(producer) if kind == "commit" else log.abort(producer)
    return log


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(), data=st.data())
def test_the_position_never_moves_back_nor_past_a_record_not_yet_on_the_target(log, data):
    start = data.draw(st.integers(log.start, log.next - 1), label="start")
    end = data.draw(st.integers(start + 1, log.next), label="end")
    window = data.draw(st.integers(1, 400), label="max_inflight_bytes")
    per_answer = data.draw(st.integers(1, 4), label="per_answer")
    exact = data.draw(st.booleans(), label="exact_bounds")
    streamed = data.draw(st.booleans(), label="streamed")       # batches given to a write stream as prepared
    coalesce_bytes = data.draw(st.sampled_from([0, 1024, 64 * 1024]), label="coalesce_bytes")
    writer = StreamingWriter() if streamed else RecordingWriter()
    seen: list[int] = []

    def progress(result):
        seen.append(result.source_end)
        below = [o for o in log.committed if start <= o < result.source_end]
        assert set(below) <= set(writer.source_offsets), "the position passed a record the target does not hold"

    result, _, _ = copy(log, start, end, writer=writer, per_answer=per_answer, progress=progress,
                        max_inflight_bytes=window, exact_bounds=exact, overlap=streamed,
                        coalesce_bytes=coalesce_bytes)
    for record in writer.landed:   # the offset map translates every copied offset to where it landed
        assert result.offset_runs.translate(record.source_offset) == record.target_offset
    assert result.coalesced_batches == 0 or coalesce_bytes
    if streamed:
        assert writer.calls == writer.added and not writer.settled and writer.open is None
    assert seen == sorted(seen)
    assert result.source_end >= end
    if exact:
        assert result.source_end == end
    wanted = [o for o in log.committed if start <= o < end]
    landed = writer.source_offsets
    assert landed == sorted(set(landed)), "written out of order or twice"
    assert set(wanted) <= set(landed) <= set(log.committed)
    if exact:
        assert landed == wanted


def test_a_new_leader_whose_high_watermark_lags_the_position_for_one_answer_is_not_a_wrong_range(monkeypatch):
    """Leader failover: the copy read up to offset 2 from the old leader; the new leader's HW (hence LSO) is still
    1 for one answer, then catches up. The range [0, 4) was planned under the LSO (4) and is right. (Found by a
    committer review of the stall fix: the wait is measured from the first empty answer, not from the last progress,
    so a fetch retried across a failover does not use up the stall budget.)"""
    log = SourceLog()
    log.data(2)   # 0-1
    log.data(2)   # 2-3

    class FailoverFetcher(LogFetcher):
        def _fetch_once(self, resent=False):
            if self.answers == 1:     # second answer: the new leader, HW lagging below our position
                self.answers += 1
                clock[0] += 31.0      # the Fetch to the crashed leader timed out (request_timeout_ms 30 s), retried
                return self.handle(SimpleNamespace(error_code=0, records=memoryview(b""), aborted_transactions=[],
                                                   high_watermark=1, last_stable_offset=1, log_start_offset=0,
                                                   diverging_epoch=None))
            return super()._fetch_once(resent)

    clock = [1000.0]
    monkeypatch.setattr(copier_module.time, "monotonic", lambda: clock[0])
    writer = RecordingWriter()
    copier = RangeCopier(Cluster("src"), Cluster("dst"), writer, CopyOptions(overlap=False))  # stall 30 s
    result = copier.copy(PartitionRange("orders", 3, 0, 4, "dr.orders", 3),
                         fetcher=FailoverFetcher(log, 0, 4, per_answer=1))
    assert writer.source_offsets == [0, 1, 2, 3] and result.source_end == 4


# -- coalescing small batches (``CopyOptions.coalesce_bytes``) --------------------------------------------------------

def test_runs_of_one_record_batches_are_merged_between_markers_with_the_exact_offset_map():
    log = SourceLog()
    log.data(1)
    for _ in range(99):
        log.data(1)                 # 0-99: one record per batch
    log.txn(7, 1)                   # 100
    log.commit(7)                   # 101: a marker, a gap in the offsets the target receives
    for _ in range(50):
        log.data(1)                 # 102-151
    log.data(deltas=[0, 2])         # 152, 154: holes (a deep re-encode of its own, never merged)
    for _ in range(20):
        log.data(1)                 # 155-174
    result, writer, _ = copy(log, 0, 175, per_answer=400, coalesce_bytes=64 * 1024)
    assert writer.source_offsets == log.committed               # every committed record, in order, once
    for record in writer.landed:
        assert result.offset_runs.translate(record.source_offset) == record.target_offset
    # one merged batch per run: [0, 101) (the committed transactional batch joins), [102, 152), [155, 175)
    assert writer.calls == [4]
    assert result.coalesced_batches == 101 + 50 + 20
    assert result.deep_batches == 4 and result.batches == 4 and result.records == len(log.committed)
    assert result.source_end == 175


def test_coalescing_off_copies_every_batch_as_it_is():
    log = SourceLog()
    for _ in range(30):
        log.data(1)
    result, writer, _ = copy(log, 0, 30, per_answer=400)
    assert writer.calls == [30] and result.coalesced_batches == 0 and result.deep_batches == 0


def test_a_merged_run_never_passes_the_limit_and_the_window_still_flushes():
    log = SourceLog()
    for _ in range(500):
        log.data(1)
    result, writer, _ = copy(log, 0, 500, per_answer=600, coalesce_bytes=2048, max_inflight_bytes=4096)
    assert writer.source_offsets == log.committed
    assert len(writer.calls) > 1 and sum(writer.calls) == result.batches < 100
    assert result.coalesced_batches == 500


def test_coalesce_bytes_below_the_minimum_is_refused():
    from mirror_core.errors import ConfigError
    with pytest.raises(ConfigError, match="coalesce_bytes must be 0 .off. or between 1024 and 1048576 bytes, not 100"):
        CopyOptions(coalesce_bytes=100)


def test_merged_batches_are_built_as_they_are_written_not_an_answer_ahead(monkeypatch):
    """Review finding: the merged batches of a whole answer were built before the first was written and stayed
    alive after their flush, outside the write window (DESIGN §3.8); now each is built when the copy takes it.
    Counted at each write: merged batches built so far beyond those written (with this write) so far."""
    from mirror_core.codec import batch_coalesce

    built = [0]
    encode = batch_coalesce._encode

    def counting_encode(*args, **kwargs):
        built[0] += 1
        return encode(*args, **kwargs)

    monkeypatch.setattr(batch_coalesce, "_encode", counting_encode)

    class CountingWriter(RecordingWriter):
        def __init__(self):
            super().__init__()
            self.written = 0
            self.ahead: list[int] = []   # merged batches built and not in this or an earlier write

        def write(self, outgoing):
            self.written += len(outgoing)
            self.ahead.append(built[0] - self.written)
            return super().write(outgoing)

    log = SourceLog()
    for _ in range(2000):
        log.data(1)
    result, writer, _ = copy(log, 0, 2000, writer=CountingWriter(), per_answer=3000, coalesce_bytes=2048,
                             max_inflight_bytes=2048)
    assert writer.source_offsets == log.committed and len(writer.calls) > 5
    assert result.coalesced_batches == 2000 and built[0] == writer.written
    assert max(writer.ahead) == 0, f"merged batches built ahead of the write window: {writer.ahead[:5]}"
