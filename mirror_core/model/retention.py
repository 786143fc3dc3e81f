"""Retention-deadline model: per partition, how long until the source deletes what has not been copied, against how
long the copy needs — before it happens. Pure: no I/O; :mod:`mirror_core.kafka.retention_inputs` gathers the inputs.

How the broker deletes (Apache Kafka ``UnifiedLog.deleteOldSegments`` / ``LogSegment``), and what follows here
-------------------------------------------------------------------------------------------------------------
- Deletion works on **whole segments**, oldest first, on the ``log.retention.check.interval.ms`` tick, and only
  below the high watermark. The log start offset moves to the next segment's base offset at once (the files go
  later, after ``file.delete.delay.ms``): that is the moment data becomes unreadable.
- **Time**: a segment is deletable when ``now - segment.largestTimestamp > retention.ms``, where
  ``largestTimestamp`` is the largest record timestamp in the segment. The active segment is no exception once all
  of it has expired (the broker rolls a new one first). ``segment.ms`` only rolls a segment when a record arrives
  whose timestamp is more than ``segment.ms`` past the segment's first batch timestamp.
- **Size**: while ``partition size - oldest segment size >= retention.bytes`` the oldest segment is deleted, so a
  segment goes once the bytes *after* it reach ``retention.bytes``.
- **Compaction** (``cleanup.policy`` contains ``compact``) keeps the latest value per key but removes a tombstone
  ``delete.retention.ms`` after the cleaner first cleaned its segment, and it cannot clean records younger than
  ``min.compaction.lag.ms``: a mirror lagging longer than that misses deletes. ``compact`` alone never deletes by
  time or size; ``compact,delete`` does both.

We never see segments, only record batches (Fetch) and offsets/timestamps (ListOffsets). So time to loss is a
**lower bound** for the oldest unmirrored record, the batch at the mirror position ``p``:

- time: its segment's ``largestTimestamp`` is at least the largest batch timestamp we saw from ``p`` onward
  *within that segment* (a Fetch reads from one segment only, so the batches one probe returns all share ``p``'s
  segment), hence deletion is no earlier than ``seen_max_ts + retention.ms``. When the probe ended at the segment's
  end (fewer bytes than asked, before the high watermark) that maximum is exact and so is the deadline, up to one
  retention-check interval. Otherwise the latest it can be is one segment roll later: with monotonic timestamps
  the segment's first batch is no later than ``p``'s, so its largest timestamp is at most ``ts(p) + segment.ms``
  (or the newest timestamp in the log, when nothing more is coming in) — the ``deletion window``.
- size: the bytes after ``p``'s segment are at most the bytes from ``p`` to the end, so deletion is no earlier
  than when ingest has added ``retention.bytes - bytes_from_p`` (never, on an idle partition).
- tombstones: ``p``'s segment can be cleaned no earlier than ``ts(p) + min.compaction.lag.ms``; a tombstone in it
  can then vanish ``delete.retention.ms`` later.
- infinite retention (``-1``) gives no deadline, and so does a partition with nothing unmirrored.

Catch-up ETA is ``unmirrored bytes / (copy throughput - ingest rate)``; never when copying is not faster than
ingest (:mod:`mirror_core.model.copy_capacity` holds the throughput, its estimate and this arithmetic).
``margin = time to loss - ETA``; comparing the *whole* backlog's ETA with the *oldest* record's deadline is
conservative (later records expire later), so a margin >= 0 means no loss at these rates. Status: LOST (position
below the log start: the exact offsets ``[position, log start)`` are gone), LOSING (ETA beyond time to loss),
AT_RISK (margin under the threshold), else SAFE. Each non-SAFE status names what would fix it: copy streams
needed, or how much longer the source retention must be. Times are wall-clock ms against record timestamps
(CreateTime is the producer's clock; clock skew shifts the deadline by the same amount).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mirror_core.errors import ConfigError, RetentionLossError
from mirror_core.model.copy_capacity import CopyCapacity, catch_up_eta, streams_needed

INF = math.inf
DEFAULT_CHECK_INTERVAL_MS = 300_000  # Kafka's log.retention.check.interval.ms default


class Status(enum.Enum):
    SAFE = "SAFE"
    AT_RISK = "AT_RISK"
    LOSING = "LOSING"
    LOST = "LOST"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.SAFE: 0, Status.AT_RISK: 1, Status.LOSING: 2, Status.LOST: 3}


class LossCause(enum.Enum):
    TIME = "retention.ms"
    SIZE = "retention.bytes"
    TOMBSTONE = "delete.retention.ms"
    DELETE_RECORDS = "DeleteRecords"    # LOST only: records deleted explicitly (the log start moved mid-batch, or
                                        # on a topic whose retention never deletes)
    TRUNCATED = "truncated log"         # LOST only: the source log now ends before the mirror position


@dataclass(frozen=True)
class TopicRetention:
    """The topic settings that decide deletion; ``None`` means infinite (Kafka's ``-1``)."""

    cleanup_policy: frozenset[str] = frozenset({"delete"})
    retention_ms: int | None = 7 * 24 * 3_600_000
    retention_bytes: int | None = None
    segment_ms: int = 7 * 24 * 3_600_000
    segment_bytes: int = 1024 ** 3
    delete_retention_ms: int = 24 * 3_600_000
    min_compaction_lag_ms: int = 0

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy

    @classmethod
    def from_configs(cls, configs: Mapping[str, str | None]) -> TopicRetention:
        """From DescribeConfigs values (strings); missing keys take Kafka's defaults."""
        def number(key: str, default: int) -> int:
            value = configs.get(key)
            if value is None or value == "":
                return default
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"topic config {key}={value!r} is not a number") from None

        def infinite(value: int) -> int | None:
            return None if value < 0 else value

        d = cls()
        policy = frozenset(p.strip() for p in str(configs.get("cleanup.policy") or "delete").split(",") if p.strip())
        return cls(cleanup_policy=policy,
                   retention_ms=infinite(number("retention.ms", d.retention_ms)),
                   retention_bytes=infinite(number("retention.bytes", -1)),
                   segment_ms=number("segment.ms", d.segment_ms),
                   segment_bytes=number("segment.bytes", d.segment_bytes),
                   delete_retention_ms=number("delete.retention.ms", d.delete_retention_ms),
                   min_compaction_lag_ms=number("min.compaction.lag.ms", 0))


@dataclass(frozen=True)
class PartitionSnapshot:
    """What the clusters said about one partition at ``observed_at_ms`` (all timestamps in ms).

    ``probe_*`` describe one Fetch at the (effective) mirror position: the largest batch timestamp it returned, the
    bytes it returned from the position on, and whether it ended at the end of the position's segment.
    """

    topic: str
    partition: int
    position: int
    log_start: int
    log_end: int
    size_bytes: int
    observed_at_ms: int
    ingest_bytes_per_s: float = 0.0
    position_ts: int | None = None          # max timestamp of the batch holding the first unmirrored offset
    probe_max_ts: int | None = None         # largest timestamp seen from there within the same segment
    probe_bytes: int = 0
    probe_reached_segment_end: bool = False
    newest_ts: int | None = None            # largest timestamp in the log (ListOffsets MAX_TIMESTAMP)
    log_start_mid_batch: bool = False       # the batch holding the log start begins below it (DeleteRecords)

    @property
    def truncated(self) -> bool:
        """The mirror position lies past the source's log end: the source lost what the mirror had copied."""
        return self.position > self.log_end

    @property
    def effective_position(self) -> int:
        return min(max(self.position, self.log_start), self.log_end)

    @property
    def unmirrored_records(self) -> int:
        return max(0, self.log_end - self.effective_position)

    @property
    def unmirrored_bytes(self) -> int:
        """Bytes from the position to the end, pro rata over the retained offsets (exact when nothing is mirrored)."""
        span = self.log_end - self.log_start
        if span <= 0 or self.unmirrored_records == 0:
            return 0
        return round(self.size_bytes * self.unmirrored_records / span)


@dataclass(frozen=True)
class Remedy:
    """What would make a partition SAFE: more copy streams and/or longer source retention (new config values)."""

    streams_needed: int | None = None      # None: no number of streams is enough (or not needed)
    config_changes: dict[str, int] = field(default_factory=dict)
    accept_loss: bool = False
    text: str = ""


@dataclass(frozen=True)
class RetentionStatus:
    """The verdict for one partition. Seconds are from ``observed_at_ms``; ``INF`` means never.

    For LOST, ``time_to_loss_s`` is 0 and ``margin_s`` is ``-INF``; ``deadlines_s``, ``eta_s`` and the remedy then
    describe the data still retained (from the log start on).
    """

    topic: str
    partition: int
    status: Status
    position: int
    log_start: int
    log_end: int
    unmirrored_records: int
    unmirrored_bytes: int
    time_to_loss_s: float
    loss_cause: LossCause | None
    eta_s: float
    margin_s: float
    ingest_bytes_per_s: float
    copy_bytes_per_s: float
    deletion_window_s: tuple[float, float] | None = None   # when the broker should delete (earliest, latest)
    deadlines_s: dict[str, float] = field(default_factory=dict)   # per cause
    lost_range: tuple[int, int] | None = None
    remedy: Remedy = field(default_factory=Remedy)
    observed_at_ms: int = 0

    @property
    def lost_records(self) -> int:
        return 0 if self.lost_range is None else self.lost_range[1] - self.lost_range[0]

    def deletion_at_ms(self) -> int | None:
        """Wall-clock ms of the earliest possible deletion of the oldest unmirrored record (None: never)."""
        if math.isinf(self.time_to_loss_s) or self.status is Status.LOST:
            return None
        return self.observed_at_ms + round(self.time_to_loss_s * 1000)


def assess_partition(snap: PartitionSnapshot, topic: TopicRetention, copy: CopyCapacity, *,
                     at_risk_below_s: float, check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS) -> RetentionStatus:
    """Time to loss, catch-up ETA, margin, status and remedy of one partition (see the module docstring)."""
    if snap.truncated:
        lost = (snap.log_end, snap.position)
    else:
        lost = (snap.position, snap.log_start) if snap.position < snap.log_start else None
    backlog = snap.unmirrored_bytes
    deadlines, window = _deadlines(snap, topic, check_interval_ms)
    cause = min(deadlines, key=deadlines.get, default=None)
    ttl = deadlines[cause] if cause is not None else INF
    eta = catch_up_eta(backlog, snap.ingest_bytes_per_s, copy.bytes_per_s)
    margin = ttl - eta if not math.isinf(ttl) else INF
    if lost is not None:
        status = Status.LOST
    elif margin < 0:
        status = Status.LOSING
    elif margin < at_risk_below_s:
        status = Status.AT_RISK
    else:
        status = Status.SAFE
    remedy = _remedy(status, snap, topic, copy, deadlines, eta, backlog, at_risk_below_s, lost)
    return RetentionStatus(
        topic=snap.topic, partition=snap.partition, status=status, position=snap.position,
        log_start=snap.log_start, log_end=snap.log_end, unmirrored_records=snap.unmirrored_records,
        unmirrored_bytes=backlog, time_to_loss_s=0.0 if lost is not None else ttl,
        loss_cause=lost_cause(snap, topic) if lost is not None else LossCause(cause) if cause else None,
        eta_s=eta, margin_s=-INF if lost is not None else margin, ingest_bytes_per_s=snap.ingest_bytes_per_s,
        copy_bytes_per_s=copy.bytes_per_s, deletion_window_s=window,
        deadlines_s=deadlines, lost_range=lost, remedy=remedy, observed_at_ms=snap.observed_at_ms)


def lost_cause(snap: PartitionSnapshot, topic: TopicRetention) -> LossCause:
    """Why a LOST partition's data is gone. Retention deletes whole segments, so it leaves the log start on a batch
    boundary, and only on a topic that deletes with a finite retention; anything else moved the log start by
    DeleteRecords. (DeleteRecords exactly at a batch boundary of a retention-deleting topic looks like retention.)"""
    if snap.truncated:
        return LossCause.TRUNCATED
    if snap.log_start_mid_batch or not topic.deletes or (topic.retention_ms is None
                                                         and topic.retention_bytes is None):
        return LossCause.DELETE_RECORDS
    return LossCause.TIME if topic.retention_ms is not None else LossCause.SIZE


def _deadlines(snap: PartitionSnapshot, topic: TopicRetention,
               check_interval_ms: int) -> tuple[dict[str, float], tuple[float, float] | None]:
    """Lower bounds, in seconds from now, per cause (absent: no deadline), and the time-based deletion window."""
    out: dict[str, float] = {}
    window = None
    if snap.unmirrored_records == 0:
        return out, None
    now = snap.observed_at_ms
    ts_p = snap.position_ts
    seen = [t for t in (ts_p, snap.probe_max_ts) if t is not None and t >= 0]
    seen_max = max(seen) if seen else None
    if topic.deletes and topic.retention_ms is not None and seen_max is not None:
        earliest_ms = seen_max + topic.retention_ms - now
        if snap.probe_reached_segment_end:
            latest_seg_max = seen_max
        else:
            idle_newest = snap.newest_ts if snap.ingest_bytes_per_s <= 0 else None   # nothing more will join it
            candidates = [t for t in (ts_p + topic.segment_ms if ts_p is not None else None, idle_newest)
                          if t is not None]
            latest_seg_max = max(seen_max, min(candidates)) if candidates else seen_max
        latest_ms = latest_seg_max + topic.retention_ms + check_interval_ms - now
        out[LossCause.TIME.value] = earliest_ms / 1000
        window = (earliest_ms / 1000, latest_ms / 1000)
    if topic.deletes and topic.retention_bytes is not None:
        bytes_from_p = snap.unmirrored_bytes
        if snap.probe_reached_segment_end:
            bytes_from_p -= min(snap.probe_bytes, bytes_from_p)   # bytes after the position's segment
        room = topic.retention_bytes - bytes_from_p
        if room <= 0:
            out[LossCause.SIZE.value] = 0.0
        elif snap.ingest_bytes_per_s > 0:
            out[LossCause.SIZE.value] = room / snap.ingest_bytes_per_s
    if topic.compacts and ts_p is not None and ts_p >= 0:
        horizon = ts_p + topic.min_compaction_lag_ms + topic.delete_retention_ms - now
        out[LossCause.TOMBSTONE.value] = horizon / 1000
    return out, window


def _remedy(status: Status, snap: PartitionSnapshot, topic: TopicRetention, copy: CopyCapacity,
            deadlines: Mapping[str, float], eta: float, backlog: int, threshold: float,
            lost: tuple[int, int] | None) -> Remedy:
    if status is Status.SAFE:
        return Remedy()
    parts: list[str] = []
    if lost is not None and snap.truncated:
        parts.append(f"the source log now ends at {snap.log_end}, before the mirror position {snap.position}: the "
                     f"source lost offsets [{lost[0]}, {lost[1]}) that the mirror had copied (unclean leader "
                     "election or a replaced broker); the target keeps them — compare both sides before resuming")
        return Remedy(accept_loss=True, text="; ".join(parts))
    if lost is not None:
        how = lost_cause(snap, topic).value
        parts.append(f"offsets [{lost[0]}, {lost[1]}) were deleted by {how} before they were copied: accept the "
                     f"loss explicitly (--accept-loss, recorded) and continue from the log start {snap.log_start}")
        if margin_ok(deadlines, eta, threshold):
            return Remedy(accept_loss=True, text="; ".join(parts))
    ttl = min(deadlines.values(), default=INF)
    streams = streams_needed(backlog, snap.ingest_bytes_per_s, copy, ttl - threshold)
    if streams is not None and streams > 1:
        parts.append(f"copy with {streams} streams ({copy.with_streams(streams) / 1e6:.3g} MB/s)")
    elif streams is None and ttl - threshold > 0:
        parts.append("no number of copy streams is enough at the link ceiling")
    changes: dict[str, int] = {}
    if not math.isinf(eta):
        needed_s = eta + threshold
        for cause, deadline in deadlines.items():
            if deadline >= needed_s:
                continue
            extra_s = needed_s - deadline
            if cause == LossCause.TIME.value and topic.retention_ms is not None:
                changes["retention.ms"] = topic.retention_ms + math.ceil(extra_s * 1000)
            elif cause == LossCause.SIZE.value and topic.retention_bytes is not None:
                changes["retention.bytes"] = topic.retention_bytes + math.ceil(
                    max(extra_s * snap.ingest_bytes_per_s, backlog - topic.retention_bytes + 1, 1))
            elif cause == LossCause.TOMBSTONE.value:
                changes["delete.retention.ms"] = topic.delete_retention_ms + math.ceil(extra_s * 1000)
        if changes:
            parts.append(("or raise" if parts else "raise") + " source " +
                         ", ".join(f"{k} to >= {v}" for k, v in changes.items()))
    else:
        parts.append("copying is not faster than ingest: longer retention only delays the loss")
    return Remedy(streams_needed=streams, config_changes=changes, accept_loss=lost is not None,
                  text="; ".join(parts))


def margin_ok(deadlines: Mapping[str, float], eta: float, threshold: float) -> bool:
    return min(deadlines.values(), default=INF) - eta >= threshold


def assess_partitions(snapshots: Iterable[PartitionSnapshot], topics: Mapping[str, TopicRetention],
                      copy: CopyCapacity, *, at_risk_below_s: float,
                      check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS) -> list[RetentionStatus]:
    """Every partition's status, most urgent first (see :func:`order_by_deadline`)."""
    return order_by_deadline([assess_partition(s, topics[s.topic], copy, at_risk_below_s=at_risk_below_s,
                                               check_interval_ms=check_interval_ms) for s in snapshots])


def order_by_deadline(statuses: Iterable[RetentionStatus]) -> list[RetentionStatus]:
    """Most urgent first: LOST, then by margin, then by time to loss — the order a backfill should copy in."""
    return sorted(statuses, key=lambda s: (s.status is not Status.LOST, s.margin_s, s.time_to_loss_s, s.topic,
                                           s.partition))


# -- guarding a plan ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossRecord:
    """An accepted loss, for the ledger: ``[first_offset, end_offset)`` of ``topic-partition`` were never copied."""

    cluster: str
    topic: str
    partition: int
    first_offset: int
    end_offset: int
    observed_at_ms: int

    @property
    def records(self) -> int:
        return self.end_offset - self.first_offset


def guard_plan(cluster: str, statuses: Iterable[RetentionStatus], *, accept_loss: bool) -> list[LossRecord]:
    """Refuse a plan with LOST partitions unless ``accept_loss``; return the losses to record in the ledger."""
    lost = [s for s in statuses if s.status is Status.LOST and s.lost_range is not None]
    if lost and not accept_loss:
        raise RetentionLossError(cluster, lost)
    return [LossRecord(cluster, s.topic, s.partition, s.lost_range[0], s.lost_range[1], s.observed_at_ms)
            for s in lost]
