"""Gather the retention model's inputs from a source cluster (Kafka I/O; the model is
:mod:`mirror_core.model.retention`).

Per topic: DescribeConfigs (cleanup policy, retention, segment and compaction settings) and the leader's
``log.retention.check.interval.ms``. Per partition: ListOffsets (log start, log end, and the newest timestamp via
``MAX_TIMESTAMP``), DescribeLogDirs on the leader (partition size), and one Fetch "probe" at the mirror position
(READ_UNCOMMITTED: retention deletes aborted and committed batches alike) whose batches give the oldest unmirrored
timestamp and, because a Fetch never crosses a segment boundary, a lower bound on that segment's largest
timestamp — exact when the probe stops short of its byte limit before the high watermark.

Positions come from the caller (checkpoint store, plan or a positions file); a partition without one is taken as
not mirrored at all (position = log start); a position past the log end is reported LOST with the cause "truncated
log" (the source lost what the mirror had copied), not refused. The ingest rate is measured by sampling the log
end twice ``sample_s`` apart, or, with ``sample_s == 0``, estimated as the retained bytes over the age of the
oldest retained record. Copy throughput comes from the policy: measured, or estimated from the round trip the copy
sees (:func:`copy_round_trip`: the slowest source broker's Kafka round trip, measured the way ``--link-mbps``
sizing measures it, and the target's). :func:`assess_positions` is the one retention verdict every component
uses.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.consumer import FetchRequest, IsolationLevel

from mirror_core.codec.batch_codec import verify_crc, walk_batches
from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, CorruptBatchError, FetchError, MirrorError, PartitionUnavailableError
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.kafka.list_offsets import list_offsets, lookup_offsets, newest_timestamps
from mirror_core.kafka.retries import Backoff, is_retriable
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.retention import DEFAULT_CHECK_INTERVAL_MS, PartitionSnapshot, TopicRetention

DEFAULT_PROBE_BYTES = 1024 * 1024
PROBE_BOUNDS_ATTEMPTS = 3   # probes of one partition whose offset left the log between ListOffsets and the Fetch


@dataclass(frozen=True)
class RetentionInputs:
    """Everything :func:`mirror_core.model.retention.assess_partitions` needs about one cluster."""

    cluster: str
    topics: dict[str, TopicRetention]
    snapshots: list[PartitionSnapshot]
    check_interval_ms: int


@dataclass(frozen=True)
class PositionProbe:
    """One Fetch at ``offset``: the batches it returned all lie in ``offset``'s segment."""

    position_ts: int | None        # max timestamp of the batch holding ``offset``
    max_ts: int | None             # largest timestamp among the returned batches
    bytes_from_position: int       # bytes of the returned batches that end after ``offset``
    reached_segment_end: bool      # stopped short of max_bytes before the high watermark: the segment ended
    next_offset: int | None = None  # the offset after the last returned batch
    first_base_offset: int | None = None  # base offset of the batch holding ``offset`` (below it: mid-batch)
    out_of_range: bool = False     # OFFSET_OUT_OF_RANGE: ``offset`` left the log (deleted) since its bounds were read


@dataclass(frozen=True)
class SkippedPartition:
    """A partition (or a whole topic: ``partition`` None) a watch over many lanes left out of an assessment, and why:
    ``reason`` is ``not_on_source``, ``partition_not_on_source``, or the lane reason of the error its probe raised
    (``corrupt_batch``, ``unavailable``, ...), whose message is ``error``."""

    topic: str
    partition: int | None
    reason: str
    error: str | None = None


def gather_inputs(cluster: ClusterConfig, topics: Mapping[str, Sequence[int] | None],
                  positions: Mapping[tuple[str, int], int] | None = None, *, probe_bytes: int = DEFAULT_PROBE_BYTES,
                  sample_s: float = 0.0, clock: Callable[[], float] = time.time,
                  sleep: Callable[[float], None] = time.sleep,
                  oldest: OldestTimestamps | None = None,
                  skipped: list[SkippedPartition] | None = None) -> RetentionInputs:
    """Snapshots of ``topics`` (topic → partitions, None for all) on ``cluster`` at the given mirror positions.

    A topic or partition the cluster does not have is a ConfigError naming it, and a partition whose probe fails
    (a corrupt batch at the position, its leader unavailable for the probe's retries) raises that error — unless
    ``skipped`` is given (a watch over many lanes, e.g. the daemon's: one deleted topic or one damaged partition
    must not blind it to every other lane): then it is left out and appended there (:class:`SkippedPartition`).

    Log starts, log ends and newest timestamps are asked with one ListOffsets per leader for all partitions (a
    failed partition is retried on its own, as before); what is left per partition is the Fetch probe at the
    position (only where something is unmirrored) and, for the ingest estimate, the probe at the log start —
    which ``oldest`` (kept by a caller that assesses again and again, e.g. the daemon's retention watch) answers
    from the previous assessment while the log start has not moved (issue #18: 2,000 idle lanes cost ~4 CPU-s
    per assessment when every partition took four to five round trips)."""
    positions = positions or {}
    admin = ClusterAdmin(cluster)
    with WireClient.for_cluster(cluster) as client:
        chosen: dict[str, list[int]] = {}
        leaders: dict[tuple[str, int], int] = {}
        topic_ids: dict[str, object] = {}
        for topic, parts in topics.items():
            try:
                meta = _topic_metadata(client, topic)
            except ConfigError:
                if skipped is None:
                    raise
                skipped.append(SkippedPartition(topic, None, "not_on_source"))
                continue
            topic_ids[topic] = getattr(meta, "topic_id", None)
            chosen[topic] = sorted(meta.partitions) if parts is None else list(parts)
            for p in chosen[topic]:
                if p not in meta.partitions:
                    if skipped is None:
                        raise ConfigError(f"topic {topic!r} on cluster {cluster.name!r} has no partition {p}")
                    skipped.append(SkippedPartition(topic, p, "partition_not_on_source"))
                    continue
                leaders[(topic, p)] = meta.partitions[p].leader
        configs = {topic: TopicRetention.from_configs(admin.topic_configs(topic)) for topic in chosen}
        check_interval_ms = read_check_interval_ms(cluster, next(iter(leaders.values()), None))
        ends0 = {tp: list_offsets(client, *tp, "latest") for tp in leaders} if sample_s > 0 else {}
        t0 = clock()
        if sample_s > 0:
            sleep(sample_s)
        sizes = partition_sizes(cluster, leaders)
        starts = lookup_offsets(client, leaders, "earliest")
        ends = lookup_offsets(client, leaders, "latest")
        newest = newest_timestamps(client, [tp for tp in leaders if ends[tp] > starts[tp]])
        oldest = oldest if oldest is not None else OldestTimestamps()
        oldest.keep_only(leaders, configs, topic_ids)
        snapshots = []
        for (topic, p) in leaders:
            try:
                snapshots.append(_snapshot(client, cluster.name, topic, p, positions.get((topic, p)), sizes,
                                           probe_bytes, ends0, t0, clock, log_start=starts[(topic, p)],
                                           log_end=ends[(topic, p)], newest_ts=newest.get((topic, p)),
                                           oldest=oldest))
            except (CorruptBatchError, FetchError, PartitionUnavailableError) as exc:   # this partition's own
                if skipped is None:
                    raise
                skipped.append(SkippedPartition(topic, p, exc.lane_reason, str(exc)))
    return RetentionInputs(cluster.name, configs, snapshots, check_interval_ms)


class OldestTimestamps:
    """(topic, partition) → (log start, timestamp of the batch there): the ingest estimate's probe at the log
    start, kept between assessments. Invariant: an entry is used only while the partition's log start is the one
    it was read at (records below a log start never come back, the batch at it never changes) and only for a
    topic that is not compacted (compaction can remove the first batch without moving the log start), and of the
    same topic id (a topic deleted and created again under its name starts again at log start 0 with other data)."""

    def __init__(self):
        self._known: dict[tuple[str, int], tuple[int, int | None]] = {}
        self._topic_ids: dict[str, object] = {}
        self.probes = 0  # probes actually sent (for tests and diagnostics)

    def keep_only(self, partitions, configs: Mapping[str, TopicRetention],
                  topic_ids: Mapping[str, object] | None = None) -> None:
        topic_ids = topic_ids or {}
        recreated = {topic for topic, topic_id in topic_ids.items()
                     if topic in self._topic_ids and self._topic_ids[topic] != topic_id}
        self._topic_ids.update(topic_ids)
        self._known = {tp: v for tp, v in self._known.items()
                       if tp in partitions and not configs[tp[0]].compacts and tp[0] not in recreated}

    def get(self, client: WireClient, topic: str, p: int, log_start: int, probe_bytes: int) -> int | None:
        known = self._known.get((topic, p))
        if known is not None and known[0] == log_start:
            return known[1]
        self.probes += 1
        ts = probe_position(client, topic, p, log_start, min(probe_bytes, 64 * 1024)).position_ts
        self._known[(topic, p)] = (log_start, ts)
        return ts


def _snapshot(client: WireClient, cluster: str, topic: str, p: int, position: int | None,
              sizes: Mapping[tuple[str, int], int], probe_bytes: int, ends0: Mapping[tuple[str, int], int],
              t0: float, clock: Callable[[], float], *, log_start: int, log_end: int, newest_ts: int | None,
              oldest: OldestTimestamps) -> PartitionSnapshot:
    position = log_start if position is None else position
    for _ in range(PROBE_BOUNDS_ATTEMPTS):
        effective = min(max(position, log_start), log_end)
        probe = probe_position(client, topic, p, effective, probe_bytes) if effective < log_end else None
        if probe is None or not probe.out_of_range:
            break
        # Retention or DeleteRecords moved the log start past ``effective`` after ListOffsets read it: a probe
        # without timestamps would be a verdict without a deadline (SAFE for data just deleted), so read the
        # bounds again — the verdict then sees the new log start (LOST if it passed the position).
        log_start = list_offsets(client, topic, p, "earliest")
        log_end = list_offsets(client, topic, p, "latest")
    else:
        raise FetchError(cluster, topic, p, effective,
                         f"OffsetOutOfRange at {effective} though the log is [{log_start}, {log_end}) "
                         f"({PROBE_BOUNDS_ATTEMPTS} reads of the bounds)")
    now = clock()
    size = sizes.get((topic, p))
    if size is None:   # the leader did not report it (e.g. not authorized): extrapolate from the probe
        size = _size_from_probe(probe, effective, log_start, log_end)
    if (topic, p) in ends0:
        per_offset = size / (log_end - log_start) if log_end > log_start else 0.0
        ingest = (log_end - ends0[(topic, p)]) * per_offset / max(now - t0, 1e-3)
    else:
        ingest = _ingest_from_log(client, topic, p, log_start, log_end, size, now, probe_bytes, oldest)
    return PartitionSnapshot(
        topic=topic, partition=p, position=position, log_start=log_start, log_end=log_end, size_bytes=size,
        observed_at_ms=int(now * 1000), ingest_bytes_per_s=ingest,
        position_ts=probe.position_ts if probe else None, probe_max_ts=probe.max_ts if probe else None,
        probe_bytes=probe.bytes_from_position if probe else 0,
        probe_reached_segment_end=probe.reached_segment_end if probe else False, newest_ts=newest_ts,
        log_start_mid_batch=bool(position < log_start and probe is not None and probe.first_base_offset is not None
                                 and probe.first_base_offset < log_start))


def _size_from_probe(probe: PositionProbe | None, offset: int, log_start: int, log_end: int) -> int:
    if probe is None or probe.next_offset is None or probe.next_offset <= offset:
        return 0
    return round(probe.bytes_from_position / (probe.next_offset - offset) * (log_end - log_start))


def _ingest_from_log(client: WireClient, topic: str, p: int, log_start: int, log_end: int, size: int, now: float,
                     probe_bytes: int, oldest_known: OldestTimestamps) -> float:
    """Retained bytes over the age of the oldest retained record (an average that a burst does not inflate)."""
    if log_end <= log_start or size <= 0:
        return 0.0
    oldest = oldest_known.get(client, topic, p, log_start, probe_bytes)
    if oldest is None or oldest < 0:
        return 0.0
    return size / max(now - oldest / 1000, 1.0)


def _topic_metadata(client: WireClient, topic: str):
    try:
        return client.topic_metadata(topic, refresh=True)
    except Errors.UnknownTopicOrPartitionError:
        raise ConfigError(f"topic {topic!r} does not exist on cluster {client.cluster_name!r}") from None


def read_check_interval_ms(cluster: ClusterConfig, broker_id: int | None) -> int:
    """The broker's ``log.retention.check.interval.ms`` (Kafka's default when it cannot be read)."""
    if broker_id is None or broker_id < 0:
        return DEFAULT_CHECK_INTERVAL_MS
    admin = ClusterAdmin(cluster, timeout_s=30)
    try:
        value = admin.broker_config(broker_id, "log.retention.check.interval.ms")
        return int(value) if value is not None else DEFAULT_CHECK_INTERVAL_MS
    except Exception:  # noqa: BLE001 - not authorized to describe broker configs: the documented default applies
        return DEFAULT_CHECK_INTERVAL_MS


def partition_sizes(cluster: ClusterConfig, leaders: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Partition size in bytes on its leader (DescribeLogDirs through kafka-python's admin client)."""
    from kafka.admin import KafkaAdminClient

    wanted: dict[str, list[int]] = {}
    for topic, p in leaders:
        wanted.setdefault(topic, []).append(p)
    admin = KafkaAdminClient(**cluster.kafka_python())
    try:
        brokers = sorted({b for b in leaders.values() if b >= 0})
        answers = admin.describe_log_dirs(wanted, brokers=brokers)
    finally:
        admin.close()
    sizes: dict[tuple[str, int], int] = {}
    for answer in answers:
        for log_dir in answer["log_dirs"]:
            if log_dir.get("error_code"):
                continue
            for t in log_dir["topics"]:
                for part in t["partitions"]:
                    tp = (t["name"], part["partition_index"])
                    if leaders.get(tp) == answer["broker"] and not part.get("is_future_key"):
                        sizes[tp] = sizes.get(tp, 0) + int(part["partition_size"])
    return sizes


def measure_rtt(client: WireClient, *, samples: int = 5) -> float:
    """Median seconds of a minimal Metadata round trip to the cluster."""
    times = []
    for _ in range(max(1, samples)):
        t = time.perf_counter()
        client.metadata([])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def probe_position(client: WireClient, topic: str, partition: int, offset: int, max_bytes: int, *,
                   retry_timeout_s: float = 30.0) -> PositionProbe:
    """One READ_UNCOMMITTED Fetch at ``offset`` (retrying leader moves); see :class:`PositionProbe`."""
    backoff = Backoff(give_up_after=retry_timeout_s)
    while True:
        try:
            return _probe_once(client, topic, partition, offset, max_bytes)
        except Errors.KafkaError as exc:
            if not is_retriable(type(exc)):
                raise FetchError(client.cluster_name, topic, partition, offset, type(exc).__name__) from None
            client.invalidate(topic)
            if not backoff.wait():
                raise PartitionUnavailableError(client.cluster_name, topic, partition, type(exc).__name__,
                                                offset=offset) from None


def _probe_once(client: WireClient, topic: str, partition: int, offset: int, max_bytes: int) -> PositionProbe:
    leader, epoch = client.leader_for(topic, partition)
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=partition, current_leader_epoch=epoch, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=max_bytes)
    request = FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
        isolation_level=int(IsolationLevel.READ_UNCOMMITTED), session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=None, partitions=[part])], forgotten_topics_data=[],
        rack_id="", min_version=4, max_version=12)
    response = client.send(leader, request)
    if response.error_code:
        raise Errors.for_code(response.error_code)()
    data = response.responses[0].partitions[0]
    error = Errors.for_code(data.error_code)
    if error is Errors.OffsetOutOfRangeError:
        return PositionProbe(None, None, 0, False, out_of_range=True)   # deleted meanwhile: read the bounds again
    if error is not Errors.NoError:
        raise error()
    records = data.records or b""
    batches, tail = walk_batches(records)
    batches = [b for b in batches if b.next_offset > offset]
    if not batches:
        return PositionProbe(None, None, 0, False)
    try:   # the timestamps decide deadlines: a maxTimestamp changed on the disk must not push one out of sight
        for batch in batches:
            verify_crc(batch)
    except CorruptBatchError as exc:
        raise exc.located(client.cluster_name, topic, partition) from None
    stamps = [b.max_timestamp for b in batches if b.max_timestamp >= 0]
    reached_end = tail == 0 and len(records) < max_bytes and batches[-1].next_offset < data.high_watermark
    return PositionProbe(position_ts=batches[0].max_timestamp if batches[0].max_timestamp >= 0 else None,
                         max_ts=max(stamps) if stamps else None, bytes_from_position=sum(b.size for b in batches),
                         reached_segment_end=reached_end, next_offset=batches[-1].next_offset,
                         first_base_offset=batches[0].base_offset)


TARGET_PROBE_TIMEOUT_MS = 10_000  # how long copy_round_trip waits for a target to answer before pacing by the source


def copy_round_trip(source: ClusterConfig, target: ClusterConfig | None = None) -> tuple[float, str]:
    """The round trip that paces a copy, and where it came from. The copy overlaps fetch and write (the next
    fetch travels while the previous one is written), so the slower side paces it: the larger of the source's
    round trip — the slowest broker's, measured as ``--link-mbps`` sizing measures it
    (:func:`mirror_core.kafka.round_trips.measure_links`), or a Metadata round trip when that cannot be done, e.g. over
    TLS — and the target's (when the target does not answer: the source's alone, said in the second value)."""
    from mirror_core.kafka.round_trips import measure_links

    try:
        rtts = [(link.rtt_s, link.broker) for link in measure_links(source) if link.rtt_s is not None]
    except MirrorError:
        rtts = []
    if rtts:
        src, broker = max(rtts)
        src_how = f"measured: source broker {broker} {src * 1000:.2f} ms"
    else:
        with WireClient.for_cluster(source) as client:
            src = measure_rtt(client)
        src_how = f"measured: source {src * 1000:.2f} ms (Metadata)"
    if target is None:
        return src, src_how
    try:  # a target that does not answer is known in seconds, not after the default 30 s bootstrap
        with WireClient.for_cluster(target, bootstrap_timeout_ms=TARGET_PROBE_TIMEOUT_MS) as client:
            tgt = measure_rtt(client)
    except (MirrorError, Errors.KafkaError) as exc:
        # the verdict is about the source's retention: a target that does not answer — the usual reason lanes stop
        # copying, when the verdict matters most — must not stop it (the estimate then assumes the copy resumes)
        return src, f"{src_how}; target not measured ({type(exc).__name__}: {exc}), the source's paces the copy"
    return max(src, tgt), f"{src_how}, target {tgt * 1000:.2f} ms; the slower paces the copy"


