"""Copy several partitions' ranges at once: one multi-partition Fetch per source broker per round, one writer per
lane, and the next round in flight while this round is written (``shoal copy``).

Each round sends one FetchRequest per source leader carrying every unfinished range's partition at its position
(:func:`mirror_core.kafka.broker_fetch.send_round`, the Java consumer's way), then — before the answers are taken — the
previous round's shares are written and committed. So the source round trip overlaps the writes, and partitions
no longer wait for one another. In exactly-once mode the lanes write one after another (one transactional producer
per Produce request); in ``none`` and at-least-once mode (``CopyOptions.combine_lanes``) the lanes' shares run as
one-at-a-time tasks whose writes go out together (:mod:`mirror_core.kafka.shared_produce`): one Produce request per
target broker carries a batch of every lane, so small batches cost one request per round of lanes, not per lane.
Where one connection's window caps the link, a round deals a broker's partitions over
``CopyOptions.fetch_connections`` connections to it.

A lane writes its share ``[start, fetcher.position)`` through the same path as the daemon
(:meth:`LaneSession.copy` with :class:`~mirror_core.engine.copier.FetchedOnce`; mode ``none``: a :class:`RangeCopier`
of its own), so every DESIGN §3 rule applies per share: the copy's first batch lands where the checkpoint says,
data and checkpoint commit together, order per partition is the fetch order (one writer per lane, shares in round
order).

Where the in-flight state lives and why it is safe: the one round in flight is a
:class:`~mirror_core.kafka.broker_fetch.PendingRound`; no fetcher's position moves until :meth:`PendingRound.collect`
hands it the answer, which happens only after every share of the previous round was written (or the copy failed
and the round was dropped unread). A lane's checkpoint is committed from what its writer acknowledged, never from
the fetch position. A failure in one lane stops the copy with that lane's error; what other lanes committed stays,
and a rerun resumes every lane at its checkpoint (nothing skipped, nothing written twice in exactly-once mode).

Memory: two rounds at most (the one being written and the one in flight) plus the prepared batches of the round
being written. A round asks each partition for at most ``CopyOptions.fetch_max_bytes`` and all its requests
together for at most ``CopyOptions.round_max_bytes`` (:func:`request_max_bytes`), so peak memory stays near
3 × ``round_max_bytes`` whatever the number of partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from mirror_core.engine.copier import CopyOptions, CopyResult, FetchedOnce, RangeCopier, StallWatch
from mirror_core.errors import PartitionUnavailableError
from mirror_core.kafka.broker_fetch import PartitionOutcome, PendingRound, RoundStats, deal_to_connections, send_round
from mirror_core.kafka.fetcher import RawBatchFetcher, kept_bytes_of
from mirror_core.kafka.shared_produce import SharedProduce
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.offset_runs import OffsetRuns
from mirror_core.model.ranges import PartitionRange
from mirror_core.model.throttle import Throttle

log = logging.getLogger(__name__)

RETRY_DELAY_S = 0.5  # a partition whose fetch failed retriably sits out this long before its next round


class ShareWriter:
    """Writes one lane's shares: ``copy_share(start, end, fetched, first, pace) -> CopyResult`` for ``[start, end)``
    of a round. ``pace`` (None: no throttle) waits for the throttle: a transactional writer calls it after the
    share's data is written and before its commit, so the wait holds the transaction open rather than idling
    between transactions (a copy killed while throttled then leaves an open transaction to abort, as the
    single-lane copy always did)."""

    def __init__(self, copy_share: Callable[[int, int, FetchedOnce, bool, Callable[[], object] | None], CopyResult],
                 resume_at: int | None = None, resume_epoch: int | None = None, batch_writer=None,
                 topic_id: str | None = None):
        self.copy_share = copy_share
        self.resume_at = resume_at        # the lane's checkpoint position (None: none)
        self.resume_epoch = resume_epoch  # the source leader epoch below it
        # the source topic's id the lane pinned when it opened (None: none yet): the lane's fetcher asks by it, so a
        # topic deleted and recreated since is refused (TopicRecreatedError), never read at the old positions
        self.topic_id = topic_id
        # the lane's BatchWriter when its writes may share Produce requests with other lanes' (modes none and
        # at-least-once: no transactions); None: it writes alone (exactly-once)
        self.batch_writer = batch_writer


@dataclass
class _Lane:
    range: PartitionRange
    writer: ShareWriter
    fetcher: RawBatchFetcher
    result: CopyResult
    first: bool = True
    retry_at: float = 0.0
    failing_since: float | None = None
    # a range planned past the partition's end, told from a slow source (the copy passes its options' timeout)
    stall: StallWatch = field(default_factory=lambda: StallWatch(CopyOptions().stall_timeout_s))

    @property
    def done(self) -> bool:
        return self.fetcher.done


def plan_round(lanes: Sequence[_Lane], now: float) -> list[_Lane]:
    """The lanes a round fetches for: unfinished ones not sitting out a retry delay (pure)."""
    return [lane for lane in lanes if not lane.done and lane.retry_at <= now]


def request_max_bytes(partition_max_bytes: int, partitions: int, *, leaders: int = 1,
                      round_max_bytes: int | None = None) -> int:
    """A round's per-request byte limit (pure): every partition of the busiest request can bring a full
    ``partition_max_bytes``, but the round's ``leaders`` requests together never ask for more than
    ``round_max_bytes`` — so what a round holds does not grow with the partition count.

    ``partitions``: the most partitions one request carries. The broker may exceed a request's limit by one batch
    only when that batch alone is larger (it always returns the first batch of the first non-empty partition), so a
    round holds at most ``max(round_max_bytes, leaders × the largest batch)``."""
    wanted = partition_max_bytes * max(1, partitions)
    if round_max_bytes is None:
        return wanted
    return max(1, min(wanted, round_max_bytes // max(1, leaders)))


class ConcurrentCopy:
    """Copies ``ranges`` (one per partition, each its own lane) concurrently; see the module docstring."""

    def __init__(self, source: WireClient, options: CopyOptions, writers: Sequence[ShareWriter],
                 ranges: Sequence[PartitionRange], *, max_wait_ms: int = 500, retry_timeout_s: float = 120.0):
        if len(writers) != len(ranges):
            raise ValueError("one writer per range")
        self.source = source
        self.options = options
        self.retry_timeout_s = retry_timeout_s
        self.max_wait_ms = max_wait_ms
        self.throttle = Throttle(options.throttle_bytes_per_s) if options.throttle_bytes_per_s else None
        self.lanes: list[_Lane] = []
        for rng, writer in zip(ranges, writers, strict=True):
            start = rng.start if writer.resume_at is None else min(max(rng.start, writer.resume_at), rng.end)
            epoch = writer.resume_epoch if writer.resume_at is not None and start == writer.resume_at else None
            fetcher = RawBatchFetcher(source, rng.topic, rng.partition, start, rng.end,
                                      max_bytes=options.fetch_max_bytes, max_wait_ms=max_wait_ms, last_epoch=epoch,
                                      topic_id=writer.topic_id, check_crcs=False)   # checked when prepared
            self.lanes.append(_Lane(rng, writer, fetcher, CopyResult(rng, source_start=start, source_end=start),
                                    stall=StallWatch(options.stall_timeout_s)))
        # modes none / at-least-once: the lanes' writes of a round go out together, one request per target broker
        # carrying every lane's batch (mirror_core.kafka.shared_produce)
        sharing = [w.batch_writer for w in writers if w.batch_writer is not None]
        self.shared = SharedProduce() if options.combine_lanes and len(sharing) > 1 else None
        for writer in sharing if self.shared is not None else ():
            self.shared.attach(writer)
        self.rounds = 0
        self.round_asked_bytes = 0  # what the latest round's requests asked for together (≤ round_max_bytes)
        self.max_round_bytes = 0  # the most source bytes one round brought (measured: memory tests and benchmarks)
        self.stats = RoundStats()  # requests and partitions per round (one request per source broker)

    def run(self, progress: Callable[[PartitionRange, CopyResult], None] | None = None) -> list[CopyResult]:
        try:
            return self._run(progress)
        finally:
            if self.shared is not None:
                self.shared.close()  # the lane threads live for the copy's run

    def _run(self, progress) -> list[CopyResult]:
        started = time.monotonic()
        pending: PendingRound | None = None
        asked: list[tuple[_Lane, int]] = []  # the lanes of ``pending`` and where each one's fetch starts
        while True:
            if pending is None:
                pending, asked = self._send()
                if pending is None:
                    if all(lane.done for lane in self.lanes):
                        break
                    time.sleep(RETRY_DELAY_S)  # every unfinished lane sits out a retry delay
                    continue
            outcomes = pending.collect()  # positions move here, after the previous round was written
            self.max_round_bytes = max(self.max_round_bytes, _round_bytes(outcomes))
            shares = list(zip(asked, outcomes, strict=True))
            pending, asked = self._send()  # the next round travels while this one is written
            try:
                self._write_round(shares, progress)
            except BaseException:
                if pending is not None:  # never collected: no position moves, nothing of it is written
                    log.info("dropping the fetch round in flight unread (%s)",
                             ", ".join(f"{lane.range.topic}-{lane.range.partition} at {at}" for lane, at in asked))
                raise
            # this round's answers are not kept while the next one is collected (a blocking read of a whole round)
            outcomes = shares = None
            if pending is None and all(lane.done for lane in self.lanes):
                break
        for lane in self.lanes:
            lane.result.seconds = time.monotonic() - started
        return [lane.result for lane in self.lanes]

    def _write_round(self, shares, progress) -> None:
        """Write a round's shares: lane by lane, or (shared produce) as lane tasks whose writes go out together;
        once every lane of the round has finished, each failed lane's error is logged and the most severe one
        raised (:func:`most_severe`: a data loss on one lane never hides behind another lane's retriable error)."""
        if self.shared is None:
            for (lane, start), outcome in shares:
                self._write_share(lane, start, outcome)
                if progress is not None:
                    progress(lane.range, lane.result)
            return
        tasks = [lambda lane=lane, start=start, outcome=outcome: self._write_share(lane, start, outcome)
                 for (lane, start), outcome in shares]
        done = self.shared.run(tasks)
        failed = []
        for ((lane, _), _), (_, error) in zip(shares, done, strict=True):
            if error is not None:
                failed.append((lane.range, error))
            elif progress is not None:
                progress(lane.range, lane.result)
        if failed:
            worst = most_severe([error for _, error in failed])
            for rng, error in failed:
                log.error("copy %s-%d: %s: %s%s", rng.topic, rng.partition, type(error).__name__, error,
                          "" if error is worst else " (another lane's error is raised)")
            raise worst

    def _send(self) -> tuple[PendingRound | None, list[tuple[_Lane, int]]]:
        lanes = plan_round(self.lanes, time.monotonic())
        if not lanes:
            return None, []
        self.rounds += 1
        requests, busiest = round_shape(_partitions_by_leader(lanes), self.options.fetch_connections)
        max_bytes = request_max_bytes(self.options.fetch_max_bytes, busiest, leaders=requests,
                                      round_max_bytes=self.options.round_max_bytes)
        self.round_asked_bytes = max_bytes * max(1, requests)
        round_ = send_round(self.source, [lane.fetcher for lane in lanes], max_bytes=max_bytes,
                            max_wait_ms=self.max_wait_ms, rotation=self.rounds, stats=self.stats,
                            connections=self.options.fetch_connections)
        return round_, [(lane, lane.fetcher.position) for lane in lanes]

    def _write_share(self, lane: _Lane, start: int, outcome: PartitionOutcome) -> None:
        rng = lane.range
        if outcome.error is not None:
            if not outcome.retriable:
                raise outcome.error
            now = time.monotonic()
            lane.failing_since = lane.failing_since or now
            if now - lane.failing_since > self.retry_timeout_s:
                raise PartitionUnavailableError(self.source.cluster_name, rng.topic, rng.partition,
                                                type(outcome.error).__name__, offset=start)
            log.info("fetch %s-%d at %d: %s; retrying", rng.topic, rng.partition, start,
                     type(outcome.error).__name__)
            lane.retry_at = now + RETRY_DELAY_S
            return
        lane.failing_since = None
        fetched = outcome.result
        end = lane.fetcher.position if not self.options.exact_bounds else min(lane.fetcher.position, rng.end)
        if end <= start:
            lane.stall.no_progress(self.source.cluster_name, rng, fetched, lane.fetcher.position)
            return
        lane.stall.moved()
        pace = None
        if self.throttle is not None and fetched.batches:
            size = kept_bytes_of(fetched)
            pace = lambda: self.throttle.consume(size)  # noqa: E731 - called once, by the writer
        share = lane.writer.copy_share(start, end, FetchedOnce(fetched, start), lane.first, pace)
        lane.first = False
        _merge(lane.result, share)

def most_severe(errors: Sequence[BaseException]) -> BaseException:
    """The error a copy stops with when several lanes failed in one round (pure): an interrupt or a bug (not an
    :class:`Exception`) first, then one no retry can cure (data loss, a recreated topic, a rejected batch), then a
    retriable one; the earliest lane's among equals."""

    def rank(error: BaseException) -> int:
        if not isinstance(error, Exception):
            return 0
        return 2 if getattr(error, "retriable", False) else 1  # MirrorError and KafkaError both say

    return min(errors, key=rank)


def connections_for_link(*, window_bytes: int | None, rtt_s: float | None, link_bytes_per_s: float,
                         partitions: int, most: int = 4) -> int:
    """Connections per source broker so their windows together carry the link (pure): one connection carries at
    most window / RTT (a broker's fixed ``socket.send.buffer.bytes``); never more than the partitions (each
    connection carries different ones) nor ``most``. 1 when the window is unknown or autotuned."""
    if not window_bytes or window_bytes <= 0 or not rtt_s or rtt_s <= 0 or link_bytes_per_s <= 0:
        return 1
    per_connection = window_bytes / rtt_s
    needed = -(-int(link_bytes_per_s) // max(1, int(per_connection)))
    return max(1, min(needed, partitions, most))


def _round_bytes(outcomes: Sequence[PartitionOutcome]) -> int:
    return sum(kept_bytes_of(outcome.result) for outcome in outcomes if outcome.result is not None)


def round_shape(by_leader: dict[int, list[tuple[str, int]]], connections: int) -> tuple[int, int]:
    """(requests, partitions of the busiest request) of a round whose leaders lead ``by_leader``'s partitions, dealt
    over ``connections`` per leader exactly as :func:`~mirror_core.kafka.broker_fetch.send_round` deals them (pure)."""
    shares = [len(share) for keys in by_leader.values() for share in deal_to_connections(keys, connections)]
    return len(shares), max(shares, default=1)


def _partitions_by_leader(lanes: Sequence[_Lane]) -> dict[int, list[tuple[str, int]]]:
    """{source leader: (topic, partition) of each lane of this round it leads}; a lane whose leader is unknown
    counts as its own (send_round reports its error)."""
    found: dict[int, list[tuple[str, int]]] = {}
    for index, lane in enumerate(lanes):
        try:
            leader = lane.fetcher.locate()[0]
        except Exception:  # noqa: BLE001 - send_round meets the same error and hands it to the lane
            leader = -1 - index
        found.setdefault(leader, []).append((lane.fetcher.topic, lane.fetcher.partition))
    return found


def _merge(total: CopyResult, share: CopyResult) -> None:
    """Add one share's counts to the lane's result (shares come in order: the later one's end wins)."""
    if total.records == 0 and share.records:
        total.source_start = min(total.source_start, share.source_start)
    if total.first_target_offset is None:
        total.first_target_offset = share.first_target_offset
    if share.next_target_offset is not None:
        total.next_target_offset = share.next_target_offset
    if share.source_end >= total.source_end:
        total.source_end, total.source_end_epoch = share.source_end, share.source_end_epoch
    total.records += share.records
    total.batches += share.batches
    total.bytes += share.bytes
    total.deep_batches += share.deep_batches
    total.coalesced_batches += share.coalesced_batches
    total.commits += share.commits
    total.lost_ranges = total.lost_ranges or share.lost_ranges
    if share.newest_timestamp_ms is not None:
        total.newest_timestamp_ms = max(total.newest_timestamp_ms or share.newest_timestamp_ms,
                                        share.newest_timestamp_ms)
    total.records_digest = share.records_digest if not total.records_digest else total.records_digest


def plain_share_writer(source: WireClient, target: WireClient, options: CopyOptions, rng: PartitionRange, *,
                       topic_id: str | None = None) -> ShareWriter:
    """Mode ``none``: the lane's own idempotent writer; one offset map across its shares. ``topic_id``: the source
    topic's id the range was resolved against (the lane's fetcher refuses another)."""
    copier = RangeCopier(source, target, options=replace(options, throttle_bytes_per_s=None))
    runs = OffsetRuns()

    def copy_share(start: int, end: int, fetched: FetchedOnce, first: bool, pace=None) -> CopyResult:
        share = PartitionRange(rng.topic, rng.partition, start, end, rng.target_topic, rng.target_partition)
        result = copier.copy(share, offset_runs=runs, fetcher=fetched)
        if pace is not None:
            pace()
        return result

    return ShareWriter(copy_share, batch_writer=copier.writer, topic_id=topic_id)


def lane_share_writer(session, rng: PartitionRange) -> ShareWriter:
    """Exactly-once / at-least-once: the lane's :class:`~mirror_core.engine.lane_session.LaneSession` (opened, so
    older writers are fenced and the checkpoint is read); each share commits with its checkpoint. The first share
    is asked from ``rng.start``, so a start past the checkpoint is refused or recorded as an accepted loss
    exactly as a single copy does; later shares start at the checkpoint the previous one committed."""

    def copy_share(start: int, end: int, fetched: FetchedOnce, first: bool, pace=None) -> CopyResult:
        return session.copy(rng.start if first else start, end, fetcher=fetched, before_commit=pace)

    return ShareWriter(copy_share, resume_at=session.position, resume_epoch=session.position_epoch,
                       batch_writer=None if session.exactly_once else session.writer,
                       topic_id=session.source_topic_id)
