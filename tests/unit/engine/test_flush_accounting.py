"""A flush's bookkeeping (``RangeCopier._account``) against the batch-by-batch steps it replaced, kept here as the
oracle: the landing check of every batch, the offset map, the counts, the source end with its epoch, the digest —
over generated flushes of shallow and deep batches landing in order, after markers, as duplicates without an
offset, or where another writer's records would put them (an error, with the same message). Pure."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mirror_core.codec.batch_codec import PreparedBatch
from mirror_core.codec.records_digest import RecordsDigest
from mirror_core.engine.copier import CopyResult, RangeCopier, _advance_end, _Session
from mirror_core.errors import MirrorError
from mirror_core.model.offset_runs import OffsetRuns
from mirror_core.model.ranges import PartitionRange

pytestmark = pytest.mark.unit

RANGE = PartitionRange("s", 0, 0, 10_000, "t", 0)


class _Target:
    cluster_name = "target"


class _Landing:
    def __init__(self):
        self.told = []

    def before_first_write(self, prepared):
        pass

    def first_landing(self, prepared, base):
        self.told.append((prepared.source_first_offset, base))


def _oracle(pending, bases, result, session):
    """The per-batch bookkeeping as ``RangeCopier._flush`` did it before ``_account``."""
    for prepared, base in zip(pending, bases, strict=True):
        base = session.check_landing("target", RANGE, prepared, base)
        if result.first_target_offset is None:
            result.first_target_offset = base
        result.next_target_offset = base + prepared.record_count
        result.offset_runs.add_batch(base, prepared.offset_runs())
        result.records += prepared.record_count
        result.batches += 1
        result.bytes += len(prepared.data)
        result.deep_batches += prepared.deep
        _advance_end(result, prepared.source_next_offset, prepared.source_leader_epoch)
        session.digest.add(memoryview(prepared.data)[61:])


batch = st.fixed_dictionaries({
    "source_gap": st.sampled_from([0, 0, 0, 2]),     # source offsets skipped before it (markers, aborted data)
    "count": st.integers(1, 4),
    "deep": st.sampled_from([None, None, "dense", "sparse"]),  # deep: per-record source offsets
    "epoch": st.integers(-1, 2),
    "landing": st.sampled_from(["next"] * 6 + ["gap1", "gap3", "duplicate", "behind"]),
    "body": st.binary(min_size=0, max_size=6),
})


def _flush_input(specs, source_first, target_first):
    pending, bases, source, target = [], [], source_first, target_first
    for spec in specs:
        source += spec["source_gap"]
        count = spec["count"]
        if spec["deep"] is None:
            offsets, span = None, count
        elif spec["deep"] == "dense":
            offsets, span = tuple(range(source, source + count)), count
        else:
            offsets = tuple(source + 2 * i for i in range(count))
            span = 2 * count - 1
        data = bytearray(61) + spec["body"] + bytes([count])
        pending.append(PreparedBatch(data, count, source, source + span, deep=spec["deep"] is not None,
                                     source_offsets=offsets, source_leader_epoch=spec["epoch"]))
        landing = spec["landing"]
        base = {"next": target, "gap1": target + 1, "gap3": target + 3, "duplicate": -1, "behind": target - 1}[landing]
        bases.append(base)
        target = (target if base < 0 else base) + count
        source += span
    return pending, bases


def _state(result, session, landing):
    return (result.records, result.batches, result.bytes, result.deep_batches, result.first_target_offset,
            result.next_target_offset, result.source_end, result.source_end_epoch, list(result.offset_runs),
            session.expected, session.markers_allowed, session.digest.hexdigest(), landing.told)


def _run(account, pending, bases, expected, allowed, earlier_runs, source_end):
    runs = OffsetRuns()
    for run in earlier_runs:
        runs.append(run)
    result = CopyResult(RANGE, source_start=0, source_end=source_end, offset_runs=runs)
    landing = _Landing()
    session = _Session(RecordsDigest(), expected=expected, markers_allowed=allowed, landing=landing)
    try:
        account(pending, bases, result, session)
    except (MirrorError, ValueError) as exc:
        return ("raised", type(exc).__name__, str(exc))
    return _state(result, session, landing)


@settings(max_examples=700, deadline=None)
@given(st.lists(batch, min_size=1, max_size=9), st.integers(0, 50), st.integers(0, 50),
       st.sampled_from([None, "here", "before"]), st.integers(0, 2), st.booleans(), st.integers(0, 60))
@example([{"source_gap": 0, "count": 1, "deep": None, "epoch": 1, "landing": "next", "body": b""},
          {"source_gap": 0, "count": 1, "deep": None, "epoch": 1, "landing": "gap1", "body": b""}],
         10, 20, "here", 2, False, 0)   # markers are allowed before a flush's first batch only
def test_a_flush_is_booked_as_batch_by_batch(specs, source_first, target_first, expected, allowed, earlier,
                                             source_end):
    pending, bases = _flush_input(specs, source_first, target_first)
    expected_at = {None: None, "here": target_first, "before": max(0, target_first - 1)}[expected]
    earlier_runs = []
    if earlier:   # the map already ends where this flush begins (a plain shallow copy's next flush)
        from mirror_core.model.offset_runs import OffsetRun
        earlier_runs = [OffsetRun(max(0, source_first - 5), source_first, target_first - 5)] \
            if target_first >= 5 and source_first >= 5 else []
    copier = RangeCopier(_Target(), _Target(), writer=object())
    fast = _run(lambda p, b, r, s: copier._account(RANGE, p, b, r, s), pending, bases, expected_at, allowed,
                earlier_runs, source_end)
    slow = _run(_oracle, pending, bases, expected_at, allowed, earlier_runs, source_end)
    if slow[0] == "raised" or fast[0] == "raised":
        assert fast == slow     # the same error, the same message (the state left behind is the failed copy's)
    else:
        assert fast == slow
