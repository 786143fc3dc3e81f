"""Fetch committed raw record batches of one source partition.

A Fetch response's ``records`` field is a run of whole record batches, except that the last one may be cut off by
the size limit, and the first one may start before the requested offset. With isolation READ_COMMITTED the broker
stops at the last stable offset and lists the aborted transactions that overlap the returned range; it still
returns the aborted batches themselves, so the client drops them the way the Java consumer does
(:func:`select_committed`). Control batches (commit/abort markers) are never copied: they cannot be produced.

Batches are walked and read by :mod:`mirror_core.codec.batch_codec`, the only module that knows their byte layout, and
handed on as zero-copy views (:class:`~mirror_core.codec.batch_codec.BatchView`) over the response buffer; a legacy
(magic 0/1) entry's offset is the last offset it holds. A kept batch's CRC is checked when it is prepared for the
target (:func:`~mirror_core.codec.batch_prepare.prepare_for_target`); a batch dropped unread (a marker, aborted data)
has its CRC checked here, before it is dropped, so a data batch whose control or transactional bit flipped on the
source halts the copy (:class:`CorruptBatchError`) instead of vanishing from it (the Java consumer checks every
batch's CRC, ``check.crcs``).
"""

from __future__ import annotations

import collections
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.consumer import FetchRequest, IsolationLevel

from mirror_core.codec.batch_codec import (
    CONTROL_ABORT,
    CONTROL_BIT,
    MAGIC_OFFSET,
    TRANSACTIONAL_BIT,
    BatchView,
    control_type,
    verify_crc,
    walk_batches,
    walk_v2_data,
)
from mirror_core.codec.fetch_messages import FetchPartitionSpec, FetchTopicSpec
from mirror_core.errors import (
    CorruptBatchError,
    DataLossError,
    FetchError,
    PartitionUnavailableError,
    SourceTruncatedError,
    TopicRecreatedError,
)
from mirror_core.kafka.epochs import validate_position
from mirror_core.kafka.fetch_requests import diverging_epoch, kafka_python_fetch_request, send_fetch, wait_fetch
from mirror_core.kafka.fetch_session import FetchSession, SessionRequest
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.retries import Backoff, is_retriable
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

_Ticket = tuple[FetchSession, SessionRequest]   # a request sent in a fetch session, and that session


@dataclass(frozen=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


def _verify_all(batches: Iterable[BatchView]) -> None:
    """:func:`verify_crc` of each batch, in order (the first mismatch raises, naming its offset)."""
    for batch in batches:
        verify_crc(batch)


def select_committed(batches: Iterable[BatchView], aborted: Iterable[AbortedTransaction] | None) -> list[BatchView]:
    """The data batches a READ_COMMITTED consumer would read, in order (Java consumer semantics).

    ``aborted`` is the response's aborted-transaction list. Walking in offset order, a producer id becomes
    "aborted" once a batch's last offset reaches that transaction's first offset; its transactional batches are
    dropped until that producer's ABORT marker is seen. Control batches are always dropped.
    """
    pending = collections.deque(sorted(aborted or (), key=lambda txn: txn.first_offset))
    aborted_ids: set[int] = set()
    kept = []
    for batch in batches:   # BatchView's legacy / control / transactional / next_offset, read inline: per batch
        if batch.magic >= 2:
            attributes, producer_id = batch.attributes, batch.producer_id
            if attributes & CONTROL_BIT:
                # dropped unread, so checked here (a kept batch is checked when it is prepared): a data batch whose
                # control bit flipped on the source's disk must halt the copy, not vanish as a marker would
                verify_crc(batch)
            if producer_id >= 0:
                last_offset = batch.base_offset + batch.last_offset_delta
                while pending and pending[0].first_offset <= last_offset:
                    aborted_ids.add(pending.popleft().producer_id)
                if attributes & CONTROL_BIT:
                    if control_type(batch) == CONTROL_ABORT:
                        aborted_ids.discard(producer_id)
                    continue
                if attributes & TRANSACTIONAL_BIT and producer_id in aborted_ids:
                    verify_crc(batch)   # aborted data, dropped unread: its bytes checked first, as a marker's
                    continue
            elif attributes & CONTROL_BIT:
                continue
        kept.append(batch)
    return kept


def ensure_in_order(batches: Sequence[BatchView]) -> None:
    """:class:`CorruptBatchError` for a magic-2 batch that begins below the end of the batch before it. A log's
    batches never overlap, and baseOffset lies outside the CRC: a bit flipped there would otherwise move a batch
    past the range end or out of the kept span (its records skipped), or put it at the wrong offsets in the map."""
    reached = None
    for batch in batches:
        if batch.magic >= 2 and reached is not None and batch.base_offset < reached:
            raise CorruptBatchError(batch.base_offset, f"batch begins below the end ({reached}) of the batch "
                                    "before it (baseOffset is not covered by the CRC)")
        reached = batch.next_offset


def batches_reaching_below(batches: Sequence[BatchView], position: int, end: int) -> list[BatchView]:
    """The leading ``batches`` (fetched from ``position``, in order) that may hold offsets below ``end``.

    A v2 batch does when its base offset is below ``end``. A legacy (magic 0/1) compressed wrapper's offset field
    is its *last* inner offset, so its first one is known only once decoded: it may hold offsets below ``end``
    whenever the batches before it ended below ``end`` (a wrapper straddling an exact bound belongs to both
    ranges; the copier trims it to each).
    """
    ours = []
    reached = position
    for batch in batches:
        first_possible = reached if batch.legacy else batch.base_offset
        if first_possible >= end:
            break
        ours.append(batch)
        reached = batch.next_offset
    return ours


def metadata_stamp_of(client) -> int:
    """``client.metadata_stamp()``; 0 for a stand-in client without one (unit tests' fakes)."""
    stamp = getattr(client, "metadata_stamp", None)
    return stamp() if stamp is not None else 0


def fresh_topic_metadata(client, topic: str, stamp: int):
    """``client.topic_metadata_since``; a fresh look-up on a stand-in client without it."""
    since = getattr(client, "topic_metadata_since", None)
    return since(topic, stamp) if since is not None else client.topic_metadata(topic, refresh=True)


@dataclass(frozen=True)
class FetchResult:
    batches: list[BatchView]     # committed data batches that end at or after the requested offset, in order
    next_offset: int             # where the next fetch starts (past skipped markers and aborted batches too)
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    last_epoch: int = -1         # leader epoch of the batch just below next_offset (-1: unknown)
    # bytes of the partition's records section in the response, which any view in ``batches`` keeps alive: the
    # kept batches plus what was dropped (aborted transactions, markers, a cut-off last batch, batches past the
    # range end). None: unknown (the copier then measures the buffers the views are over)
    frame_bytes: int | None = None
    # the bytes of ``batches`` together (their views' sizes), when the fetcher counted them on its walk; None:
    # not counted (sum the views' sizes: :func:`kept_bytes_of`)
    kept_bytes: int | None = None


def kept_bytes_of(result: FetchResult) -> int:
    """The bytes of ``result``'s batches together: counted by the fetcher's walk, else summed."""
    counted = result.kept_bytes
    return counted if counted is not None else sum(view.size for view in result.batches)


class RawBatchFetcher:
    """Reads the committed batches of one source partition in the offset range [start, end).

    Invariants: ``position`` only moves forward, to the next offset after a whole batch the broker returned
    (kept, skipped control marker or aborted); batches are yielded in offset order, each at most once; a batch
    that straddles ``start`` or ``end`` is yielded whole (trimming is the caller's choice); data deleted before it
    was read raises :class:`DataLossError`, a recreated topic :class:`TopicRecreatedError`, never a silent reset.
    ``last_epoch`` is the leader epoch of the batch just below ``position`` (every batch moved past counts,
    markers and aborted ones too; -1: unknown), sent as Fetch's LastFetchedEpoch, so a source log that was
    truncated below ``position`` answers with a DivergingEpoch and raises :class:`SourceTruncatedError`.
    """

    def __init__(self, client: WireClient, topic: str, partition: int, start: int, end: int | None = None, *,
                 max_bytes: int = 8 * 1024 * 1024, max_wait_ms: int = 500,
                 isolation: IsolationLevel = IsolationLevel.READ_COMMITTED, retry_timeout_s: float = 120.0,
                 topic_id: uuid.UUID | str | None = None, every_batch: bool = False, last_epoch: int | None = None,
                 fetch_session: bool = False, check_crcs: bool = True):
        if end is not None and end < start:
            raise ValueError(f"empty range [{start}, {end})")
        self.client = client
        self.topic = topic
        self.partition = partition
        self.position = start
        self.last_epoch = -1 if last_epoch is None else last_epoch  # the caller's: e.g. a checkpoint's epoch
        self.end = end
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self.isolation = IsolationLevel(isolation)
        self.retry_timeout_s = retry_timeout_s
        self.every_batch = every_batch  # yield control markers and aborted batches too (raw log readers)
        # every batch handed to the caller has its CRC checked first (the Java consumer's ``check.crcs``): a reader
        # that decodes records (checkpoints, timestamps, the landing check's target records) must not act on bytes
        # that changed on a disk. False only for a copy, which checks every batch it writes when it prepares it
        # (``prepare_for_target``; the copied bytes are the broker's to check again). Batches dropped unread
        # (markers, aborted data) are checked either way (:func:`select_committed`, :func:`walk_v2_data`).
        self.check_crcs = check_crcs
        # (base offset, next offset) of the magic-2 batch whose end the position was last moved to by an answer
        # (None: the position came from the caller, a range end, or a legacy entry). The next answer's first batch
        # holds ``position``; in a log, batches never overlap, so it cannot begin below the end of that batch
        # unless a baseOffset (outside the CRC) was damaged, in it or in the batch read before
        self._ended_batch: tuple[int, int] | None = None
        # pinned at the first lookup, or by the caller (the id a checkpoint was written under): a different id
        # later means the topic was recreated
        self._topic_id = uuid.UUID(str(topic_id)) if topic_id is not None else None
        self._leader = None
        # the client's metadata stamp when the leader became unknown (made, forgotten): :meth:`locate` trusts only
        # metadata answered after it — one Metadata request serves every partition of the topic that needs it
        self._stale_at = metadata_stamp_of(client)
        # The one Fetch sent ahead by :meth:`prefetch` (overlap: the next range travels while the caller writes
        # the previous one): (the position it was asked at, its future). In-flight state only: ``position`` and
        # ``last_epoch`` move when its answer is taken by :meth:`fetch`, never when it is sent, so a caller that
        # fails meanwhile and drops the fetcher has skipped nothing; an unanswered one is simply never read
        # (responses are matched to their own futures, so a later request on the connection is not confused).
        self._prefetched: tuple[int, Future, _Ticket | None] | None = None
        # A fetch session (KIP-227) with the leader, for this fetcher's own requests (``fetch_session=True``; off by
        # default: a one-partition session saves ~100 bytes per round trip but holds one of the broker's session
        # cache slots, which consumers cannot take back from a live session; the daemon's and ``shoal copy``'s
        # multi-partition rounds use sessions of their own, :mod:`mirror_core.kafka.broker_fetch`). A new leader gets a
        # new session.
        self._session: tuple[int, FetchSession] | None = None
        self.fetch_session = fetch_session

    @property
    def done(self) -> bool:
        return self.end is not None and self.position >= self.end

    def __iter__(self) -> Iterator[BatchView]:
        """Yield batches until the range end (blocks while the source has not reached it yet)."""
        if self.end is None:
            raise ValueError("iterating needs an end offset; call fetch() for an open range")
        while not self.done:
            yield from self.fetch().batches

    @property
    def prefetching(self) -> bool:
        """Whether a Fetch sent by :meth:`prefetch` is waiting to be taken by :meth:`fetch`."""
        return self._prefetched is not None

    def prefetch(self) -> bool:
        """Send the next Fetch (at ``position``) now, without waiting; :meth:`fetch` takes its answer. Returns
        whether one is outstanding. Nothing is sent when the range is done or the leader is unknown (then
        :meth:`fetch` looks it up and retries as usual). Safe to call repeatedly: one prefetch at a time."""
        if self._prefetched is not None:
            return True
        if self.done:
            return False
        try:
            leader, epoch = self.locate()
            future, request = self._send(leader, epoch)
        except Errors.KafkaError:
            return False  # fetch() meets the same trouble and retries it
        self._prefetched = (self.position, future, request)
        return True

    def discard_prefetch(self) -> bool:
        """Forget an outstanding prefetch (the caller stops, e.g. after a failed write): its answer is never
        taken, so the position stays where the last taken answer left it. Returns whether one was outstanding."""
        if self._prefetched is None:
            return False
        log.info("cluster %r %s-%d: dropping the fetch outstanding at offset %d unread", self.client.cluster_name,
                 self.topic, self.partition, self._prefetched[0])
        self._prefetched = None
        return True

    def fetch(self) -> FetchResult:
        """One Fetch round trip (retrying leader moves and transient errors); may return no batches. Takes the
        answer of an outstanding :meth:`prefetch` first."""
        backoff = Backoff(give_up_after=self.retry_timeout_s)
        while True:
            try:
                return self._fetch_once()
            except Errors.KafkaError as exc:
                if not is_retriable(type(exc)):
                    raise FetchError(self.client.cluster_name, self.topic, self.partition, self.position,
                                     type(exc).__name__) from None
                log.info("fetch %s-%s at %d: %s; retrying", self.topic, self.partition, self.position,
                         type(exc).__name__)
                self.forget_leader()
                if not backoff.wait():
                    raise PartitionUnavailableError(self.client.cluster_name, self.topic, self.partition,
                                                    type(exc).__name__, offset=self.position) from None

    @property
    def topic_id(self):
        """The source topic's id as first seen (None before the first fetch, or on brokers without ids)."""
        return self._topic_id

    def locate(self) -> tuple[int, int]:
        """(leader node, leader epoch) of the partition; the first lookup also pins the topic id, a later one that
        finds another id raises :class:`TopicRecreatedError`.

        A lookup uses metadata answered after the leader became unknown (this fetcher made, or its leader
        forgotten): the client's cached answer when another partition of the topic already asked since, else a
        new Metadata request. So N partitions of a topic cost one request, not N, and the topic id is still
        compared with an answer newer than the event that made the leader unknown."""
        if self._leader is None:
            meta = fresh_topic_metadata(self.client, self.topic, self._stale_at)
            if self._topic_id is None:
                self._topic_id = meta.topic_id
            elif meta.topic_id is not None and meta.topic_id != self._topic_id:
                raise TopicRecreatedError(self.client.cluster_name, self.topic, self._topic_id, meta.topic_id)
            self._leader = self.client.leader_for(self.topic, self.partition)
        return self._leader

    @property
    def leader_known(self) -> bool:
        """Whether :meth:`locate` answers without asking the cluster."""
        return self._leader is not None

    def forget_leader(self) -> None:
        """After a retriable error: look the leader (and the topic id) up again before the next request."""
        self._leader = None
        self._stale_at = metadata_stamp_of(self.client)
        self.client.invalidate(self.topic)

    def spec(self, leader_epoch: int) -> FetchPartitionSpec:
        """This partition's entry in a FetchRequest, at the current position."""
        return FetchPartitionSpec(partition=self.partition, current_leader_epoch=leader_epoch,
                                  fetch_offset=self.position, partition_max_bytes=self.max_bytes,
                                  last_fetched_epoch=self.last_epoch)

    def _request(self, leader_epoch: int) -> FetchRequest:
        return kafka_python_fetch_request(
            [FetchTopicSpec(self.topic, self._topic_id, [self.spec(leader_epoch)])],
            max_wait_ms=self.max_wait_ms, max_bytes=self.max_bytes, isolation=self.isolation)

    def _send(self, leader: int, epoch: int) -> tuple[Future, _Ticket | None]:
        """Send this partition's Fetch at ``position`` to ``leader`` (in this fetcher's session, if it keeps one)."""
        topics = [FetchTopicSpec(self.topic, self._topic_id, [self.spec(epoch)])]
        ticket = None
        if self.fetch_session:
            if self._session is None or self._session[0] != leader:
                self._session = (leader, FetchSession())
            ticket = (self._session[1], self._session[1].build(topics))
        future = send_fetch(self.client, leader, topics, max_wait_ms=self.max_wait_ms, max_bytes=self.max_bytes,
                            isolation=self.isolation, session=ticket[1] if ticket else None)
        return future, ticket

    def _fetch_once(self, resent: bool = False) -> FetchResult:
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == self.position:
            future, ticket = prefetched[1], prefetched[2]
        else:  # none outstanding (or asked at another position, which the position's one-way moves rule out)
            leader, epoch = self.locate()
            future, ticket = self._send(leader, epoch)
        wait_fetch(self.client, future)
        if future.failed():
            if ticket is not None:
                ticket[0].failed(ticket[1])
            raise future.exception
        response = future.value
        if ticket is None:
            if response.error_code:
                raise Errors.for_code(response.error_code)()
            if not response.responses or not response.responses[0].partitions:
                raise Errors.KafkaConnectionError("fetch response without our partition")
            return self.handle(response.responses[0].partitions[0])
        answer = ticket[0].answer(ticket[1], response)
        if answer.resend_full and not resent:   # the session was lost: ask again at once, as a full request
            return self._fetch_once(resent=True)
        if answer.resend_full or answer.error_code:
            raise Errors.for_code(answer.error_code or response.error_code)()
        if answer.parts:
            return self.handle(next(iter(answer.parts.values())))
        if answer.unchanged:
            return self.unchanged(next(iter(answer.unchanged.values())))
        raise Errors.KafkaConnectionError("fetch response without our partition")

    def unchanged(self, ends) -> FetchResult:
        """This partition was left out of an incremental fetch session's answer: nothing new (no records, no
        error, same high watermark and log start as last said). The position stays; ``ends`` are the
        :class:`~mirror_core.kafka.fetch_session.PartitionEnds` the broker last sent."""
        return FetchResult([], self.position, ends.high_watermark, ends.last_stable_offset, ends.log_start_offset,
                           self.last_epoch, frame_bytes=0)

    def handle(self, data) -> FetchResult:
        """Take this partition's part of a Fetch response (from our own request or a shared one): advance the
        position and return the committed batches. Raises kafka-python's error for a partition error code (the
        caller retries retriable ones after :meth:`forget_leader`), :class:`DataLossError` for
        OFFSET_OUT_OF_RANGE below the log start, :class:`TopicRecreatedError` for a changed topic id,
        :class:`SourceTruncatedError` for a DivergingEpoch (the source log no longer holds what we read)."""
        error = Errors.for_code(data.error_code)
        diverging = diverging_epoch(data)
        if diverging is not None and error is Errors.NoError:
            self._raise_diverged(*diverging)
        if error is Errors.OffsetOutOfRangeError:
            self._raise_out_of_range()
        if error in (Errors.UnknownTopicIdError, Errors.InconsistentTopicIdError):
            self._leader = None
            self._stale_at = metadata_stamp_of(self.client)  # only an answer taken from now on tells
            self.locate()            # raises TopicRecreatedError when the id changed
            raise error()
        if error is not Errors.NoError:
            raise error()
        try:
            return self._accept(data)
        except CorruptBatchError as exc:
            raise exc.located(self.client.cluster_name, self.topic, self.partition) from None

    def _accept(self, data) -> FetchResult:
        section = memoryview(data.records or b"")
        ended = self._ended_batch
        if ended is not None and section.nbytes > MAGIC_OFFSET and section[MAGIC_OFFSET] == 2:
            first = int.from_bytes(section[:8], "big", signed=True)
            if first < ended[1]:
                raise CorruptBatchError(first, f"the answer's first batch begins below offset {ended[1]}, where the "
                                        f"batch read before it (as [{ended[0]}, {ended[1]})) ended: a baseOffset is "
                                        "damaged in one of the two (it is not covered by the CRC), or the log was "
                                        "rewritten under the position (a leader without the epoch check, Kafka < 2.7); "
                                        f"offsets before {ended[1]} may have been copied to the wrong place or "
                                        "skipped: compare the source and the target (shoal verify) before resuming")
        if not self.every_batch and not data.aborted_transactions:
            plain = self._accept_plain(data, section)
            if plain is not None:
                return plain
        return self._accept_general(data, section)

    def _accept_general(self, data, section: memoryview) -> FetchResult:
        batches, tail = walk_batches(section)
        if not batches and tail:
            raise FetchError(self.client.cluster_name, self.topic, self.partition, self.position,
                             f"a batch larger than max_bytes={self.max_bytes} could not be fetched whole")
        ensure_in_order(batches)
        start = self.position
        # Advance only over batches inside the range: a batch starting at or after ``end`` belongs to the next
        # range, and moving past it would make that range start too late (silent loss of the batches between).
        ours = batches if self.end is None else batches_reaching_below(batches, start, self.end)
        # judged (markers read, dropped batches checked) only up to the end: what lies past it is the next range's,
        # read again and judged by that range (a batch past the end is never kept here). The order of the whole
        # answer is checked above all the same: a batch moved past the end by a flipped baseOffset shows there
        aborted = [AbortedTransaction(t.producer_id, t.first_offset) for t in (data.aborted_transactions or ())]
        committed = ours if self.every_batch else select_committed(ours, aborted)
        reached = ours[-1].next_offset if ours else self.position
        if len(ours) < len(batches):  # the response went past the end: every offset before it was seen
            reached = max(reached, self.end)
        kept = [b for b in committed if start < b.next_offset <= reached]
        if self.check_crcs:
            _verify_all(kept)   # before the position moves: a corrupt batch is never passed
        if ours and ours[-1].next_offset > self.position:
            self.last_epoch = max(ours[-1].partition_leader_epoch, -1)  # legacy entries carry none: unknown
        if reached > self.position:
            last = ours[-1] if ours else None
            self._ended_batch = (last.base_offset, reached) if last is not None and last.magic >= 2 \
                and last.next_offset == reached else None
        self.position = max(self.position, reached)
        return FetchResult(kept, self.position, data.high_watermark, data.last_stable_offset,
                           data.log_start_offset, self.last_epoch, frame_bytes=section.nbytes)

    def _accept_plain(self, data, section: memoryview) -> FetchResult | None:
        """:meth:`_accept`'s general rules for the usual answer (magic-2 batches only, no aborted transaction listed,
        so every data batch is committed), from one pass over it (:func:`walk_v2_data`): the same position, epoch
        and batches (tested against the general rules). None: not the usual answer, take the general rules."""
        walked = walk_v2_data(section, self.position, self.end)
        if walked is None:
            return None
        kept, kept_bytes, last, past, count, tail = walked
        if not count and tail:
            return None   # the general rules name the batch larger than max_bytes
        if self.check_crcs:
            _verify_all(kept)   # before the position moves, as in the general rules
        start = self.position
        reached = last.next_offset if last is not None else start
        if past:  # the response went past the end: every offset before it was seen
            reached = max(reached, self.end)
        if last is not None and last.next_offset > start:
            self.last_epoch = max(last.partition_leader_epoch, -1)
        if reached > start:   # every batch here is magic 2
            self._ended_batch = (last.base_offset, reached) if last is not None and last.next_offset == reached \
                else None
        self.position = max(start, reached)
        return FetchResult(kept, self.position, data.high_watermark, data.last_stable_offset,
                           data.log_start_offset, self.last_epoch, frame_bytes=section.nbytes, kept_bytes=kept_bytes)

    def _raise_diverged(self, epoch: int, end_offset: int) -> None:
        """The leader says our last fetched epoch ends at ``end_offset`` on its log (``epoch``: the largest one it
        has up to ours): what we read from there on is no longer in the source log."""
        diverged_from = end_offset if 0 <= end_offset < self.position else None
        raise SourceTruncatedError(self.client.cluster_name, self.topic, self.partition, diverged_from,
                                   self.position, self.last_epoch, epoch)

    def _raise_out_of_range(self) -> None:
        cluster, topic, partition = self.client.cluster_name, self.topic, self.partition
        earliest = list_offsets(self.client, topic, partition, "earliest")
        if earliest > self.position:
            raise DataLossError(cluster, topic, partition, self.position, earliest)
        latest = list_offsets(self.client, topic, partition, "latest")
        # the log may have been truncated below our position (the leader also answers OFFSET_OUT_OF_RANGE when it
        # finds no end offset for our last fetched epoch): SourceTruncatedError names the diverged range
        if self.last_epoch >= 0 and not validate_position(self.client, topic, partition, self.position,
                                                          self.last_epoch, log_start=earliest):
            self.last_epoch = -1  # nothing below the position left to compare: fetch without it
        if self.position > latest:
            raise FetchError(cluster, topic, partition, self.position,
                             f"OFFSET_OUT_OF_RANGE: the log ends at {latest}, before the requested offset "
                             "(source truncated or range planned past its end)")
        raise Errors.OffsetNotAvailableError()   # in range now: a lagging leader, retried as transient
