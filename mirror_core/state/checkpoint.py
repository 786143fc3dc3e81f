"""Where each pipeline's copy of each source partition stands, stored on the target cluster.

A checkpoint per (pipeline, source topic, partition): the position (next source offset to copy), the target
partition and its next offset, the owner (a backfill run or the daemon) with its epoch, and the offset-map runs.
They live in a compacted topic on the **target** (``__shoal_checkpoints``), because a DR target must be able to
resume and translate offsets after losing its source. The topic has several partitions so one lane's open
transaction holds back only the readers of its own partition; a key always maps to the same partition
(CRC-32 of the key), which compaction relies on.

Invariant: a checkpoint is never ahead of what the target acknowledged. In exactly-once mode it is produced in the
same target transaction as the data it describes (:meth:`CheckpointStore.checkpoint_batch` gives the raw batch
for that); in at-least-once mode it is written only after the data was acknowledged. Readers use READ_COMMITTED,
so a checkpoint of an aborted transaction is never seen.

Every heartbeat, lease renewal and commit appends to this topic, so a store never re-reads it whole: each
:class:`CheckpointStore` keeps the last value per key of every partition it has read and the offset it read up to,
and a read fetches only what was appended since (see :class:`_PartitionCache` for the invariants).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.batch_codec import CONTROL_COMMIT, Codec, control_type
from mirror_core.codec.batch_deep import (
    SourceRecord,
    decode_record_tail,
    encode_batch,
    encode_record_tail,
    read_records,
)
from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.errors import (
    CheckpointReadStalledError,
    ConfigError,
    DataLossError,
    MirrorError,
    PartitionUnavailableError,
    TopicRecreatedError,
)
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets, lookup_offsets
from mirror_core.kafka.wire_client import Backoff, WireClient, is_retriable
from mirror_core.kafka.writer import OutgoingBatch
from mirror_core.model.lane_status import PersistedLaneState
from mirror_core.model.map_segments import MapCommit, SegmentChain, assemble_map, segment_key, segment_key_prefix
from mirror_core.model.offset_map import OffsetMap, normalise_ranges

log = logging.getLogger(__name__)

CHECKPOINT_PARTITIONS = 8
# The largest batch Shoal writes to the checkpoint topic: a checkpoint with a full open tail (SEGMENT_BYTES of map,
# base64) and its fields, or a sealed segment; what the topic's max.message.bytes must allow at least.
LARGEST_RECORD_BYTES = 12 * 1024
CHECKPOINT_TOPIC_CONFIG = {  # explicit, so a cluster's defaults cannot change what the checkpoints rely on
    "cleanup.policy": "compact",  # last value per key; "delete" would let retention erase the checkpoints
    "max.message.bytes": str(1024 * 1024),
    "min.insync.replicas": "1",  # raised with the replication factor at creation (checkpoint_topic_settings)
    "min.compaction.lag.ms": "0",
    "segment.ms": "3600000",
}
SETTLE_TIMEOUT_S = 1.0  # how long a read waits for transactions written before it to settle (CheckpointStore.refresh)
READ_STALL_S = 30.0  # a checkpoint read making no progress this long ends in CheckpointReadStalledError

@dataclass(frozen=True)
class Checkpoint:
    """One source partition's copy state in one pipeline.

    Invariants: ``position`` never passes what the target acknowledged (module docstring); ``lost_ranges`` are
    sorted, disjoint source ranges ``[start, end)`` below ``position`` that an operator accepted as lost — they
    were deleted (or truncated) on the source before they were copied, and the offset map declines to translate
    into them (:attr:`offset_map` carries them); ``position_epoch`` is the source leader epoch of the last batch
    below ``position`` (markers and aborted batches count), the pair a resumed lane validates with
    OffsetsForLeaderEpoch; ``target_topic_id`` pins the target topic the offsets live in.

    The offset map (format 4) lives in bounded pieces: sealed segments, each its own record, chained by
    ``map_segments``, and the open tail, the only part the checkpoint value encodes (:meth:`to_value`). A
    checkpoint a :class:`CheckpointStore` read holds the whole map (segments assembled); the one a lane builds at
    a commit holds the tail only (its ``offset_map.start`` is the chain's end) — either way the value written is
    the same.
    """

    pipeline: str
    topic: str
    partition: int
    position: int  # next source offset to copy: everything below it is on the target (or needed no copy)
    target_topic: str
    target_partition: int
    target_next: int | None  # the target's next offset after our last committed batch (None: nothing written)
    owner: str  # "backfill:<run id>", "daemon", "copy"
    owner_epoch: int
    offset_map: OffsetMap | None = None  # None until something was written
    source_topic_id: str | None = None  # a different id later means the source topic was recreated
    handoff_position: int | None = None  # where ownership passed to the daemon (the seam `shoal verify seam` checks)
    updated_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # -- format 3 --
    position_epoch: int | None = None  # source leader epoch of the last batch below position (None: unknown)
    target_topic_id: str | None = None  # a different id later means the target topic was recreated
    lost_ranges: tuple[tuple[int, int], ...] = ()  # accepted losses, see the class docstring
    # -- format 4 --
    lane_state: PersistedLaneState | None = None  # halted or retired lane (None: healthy), see lane_status
    map_segments: SegmentChain | None = None  # sealed map segments in records of their own (model.map_segments)
    map_pruned_below: int | None = None  # the map was pruned: offsets below this were dropped (nothing could ask)

    def __post_init__(self) -> None:
        lost = normalise_ranges(self.lost_ranges)
        object.__setattr__(self, "lost_ranges", lost)
        if self.offset_map is not None and self.offset_map.lost != lost:
            object.__setattr__(self, "offset_map", self.offset_map.with_lost(lost))

    @property
    def key(self) -> bytes:
        return checkpoint_key(self.pipeline, self.topic, self.partition)

    def to_value(self) -> bytes:
        """JSON; the offset map in its compact binary encoding (base64), so the value stays small."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["offset_map"] = None if self.offset_map is None else \
            base64.b64encode(self.tail_map().to_bytes()).decode()
        body["lost_ranges"] = [list(r) for r in self.lost_ranges]
        body["lane_state"] = None if self.lane_state is None else self.lane_state.to_dict()
        body["map_segments"] = None if self.map_segments is None else self.map_segments.as_list()
        body["v"] = FORMAT_VERSION
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_value(cls, value: bytes) -> Checkpoint:
        """Decode any format this Shoal knows, migrating older ones step by step (see :data:`MIGRATIONS`)."""
        body = upgrade_checkpoint_body(json.loads(value))
        encoded = body.pop("offset_map")
        body["lost_ranges"] = tuple(tuple(r) for r in body.get("lost_ranges", ()))
        lane_state = body.pop("lane_state", None)
        body["lane_state"] = None if lane_state is None else PersistedLaneState.from_dict(lane_state)
        body["map_segments"] = SegmentChain.from_list(body.get("map_segments"))
        return cls(**body, offset_map=None if encoded is None else OffsetMap.from_bytes(base64.b64decode(encoded)))

    def tail_map(self) -> OffsetMap | None:
        """The open tail of the offset map: the runs from the last sealed segment's end on (all of them when
        nothing is sealed). Costs the size of the tail."""
        if self.offset_map is None or self.map_segments is None:
            return self.offset_map
        if self.offset_map.start == self.map_segments.end:
            return self.offset_map
        return self.offset_map.tail_from(self.map_segments.end)


# -- checkpoint formats ----------------------------------------------------------------------------------------
#
# A checkpoint value is a JSON object with ``"v"``: the format version. Each format change adds fields with a
# default meaning "unknown/none" and one migration step from the previous version; a reader upgrades old values
# step by step and refuses values newer than itself (a newer Shoal wrote them: guessing would lose what the new
# fields say). Writers always write FORMAT_VERSION.
#   2: the offset map in OffsetMap's binary encoding
#   3: position_epoch (truncation check), target_topic_id (recreated target), lost_ranges (accepted losses)
#   4: lane_state (a halted or retired lane and why: a restarted daemon does not reopen it); map_segments (sealed
#      offset-map segments, the value's offset_map is the open tail), map_pruned_below

FORMAT_VERSION = 4


def _v2_to_v3(body: dict) -> dict:
    return {**body, "position_epoch": None, "target_topic_id": None, "lost_ranges": []}


def _v3_to_v4(body: dict) -> dict:
    return {**body, "lane_state": None,
            "map_segments": None, "map_pruned_below": None}  # the whole map was in the value


MIGRATIONS = {2: _v2_to_v3, 3: _v3_to_v4}  # version -> step to version + 1


def upgrade_checkpoint_body(body: dict) -> dict:
    """A decoded checkpoint JSON body in today's format (without ``"v"``); refuses unknown versions and keys."""
    body = dict(body)
    version = body.pop("v", None)
    if not isinstance(version, int) or version > FORMAT_VERSION or (version < FORMAT_VERSION
                                                                     and version not in MIGRATIONS):
        raise MirrorError(f"checkpoint format {version!r} is not supported (this Shoal reads formats "
                          f"{min(MIGRATIONS)}..{FORMAT_VERSION}); a newer Shoal may have written it")
    while version < FORMAT_VERSION:
        body = MIGRATIONS[version](body)
        version += 1
    known = {f.name for f in fields(Checkpoint)}
    unknown = set(body) - known
    if unknown:
        raise MirrorError(f"checkpoint has unknown fields {sorted(unknown)} for format {FORMAT_VERSION}")
    return body


def checkpoint_topic_settings(brokers: int) -> tuple[int, dict[str, str]]:
    """Replication factor and configs for a new checkpoint topic on a cluster of ``brokers`` brokers: it follows
    the cluster (up to 3 replicas, ``min.insync.replicas`` one below that), so a replicated target keeps its
    checkpoints through a broker loss; a single broker gets 1 and 1."""
    replicas = max(1, min(3, brokers))
    return replicas, {**CHECKPOINT_TOPIC_CONFIG, "min.insync.replicas": str(max(1, replicas - 1))}


def checkpoint_topic_problems(configs: dict[str, str], replication_factor: int | None = None) -> list[str]:
    """What in an existing checkpoint topic's settings would break it (empty: nothing), each naming the config,
    its value and why."""
    problems = []
    min_isr = configs.get("min.insync.replicas")
    if replication_factor is not None and min_isr is not None and int(min_isr) > replication_factor:
        problems.append(f"min.insync.replicas={min_isr} is above its replication factor ({replication_factor}): "
                        "every checkpoint write would be refused (NOT_ENOUGH_REPLICAS) for ever; lower it")
    cleanup = configs.get("cleanup.policy", "")
    if "delete" in cleanup.split(",") or "compact" not in cleanup.split(","):
        problems.append(f"cleanup.policy={cleanup} would let retention delete checkpoints (or keep every old "
                        "value): set it to compact")
    max_bytes = configs.get("max.message.bytes")
    if max_bytes is not None and int(max_bytes) < LARGEST_RECORD_BYTES:
        problems.append(f"max.message.bytes={max_bytes} is smaller than Shoal's largest checkpoint record "
                        f"({LARGEST_RECORD_BYTES} bytes): raise it to at least that")
    return problems


def checkpoint_key(pipeline: str, topic: str, partition: int) -> bytes:
    return json.dumps([pipeline, topic, partition], separators=(",", ":")).encode()


def _committed_value(entries: dict[bytes, tuple[int, bytes]]):
    """``key -> value or None`` over a partition cache's entries."""
    def value_of(key: bytes) -> bytes | None:
        found = entries.get(key)
        return None if found is None else found[1]
    return value_of


def checkpoint_partition(key: bytes, partitions: int = CHECKPOINT_PARTITIONS) -> int:
    return zlib.crc32(key) % partitions


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


class CheckpointStore:
    """Reads and writes :class:`Checkpoint` s in the compacted checkpoint topic of one (target) cluster.

    Reads are incremental: the store keeps, per partition of the topic, the offset it has read up to and the last
    value per key (:class:`_PartitionCache`, whose docstring holds the invariants). Every read first refreshes the
    partitions it needs — checks the topic id, the log start and the last stable offset, and fetches only the
    records appended since the previous read — so a read costs a few offset look-ups plus the new records, not
    the whole partition. What a read returns is what a fresh READ_COMMITTED reader of the topic would fold into
    "last value per key" at that moment: never an aborted or still-open checkpoint, and every checkpoint whose
    write or commit was acknowledged before the read began (the read waits, up to ``settle_timeout_s``, for the
    broker to finish writing commit markers; see :meth:`refresh`).

    ``records_read`` counts the records this instance has fetched and decoded (tests use it to see that a second
    read reads only what was appended); ``cache_resets`` counts partition caches dropped and re-read (log start
    moved past the read position, topic recreated, log truncated). The cache is guarded by a lock; the
    :class:`WireClient` rules still apply (one client per thread), so share a store only where its client may go.
    """

    def __init__(self, cluster: ClusterConfig, client: WireClient, *, topic: str = CHECKPOINT_TOPIC,
                 partitions: int = CHECKPOINT_PARTITIONS, settle_timeout_s: float = SETTLE_TIMEOUT_S):
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
        # checkpoint key -> (value, decoded) for read_all(whole_maps=False): a value is decoded once, not at every
        # read (a daemon's lane round reads every lane's checkpoint every few seconds, almost all unchanged; a
        # Checkpoint is frozen, so sharing it is safe). Both dicts hold at most one entry per key of the topic,
        # like the partition caches themselves
        self._decoded: dict[bytes, tuple[bytes, Checkpoint]] = {}
        self._idents: dict[bytes, tuple | None] = {}  # record key -> checkpoint identity (None: not a checkpoint)

    def ensure_topic(self) -> None:
        """Create the compacted checkpoint topic if it is missing (its partition count then stays fixed), with its
        settings explicit (:data:`CHECKPOINT_TOPIC_CONFIG`); refuse an existing one whose settings would break it
        (:func:`checkpoint_topic_problems`)."""
        from mirror_core.kafka.topics import TopicAdmin

        admin = TopicAdmin(self.cluster)
        existing = admin.list_topics().get(self.topic)
        if existing is None:
            replicas, config = checkpoint_topic_settings(admin.broker_count())
            if admin.create(self.topic, self.partitions, config, exist_ok=True, replication_factor=replicas):
                return  # created with our settings (DescribeConfigs may not know it yet: nothing to check)
            # it existed after all: the metadata that answered did not know it yet, or another process created it
            # a moment ago, with settings of its own. Those are checked like any existing topic's.
            existing = self._once_known(lambda: admin.list_topics().get(self.topic), "its metadata did not list it")
        if existing != self.partitions:
            raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r} has {existing} "
                              f"partitions, Shoal expects {self.partitions}; keys would land in the wrong place")
        # asked until known: the broker that answers may not know a topic created a moment ago, and an unknown
        # replication factor would skip the min.insync.replicas check (writes refused for ever)
        replicas = self._once_known(lambda: admin.replication_factor(self.topic),
                                    "no broker asked named its replication factor")
        problems = checkpoint_topic_problems(admin.configs(self.topic), replicas)
        if problems:
            raise ConfigError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r}: "
                              + "; ".join(problems))

    METADATA_CATCH_UP_S = 5.0  # how long a topic the cluster said exists may stay missing from its metadata

    def _once_known(self, ask, missing: str) -> int:
        """``ask()`` about this store's topic, which the cluster said exists while the broker that answered may not
        know it yet (metadata reaches the brokers one after another): asked again for up to
        :attr:`METADATA_CATCH_UP_S` while it answers None."""
        wait_s = self.METADATA_CATCH_UP_S
        deadline = time.monotonic() + wait_s
        while (known := ask()) is None:
            if time.monotonic() > deadline:
                raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r} exists (creating "
                                  f"it was refused, or it was listed) but {missing} within {wait_s:g} s")
            time.sleep(0.2)
        return known

    def checkpoint_batch(self, checkpoint: Checkpoint) -> OutgoingBatch:
        """The checkpoint as a raw batch for this store's topic, for a writer (inside its transaction, if any)."""
        return self._record_batch(checkpoint.key, checkpoint.to_value(), checkpoint, "checkpoint")

    def checkpoint_batches(self, checkpoint: Checkpoint, commit: MapCommit | None) -> list[OutgoingBatch]:
        """A commit's batches, in order: the newly sealed map segments, the checkpoint that references them, then
        tombstones for pruned segments. Written in one transaction (exactly-once) nothing is ever referenced that
        is not there; at-least-once (acknowledged in order, one partition), the segments land before the
        checkpoint naming them and a pruned segment is tombstoned only after a checkpoint that no longer names
        it."""
        if commit is None:
            return [self.checkpoint_batch(checkpoint)]
        ident = (checkpoint.pipeline, checkpoint.topic, checkpoint.partition)
        batches = [self._record_batch(segment_key(*ident, m.start), m.to_bytes(), checkpoint, "map segment")
                   for m in commit.sealed]
        batches.append(self.checkpoint_batch(checkpoint))
        batches += [self._record_batch(segment_key(*ident, start), None, checkpoint, "tombstone")
                    for start in commit.dropped]
        return batches

    def _record_batch(self, key: bytes, value: bytes | None, checkpoint: Checkpoint, what: str) -> OutgoingBatch:
        """One record in one batch, in the partition of ``checkpoint``'s key (segments share it, see
        :mod:`mirror_core.model.map_segments`); refused when larger than :data:`LARGEST_RECORD_BYTES`."""
        tail = encode_record_tail(key, value)
        data = encode_batch([SourceRecord(0, checkpoint.updated_ms, 0, tail)], Codec.NONE)
        if len(data) > LARGEST_RECORD_BYTES:
            raise MirrorError(f"pipeline {checkpoint.pipeline!r} {checkpoint.topic}-{checkpoint.partition}: the "
                              f"{what} record is {len(data)} bytes, above the {LARGEST_RECORD_BYTES} Shoal allows "
                              f"in {self.topic!r} (too many lost ranges?)")
        return OutgoingBatch(self.topic, checkpoint_partition(checkpoint.key, self.partitions), data,
                             source_offset=checkpoint.position)

    def pipeline_checkpoints_in(self, topic: str, pipeline: str) -> int:
        """How many checkpoints of ``pipeline`` the checkpoint topic ``topic`` (another than this store's) holds
        on this cluster; 0 when it does not exist. A daemon whose pipeline file names its own checkpoint topic
        asks this of the default one, where ``shoal backfill``, ``shoal copy`` and the handoff write."""
        from mirror_core.kafka.topics import TopicAdmin

        if topic == self.topic or topic not in TopicAdmin(self.cluster).list_topics():
            return 0
        other = CheckpointStore(self.cluster, self.client, topic=topic, partitions=self.partitions,
                                settle_timeout_s=self.settle_timeout_s)
        return len(other.read_all(pipeline, whole_maps=False))

    # ---- reading ---------------------------------------------------------------------------------------------

    def read_all(self, pipeline: str | None = None, *, whole_maps: bool = True, refresh: bool = True
                 ) -> dict[tuple[str, str, int], Checkpoint]:
        """Every committed checkpoint (last value per key wins), optionally of one pipeline, maps assembled.

        ``whole_maps=False``: each checkpoint keeps only the open tail of its offset map (translation declines
        below the tail's start) — for readers that need positions, owners and lane states (the daemon's lease
        round, status pages), so they neither pay for assembling every lane's map nor fail for all lanes when one
        lane's segment chain is broken (that lane's own open still assembles it and reports the error).
        ``refresh=False``: from the cache as it is (the caller refreshed)."""
        out: dict[tuple[str, str, int], Checkpoint] = {}
        with self._lock:
            if refresh:
                self.refresh()
            for partition in range(self.partitions):
                entries = self._caches[partition].entries
                for key, (_offset, value) in list(entries.items()):
                    ident = self._idents.get(key, False)
                    if ident is False:
                        decoded = json.loads(key)
                        ident = self._idents[key] = tuple(decoded) if isinstance(decoded, list) else None
                    if ident is None:
                        continue  # leases, map segments and other records sharing the topic
                    if pipeline is not None and ident[0] != pipeline:
                        continue  # decode only what was asked for: other pipelines may be another Shoal's format
                    if whole_maps:
                        out[ident] = self._with_whole_map(Checkpoint.from_value(value), _committed_value(entries))
                        continue
                    known = self._decoded.get(key)
                    if known is None or known[0] != value:
                        known = self._decoded[key] = (value, Checkpoint.from_value(value))
                    out[ident] = known[1]
        return out

    def read(self, pipeline: str, topic: str, partition: int) -> Checkpoint | None:
        """One checkpoint, or None; refreshes only the partition of the topic its key lives in."""
        key = checkpoint_key(pipeline, topic, partition)
        part = checkpoint_partition(key, self.partitions)
        with self._lock:
            self.refresh([part])
            entries = self._caches[part].entries
            found = entries.get(key)
            return None if found is None else self._with_whole_map(Checkpoint.from_value(found[1]),
                                                                   _committed_value(entries))

    def cached(self, pipeline: str, topic: str, partition: int) -> Checkpoint | None:
        """One checkpoint as the cache holds it (no request: what the last refresh read), its offset map only the
        open tail (like ``read_all(whole_maps=False)``); None when the cache has none. For a caller that must not
        wait on the target — e.g. the daemon placing a lane that cannot open with the retention watch."""
        key = checkpoint_key(pipeline, topic, partition)
        with self._lock:
            cache = self._caches.get(checkpoint_partition(key, self.partitions))
            found = None if cache is None else cache.entries.get(key)
            if found is None:
                return None
            known = self._decoded.get(key)
            if known is None or known[0] != found[1]:
                known = self._decoded[key] = (found[1], Checkpoint.from_value(found[1]))
            return known[1]

    def read_own(self, pipeline: str, topic: str, partition: int) -> Checkpoint | None:
        """The lane's own checkpoint, including what it committed past the last stable offset.

        Only sound once ``InitProducerId`` with the lane's transactional.id has returned: from then on every
        transaction the lane ever wrote is decided and its markers are in the log. A READ_COMMITTED read stops at
        the LSO, so another lane's open transaction on the same partition of the checkpoint topic (a hung writer,
        a slow marker) would hide the lane's newer checkpoints and make it resume from an older one — a duplicate
        range in exactly-once mode. So this reads the committed fold up to the LSO (no settle wait), then the log
        above it up to the high watermark uncommitted, and resolves each producer's records of this key (and of
        the lane's map segments, committed with it) by that producer's own commit/abort markers; records of
        still-undecided transactions (other writers) are ignored. Before the lane's InitProducerId (a daemon
        deciding whether a lane was handed off) it gives the newest *decided* value — never older than what a
        READ_COMMITTED reader sees.
        """
        key = checkpoint_key(pipeline, topic, partition)
        segments = segment_key_prefix(pipeline, topic, partition)
        part = checkpoint_partition(key, self.partitions)
        with self._lock:
            self.refresh([part], settle=False)
            cache = self._caches[part]
            committed = _committed_value(cache.entries)
            above: dict[bytes, bytes | None] = {}
            high_watermark = self._offsets([part], "latest")[part]
            if high_watermark > cache.next_offset:
                above = self._decided_above_lso(part, lambda k: k == key or k.startswith(segments),
                                                cache.next_offset, high_watermark)
            value = above[key] if key in above else committed(key)
            if value is None:
                return None
            return self._with_whole_map(Checkpoint.from_value(value),
                                        lambda k: above[k] if k in above else committed(k))

    def read_own_many(self, pipeline: str, lanes: Iterable[tuple[str, int]]
                      ) -> dict[tuple[str, int], Checkpoint | None]:
        """(topic, partition) → what :meth:`read_own` returns for it, for every one of ``lanes``, in one pass over
        the checkpoint topic: each partition holding one of their keys refreshed once (no settle wait), one
        ListOffsets for all their high watermarks, and the log above each one's LSO read once for all the keys in
        it. Sound on the same condition as :meth:`read_own`: each lane's InitProducerId returned before this call
        (a daemon opening many lanes fences them all, then reads them all here)."""
        by_partition: dict[int, list[tuple[tuple[str, int], bytes, bytes]]] = collections.defaultdict(list)
        for topic, partition in dict.fromkeys(lanes):
            key = checkpoint_key(pipeline, topic, partition)
            by_partition[checkpoint_partition(key, self.partitions)].append(
                ((topic, partition), key, segment_key_prefix(pipeline, topic, partition)))
        out: dict[tuple[str, int], Checkpoint | None] = {}
        if not by_partition:
            return out
        parts = sorted(by_partition)
        with self._lock:
            self.refresh(parts, settle=False)
            high_watermarks = self._offsets(parts, "latest")
            for part in parts:
                members = by_partition[part]
                cache = self._caches[part]
                committed = _committed_value(cache.entries)
                above: dict[bytes, bytes | None] = {}
                if high_watermarks[part] > cache.next_offset:
                    keys = {key for _lane, key, _prefix in members}
                    prefixes = tuple(prefix for _lane, _key, prefix in members)
                    above = self._decided_above_lso(part, lambda k, keys=keys, prefixes=prefixes:
                                                    k in keys or k.startswith(prefixes),
                                                    cache.next_offset, high_watermarks[part])

                def value_of(k: bytes, above=above, committed=committed) -> bytes | None:
                    return above[k] if k in above else committed(k)

                for lane, key, _prefix in members:
                    value = value_of(key)
                    out[lane] = None if value is None else self._with_whole_map(Checkpoint.from_value(value),
                                                                                value_of)
        return out

    def _with_whole_map(self, checkpoint: Checkpoint, value_of) -> Checkpoint:
        """``checkpoint`` with its sealed map segments (``value_of(key)``: a record's value) assembled."""
        chain = checkpoint.map_segments
        if chain is None or checkpoint.offset_map is None:
            return checkpoint
        ident = (checkpoint.pipeline, checkpoint.topic, checkpoint.partition)

        def segment(start: int) -> OffsetMap | None:
            key = segment_key(*ident, start)
            value = value_of(key)
            if value is None:
                return None
            cached = self._segments.get(key)
            if cached is None or cached[0] != value:
                cached = self._segments[key] = (value, OffsetMap.from_bytes(value))
            return cached[1]

        try:
            whole, walked = assemble_map(chain, checkpoint.offset_map, segment)
        except ValueError as exc:
            raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r}: pipeline "
                              f"{checkpoint.pipeline!r} {checkpoint.topic}-{checkpoint.partition}: its offset map "
                              f"cannot be assembled: {exc}. Its sealed segments are records of their own in the "
                              "same topic: were they deleted or the topic's compaction settings changed?") from None
        return dataclasses.replace(checkpoint, offset_map=whole, map_segments=walked)

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

    def content_version(self) -> tuple:
        """A value that changes whenever what the cache holds may have changed — records read into a partition,
        a log start applied, a partition re-read, the topic recreated — and stays equal otherwise (no I/O; call
        :meth:`refresh` first to see the topic as it is now). Readers that derive something from every record
        (the daemon's group round) recompute it only when this changed."""
        with self._lock:
            return (self._topic_id, self.cache_resets,
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
        were last written."""
        with self._lock:
            if refresh:
                self.refresh()
            return [(key, value) for partition in range(self.partitions)
                    for key, (_offset, value) in self._caches[partition].entries.items()]

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

    def refresh(self, partitions: Iterable[int] | None = None, *, settle: bool = True) -> None:
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
                        self._refresh_partition(partition, earliest[partition], stable[partition])
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

    def export_parquet(self, path: Path, pipeline: str | None = None) -> int:
        """Write the checkpoints (one row each, offset runs as a list column) to Parquet; returns the row count."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = []
        for cp in self.read_all(pipeline).values():
            row = {f.name: getattr(cp, f.name) for f in fields(cp) if f.name != "offset_map"}
            row["offset_runs"] = [] if cp.offset_map is None else [list(r) for r in cp.offset_map.as_tuples()]
            rows.append(row)
        schema = pa.schema([("pipeline", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                            ("position", pa.int64()), ("target_topic", pa.string()),
                            ("target_partition", pa.int32()), ("target_next", pa.int64()), ("owner", pa.string()),
                            ("owner_epoch", pa.int32()), ("offset_runs", pa.list_(pa.list_(pa.int64()))),
                            ("updated_ms", pa.int64())])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return len(rows)
