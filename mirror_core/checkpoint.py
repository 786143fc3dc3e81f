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
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path

from mirror_core.batch_codec import Codec
from mirror_core.batch_deep import SourceRecord, decode_record_tail, encode_batch, encode_record_tail, read_records
from mirror_core.cluster import ClusterConfig
from mirror_core.errors import MirrorError
from mirror_core.fetcher import RawBatchFetcher, list_offsets
from mirror_core.kafka_wire import WireClient
from mirror_core.offset_map import OffsetMap
from mirror_core.writer import OutgoingBatch

CHECKPOINT_TOPIC = "__shoal_checkpoints"
CHECKPOINT_PARTITIONS = 8
FORMAT_VERSION = 2  # 2: offset map in OffsetMap's binary encoding


@dataclass(frozen=True)
class Checkpoint:
    """One source partition's copy state in one pipeline."""

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

    @property
    def key(self) -> bytes:
        return checkpoint_key(self.pipeline, self.topic, self.partition)

    def to_value(self) -> bytes:
        """JSON; the offset map in its compact binary encoding (base64), so the value stays small."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["offset_map"] = None if self.offset_map is None else \
            base64.b64encode(self.offset_map.to_bytes()).decode()
        body["v"] = FORMAT_VERSION
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_value(cls, value: bytes) -> Checkpoint:
        body = json.loads(value)
        version = body.pop("v", None)
        if version != FORMAT_VERSION:
            raise MirrorError(f"checkpoint format {version!r} is not supported (this Shoal reads {FORMAT_VERSION})")
        encoded = body.pop("offset_map")
        return cls(**body, offset_map=None if encoded is None else OffsetMap.from_bytes(base64.b64decode(encoded)))


def checkpoint_key(pipeline: str, topic: str, partition: int) -> bytes:
    return json.dumps([pipeline, topic, partition], separators=(",", ":")).encode()


def checkpoint_partition(key: bytes, partitions: int = CHECKPOINT_PARTITIONS) -> int:
    return zlib.crc32(key) % partitions


class CheckpointStore:
    """Reads and writes :class:`Checkpoint` s in the compacted checkpoint topic of one (target) cluster."""

    def __init__(self, cluster: ClusterConfig, client: WireClient, *, topic: str = CHECKPOINT_TOPIC,
                 partitions: int = CHECKPOINT_PARTITIONS):
        self.cluster = cluster
        self.client = client
        self.topic = topic
        self.partitions = partitions

    def ensure_topic(self) -> None:
        """Create the compacted checkpoint topic if it is missing (its partition count then stays fixed)."""
        from mirror_core.topics import TopicAdmin

        admin = TopicAdmin(self.cluster)
        existing = admin.list_topics().get(self.topic)
        if existing is None:
            admin.create(self.topic, self.partitions, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                                                       "segment.ms": "3600000"}, exist_ok=True)
        elif existing != self.partitions:
            raise MirrorError(f"cluster {self.cluster.name!r}: checkpoint topic {self.topic!r} has {existing} "
                              f"partitions, Shoal expects {self.partitions}; keys would land in the wrong place")

    def checkpoint_batch(self, checkpoint: Checkpoint) -> OutgoingBatch:
        """The checkpoint as a raw batch for this store's topic, for a writer (inside its transaction, if any)."""
        tail = encode_record_tail(checkpoint.key, checkpoint.to_value())
        data = encode_batch([SourceRecord(0, checkpoint.updated_ms, 0, tail)], Codec.NONE)
        return OutgoingBatch(self.topic, checkpoint_partition(checkpoint.key, self.partitions), data,
                             source_offset=checkpoint.position)

    def read_all(self, pipeline: str | None = None) -> dict[tuple[str, str, int], Checkpoint]:
        """Every committed checkpoint (last value per key wins), optionally of one pipeline."""
        out: dict[tuple[str, str, int], Checkpoint] = {}
        for partition in range(self.partitions):
            for key, value in self._read_partition(partition):
                decoded = json.loads(key)
                if not isinstance(decoded, list):
                    continue  # leases and other records sharing the topic (see mirror_core.leases)
                ident = tuple(decoded)
                if pipeline is not None and ident[0] != pipeline:
                    continue  # decode only what was asked for: other pipelines may be another Shoal's format
                if value is None:
                    out.pop(ident, None)
                else:
                    out[ident] = Checkpoint.from_value(value)
        return out

    def read(self, pipeline: str, topic: str, partition: int) -> Checkpoint | None:
        key = checkpoint_key(pipeline, topic, partition)
        found = None
        for record_key, value in self._read_partition(checkpoint_partition(key, self.partitions)):
            if record_key == key:
                found = None if value is None else Checkpoint.from_value(value)
        return found

    def records(self, partition: int):
        """(key, value) of every committed record of one partition of the topic, in order."""
        return self._read_partition(partition)

    def _read_partition(self, partition: int):
        start = list_offsets(self.client, self.topic, partition, "earliest")
        end = list_offsets(self.client, self.topic, partition, "last_stable")
        if start >= end:
            return
        fetcher = RawBatchFetcher(self.client, self.topic, partition, start, end)
        while not fetcher.done:
            for view in fetcher.fetch().batches:
                for record in read_records(view):
                    if record.offset < start or record.offset >= end:
                        continue
                    key, value, _headers = decode_record_tail(record.tail)
                    yield key, value

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
