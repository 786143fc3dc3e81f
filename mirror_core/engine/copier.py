"""Copy a bounded offset range of one source partition to one target partition, as raw batches.

Fetch (READ_COMMITTED, markers and aborted transactions dropped by the fetcher) → prepare each batch for the target
(header rewrite; the named deep cases re-encode and are counted) → produce in order through one
:class:`~mirror_core.kafka.writer.BatchWriter`. Prepared batches are written whenever they reach ``max_inflight_bytes``.

Overlap: as soon as a fetch is answered, the next one is sent (:meth:`RawBatchFetcher.prefetch`), so it travels
while this one's batches are prepared, written and committed; on a far source a lane then pays the fetch round
trip once, not once per fetch plus once per write and commit. Where the in-flight state lives and why it is safe:
the one outstanding Fetch is held by the fetcher (``RawBatchFetcher._prefetched``), and the fetcher's position
moves only when that answer is *taken* (in order, after the previous answer's batches were queued), so order is
the source order and ``CopyResult.source_end`` — the checkpoint — still moves only over written batches or over
offsets whose batches need no copy; a failed write drops the outstanding fetch unread (the next copy resumes at the
checkpoint: nothing skipped, nothing committed twice). Memory is bounded by ``CopyOptions.buffer_budget_bytes``
(DESIGN §3.8): a prefetch is sent only while the answer being processed, the batches waiting to be written and
one more full answer fit in it (:func:`may_prefetch`); by default ``2 × fetch_max_bytes + max_inflight_bytes``.
Answers count whole (:attr:`FetchResult.frame_bytes`: aborted transactions, markers and a cut-off tail included),
and so does an answer kept alive by batches waiting in place (re-stamped in its buffer, not copied).
Overlap on the target side too: with a writer that takes a write a batch at a time
(:meth:`BatchWriter.stream <mirror_core.kafka.writer.BatchWriter.stream>`), each prepared batch is given to the open
:class:`~mirror_core.kafka.writer.WriteStream` as soon as it is prepared (sent as the pipeline's limits allow) and the
flush only finishes the stream, so the broker works on a write's first batches while the copier prepares the rest;
the batches are held exactly as before (they wait in ``pending`` for the flush's bookkeeping), the checkpoint still
moves at the flush only, and a copy failing with a stream open settles it (answers in flight taken, nothing more sent).

Range bounds: by default whole batches are copied, so a batch that straddles ``end`` is copied whole and the
actual end (the next offset after it) is reported; the next range or the daemon starts there. With
``exact_bounds`` straddling batches are trimmed (a deep case). A *resumed* copy (its start is a checkpoint position,
so everything below it is on the target already) trims the head of a first batch straddling the start, exact
bounds or not: an exact range or a time bound may have ended inside that batch.

Delivery: the copier itself only writes; a :class:`FlushListener` (see :mod:`mirror_core.engine.checkpointed`) turns
flushes into transactions and checkpoints. Invariants: batches reach the target in source order; within a session
the target offsets a partition receives are contiguous except for one transaction marker per commit (a jump means
someone else wrote to it, and the copy halts); ``CopyResult.source_end`` never passes what the target acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mirror_core.codec.batch_coalesce import coalesce_items
from mirror_core.codec.batch_codec import MAX_TIMESTAMP_OFFSET, PreparedBatch
from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.codec.kafka_primitives import I64
from mirror_core.codec.records_digest import RecordsDigest
from mirror_core.config.coalescing import checked_coalesce_bytes
from mirror_core.errors import ConfigError, CorruptBatchError, MirrorError, ProducerFencedError
from mirror_core.kafka.fetcher import FetchResult, RawBatchFetcher, kept_bytes_of
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch, WriteStream
from mirror_core.model.offset_runs import OffsetRuns
from mirror_core.model.ranges import PartitionRange
from mirror_core.model.throttle import Throttle

log = logging.getLogger(__name__)

# A concurrent copy's fetch round never asks for more than this by default, whatever its partition count (memory):
# the copy holds about two rounds plus one round's prepared batches (see mirror_core.engine.concurrent_copy)
DEFAULT_ROUND_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class CopyOptions:
    exact_bounds: bool = False
    preserve_log_append_time: bool = True
    fetch_max_bytes: int = 4 * 1024 * 1024
    max_inflight_bytes: int = 8 * 1024 * 1024
    stall_timeout_s: float = 30.0  # no progress while the source has nothing more to give: the range is wrong
    throttle_bytes_per_s: float | None = None  # shared by every range this copier copies
    overlap: bool = True  # send the next fetch while the previous range is written (see the module docstring)
    buffer_budget_bytes: int | None = None  # None: 2 × fetch_max_bytes + max_inflight_bytes
    # a concurrent copy's fetch round (every source broker's request together) asks for at most this many bytes
    round_max_bytes: int = DEFAULT_ROUND_MAX_BYTES
    # concurrent copy, modes none and at-least-once: the lanes' writes to one target broker share Produce requests
    combine_lanes: bool = True
    # concurrent copy: connections per source broker a round deals that broker's partitions over (each its own
    # request and TCP window; fast path only): > 1 where one connection's window per round trip is below the link
    fetch_connections: int = 1
    # > 0: runs of small batches (any codec) are merged into batches of up to this many bytes (the named deep
    # case ``coalesced``, mirror_core.codec.batch_coalesce): one Produce request per run instead of per batch
    coalesce_bytes: int = 0

    def __post_init__(self) -> None:
        if self.fetch_max_bytes <= 0 or self.max_inflight_bytes <= 0:
            raise ConfigError("fetch_max_bytes and max_inflight_bytes must be positive")
        if self.buffer_budget_bytes is not None and self.buffer_budget_bytes <= 0:
            raise ConfigError("buffer_budget_bytes must be positive")
        if self.round_max_bytes <= 0:
            raise ConfigError("round_max_bytes must be positive")
        if self.fetch_connections < 1:
            raise ConfigError("fetch_connections must be at least 1")
        checked_coalesce_bytes(self.coalesce_bytes)

    @property
    def budget_bytes(self) -> int:
        """Bytes of fetched and prepared data a copy may hold at once, a prefetched answer included."""
        if self.buffer_budget_bytes is not None:
            return self.buffer_budget_bytes
        return 2 * self.fetch_max_bytes + self.max_inflight_bytes


def answer_size(fetched: FetchResult, kept_bytes: int) -> int:
    """Bytes a fetch answer's batches keep alive: its records section as the fetcher measured it, else the buffers
    its views are over (never less than the kept batches themselves)."""
    if fetched.frame_bytes is not None:
        return max(fetched.frame_bytes, kept_bytes)
    buffers = {id(view.buffer.obj): view.buffer.obj for view in fetched.batches}
    return max(sum(memoryview(buffer).nbytes for buffer in buffers.values()), kept_bytes)


def may_prefetch(*, held_bytes: int, fetch_max_bytes: int, budget_bytes: int) -> bool:
    """Whether a copy holding ``held_bytes`` (the answer being processed plus batches waiting to be written) may
    send one more fetch, whose answer can be as large as ``fetch_max_bytes``, and stay within ``budget_bytes``."""
    return held_bytes + fetch_max_bytes <= budget_bytes



@dataclass
class StallWatch:
    """Tells a range planned past the partition's end from a source that is merely slow (both copiers use it).

    The wait starts at the first answer that made no progress while the fetch position is at or above the last
    stable offset, and resets when the position moves or the source has more: a fetch retried across a leader
    failover can take longer than the timeout, and a new leader whose high watermark lags the position for an
    answer or two is not a range planned past the end."""

    timeout_s: float
    since: float | None = None  # the first empty answer at the last stable offset since the position last moved

    def moved(self) -> None:
        self.since = None

    def no_progress(self, source: str, rng: PartitionRange, fetched, position: int) -> None:
        """An answer that did not move ``position``: raise once this has lasted ``timeout_s`` with the source
        holding nothing more (MirrorError naming the cluster, partition, range end and last stable offset)."""
        if fetched.last_stable_offset > position:
            self.since = None  # the source has more: data is coming
            return
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > self.timeout_s:
            raise MirrorError(
                f"cluster {source!r} {rng.topic}-{rng.partition}: the range ends at {rng.end} but the partition's "
                f"last stable offset is {fetched.last_stable_offset} (high watermark {fetched.high_watermark}) and "
                f"nothing arrived for {self.timeout_s:.0f}s; plan the range up to the last stable offset")

@dataclass
class CopyResult:
    """What one range copy did. ``source_end`` is where the next copy of this partition starts."""

    range: PartitionRange
    source_start: int
    source_end: int
    records: int = 0
    batches: int = 0
    bytes: int = 0
    deep_batches: int = 0
    coalesced_batches: int = 0  # source batches merged into larger ones (``CopyOptions.coalesce_bytes``)
    first_target_offset: int | None = None
    next_target_offset: int | None = None
    offset_runs: OffsetRuns = field(default_factory=OffsetRuns)
    records_digest: str = ""
    seconds: float = 0.0
    commits: int = 0
    newest_timestamp_ms: int | None = None  # the newest record timestamp among the copied batches (record age)
    lost_ranges: tuple[tuple[int, int], ...] = ()  # source ranges skipped by an accepted loss (never copied)
    source_end_epoch: int | None = None  # source leader epoch of the last batch below source_end (None: unknown)

    @property
    def last_target_offset(self) -> int | None:
        return None if self.next_target_offset is None else self.next_target_offset - 1


Progress = Callable[[CopyResult], None]


class FlushListener(Protocol):
    """Told after every acknowledged flush and at the end; returns how many transaction markers it added to the
    target partition (each commit writes one), so the contiguity check can allow for them."""

    def flushed(self, result: CopyResult, *, final: bool) -> int: ...


class LandingRule(Protocol):
    """Told where a copy's first batch landed on the target (later ones are checked for contiguity by the copier
    itself); raises to halt the copy when the target does not end where the caller's state says it should. Told
    too, once, just before that batch is written (a lane with no checkpoint yet records where it will land)."""

    def before_first_write(self, prepared: PreparedBatch) -> None:
        """Called once, before the copy's first batch (``prepared``) is written."""

    def first_landing(self, prepared: PreparedBatch, base: int) -> None: ...


class BatchSource(Protocol):
    """What the copier reads from: :class:`RawBatchFetcher`, or :class:`FetchedOnce`."""

    position: int
    last_epoch: int  # leader epoch of the batch just below position (-1: unknown)

    @property
    def done(self) -> bool: ...

    def fetch(self) -> FetchResult: ...


class FetchedOnce:
    """A batch source over one fetch result already received: gives it once, then is done at its next offset.

    The daemon fetches many partitions in one request per broker (:mod:`mirror_core.kafka.broker_fetch`) and copies each
    partition's share through the same copier path as a bounded range ``[start, result.next_offset)``."""

    def __init__(self, result: FetchResult, start: int):
        self._result = result
        self.position = start
        self.last_epoch = -1
        self.done = False

    @property
    def batches(self) -> list:
        """The answer's batches, whether or not taken yet (read-only: for reports about a failed share)."""
        return self._result.batches

    def fetch(self) -> FetchResult:
        self.done = True
        if self._result.next_offset > self.position:
            self.position, self.last_epoch = self._result.next_offset, self._result.last_epoch
        return self._result


class RangeCopier:
    """Copies :class:`PartitionRange` s from one source cluster to one target cluster through a shared writer."""

    def __init__(self, source: WireClient, target: WireClient, writer: BatchWriter | None = None,
                 options: CopyOptions | None = None, listener: FlushListener | None = None):
        self.source = source
        self.target = target
        self.writer = writer or BatchWriter(target)
        self.options = options or CopyOptions()
        self.listener = listener
        self.throttle = Throttle(self.options.throttle_bytes_per_s) if self.options.throttle_bytes_per_s else None

    def copy(self, rng: PartitionRange, progress: Progress | None = None, *,
             offset_runs: OffsetRuns | None = None, fetcher: BatchSource | None = None,
             landing: LandingRule | None = None, start_epoch: int | None = None,
             resume: bool = False, topic_id: str | None = None) -> CopyResult:
        """Copy ``rng``; ``offset_runs`` continues an earlier map of this partition (a resumed copy), and
        ``start_epoch`` is the source leader epoch below ``rng.start`` (a checkpoint's, sent as LastFetchedEpoch).

        ``fetcher`` replaces the copier's own :class:`RawBatchFetcher` over ``rng`` (the daemon passes
        :class:`FetchedOnce`: batches it already fetched for many partitions in one request per broker).
        ``resume``: every offset below ``rng.start`` is on the target already (the start is a checkpoint
        position), so a first batch straddling the start is trimmed to it (a counted deep case) instead of being
        copied whole as a fresh copy does; otherwise its head would be copied twice. ``topic_id``: the source topic
        id the caller pinned (a lane's, at open): the copier's own fetcher asks by it, so a topic recreated since
        is refused, never read at the old positions."""
        opts = self.options
        started = time.monotonic()
        result = CopyResult(rng, source_start=rng.start, source_end=rng.start,
                            offset_runs=offset_runs if offset_runs is not None else OffsetRuns())
        session = _Session(RecordsDigest(), landing=landing)
        if rng.start == rng.end:
            return self._finish(result, session, started, progress)
        if fetcher is None:
            fetcher = RawBatchFetcher(self.source, rng.topic, rng.partition, rng.start, rng.end,
                                      max_bytes=opts.fetch_max_bytes, last_epoch=start_epoch, topic_id=topic_id,
                                      check_crcs=False)   # prepare_for_target checks each batch
        bounds = (rng.start, rng.end) if opts.exact_bounds else (rng.start, None) if resume else None
        try:
            return self._copy_from(rng, result, session, fetcher, bounds, started, progress)
        finally:
            discard = getattr(fetcher, "discard_prefetch", None)
            if discard is not None:
                discard()  # a failed copy leaves no fetch outstanding whose answer anyone could take

    def _copy_from(self, rng: PartitionRange, result: CopyResult, session: _Session, fetcher: BatchSource,
                   bounds, started: float, progress: Progress | None) -> CopyResult:
        try:
            return self._copy_loop(rng, result, session, fetcher, bounds, started, progress)
        except BaseException as exc:
            stream, session.stream = session.stream, None
            if stream is not None:   # batches may be in flight: take their answers, send nothing more
                if not isinstance(exc, Exception):
                    stream.drop()    # interrupted: no waiting for answers (the writer renews its producer id)
                else:
                    fence = stream.settle()
                    if isinstance(fence, ProducerFencedError):   # the lane is no longer ours, whatever else failed
                        raise fence from exc
                    if fence is not None:   # e.g. the transaction timed out meanwhile: the copy's own error stands
                        log.warning("cluster %r %s-%d: %s (while the copy failed: %s)", self.target.cluster_name,
                                    rng.target_topic, rng.target_partition, fence, exc)
            if isinstance(exc, CorruptBatchError) and exc.cluster is None:
                # a source batch its preparation (or coalescing) refused: the codec does not know where it was
                raise exc.located(self.source.cluster_name, rng.topic, rng.partition) from None
            raise

    def _copy_loop(self, rng: PartitionRange, result: CopyResult, session: _Session, fetcher: BatchSource,
                   bounds, started: float, progress: Progress | None) -> CopyResult:
        opts = self.options
        prefetch = getattr(fetcher, "prefetch", None) if opts.overlap else None
        # overlap: each prepared batch goes to a write stream at once, so the target works on a write's first
        # batches while the copier prepares the rest (on one partition of small batches the broker sat idle through
        # every preparation); the batches still wait in ``pending`` for their bookkeeping at the flush
        streaming = opts.overlap and getattr(self.writer, "stream", None) is not None
        pending: list[PreparedBatch] = []
        pending_bytes = 0
        stall = StallWatch(opts.stall_timeout_s)
        last_position = fetcher.position
        while not fetcher.done:
            fetched = fetcher.fetch()
            kept_bytes = kept_bytes_of(fetched)
            answer_bytes = answer_size(fetched, kept_bytes)
            if prefetch is not None and may_prefetch(
                    held_bytes=pending_bytes + answer_bytes,
                    fetch_max_bytes=opts.fetch_max_bytes, budget_bytes=opts.budget_bytes):
                prefetch()  # travels while this answer is prepared, written and committed
            if self.throttle is not None and fetched.batches:
                self.throttle.consume(kept_bytes)
            # In place (no copy): the answer is this copy's own and its source bytes are not read again. A batch
            # re-stamped in place keeps the whole answer alive until it is written (a slice of its buffer: the
            # aborted transactions, markers, cut-off tail and batches past the range end in it too), so: only
            # for an answer mostly made of kept batches (else copying them costs little and frees the answer),
            # only until a flush inside the answer (the batches after it are copied), and an answer still held
            # by pending batches when the next one is taken counts whole in ``pending_bytes`` (DESIGN §3.8)
            in_place = 2 * kept_bytes >= answer_bytes
            held_in_place = 0  # bytes of this answer's batches pending in place (0: the answer is not held)
            # coalescing on: runs of small batches come merged, each a prepared batch (a counted deep case)
            items = coalesce_items(fetched.batches, opts.coalesce_bytes, *(bounds or (None, None)),
                                   log_append_time_to_max=opts.preserve_log_append_time) \
                if opts.coalesce_bytes else fetched.batches
            for view in items:
                if view.__class__ is PreparedBatch:
                    prepared = view
                    result.coalesced_batches += prepared.coalesced
                    newest = I64.unpack_from(prepared.data, MAX_TIMESTAMP_OFFSET)[0]
                else:
                    prepared = prepare_for_target(view, preserve_log_append_time=opts.preserve_log_append_time,
                                                  exact_bounds=bounds, in_place=in_place)
                    if prepared is None:
                        continue
                    newest = view.max_timestamp
                # a whole first batch straddling the start: the copy began below it (a legacy wrapper's first
                # offset is known only once decoded, hence the prepared batch, not the view)
                result.source_start = min(result.source_start, prepared.source_first_offset)
                if result.newest_timestamp_ms is None or newest > result.newest_timestamp_ms:
                    result.newest_timestamp_ms = newest
                pending.append(prepared)
                pending_bytes += len(prepared.data)
                if streaming:
                    streaming = self._stream(rng, session, prepared)
                if isinstance(prepared.data, memoryview):
                    held_in_place += len(prepared.data)
                if pending_bytes >= opts.max_inflight_bytes:
                    self._flush(rng, pending, result, session)
                    pending, pending_bytes = [], 0
                    in_place, held_in_place = False, 0
            if held_in_place:
                # the rest of this answer stays alive behind its pending batches: count it as held
                pending_bytes += max(answer_bytes - held_in_place, 0)
                if pending_bytes >= opts.max_inflight_bytes:
                    self._flush(rng, pending, result, session)
                    pending, pending_bytes = [], 0
            # progress is the fetch position moving (batches, or markers and aborted data it stepped over), not the
            # position being above source_end: batches pending in the write window keep source_end behind it, and a
            # range past the last stable offset would then fetch the empty end of the partition for ever
            if fetched.batches or fetcher.position > last_position:
                last_position = fetcher.position
                stall.moved()
            else:
                stall.no_progress(self.source.cluster_name, rng, fetched, fetcher.position)
            # everything up to the fetch position is either pending or needs no copy (markers, aborted data)
            if not pending:
                _advance_end(result, self._reachable_end(fetcher, rng), fetcher.last_epoch)
            if progress is not None:
                progress(result)
            # drop this response's views before the next fetch is taken: besides the prefetched answer, only answers
            # held by batches pending in place stay alive, and those are counted whole in pending_bytes: what is
            # held is the pending bytes plus this answer and the prefetched one (bounded by may_prefetch)
            fetched = view = items = prepared = None
        if pending:
            self._flush(rng, pending, result, session)
        _advance_end(result, self._reachable_end(fetcher, rng), fetcher.last_epoch)
        return self._finish(result, session, started, progress)

    def _finish(self, result: CopyResult, session: _Session, started: float, progress: Progress | None):
        if self.listener is not None:
            self.listener.flushed(result, final=True)
        result.records_digest = session.digest.hexdigest()
        result.seconds = time.monotonic() - started
        if progress is not None:
            progress(result)
        return result

    def _reachable_end(self, fetcher: BatchSource, rng: PartitionRange) -> int:
        return fetcher.position if not self.options.exact_bounds else min(fetcher.position, rng.end)

    def _stream(self, rng: PartitionRange, session: _Session, prepared: PreparedBatch) -> bool:
        """Give ``prepared`` to the open write stream (opened, and the landing rule told, at a write's first
        batch); False when the writer writes whole lists only (then :meth:`_flush` writes ``pending``)."""
        if session.stream is None:
            stream = self.writer.stream()
            if stream is None:
                return False
            self._announce(session, prepared)
            session.stream = stream
        session.stream.add(OutgoingBatch(rng.target_topic, rng.target_partition, prepared.data,
                                         prepared.source_first_offset))
        # digested as it is given, in the order written (a copy that fails after this returns no digest): the
        # flush's bookkeeping, done while the target waits for the next round, is then that much shorter
        session.digest.add_batches((prepared.data,))
        return True

    @staticmethod
    def _announce(session: _Session, first: PreparedBatch) -> None:
        """Before the copy's first batch is sent: the landing rule's look at it (once per copy)."""
        if session.expected is None and session.landing is not None and not session.announced:
            session.announced = True
            session.landing.before_first_write(first)

    def _flush(self, rng: PartitionRange, pending: list[PreparedBatch], result: CopyResult,
               session: _Session) -> None:
        stream, session.stream = session.stream, None
        streamed = stream is not None and len(stream) == len(pending)
        if streamed:   # every pending batch was given to the stream, and digested then (_stream)
            bases = stream.finish()
        else:
            if stream is not None:  # cannot happen: every pending batch went to the stream or none did
                stream.settle()     # (its result is moot: this error halts the copy)
                raise MirrorError(f"{rng.topic}-{rng.partition}: {len(stream)} of {len(pending)} batches were "
                                  "streamed")
            self._announce(session, pending[0])
            bases = self.writer.write([OutgoingBatch(rng.target_topic, rng.target_partition, p.data,
                                                     p.source_first_offset) for p in pending])
        self._account(rng, pending, bases, result, session, digested=streamed)
        if self.listener is not None:
            session.markers_allowed += self.listener.flushed(result, final=False)

    def _account(self, rng: PartitionRange, pending: list[PreparedBatch], bases: list[int], result: CopyResult,
                 session: _Session, *, digested: bool = False) -> None:
        """Book a flush's acknowledged batches, in order: the landing check of each (:meth:`_Session.check_landing`),
        the offset map, the counts, the source end and (unless ``digested``: done as they were streamed) the
        digest. The batch landing where the one before it ended (every batch of a flush but the first, as a rule)
        is checked inline, and batches landing one after another at one shift enter the offset map as one span
        (what adding them one by one makes of them: the same runs); the rest take the general steps. On one
        partition of small batches this runs while the target waits for the next round, so it is kept to a few
        steps per batch."""
        check_landing, cluster = session.check_landing, self.target.cluster_name
        runs = result.offset_runs
        expected, allowed = session.expected, session.markers_allowed
        source_end, source_end_epoch = result.source_end, result.source_end_epoch
        records = size = deep = 0
        # batches landing right after the one before, at its shift: the map's last run grows by ``grown`` records
        # from source ``span_end - grown`` (added at once, after the span), so each adds no run of its own
        shift = span_end = None
        grown = 0
        for prepared, base in zip(pending, bases, strict=True):
            count = prepared.record_count
            if expected is None or base != expected or allowed:   # _Session.check_landing's general rules
                session.expected = expected
                base = check_landing(cluster, rng, prepared, base)
                allowed = 0   # check_landing allows markers before the flush's first batch only
            expected = base + count
            source = prepared.source_first_offset
            if span_end == source and base - source == shift and count > 0 and prepared.source_offsets is None:
                span_end += count
                grown += count
            else:   # added as add_batch adds it (checked against the map: an error names this batch's run)
                if grown:
                    runs.add_batch(span_end - grown + shift, ((span_end - grown, 0, grown),))
                    grown = 0
                runs.add_batch(base, prepared.offset_runs())
                shift, span_end = (base - source, source + count) if prepared.source_offsets is None else (None, None)
            if result.first_target_offset is None:
                result.first_target_offset = base
            records += count
            size += len(prepared.data)
            deep += prepared.deep
            offset = prepared.source_next_offset   # _advance_end, inline
            if offset > source_end or (offset == source_end and source_end_epoch is None):
                epoch = prepared.source_leader_epoch
                source_end, source_end_epoch = offset, (epoch if epoch >= 0 else None)
        if grown:
            runs.add_batch(span_end - grown + shift, ((span_end - grown, 0, grown),))
        if not digested:
            session.digest.add_batches(prepared.data for prepared in pending)
        if pending:   # (markers_allowed is 0 already: a flush's first batch takes the general rules when it was not)
            session.expected = expected
            result.next_target_offset = expected
        result.records += records
        result.batches += len(pending)
        result.bytes += size
        result.deep_batches += deep
        result.source_end, result.source_end_epoch = source_end, source_end_epoch


def _advance_end(result: CopyResult, offset: int, epoch: int) -> None:
    """Move ``result.source_end`` forward to ``offset``, with the epoch of the source batch just below it."""
    if offset > result.source_end or (offset == result.source_end and result.source_end_epoch is None):
        result.source_end, result.source_end_epoch = offset, (epoch if epoch >= 0 else None)


@dataclass
class _Session:
    """Per-copy bookkeeping of where the next batch must land on the target."""

    digest: RecordsDigest  # over the records sections written, in order
    expected: int | None = None
    markers_allowed: int = 0
    landing: LandingRule | None = None  # checks the first batch (the copier has no earlier landing to go by)
    announced: bool = False  # the landing rule was told about the first batch before it was written
    stream: WriteStream | None = None  # the write being given batch by batch (``pending`` of the copy loop)

    def check_landing(self, cluster: str, rng: PartitionRange, prepared: PreparedBatch, base: int) -> int:
        if base < 0:  # the broker answered "duplicate" without an offset: it is where we expected it
            if self.expected is None:
                raise MirrorError(f"cluster {cluster!r} {rng.target_topic}-{rng.target_partition}: first batch "
                                  "acknowledged without an offset")
            base = self.expected
        elif self.expected is None and self.landing is not None:
            self.landing.first_landing(prepared, base)
        elif self.expected is not None and not self.expected <= base <= self.expected + self.markers_allowed:
            raise MirrorError(
                f"cluster {cluster!r} {rng.target_topic}-{rng.target_partition}: the batch from source offset "
                f"{prepared.source_first_offset} landed at {base}, expected {self.expected}; another writer is "
                "producing to this partition, so the offset map would be wrong")
        self.expected = base + prepared.record_count
        self.markers_allowed = 0
        return base
