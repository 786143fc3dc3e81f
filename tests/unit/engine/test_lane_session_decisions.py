"""A lane's decisions, without a broker (issue #17): where a lane resumes from its checkpoint and whether it may
(ownership, owner epochs, a lane the daemon owns, a handoff, a start past the checkpoint), when a checkpoint is
committed under a :class:`CommitPolicy`, where a resumed copy must land on the target, and when an at-least-once
lane renews its fence. The lane runs as in production — :class:`CheckpointedCopier` → :class:`LaneSession` →
:class:`RangeCopier` — over in-process stand-ins: a source log of real batches, a target partition that records
what lands (data, transaction markers, checkpoints committed), and a checkpoint store handing back a
:class:`Checkpoint` built here."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mirror_core.engine.copier as copier_module
import mirror_core.engine.lane_fence as lane_fence
import mirror_core.engine.lane_session as lane_session
import mirror_core.engine.resume_landing as resume_landing
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import DAEMON_OWNER
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import (
    DaemonOwnsLaneError,
    DataLossError,
    ForeignWriteError,
    LaneTakenError,
    MirrorError,
    OwnershipError,
    SkipRefusedError,
    TargetNotEmptyError,
    TopicRecreatedError,
    TransactionsUnavailableError,
)
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.state.checkpoint import Checkpoint
from tests.unit.codec.test_batch_codec import decoded
from tests.unit.engine.source_stand_ins import LogFetcher, SourceLog

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PIPELINE = "dr"
TS_BASE = 1_700_000_000_000
STORE_TOPIC = "__shoal_checkpoints"


@dataclass
class CheckpointRecord:
    """What the stand-in store hands the writer for a commit: the checkpoint itself."""

    checkpoint: Checkpoint
    topic: str = STORE_TOPIC


class Store:
    """The checkpoint store: ``stored`` is what a reader past the LSO sees (the initial checkpoint, then the last one
    the target committed)."""

    topic, partitions = STORE_TOPIC, 8

    def __init__(self, target: Target, initial: Checkpoint | None):
        self.target, self.initial = target, initial

    @property
    def stored(self) -> Checkpoint | None:
        return self.target.checkpoints[-1] if self.target.checkpoints else self.initial

    def read_own(self, pipeline, topic, partition):
        return self.stored

    read = read_own

    def checkpoint_batch(self, checkpoint):
        return CheckpointRecord(checkpoint)

    def checkpoint_batches(self, checkpoint, commit):
        return [CheckpointRecord(checkpoint)]


@dataclass
class Target:
    """The target cluster: one data partition (``next`` its end offset; markers take one offset each), the
    records landed on it as (target offset, source offset), and the checkpoints it committed, in order."""

    next: int = 0
    earliest: int = 0
    open_txn_at: int | None = None  # another producer's transaction open at this offset (holds the LSO)
    topic_id: str = "dst-id"
    landed: list[tuple[int, int]] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    fences: int = 0
    events: list[str] = field(default_factory=list)  # "data <source offsets>", "checkpoint <position>", "marker"
    cluster_name: str = "dst"

    def topic_metadata(self, topic, refresh=False):
        return SimpleNamespace(topic_id=self.topic_id)

    def marker(self, why: str) -> None:
        self.next += 1
        self.events.append(why)


class Writer:
    """The lane's :class:`BatchWriter`: exactly-once, data and checkpoints count once committed (a commit marker
    follows data in the data partition); at-least-once, on acknowledgement."""

    def __init__(self, target: Target, transactional_id=None, **settings):
        self.target, self.in_transaction = target, False
        self._data_in_txn, self._checkpoints_in_txn = False, []
        self.producer_id, self.producer_epoch = 42, 1  # as after InitProducerId

    def init_producer_id(self):
        pass

    def fence_partitions(self, partitions):
        self.target.fences += 1
        self.target.marker("fence")

    def begin_transaction(self):
        self.in_transaction = True

    def expect_partitions(self, partitions):
        pass

    def write(self, outgoing):
        bases = []
        for batch in outgoing:
            if isinstance(batch, CheckpointRecord):
                if self.in_transaction:
                    self._checkpoints_in_txn.append(batch.checkpoint)
                else:
                    self._store(batch.checkpoint)
                bases.append(0)
                continue
            records = [int(key[1:]) for _, _, key, _, _ in decoded(bytes(batch.data))]
            bases.append(self.target.next)
            self.target.landed += [(self.target.next + i, source) for i, source in enumerate(records)]
            self.target.events.append(f"data {records[0]}-{records[-1]}")
            self.target.next += len(records)
            self._data_in_txn |= self.in_transaction
        return bases

    def _store(self, checkpoint):
        self.target.checkpoints.append(checkpoint)
        self.target.events.append(f"checkpoint {checkpoint.position}")

    def commit_transaction(self):
        if self._data_in_txn:
            self.target.marker("commit")
        for checkpoint in self._checkpoints_in_txn:
            self._store(checkpoint)
        self.in_transaction, self._data_in_txn, self._checkpoints_in_txn = False, False, []

    def abort_transaction(self, give_up_after_s=None):
        if self._data_in_txn:
            self.target.marker("abort")
        self.in_transaction, self._data_in_txn, self._checkpoints_in_txn = False, False, []


class Source:
    cluster_name = "src"

    def __init__(self, log: SourceLog, topic_id: str = "src-id"):
        self.log, self.topic_id = log, topic_id

    def topic_metadata(self, topic, refresh=False):
        return SimpleNamespace(topic_id=self.topic_id)


@dataclass
class Lane:
    source: Source
    target: Target
    store: Store


def offsets(client, topic, partition, which):
    if isinstance(client, Source):
        return {"earliest": client.log.start, "latest": client.log.next}[which]
    stable = client.next if client.open_txn_at is None else client.open_txn_at
    return {"earliest": client.earliest, "latest": client.next, "last_stable": stable}[which]


def committed(client, topic, partition, start, end, *, limit=None, max_bytes, **kw):
    """The target's committed records in ``[start, end)`` (what landed there), as (target, source offset)."""
    found = [(t, s) for t, s in client.landed if t >= start and (end is None or t < end)]
    return found[:limit] if limit is not None else found


@pytest.fixture
def lane(monkeypatch):
    """A source log of 2-record batches at offsets 0-11 and an empty target; the test sets the checkpoint."""
    log = SourceLog()
    for _ in range(6):
        log.data(2)
    target = Target()
    lane = Lane(Source(log), target, Store(target, None))
    monkeypatch.setattr(lane_fence, "BatchWriter", lambda client, **kw: Writer(target, **kw))
    monkeypatch.setattr(lane_session, "list_offsets", offsets)
    monkeypatch.setattr(resume_landing, "list_offsets", offsets)
    monkeypatch.setattr(resume_landing, "committed_records", committed)
    monkeypatch.setattr(lane_session, "validate_position", lambda *a, **k: True)
    monkeypatch.setattr(copier_module, "RawBatchFetcher",
                        lambda client, topic, partition, start, end, **kw: LogFetcher(client.log, start, end))
    return lane


def copier(lane: Lane, mode=DeliveryMode.EXACTLY_ONCE, *, owner="copy", owner_epoch=0, **kw):
    return CheckpointedCopier(lane.source, lane.target, lane.store, pipeline=PIPELINE, mode=mode, owner=owner,
                              owner_epoch=owner_epoch, **kw)


def run(lane: Lane, start: int, end: int, mode=DeliveryMode.EXACTLY_ONCE, **kw):
    session = copier(lane, mode, **kw).open_lane("orders", 3, "dr.orders", 3)
    return session.copy(start, end)


def resumable(lane: Lane, position: int = 6, *, marker: bool = True, **fields) -> Checkpoint:
    """The target holds source offsets [0, position) at [0, position) (then a commit marker), and a checkpoint
    says so."""
    lane.target.landed = [(o, o) for o in range(position)]
    lane.target.next = position + marker
    values = dict(pipeline=PIPELINE, topic="orders", partition=3, position=position, target_topic="dr.orders",
                  target_partition=3, target_next=position, owner="copy", owner_epoch=0,
                  offset_map=OffsetMap.from_runs([OffsetRun(0, position, 0)], start=0, position=position,
                                                 target_next=position),
                  source_topic_id="src-id", target_topic_id="dst-id")
    values.update(fields)
    lane.store.initial = Checkpoint(**values)
    return lane.store.initial


def source_offsets(target: Target) -> list[int]:
    return [source for _, source in target.landed]


# -- resume from the checkpoint ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_a_lane_resumes_at_its_checkpoint(lane, mode):
    resumable(lane, 6, marker=mode is DeliveryMode.EXACTLY_ONCE)
    result = run(lane, 0, 12, mode)
    assert source_offsets(lane.target) == list(range(12))  # 0-5 once, from before; 6-11 from this copy
    # exactly-once after the last commit's marker, at-least-once after the marker of the fence the open set
    first = 7
    assert dict((s, t) for t, s in lane.target.landed)[6] == first
    stored = lane.store.stored
    assert (stored.position, stored.target_next, result.source_end) == (12, first + 6, 12)
    assert stored.offset_map.translate(8) == first + 2


@pytest.mark.parametrize("end", [8, 7])
def test_a_rerun_of_finished_work_writes_nothing_and_says_where_the_next_range_starts(lane, end):
    """The checkpoint may even lie past the end: a batch straddling it was copied whole."""
    resumable(lane, 8)
    result = run(lane, 0, end)
    assert source_offsets(lane.target) == list(range(8)) and lane.target.checkpoints == []
    assert result.source_end == 8


# -- who may resume -------------------------------------------------------------------------------------------------

def test_a_lane_handed_to_a_newer_owner_stops_this_writer_before_it_writes(lane):
    resumable(lane, 6, owner="backfill:r2", owner_epoch=3)
    with pytest.raises(OwnershipError) as info:
        run(lane, 0, 12, owner="backfill:r1", owner_epoch=2)
    assert type(info.value) is OwnershipError
    assert str(info.value).startswith("pipeline 'dr' orders-3: owned by 'backfill:r2' at epoch 3, newer than this "
                                      "writer ('backfill:r1', epoch 2)")
    assert source_offsets(lane.target) == list(range(6)) and lane.target.checkpoints == []


def test_an_owner_of_the_same_epoch_resumes(lane):
    resumable(lane, 6, owner="backfill:r2", owner_epoch=3)
    run(lane, 0, 12, owner="backfill:r2", owner_epoch=3)
    assert lane.store.stored.position == 12


def test_a_lane_the_daemon_copied_into_is_refused_to_a_backfill_naming_how_far_it_got(lane):
    resumable(lane, 6, owner=DAEMON_OWNER, owner_epoch=5)
    with pytest.raises(DaemonOwnsLaneError, match="'dr' orders-3: the continuous mirror daemon owns this lane "
                                                  r"\(owner 'daemon', epoch 5\) and has already copied it up to "
                                                  "source offset 6"):
        run(lane, 0, 12, owner="backfill:r1", owner_epoch=1)
    assert lane.target.checkpoints == []


def test_a_lane_handed_off_to_the_daemon_is_a_handoff_not_a_daemon_start(lane):
    resumable(lane, 6, owner=DAEMON_OWNER, owner_epoch=5, handoff_position=4)
    with pytest.raises(OwnershipError) as info:
        run(lane, 0, 12, owner="backfill:r1", owner_epoch=1)
    assert type(info.value) is OwnershipError


def test_the_handoff_seam_stays_on_record_in_every_later_checkpoint(lane):
    resumable(lane, 6, owner=DAEMON_OWNER, owner_epoch=5, handoff_position=4)
    run(lane, 0, 12, owner=DAEMON_OWNER, owner_epoch=5, policy=CommitPolicy(commit_bytes=1))
    assert len(lane.target.checkpoints) > 1
    assert {(cp.owner, cp.handoff_position) for cp in lane.target.checkpoints} == {(DAEMON_OWNER, 4)}


def test_a_lane_the_daemon_started_but_never_wrote_is_taken_over_by_a_backfill_from_its_own_start(lane):
    lane.target.next = 20
    lane.store.initial = Checkpoint(pipeline=PIPELINE, topic="orders", partition=3, position=8,
                                    target_topic="dr.orders", target_partition=3, target_next=None,
                                    owner=DAEMON_OWNER, owner_epoch=5, source_topic_id="src-id",
                                    target_topic_id="dst-id")
    run(lane, 0, 12, owner="backfill:r1", owner_epoch=1)
    assert source_offsets(lane.target) == list(range(12))
    first, last = lane.target.checkpoints[0], lane.store.stored
    # the lane is claimed (a checkpoint of the backfill's at its start) before any data is written
    assert lane.target.events[:3] == ["fence", "checkpoint 0", "data 0-1"]
    assert (first.owner, first.position, first.target_next) == ("backfill:r1", 0, 21)
    assert (last.owner, last.position) == ("backfill:r1", 12)


def test_a_lane_never_continues_into_another_target_partition(lane):
    resumable(lane, 6, target_partition=4)
    with pytest.raises(MirrorError, match="pipeline 'dr' copied orders-3 to dr.orders-4 before; it cannot continue "
                                          "into dr.orders-3"):
        run(lane, 0, 12)


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_recreated_topic_is_refused_at_open(lane, side):
    resumable(lane, 6)
    getattr(lane, side).topic_id = "new-id"
    with pytest.raises(TopicRecreatedError) as info:
        run(lane, 0, 12)
    assert info.value.cluster == {"source": "src", "target": "dst"}[side]
    assert source_offsets(lane.target) == list(range(6)) and lane.target.checkpoints == []  # refused before writing


# -- a start past the checkpoint ------------------------------------------------------------------------------------

def test_a_start_past_the_checkpoint_is_refused_while_the_source_still_has_the_offsets(lane):
    resumable(lane, 6)
    with pytest.raises(SkipRefusedError) as info:
        run(lane, 10, 12)
    err = info.value
    assert (err.cluster, err.topic, err.partition, err.checkpoint_position, err.start) == ("src", "orders", 3, 6, 10)
    assert source_offsets(lane.target) == list(range(6)) and lane.target.checkpoints == []


def test_a_start_past_the_checkpoint_over_deleted_offsets_is_data_loss(lane):
    resumable(lane, 6)
    lane.source.log.start = 8
    with pytest.raises(DataLossError) as info:
        run(lane, 10, 12)
    err = info.value
    assert (err.cluster, err.topic, err.partition, err.expected_offset, err.log_start_offset) == \
        ("src", "orders", 3, 6, 8)


def test_an_accepted_loss_skips_to_the_start_and_records_the_lost_range(lane):
    resumable(lane, 6)
    result = run(lane, 10, 12, accept_loss=True)
    assert source_offsets(lane.target) == [0, 1, 2, 3, 4, 5, 10, 11]
    assert result.lost_ranges == ((6, 10),)
    stored = lane.store.stored
    assert (stored.position, stored.lost_ranges) == (12, ((6, 10),))
    assert stored.offset_map.translate(7) is None and stored.offset_map.translate(10) == 7


def test_a_start_below_the_checkpoint_is_no_loss(lane):
    resumable(lane, 6)
    result = run(lane, 2, 12)
    assert source_offsets(lane.target) == list(range(12)) and result.lost_ranges == ()


# -- when a checkpoint is committed ---------------------------------------------------------------------------------

def batch_bytes(lane: Lane) -> int:
    return len(lane.source.log.batches[0][2])


def test_a_checkpoint_is_committed_every_commit_bytes_and_at_the_end(lane):
    size = batch_bytes(lane)
    result = run(lane, 0, 10, policy=CommitPolicy(commit_bytes=2 * size, commit_interval_ms=3_600_000),
                 options=CopyOptions(max_inflight_bytes=size, overlap=False))
    assert [cp.position for cp in lane.target.checkpoints] == [4, 8, 10] and result.commits == 3
    # exactly-once: each commit's data and checkpoint are one transaction, its marker right after the data
    assert lane.target.events == ["data 0-1", "data 2-3", "commit", "checkpoint 4", "data 4-5", "data 6-7",
                                  "commit", "checkpoint 8", "data 8-9", "commit", "checkpoint 10"]


def test_a_checkpoint_is_committed_once_the_commit_interval_passed(lane, monkeypatch):
    """A slow target: every write takes 0.6 s, the interval is 1 s, so every second flush commits."""
    clock = SimpleNamespace(t=1000.0)
    monkeypatch.setattr(time, "monotonic", lambda: clock.t)
    slow = Writer.write

    def write(self, outgoing):
        clock.t += 0.6
        return slow(self, outgoing)

    monkeypatch.setattr(Writer, "write", write)
    size = batch_bytes(lane)
    run(lane, 0, 10, policy=CommitPolicy(commit_bytes=1 << 30, commit_interval_ms=1000),
        options=CopyOptions(max_inflight_bytes=size, overlap=False))
    assert [cp.position for cp in lane.target.checkpoints] == [4, 8, 10]


def test_each_committed_checkpoint_covers_only_data_already_on_the_target(lane):
    size = batch_bytes(lane)
    run(lane, 0, 12, DeliveryMode.AT_LEAST_ONCE, policy=CommitPolicy(commit_bytes=size),
        options=CopyOptions(max_inflight_bytes=size, overlap=False))
    seen: set[int] = set()
    for event in lane.target.events:
        if event.startswith("data"):
            lo, hi = map(int, event.split()[1].split("-"))
            seen |= set(range(lo, hi + 1))
        elif event.startswith("checkpoint"):
            assert set(range(int(event.split()[1]))) <= seen, event
    assert lane.store.stored.position == 12


def test_an_at_least_once_first_run_stores_where_it_begins_before_its_first_batch(lane):
    run(lane, 4, 12, DeliveryMode.AT_LEAST_ONCE)
    assert lane.target.events[:3] == ["fence", "checkpoint 4", "data 4-5"]
    first = lane.target.checkpoints[0]
    assert (first.position, first.target_next) == (4, 1)  # the data lands after the fence's marker


# -- where a resumed copy must land ---------------------------------------------------------------------------------

def test_a_target_that_ends_before_the_checkpoint_halts_the_lane_naming_both_offsets(lane):
    resumable(lane, 6)
    lane.target.next = 4  # truncated (or recreated with the same id) under the lane
    with pytest.raises(ForeignWriteError) as info:
        run(lane, 0, 12)
    err = info.value
    assert (err.cluster, err.topic, err.partition, err.expected_offset, err.landed_offset) == \
        ("dst", "dr.orders", 3, 6, 4)
    assert "ends before the checkpoint" in str(err)
    assert lane.store.stored.position == 6  # nothing committed past the old checkpoint


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_a_lane_without_checkpoint_refuses_a_target_holding_records_and_writes_nothing_committed(lane, mode):
    """A renamed pipeline, a lost checkpoint topic, another writer: nothing of this pipeline explains them."""
    lane.target.landed = [(o, o) for o in range(5)]  # another pipeline name's copy of source offsets 0-4
    lane.target.next = 6
    with pytest.raises(TargetNotEmptyError) as info:
        run(lane, 0, 12, mode)
    err = info.value
    assert (err.cluster, err.topic, err.partition, err.pipeline, err.position, err.log_start) == \
        ("dst", "dr.orders", 3, PIPELINE, 0, 0)
    assert "has no checkpoint" in str(err) and "already holds committed records" in str(err)
    assert lane.store.stored is None  # no checkpoint claims the partition
    if mode is DeliveryMode.EXACTLY_ONCE:
        assert lane.target.events[-1] == "abort"  # its first batch was written in a transaction, then aborted
    else:
        assert source_offsets(lane.target) == list(range(5))  # refused before its first batch


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_a_lane_without_checkpoint_refuses_another_producers_open_transaction_on_its_target(lane, mode):
    """An open transaction can hide committed records above it from a READ_COMMITTED look: refused too."""
    lane.target.next, lane.target.open_txn_at = 4, 1
    with pytest.raises(TargetNotEmptyError, match=r"open transaction \(from offset 1\)"):
        run(lane, 0, 12, mode)
    assert lane.store.stored is None


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_a_lane_without_checkpoint_starts_on_a_target_of_markers_only_or_emptied_by_retention(lane, mode):
    lane.target.next = 3  # an aborted first attempt's markers, an at-least-once fence's
    run(lane, 0, 4, mode)
    target = lane.target
    target.landed, target.checkpoints, target.earliest, target.next = [(o, o) for o in range(4)], [], 10, 10
    run(lane, 0, 4, mode)  # records there once, all deleted by the target's retention: nothing left to explain
    assert lane.store.stored.position == 4


def test_another_producers_open_transaction_between_the_checkpoint_and_the_landing_halts_the_lane(lane):
    resumable(lane, 6)
    lane.target.next, lane.target.open_txn_at = 9, 7
    with pytest.raises(ForeignWriteError, match="another producer's transaction is open at offset 7"):
        run(lane, 0, 12)
    assert lane.store.stored.position == 6


def test_the_lanes_own_undecided_transaction_below_the_landing_is_retried_not_halted(lane, monkeypatch):
    """After a target broker restarted with the lane's commit in progress, InitProducerId returned while that
    transaction's markers were not written yet: open below the landing, but the lane's own (its producer id at an
    older epoch). Halting named a foreign writer that does not exist (CI at 1dfbb92); copying on from the older
    checkpoint would duplicate what that transaction commits. The lane fails retriably and reads its checkpoint
    again when it reopens."""
    from mirror_core.engine import resume_landing
    from mirror_core.errors import OwnTransactionUndecidedError
    from mirror_core.model.lane_status import classify_failure

    resumable(lane, 6)
    lane.target.next, lane.target.open_txn_at = 9, 7
    monkeypatch.setattr(resume_landing, "own_open_transaction", lambda session, open_at: (42, 0))
    with pytest.raises(OwnTransactionUndecidedError, match="own earlier transaction .* open at offset 7") as raised:
        run(lane, 0, 12)
    assert classify_failure(raised.value) == (True, "checkpoint")
    assert lane.store.stored.position == 6  # nothing committed past the checkpoint it read


def test_at_least_once_does_not_retry_on_an_open_transaction_below_its_landing(lane, monkeypatch):
    """At-least-once writes its first batch outside any transaction: a retry would write it again, so the own-
    transaction look is exactly-once only (an at-least-once lane's own fences are empty aborted transactions)."""
    from mirror_core.engine import resume_landing

    resumable(lane, 6)
    lane.target.next, lane.target.open_txn_at = 9, 7
    monkeypatch.setattr(resume_landing, "own_open_transaction", lambda session, open_at: (42, 0))
    with pytest.raises(ForeignWriteError, match="another producer's transaction is open at offset 7"):
        run(lane, 0, 12, DeliveryMode.AT_LEAST_ONCE)


def test_offsets_retention_removed_between_the_checkpoint_and_the_landing_are_not_judged(lane):
    resumable(lane, 6)
    lane.target.next = lane.target.earliest = 9
    run(lane, 0, 12)
    assert lane.store.stored.position == 12


# -- the at-least-once fence renewal --------------------------------------------------------------------------------

def test_an_at_least_once_fence_is_due_one_refence_interval_after_it_was_set(lane, monkeypatch):
    clock = SimpleNamespace(t=500.0)
    monkeypatch.setattr(time, "monotonic", lambda: clock.t)
    session = copier(lane, DeliveryMode.AT_LEAST_ONCE, policy=CommitPolicy(refence_interval_s=60)).open_lane(
        "orders", 3, "dr.orders", 3)
    assert session.fence_due_at == 560.0 and not session.fence_due
    clock.t = 559.9
    assert not session.fence_due
    clock.t = 560.0
    assert session.fence_due
    exactly_once = copier(lane).open_lane("orders", 3, "dr.orders", 3)
    assert exactly_once.fence_due_at is None and not exactly_once.fence_due


@pytest.mark.parametrize(("elapsed", "fences"), [(59.0, 1), (61.0, 2)])
def test_a_copy_renews_a_due_fence_first_and_lands_after_its_marker(lane, monkeypatch, elapsed, fences):
    clock = SimpleNamespace(t=500.0)
    monkeypatch.setattr(time, "monotonic", lambda: clock.t)
    resumable(lane, 6, marker=False)
    session = copier(lane, DeliveryMode.AT_LEAST_ONCE, policy=CommitPolicy(refence_interval_s=60)).open_lane(
        "orders", 3, "dr.orders", 3)
    session.copy(0, 8)  # lands at 7, after the fence the open set
    clock.t += elapsed
    session.copy(8, 12)
    assert lane.target.fences == fences
    assert source_offsets(lane.target) == list(range(12))
    assert dict((s, t) for t, s in lane.target.landed)[8] == 9 + fences - 1
    assert lane.store.stored.position == 12


# -- at-least-once on a target without transactions: the owner check ------------------------------------------------

@pytest.fixture
def no_transactions(lane, monkeypatch):
    def writer(client, transactional_id=None, **kw):
        made = Writer(lane.target, **kw)
        if transactional_id is not None:
            def refuse():
                raise TransactionsUnavailableError("dst", transactional_id, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
            made.init_producer_id = refuse
        return made

    monkeypatch.setattr(lane_fence, "BatchWriter", writer)
    return lane


def test_without_transactions_an_at_least_once_lane_copies_unfenced(no_transactions):
    lane = no_transactions
    resumable(lane, 6, marker=False)
    run(lane, 0, 12, DeliveryMode.AT_LEAST_ONCE)
    assert lane.target.fences == 0 and source_offsets(lane.target) == list(range(12))
    assert dict((s, t) for t, s in lane.target.landed)[6] == 6  # no fence marker to land after
    with pytest.raises(TransactionsUnavailableError):
        run(lane, 12, 12)  # exactly-once cannot do without


def test_without_transactions_a_lane_whose_checkpoint_moved_under_it_stops_before_writing(no_transactions):
    lane = no_transactions
    ours = resumable(lane, 6, marker=False)
    session = copier(lane, DeliveryMode.AT_LEAST_ONCE).open_lane("orders", 3, "dr.orders", 3)
    lane.target.checkpoints.append(dataclasses.replace(ours, position=10, target_next=10, owner="copy:other"))
    with pytest.raises(LaneTakenError, match=r"'dr' orders-3: the lane's checkpoint moved under this writer \(ours: "
                                             r"position 6, target offset 6; stored: position 10, target offset 10\)"):
        session.copy(0, 12)
    assert source_offsets(lane.target) == list(range(6))


# -- at-least-once: which records between the checkpoint and the landing are a crashed run's duplicates ----------

SOURCE_RECORDS = [(TS_BASE + i, b"k%d" % i, b"v%d" % i, ()) for i in range(8)]


@given(cuts=st.lists(st.integers(1, len(SOURCE_RECORDS)), min_size=1, max_size=4))
def test_records_that_are_crashed_runs_partial_copies_of_the_source_from_the_checkpoint_are_duplicates(cuts):
    """Every crashed at-least-once run after the checkpoint started copying at the checkpoint: what lies between
    the checkpoint and the landing is one or more prefixes of the source from there, one after another."""
    found = [record for cut in cuts for record in SOURCE_RECORDS[:cut]]
    assert resume_landing.restarted_copies(found, SOURCE_RECORDS[:len(found)])


@given(cuts=st.lists(st.integers(1, len(SOURCE_RECORDS)), min_size=1, max_size=4), data=st.data())
def test_a_record_that_is_not_the_sources_next_is_not_a_duplicate(cuts, data):
    """A record another writer produced, or a source record out of its place: the lane halts (ForeignWriteError)."""
    found = [record for cut in cuts for record in SOURCE_RECORDS[:cut]]
    at = data.draw(st.integers(0, len(found) - 1), label="at")
    found[at] = data.draw(st.sampled_from([(TS_BASE, b"k0", b"changed", ()), SOURCE_RECORDS[-1]]), label="record")
    # the source's last record where it would be the next one is a true duplicate: not what this test is about
    legal = at > 0 and found[at - 1] == SOURCE_RECORDS[-2] and found[at] == SOURCE_RECORDS[-1]
    if not legal:
        assert not resume_landing.restarted_copies(found, SOURCE_RECORDS[:len(found)])


class _ProducersTarget:
    """The target client for the own-transaction look: DescribeProducers answers come from ``answers`` in turn (an
    exception class is raised), metadata refreshes are counted."""

    cluster_name = "target"

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = 0
        self.invalidated = 0

    def invalidate(self, topic):
        self.invalidated += 1


def _own_look(monkeypatch, target, *, producer_id=42, epoch=3, real_backoff=False):
    from mirror_core.kafka.active_producers import ActiveProducer
    from mirror_core.kafka.retries import Backoff

    def describe(client, topic, partition):
        client.asked += 1
        answer = client.answers.pop(0)
        if isinstance(answer, type):
            raise answer()
        return [ActiveProducer(*p) for p in answer]

    monkeypatch.setattr(resume_landing, "active_producers", describe)
    if real_backoff:   # its deadline, without its sleeps
        import mirror_core.kafka.retries as retries
        monkeypatch.setattr(retries.time, "sleep", lambda s: None)
    else:
        monkeypatch.setattr(Backoff, "wait", lambda self: True)  # no sleeping in a unit test; the count bounds it
    session = SimpleNamespace(writer=SimpleNamespace(producer_id=producer_id, producer_epoch=epoch),
                              owner=SimpleNamespace(target=target), target_topic="dr.orders", target_partition=3)
    return resume_landing.own_open_transaction(session, 7)


def test_the_own_transaction_look_retries_a_moved_leader_instead_of_halting(monkeypatch):
    """Right after a target restart the leader asked first may answer NOT_LEADER_OR_FOLLOWER (or the connection
    fails): that is retried with fresh metadata, and the lane's own undecided transaction is still recognised (a
    retriable lane error), not taken for another producer's (a halt that needs an operator)."""
    import kafka.errors as Errors

    target = _ProducersTarget(Errors.NotLeaderForPartitionError, Errors.KafkaConnectionError, [(42, 2, 7)])
    assert _own_look(monkeypatch, target) == (42, 2)
    assert target.asked == 3 and target.invalidated == 2


def test_the_own_transaction_look_gives_up_at_once_on_an_error_retrying_cannot_cure(monkeypatch):
    """An old broker without DescribeProducers: asked once, and the open transaction is taken as another
    producer's (the conservative answer), as before."""
    import kafka.errors as Errors

    target = _ProducersTarget(Errors.UnsupportedVersionError, [(42, 2, 7)])
    assert _own_look(monkeypatch, target) is None
    assert target.asked == 1


def test_the_own_transaction_look_tells_another_producer_and_a_newer_epoch_from_its_own(monkeypatch):
    assert _own_look(monkeypatch, _ProducersTarget([(41, 2, 7)])) is None        # another producer id
    assert _own_look(monkeypatch, _ProducersTarget([(42, 3, 7)])) is None        # not an older epoch
    assert _own_look(monkeypatch, _ProducersTarget([(42, 2, 5)])) is None        # open elsewhere
    assert _own_look(monkeypatch, _ProducersTarget([(41, 0, 7), (42, 1, 7)])) == (42, 1)


def test_a_transaction_decided_while_the_own_transaction_look_retried_is_judged_as_the_partition_is_now(
        lane, monkeypatch):
    """The look retried leader moves for a while (a target restart); meanwhile the coordinator wrote the markers of
    the transaction that was open below the landing. DescribeProducers then shows nothing open there: that is no
    foreign writer, and the lane must not halt naming one. The last stable offset is read again and the partition
    judged as it is now (here: the landing follows what was decided, so the copy goes on)."""
    from mirror_core.engine import resume_landing

    resumable(lane, 6)
    lane.target.next, lane.target.open_txn_at = 9, 7
    lane.target.earliest = 9   # what lay in between is not readable any more (its judgement is another test's)

    def look_while_decided(session, open_at):
        lane.target.open_txn_at = None   # the markers were written while the look retried
        return None

    monkeypatch.setattr(resume_landing, "own_open_transaction", look_while_decided)
    run(lane, 0, 12)
    assert lane.store.stored.position == 12


def test_the_own_transaction_look_that_cannot_tell_yet_is_retriable_not_a_halt(monkeypatch):
    """Leader moves for longer than the look's window: the lane cannot tell whose transaction it is yet, which is
    a retriable PartitionUnavailableError (the lane reopens later), not 'another producer's' (a persisted halt)."""
    import kafka.errors as Errors

    from mirror_core.errors import PartitionUnavailableError

    target = _ProducersTarget(*([Errors.NotLeaderForPartitionError] * 200))
    ticks = iter(range(10**6))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))   # each attempt a second later
    with pytest.raises(PartitionUnavailableError, match="DescribeProducers"):
        _own_look(monkeypatch, target, real_backoff=True)
