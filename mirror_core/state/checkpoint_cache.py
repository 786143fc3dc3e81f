"""How a :class:`~mirror_core.state.checkpoint.CheckpointStore` reads its topic: incrementally.

Every heartbeat, lease renewal and commit appends to the checkpoint topic, so a store never re-reads it whole: it
keeps the last value per key of every partition it has read and the offset it read up to (:class:`_PartitionCache`,
whose docstring holds the invariants), and a read fetches only what was appended since
(:meth:`CheckpointTopicReader.refresh`): the topic id checked, the log start applied, and the records up to the last
stable offset read once the transactions written before the read have settled. Readers use READ_COMMITTED, so a
checkpoint of an aborted transaction is never seen; what is still undecided above the last stable offset is read
only for the store's own lanes (:meth:`CheckpointTopicReader._decided_above_lso`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.batch_codec import CONTROL_COMMIT, control_type
from mirror_core.codec.batch_deep import decode_record_tail, read_records
from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import (
    CheckpointReadStalledError,
    CorruptBatchError,
    DataLossError,
    MirrorError,
    PartitionUnavailableError,
    TopicRecreatedError,
)
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets, lookup_offsets
from mirror_core.kafka.retries import Backoff, is_retriable
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.offset_map import OffsetMap

log = logging.getLogger(__name__)

READ_STALL_S = 30.0  # a checkpoint read making no progress this long ends in CheckpointReadStalledError


def _committed_value(entries: dict[bytes, tuple[int, bytes]]):
    """``key -> value or None`` over a partition cache's entries."""
    def value_of(key: bytes) -> bytes | None:
        found = entries.get(key)
        return None if found is None else found[1]
    return value_of


class _PartitionCache:
    """What one :class:`CheckpointStore` has read of one partition of the checkpoint topic.

    Invariants (they hold whenever the store's lock is free):

    * ``next_offset`` is a last stable offset (LSO) the partition leader reported, or the log start when nothing
      was read yet. Every record below an LSO is *decided* (committed or aborted), so the records below
      ``next_offset`` can only ever disappear (compaction, delete_records, retention), never change or appear;
      a refresh therefore only reads ``[next_offset, current LSO)``.
    * ``entries`` is the fold "last committed value per key" over the committed records of
      ``[log_start, next_offset)``: key → (offset, value) of the key's last record there; a key whose last
      record is a tombstone is absent. Aborted and still-open transactional records never enter it (the
      fetch is READ_COMMITTED and never goes past the LSO). The dict is in order of those offsets (a key
      written again is moved to the end), so ``records`` is in log order and pruning stops at the first
      surviving entry.
    * ``log_start`` is the partition's log start offset at the last refresh (<= ``next_offset``). When the
      broker's log start has moved up, the entries below the new log start are pruned — exactly the keys a
      fresh reader would no longer see; if it moved past ``next_offset`` the cache is dropped and the partition
      re-read from the log start. Compaction needs nothing: it keeps each key's last record, which is the
      entry already held.
    * The cache belongs to the topic id the store recorded (``CheckpointStore._topic_id``); when the topic is
      recreated (another id) every partition's cache is dropped. An LSO below ``next_offset`` (a truncated
      log) drops this partition's cache too.
    """

    __slots__ = ("next_offset", "log_start", "entries")

    def __init__(self, log_start: int):
        self.log_start = log_start
        self.next_offset = log_start
        self.entries: dict[bytes, tuple[int, bytes]] = {}

    def apply(self, offset: int, key: bytes, value: bytes | None) -> None:
        self.entries.pop(key, None)  # re-insert at the end: the dict stays in order of last-write offsets
        if value is not None:
            self.entries[key] = (offset, value)

    def prune_below(self, log_start: int) -> None:
        """Forget the entries whose last record lies below ``log_start`` (deleted from the log)."""
        stale = []
        for key, (offset, _value) in self.entries.items():
            if offset >= log_start:
                break
            stale.append(key)
        for key in stale:
            del self.entries[key]
        self.log_start = log_start


class CheckpointTopicReader:
    """The read side of a :class:`~mirror_core.state.checkpoint.CheckpointStore`: the partition caches of its topic
    and their refresh (see the store's docstring for what a read returns). ``records_read`` counts the records
    fetched and decoded; ``cache_resets`` the partition caches dropped and re-read. The cache is guarded by
    ``_lock``.

    ``damaged``: partition → the :class:`CorruptBatchError` its last refresh stopped at. A damaged batch stops
    every read of its partition (no value stored there can be trusted past it), but only a refresh with
    ``skip_damaged`` goes on without it: a reader of the whole topic that must not be blinded to every lane by one
    partition (the daemon's group round), which then asks ``damaged`` which lanes it cannot know. Whole-topic
    reads of the cache (:meth:`latest_items`, ``read_all``) leave damaged partitions out; a partition leaves
    ``damaged`` when a refresh reads it whole again (the replica restored)."""

    def __init__(self, cluster: ClusterConfig, client: WireClient, topic: str, partitions: int,
                 settle_timeout_s: float):
        self.cluster = cluster
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.settle_timeout_s = settle_timeout_s
        self.records_read = 0
        self.cache_resets = 0
        self._lock = threading.RLock()
        self._topic_id: uuid.UUID | None = None  # the topic id every partition cache belongs to
        self._caches: dict[int, _PartitionCache] = {}
        self._segments: dict[bytes, tuple[bytes, OffsetMap]] = {}  # map segment key -> (value, decoded)
        self.damaged: dict[int, CorruptBatchError] = {}

    def content_version(self) -> tuple:
        """A value that changes whenever what the cache holds may have changed — records read into a partition,
        a log start applied, a partition re-read, the topic recreated — and stays equal otherwise (no I/O; call
        :meth:`refresh` first to see the topic as it is now). Readers that derive something from every record
        (the daemon's group round) recompute it only when this changed."""
        with self._lock:
            return (self._topic_id, self.cache_resets, tuple(sorted(self.damaged)),
                    tuple((p, c.log_start, c.next_offset) for p, c in sorted(self._caches.items())))

    def latest(self, partition: int) -> dict[bytes, bytes]:
        """Key → last committed value of every live key in one partition of the topic (tombstoned keys absent),
        refreshed first; a new dict the caller may keep."""
        with self._lock:
            self.refresh([partition])
            return {key: value for key, (_offset, value) in self._caches[partition].entries.items()}

    def latest_items(self, *, refresh: bool = True) -> list[tuple[bytes, bytes]]:
        """(key, last committed value) of every live key in every partition, all partitions refreshed first
        (``refresh=False``: as the cache holds them — the caller refreshed); per partition in the order the keys
        were last written; partitions in :attr:`damaged` left out."""
        with self._lock:
            if refresh:
                self.refresh()
            return [(key, value) for partition in self.readable_partitions()
                    for key, (_offset, value) in self._caches[partition].entries.items()]

    def readable_partitions(self) -> list[int]:
        """The partitions whose cache a whole-topic read may use: all but those in :attr:`damaged`."""
        with self._lock:
            return [partition for partition in range(self.partitions) if partition not in self.damaged]

    def records(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of one partition as a reader of the compacted topic sees it: the last committed value of
        every live key, in the order they were last written (what full compaction would leave; older values
        and tombstones are folded away, so replaying these gives the same "last value per key" as replaying
        every record)."""
        return iter(list(self.latest(partition).items()))

    def invalidate(self) -> None:
        """Drop every cached partition: the next read re-reads the topic from the log start."""
        with self._lock:
            self.cache_resets += len(self._caches)
            self._caches.clear()
            self._topic_id = None
            self._segments.clear()

    def refresh(self, partitions: Iterable[int] | None = None, *, settle: bool = True,
                skip_damaged: bool = False) -> None:
        """Bring the cache of ``partitions`` (default: all) up to the current last stable offsets.

        Settling: the broker acknowledges a transaction's commit before it has written the commit markers, and
        until then the last stable offset (LSO) still hides the committed records. So a refresh first notes each
        partition's high watermark — every write acknowledged before the read began lies below it — and waits
        (up to ``settle_timeout_s``) until the LSO has reached it, i.e. until every transaction that had written
        to the partition by then is decided; then it reads up to the LSO. A transaction still open after that
        (a hung writer; the broker aborts it after its timeout) only hides its own records and everything behind
        it, as it does from any READ_COMMITTED consumer.

        The topic id is checked before (a recreated topic drops every partition cache) and again after the
        fetches; if it changed in between, what was read may belong to the new topic, so everything is dropped
        and read again.

        A partition whose read stops at a damaged batch (:class:`CorruptBatchError`) is recorded in
        :attr:`damaged`; the error is raised unless ``skip_damaged``, which reads the other partitions on.
        """
        wanted = sorted(set(range(self.partitions) if partitions is None else partitions))
        for partition in wanted:
            if not 0 <= partition < self.partitions:
                raise ValueError(f"partition {partition} is not in [0, {self.partitions})")
        if not wanted:
            return
        with self._lock:
            for _attempt in range(5):
                self._check_topic_id(self._topic_metadata(wanted[0], refresh=True).topic_id)
                stable = self._settled_offsets(wanted) if settle else self._offsets(wanted, "last_stable")
                earliest = self._offsets(wanted, "earliest")
                try:
                    for partition in wanted:
                        try:
                            self._refresh_partition(partition, earliest[partition], stable[partition])
                        except CorruptBatchError as exc:
                            if partition not in self.damaged:
                                log.error("checkpoint topic %s-%d on %s cannot be read: %s", self.topic, partition,
                                          self.cluster.name, exc)
                            self.damaged[partition] = exc
                            if not skip_damaged:
                                raise
                            continue
                        if self.damaged.pop(partition, None) is not None:
                            log.warning("checkpoint topic %s-%d on %s reads again", self.topic, partition,
                                        self.cluster.name)
                except TopicRecreatedError:  # a fetcher saw the id change under it: start over
                    self.invalidate()
                    continue
                seen = self._topic_metadata(wanted[0], refresh=False).topic_id
                if seen is None or seen == self._topic_id:
                    return
            raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r} keeps being "
                              "recreated while it is read")

    def _settled_offsets(self, partitions: list[int]) -> dict[int, int]:
        """partition → LSO, after waiting (bounded) for the transactions written before this call to settle."""
        ends = self._offsets(partitions, "latest")
        stable = self._offsets(partitions, "last_stable")
        pending = [p for p in partitions if stable[p] < ends[p]]
        deadline = time.monotonic() + self.settle_timeout_s
        delay = 0.005
        while pending and time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)
            stable.update(self._offsets(pending, "last_stable"))
            pending = [p for p in pending if stable[p] < ends[p]]
        if pending:
            log.info("checkpoint topic %s on %s: a transaction is still open in partitions %s after %.1fs; "
                     "reading up to their last stable offsets", self.topic, self.cluster.name, pending,
                     self.settle_timeout_s)
        return stable

    def _offsets(self, partitions: list[int], which: str) -> dict[int, int]:
        """partition → offset (``which`` as in :func:`list_offsets`): one ListOffsets request per leader; what
        that cannot answer (leader moved, transient errors) goes through :func:`list_offsets` and its retries."""
        found = lookup_offsets(self.client, [(self.topic, partition) for partition in partitions], which)
        return {partition: found[(self.topic, partition)] for partition in partitions}

    def _check_topic_id(self, topic_id: uuid.UUID | None) -> None:
        if topic_id is not None and topic_id != self._topic_id:
            if self._caches:
                log.info("checkpoint topic %s on %s has a new topic id (%s, was %s): re-reading it", self.topic,
                         self.cluster.name, topic_id, self._topic_id)
                self.cache_resets += len(self._caches)
            self._caches.clear()
            self._topic_id = topic_id

    def _topic_metadata(self, partition: int, *, refresh: bool):
        backoff = Backoff(give_up_after=60.0)
        while True:
            try:
                return self.client.topic_metadata(self.topic, refresh=refresh)
            except Errors.KafkaError as exc:
                if not is_retriable(type(exc)):
                    raise
                refresh = True
                if not backoff.wait():
                    raise PartitionUnavailableError(self.cluster.name, self.topic, partition,
                                                    f"Metadata: {type(exc).__name__}") from None

    def _refresh_partition(self, partition: int, earliest: int, stable: int) -> None:
        """Apply the partition's current log start (``earliest``) and read its new records up to ``stable``."""
        last_error: MirrorError | None = None
        for _attempt in range(5):
            cache = self._caches.get(partition)
            if cache is not None and (stable < cache.next_offset or earliest < cache.log_start
                                      or earliest > cache.next_offset):
                # truncated below what we read, or records we never read were deleted: start over at the log start
                log.info("checkpoint topic %s-%d on %s: log start %d, last stable %d, cache at [%d, %d); re-reading",
                         self.topic, partition, self.cluster.name, earliest, stable, cache.log_start,
                         cache.next_offset)
                self.cache_resets += 1
                cache = None
            if cache is None:
                cache = self._caches[partition] = _PartitionCache(earliest)
            elif earliest > cache.log_start:
                cache.prune_below(earliest)
            if cache.next_offset >= stable:
                return
            try:
                self._read_into(cache, partition, stable)
                return
            except (DataLossError, CheckpointReadStalledError) as exc:
                # the log start passed our position between the look-up and the fetch, or the log was truncated
                # below the LSO we measured: measure again and re-read from the log start
                last_error = exc
                self._caches.pop(partition, None)
                self.cache_resets += 1
                earliest = list_offsets(self.client, self.topic, partition, "earliest")
                stable = list_offsets(self.client, self.topic, partition, "last_stable")
        if isinstance(last_error, CheckpointReadStalledError):
            raise last_error
        raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic}-{partition} kept losing "
                          "its log start while it was read")

    def _read_into(self, cache: _PartitionCache, partition: int, end: int) -> None:
        """Fold the committed records of ``[cache.next_offset, end)`` into ``cache``; ``end`` is an LSO.

        Ends in progress or :class:`CheckpointReadStalledError`: a fetch that moves nothing while the partition's
        LSO (as the broker answers now) is at or below our position means the log no longer reaches ``end`` (it
        was truncated below the LSO measured before); any other run without progress is bounded by
        ``READ_STALL_S``."""
        start = cache.next_offset
        fetcher = RawBatchFetcher(self.client, self.topic, partition, start, end)
        updates: list[tuple[int, bytes, bytes | None]] = []
        stalled_since = None
        while not fetcher.done:
            before = fetcher.position
            fetched = fetcher.fetch()
            if fetcher.position > before:
                stalled_since = None
            else:
                now = time.monotonic()
                stalled_since = now if stalled_since is None else stalled_since
                if 0 <= fetched.last_stable_offset <= fetcher.position or now - stalled_since > READ_STALL_S:
                    raise CheckpointReadStalledError(self.cluster.name, self.topic, partition, fetcher.position,
                                                     end, fetched.last_stable_offset)
            for view in fetched.batches:
                for record in read_records(view):
                    if record.offset < start or record.offset >= end:
                        continue
                    key, value, _headers = decode_record_tail(record.tail)
                    self.records_read += 1
                    if key is not None:
                        updates.append((record.offset, key, value))
        for offset, key, value in updates:  # only once the whole range was read: a failed read changes nothing
            cache.apply(offset, key, value)
            if value is None:
                self._segments.pop(key, None)  # a pruned map segment's tombstone: its decoded copy goes too
        cache.next_offset = end

    def _decided_above_lso(self, partition: int, wanted, start: int, end: int) -> dict[bytes, bytes | None]:
        """Key → value (None: a tombstone) of the last decided-committed record in ``[start, end)`` of every key
        for which ``wanted(key)`` holds."""
        fetcher = RawBatchFetcher(self.client, self.topic, partition, start, end,
                                  isolation=IsolationLevel.READ_UNCOMMITTED, every_batch=True)
        undecided: dict[int, list[tuple[int, bytes, bytes | None]]] = collections.defaultdict(list)
        last: dict[bytes, tuple[int, bytes | None]] = {}

        def keep(offset: int, key: bytes, value: bytes | None) -> None:
            if key not in last or offset > last[key][0]:
                last[key] = (offset, value)

        while not fetcher.done:
            for view in fetcher.fetch().batches:
                if view.control:
                    mine = undecided.pop(view.producer_id, [])
                    if control_type(view) == CONTROL_COMMIT:
                        for record in mine:
                            keep(*record)
                    continue
                for record in read_records(view):
                    if not start <= record.offset < end:
                        continue
                    record_key, value, _headers = decode_record_tail(record.tail)
                    if record_key is None or not wanted(record_key):
                        continue
                    if view.transactional:
                        undecided[view.producer_id].append((record.offset, record_key, value))
                    else:
                        keep(record.offset, record_key, value)
        return {key: value for key, (_offset, value) in last.items()}
