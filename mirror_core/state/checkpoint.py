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
and a read fetches only what was appended since (:mod:`mirror_core.state.checkpoint_cache`, which holds the
invariants).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import logging
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from mirror_core.codec.batch_codec import Codec
from mirror_core.codec.batch_deep import (
    SourceRecord,
    encode_batch,
    encode_record_tail,
)
from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.errors import (
    MirrorError,
)
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import OutgoingBatch
from mirror_core.model.lane_status import PersistedLaneState
from mirror_core.model.map_segments import MapCommit, SegmentChain, assemble_map, segment_key, segment_key_prefix
from mirror_core.model.offset_map import OffsetMap, normalise_ranges
from mirror_core.state.checkpoint_cache import CheckpointTopicReader, _committed_value
from mirror_core.state.checkpoint_format import FORMAT_VERSION, upgrade_checkpoint_body
from mirror_core.state.checkpoint_topic import LARGEST_RECORD_BYTES, ensure_checkpoint_topic

log = logging.getLogger(__name__)

CHECKPOINT_PARTITIONS = 8
SETTLE_TIMEOUT_S = 1.0  # how long a read waits for transactions written before it to settle (CheckpointStore.refresh)


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
        """Decode any format this Shoal knows, migrating older ones step by step
        (:data:`~mirror_core.state.checkpoint_format.MIGRATIONS`)."""
        body = upgrade_checkpoint_body(json.loads(value), {f.name for f in fields(cls)})
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


def checkpoint_key(pipeline: str, topic: str, partition: int) -> bytes:
    return json.dumps([pipeline, topic, partition], separators=(",", ":")).encode()


def checkpoint_partition(key: bytes, partitions: int = CHECKPOINT_PARTITIONS) -> int:
    return zlib.crc32(key) % partitions


class CheckpointStore(CheckpointTopicReader):
    """Reads and writes :class:`Checkpoint` s in the compacted checkpoint topic of one (target) cluster.

    Reads are incremental: the store keeps, per partition of the topic, the offset it has read up to and the last
    value per key (:class:`~mirror_core.state.checkpoint_cache._PartitionCache`, whose docstring holds the
    invariants). Every read first refreshes the
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
        super().__init__(cluster, client, topic, partitions, settle_timeout_s)
        # checkpoint key -> (value, decoded) for read_all(whole_maps=False): a value is decoded once, not at every
        # read (a daemon's lane round reads every lane's checkpoint every few seconds, almost all unchanged; a
        # Checkpoint is frozen, so sharing it is safe). Both dicts hold at most one entry per key of the topic,
        # like the partition caches themselves
        self._decoded: dict[bytes, tuple[bytes, Checkpoint]] = {}
        self._idents: dict[bytes, tuple | None] = {}  # record key -> checkpoint identity (None: not a checkpoint)

    METADATA_CATCH_UP_S = 5.0  # how long a topic the cluster said exists may stay missing from its metadata

    def ensure_topic(self) -> None:
        """Create the compacted checkpoint topic if it is missing, or refuse an existing one whose settings would
        break it (:func:`~mirror_core.state.checkpoint_topic.ensure_checkpoint_topic`)."""
        ensure_checkpoint_topic(self.cluster, self.topic, self.partitions, catch_up_s=self.METADATA_CATCH_UP_S)

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
        ``refresh=False``: from the cache as it is (the caller refreshed; partitions it found damaged are left
        out, see :attr:`damaged`)."""
        out: dict[tuple[str, str, int], Checkpoint] = {}
        with self._lock:
            if refresh:
                self.refresh()
            for partition in self.readable_partitions():
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
