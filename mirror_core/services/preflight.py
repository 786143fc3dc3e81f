"""Preflight I/O: describe both topics and the data to copy, decide (``preflight_rules``), create a missing target.

Runs before any write of a copy. Reads partition counts (Metadata), effective configs (DescribeConfigs), the
newest timestamp per partition (ListOffsets with the max-timestamp spec, Kafka ≥ 3.0) and the oldest as the first
record at each partition's start offset, as consumers see it. The target topic is created only when the report
holds no refusal, so a refused copy leaves the target untouched.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.plan_request import PlanRequest
from mirror_core.errors import ClusterUnavailableError, MirrorError
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.kafka.round_trips import measure_links
from mirror_core.model.preflight_rules import (
    DataFacts,
    Finding,
    PreflightReport,
    SourceLink,
    TopicState,
    check_link_buffers,
    decide,
    is_internal_topic,
)

if TYPE_CHECKING:
    from mirror_core.kafka.wire_client import WireClient

__all__ = ["run_preflight", "check_only", "preflight_topics", "describe_topic", "observe_data", "create_target_topic",
           "link_findings"]


def run_preflight(source: ClusterConfig, target: ClusterConfig, topic: str, *, target_topic: str | None = None,
                  allow_internal: bool = False, max_batch_bytes: int | None = None,
                  start_offsets: Mapping[int, int] | None = None, facts: DataFacts | None = None,
                  timeout_s: float = 30.0, link_bytes_per_s: float | None = None,
                  links: Sequence[SourceLink] | Future | None = None, coalesce_bytes: int = 0,
                  source_admin: ClusterAdmin | None = None, source_client: WireClient | None = None
                  ) -> PreflightReport:
    """Check the target for a copy of ``source``/``topic`` and create it when missing and nothing refuses.

    ``target_topic`` defaults to the source name (see ``target_topic_name`` for a prefix policy); partitions map
    one to one. ``start_offsets`` (partition → first offset to copy) narrows where the oldest timestamp is read;
    ``facts`` replaces the observation entirely (e.g. figures the caller already measured).
    ``link_bytes_per_s``: the source link's rate; then the source brokers' send buffers are checked against it
    (:func:`link_findings`) — ``links``: those brokers as the caller measured them (a copy sizes its fetches from
    the same figures; over a long link each measurement costs seconds), or a future of them, measured while the
    topics are described and waited for before the data is observed (reading the first records loads the link,
    and round trips timed behind that load would come out long), else they are measured here.
    ``coalesce_bytes``: the copy merges small batches up to this size, so the target must accept batches that
    large. The source is described, observed and (when asked) measured through one admin client (``source_admin``,
    else a new one), and its first records read through ``source_client`` when the caller has one connected
    (else a new consumer): over a long link each new client pays its connection set-up (TCP, TLS, SASL) again.
    """
    target_topic = target_topic or topic
    names = dict(source_cluster=source.name, source_topic=topic, target_cluster=target.name,
                 target_topic=target_topic, allow_internal=allow_internal)
    if is_internal_topic(topic) and not allow_internal:  # refuse before reading anything from it
        return decide(None, None, DataFacts(now_ms=_now_ms()), **names)
    source_admin = source_admin or ClusterAdmin(source, timeout_s=timeout_s)
    source_state = describe_topic(source, topic, timeout_s=timeout_s, admin=source_admin)
    if isinstance(links, Future):
        links = links.result()
    if facts is None and source_state is not None:
        facts = observe_data(source, topic, source_state.partitions, start_offsets=start_offsets,
                             timeout_s=timeout_s, admin=source_admin, client=source_client)
    facts = facts or DataFacts(now_ms=_now_ms())
    if max_batch_bytes is not None:
        facts = dataclasses.replace(facts, max_batch_bytes=max_batch_bytes)
    if coalesce_bytes:
        facts = dataclasses.replace(facts, coalesce_bytes=coalesce_bytes)
    if link_bytes_per_s and links is None:
        links = measure_links(source, timeout_s=timeout_s, admin=source_admin)
    extra = tuple(link_findings(source, link_bytes_per_s, timeout_s=timeout_s, links=links)) \
        if link_bytes_per_s else ()
    for _attempt in range(2):
        report = decide(source_state, describe_topic(target, target_topic, timeout_s=timeout_s), facts, **names)
        report = dataclasses.replace(report, findings=report.findings + extra)
        if report.create_config is None or not report.ok:
            return report
        if create_target_topic(target, target_topic, report.partitions, report.create_config, timeout_s=timeout_s):
            return dataclasses.replace(report, created=True)
        # someone created it between describe and create: judge the topic that now exists
    raise MirrorError(f"cluster {target.name!r} topic {target_topic!r}: the topic kept appearing and disappearing "
                      "while preflight ran; rerun when nothing else creates or deletes it")


def link_findings(source: ClusterConfig, link_bytes_per_s: float, *, timeout_s: float = 30.0,
                  links: Sequence[SourceLink] | None = None) -> list[Finding]:
    """Size for the link: the source brokers' send buffers and round trips (``links``, else
    :func:`measure_links`), judged by :func:`~mirror_core.model.preflight_rules.check_link_buffers`."""
    links = measure_links(source, timeout_s=timeout_s) if links is None else list(links)
    return check_link_buffers(source.name, links, link_bytes_per_s=link_bytes_per_s)


def describe_topic(cluster: ClusterConfig, topic: str, *, timeout_s: float = 30.0,
                   admin: ClusterAdmin | None = None) -> TopicState | None:
    """Partition count and effective configs, or ``None`` when the topic does not exist (``admin``: a client of
    ``cluster`` to reuse)."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource

    admin = admin or ClusterAdmin(cluster, timeout_s=timeout_s)
    meta = admin.metadata(topic).topics.get(topic)
    if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if meta.error is not None:
        raise MirrorError(f"cluster {cluster.name!r} topic {topic!r}: metadata error {meta.error.str()}")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001
        raise MirrorError(f"cluster {cluster.name!r} topic {topic!r}: DescribeConfigs failed: {exc}") from None
    configs = {name: entry.value for name, entry in entries.items() if entry.value is not None}
    return TopicState(cluster.name, topic, len(meta.partitions), configs)


def observe_data(cluster: ClusterConfig, topic: str, partitions: int, *,
                 start_offsets: Mapping[int, int] | None = None, timeout_s: float = 30.0,
                 admin: ClusterAdmin | None = None, client: WireClient | None = None) -> DataFacts:
    """Oldest and newest timestamps of the data to copy (``None`` when every partition is empty).

    The newest is exact (ListOffsets max-timestamp). The oldest is the first record's timestamp at each start
    offset: CreateTime timestamps need not be monotonic, so an older record further in is possible; callers that
    see one while copying should pass their own ``DataFacts``. The three ListOffsets lookups are sent together
    (``admin``: a client of ``cluster`` to reuse); the first records are read through ``client`` (a connected
    wire client of ``cluster``: one Fetch per partition, all in flight together) or, without one, a new consumer.
    """
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    now_ms = _now_ms()
    admin = admin or ClusterAdmin(cluster, timeout_s=timeout_s)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    specs = (OffsetSpec.earliest(), OffsetSpec.latest(), OffsetSpec.max_timestamp())
    try:
        answers = admin.settled_offsets([{tp: spec for tp in tps} for spec in specs])   # in flight together
        earliest, latest, newest_of = ({tp.partition: info for tp, info in answer.items()} for answer in answers)
    except Exception as exc:  # noqa: BLE001
        raise ClusterUnavailableError(cluster.name, cluster.bootstrap, f"ListOffsets on {topic!r}: {exc}") from None
    newest = [r.timestamp for r in newest_of.values() if r.offset >= 0]
    starts = {p: max(earliest[p].offset, (start_offsets or {}).get(p, 0)) for p in range(partitions)}
    starts = {p: o for p, o in starts.items() if o < latest[p].offset}
    if client is not None:
        from mirror_core.kafka.first_records import first_record_timestamps

        ends = {p: latest[p].offset for p in starts}
        oldest = [t for t in first_record_timestamps(client, topic, starts, ends=ends, timeout_s=timeout_s).values()
                  if t is not None]
    else:
        oldest = _first_timestamps(cluster, topic, starts, timeout_s=timeout_s)
    return DataFacts(now_ms=now_ms,
                     oldest_timestamp_ms=min((t for t in oldest if t >= 0), default=None),
                     newest_timestamp_ms=max((t for t in newest if t >= 0), default=None))


def _first_timestamps(cluster: ClusterConfig, topic: str, starts: Mapping[int, int], *,
                      timeout_s: float) -> list[int]:
    """The timestamp of the first record at or after each start offset (partitions holding only markers: none)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if not starts:
        return []
    consumer = Consumer(cluster.confluent(**{
        "group.id": f"shoal-preflight-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "isolation.level": "read_uncommitted", "auto.offset.reset": "earliest",
        "check.crcs": True}))   # the timestamps decide deadlines: never from a damaged batch
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        pending, found = set(starts), []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise ClusterUnavailableError(cluster.name, cluster.bootstrap, f"no first record from {topic!r} "
                                              f"partitions {sorted(pending)} within {timeout_s:.0f} s")
            msg = consumer.poll(0.2)
            if msg is None or msg.partition() not in pending:
                continue
            if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                raise MirrorError(f"cluster {cluster.name!r} {topic}-{msg.partition()}: reading the first record "
                                  f"failed: {msg.error().str()}")
            if msg.error() is None:
                found.append(msg.timestamp()[1])
            pending.discard(msg.partition())
            consumer.pause([TopicPartition(topic, msg.partition())])
        return found
    finally:
        consumer.close()


def create_target_topic(cluster: ClusterConfig, topic: str, partitions: int, config: Mapping[str, str], *,
                        timeout_s: float = 30.0) -> bool:
    """Create the target topic; ``False`` when it already exists (the caller re-checks the existing one)."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    admin = ClusterAdmin(cluster, timeout_s=timeout_s).client
    new = NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=dict(config))
    try:
        admin.create_topics([new], operation_timeout=timeout_s, request_timeout=timeout_s)[topic].result(
            timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - KafkaException wrapping KafkaError
        err = exc.args[0] if exc.args else None
        if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise MirrorError(f"cluster {cluster.name!r}: could not create topic {topic!r} with {dict(config)}: "
                          f"{exc}") from None
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def check_only(source: ClusterConfig, target: ClusterConfig, topic: str, target_topic: str, *,
               coalesce_bytes: int = 0) -> PreflightReport:
    """Preflight without creating the target topic (dry runs write nothing)."""
    src = describe_topic(source, topic)
    facts = observe_data(source, topic, src.partitions) if src is not None else None
    facts = dataclasses.replace(facts or DataFacts(now_ms=_now_ms()), coalesce_bytes=coalesce_bytes)
    return decide(src, describe_topic(target, target_topic), facts,
                  source_cluster=source.name, source_topic=topic, target_cluster=target.name,
                  target_topic=target_topic, allow_internal=False)


def preflight_topics(source: ClusterConfig, target: ClusterConfig, request: PlanRequest, *,
                     create_missing: bool = True) -> Iterator[tuple[str, PreflightReport]]:
    """Every source topic ``request`` selects, with its preflight report, in turn: a missing target created
    (:func:`run_preflight`) or, with ``create_missing`` off, only checked (:func:`check_only`). A generator: the
    caller that stops at the first refusal preflights nothing after it."""
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.model.planner import select_topics
    from mirror_core.services.plan_inputs import list_topics

    with WireClient.for_cluster(source) as client:
        selected = select_topics(request, list_topics(client))
    for topic in selected:
        target_topic = request.naming.target_for(topic)
        if create_missing:
            yield topic, run_preflight(source, target, topic, target_topic=target_topic,
                                       coalesce_bytes=request.coalesce_bytes)
        else:
            yield topic, check_only(source, target, topic, target_topic, coalesce_bytes=request.coalesce_bytes)
