"""Copy a bounded offset range of one source partition to one target partition, as raw batches.

Fetch (READ_COMMITTED, markers and aborted transactions dropped by the fetcher) → prepare each batch for the target
(header rewrite; the named deep cases re-encode and are counted) → produce in order through one
:class:`~mirror_core.writer.BatchWriter`. Memory stays near ``fetch_max_bytes + max_inflight_bytes``: prepared
batches are written whenever they reach ``max_inflight_bytes``.

Range bounds: by default whole batches are copied, so a batch that straddles ``end`` is copied whole and the
actual end (the next offset after it) is reported; the next range or the daemon starts there. With
``exact_bounds`` straddling batches are trimmed (a deep case).

Invariants: batches reach the target in source order; the target offsets a partition receives are contiguous
(one writer per target partition — a gap or jump means someone else wrote to it, and the copy halts);
``CopyResult.source_end`` never passes what the target acknowledged.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mirror_core.batch_codec import PreparedBatch, prepare_for_target
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.fetcher import RawBatchFetcher
from mirror_core.kafka_wire import WireClient
from mirror_core.offset_map import OffsetRuns
from mirror_core.writer import BatchWriter, OutgoingBatch

RECORDS_SECTION = 61  # RecordBatch v2 header size: the digest covers what follows it


@dataclass(frozen=True)
class PartitionRange:
    """Source ``topic-partition`` offsets ``[start, end)`` to be written to ``target_topic-target_partition``."""

    topic: str
    partition: int
    start: int
    end: int
    target_topic: str
    target_partition: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ConfigError(f"{self.topic}-{self.partition}: invalid range [{self.start}, {self.end})")

    def __str__(self) -> str:
        return (f"{self.topic}-{self.partition} [{self.start}, {self.end}) -> "
                f"{self.target_topic}-{self.target_partition}")


@dataclass(frozen=True)
class CopyOptions:
    exact_bounds: bool = False
    preserve_log_append_time: bool = True
    fetch_max_bytes: int = 4 * 1024 * 1024
    max_inflight_bytes: int = 8 * 1024 * 1024
    stall_timeout_s: float = 30.0  # no progress while the source has nothing more to give: the range is wrong

    def __post_init__(self) -> None:
        if self.fetch_max_bytes <= 0 or self.max_inflight_bytes <= 0:
            raise ConfigError("fetch_max_bytes and max_inflight_bytes must be positive")


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
    first_target_offset: int | None = None
    next_target_offset: int | None = None
    offset_runs: OffsetRuns = field(default_factory=OffsetRuns)
    records_digest: str = ""
    seconds: float = 0.0

    @property
    def last_target_offset(self) -> int | None:
        return None if self.next_target_offset is None else self.next_target_offset - 1


Progress = Callable[[CopyResult], None]


class RangeCopier:
    """Copies :class:`PartitionRange` s from one source cluster to one target cluster through a shared writer."""

    def __init__(self, source: WireClient, target: WireClient, writer: BatchWriter | None = None,
                 options: CopyOptions | None = None):
        self.source = source
        self.target = target
        self.writer = writer or BatchWriter(target)
        self.options = options or CopyOptions()

    def copy(self, rng: PartitionRange, progress: Progress | None = None) -> CopyResult:
        opts = self.options
        started = time.monotonic()
        result = CopyResult(rng, source_start=rng.start, source_end=rng.start)
        digest = hashlib.blake2b(digest_size=16)
        if rng.start == rng.end:
            result.records_digest = digest.hexdigest()
            return result
        fetcher = RawBatchFetcher(self.source, rng.topic, rng.partition, rng.start, rng.end,
                                  max_bytes=opts.fetch_max_bytes)
        bounds = (rng.start, rng.end) if opts.exact_bounds else None
        pending: list[PreparedBatch] = []
        pending_bytes = 0
        first_fetched = True
        last_progress = time.monotonic()
        while not fetcher.done:
            fetched = fetcher.fetch()
            for view in fetched.batches:
                if first_fetched and not opts.exact_bounds:
                    result.source_start = min(rng.start, view.base_offset)
                first_fetched = False
                prepared = prepare_for_target(view, preserve_log_append_time=opts.preserve_log_append_time,
                                              exact_bounds=bounds)
                if prepared is None:
                    continue
                pending.append(prepared)
                pending_bytes += len(prepared.data)
                if pending_bytes >= opts.max_inflight_bytes:
                    self._flush(rng, pending, result, digest)
                    pending, pending_bytes = [], 0
            if fetched.batches or fetcher.position > result.source_end:
                last_progress = time.monotonic()
            elif fetched.last_stable_offset <= fetcher.position and \
                    time.monotonic() - last_progress > opts.stall_timeout_s:
                raise MirrorError(
                    f"cluster {self.source.cluster_name!r} {rng.topic}-{rng.partition}: the range ends at "
                    f"{rng.end} but the partition's last stable offset is {fetched.last_stable_offset} "
                    f"(high watermark {fetched.high_watermark}) and nothing arrived for {opts.stall_timeout_s:.0f}s;"
                    " plan the range up to the last stable offset")
            # everything up to the fetch position is either pending or needs no copy (markers, aborted data)
            if not pending:
                result.source_end = max(result.source_end, self._reachable_end(fetcher, rng))
            if progress is not None:
                progress(result)
        if pending:
            self._flush(rng, pending, result, digest)
        result.source_end = max(result.source_end, self._reachable_end(fetcher, rng))
        result.records_digest = digest.hexdigest()
        result.seconds = time.monotonic() - started
        if progress is not None:
            progress(result)
        return result

    def _reachable_end(self, fetcher: RawBatchFetcher, rng: PartitionRange) -> int:
        return fetcher.position if not self.options.exact_bounds else min(fetcher.position, rng.end)

    def _flush(self, rng: PartitionRange, pending: list[PreparedBatch], result: CopyResult, digest) -> None:
        outgoing = [OutgoingBatch(rng.target_topic, rng.target_partition, p.data, p.source_first_offset)
                    for p in pending]
        bases = self.writer.write(outgoing)
        for prepared, base in zip(pending, bases, strict=True):
            expected = result.next_target_offset
            if base < 0:  # the broker answered "duplicate" without an offset: it is where we expected it
                if expected is None:
                    raise MirrorError(f"cluster {self.target.cluster_name!r} {rng.target_topic}-"
                                      f"{rng.target_partition}: first batch acknowledged without an offset")
                base = expected
            elif expected is not None and base != expected:
                raise MirrorError(
                    f"cluster {self.target.cluster_name!r} {rng.target_topic}-{rng.target_partition}: the batch "
                    f"from source offset {prepared.source_first_offset} landed at {base}, expected {expected}; "
                    "another writer is producing to this partition, so the offset map would be wrong")
            if result.first_target_offset is None:
                result.first_target_offset = base
            result.next_target_offset = base + prepared.record_count
            result.offset_runs.add_batch(base, prepared.offset_runs())
            result.records += prepared.record_count
            result.batches += 1
            result.bytes += len(prepared.data)
            result.deep_batches += prepared.deep
            result.source_end = max(result.source_end, prepared.source_next_offset)
            section = memoryview(prepared.data)[RECORDS_SECTION:]
            digest.update(len(section).to_bytes(4, "big"))
            digest.update(section)
