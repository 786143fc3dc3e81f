"""Record-by-record comparison of two topics as consumers see them (read_committed), for verification.

Independent of the copy path: it reads with confluent-kafka, not with Shoal's raw fetcher, and compares key, value,
headers, timestamp and order per partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import MirrorError


@dataclass(frozen=True)
class Comparison:
    records: int
    equal: bool
    first_difference: str | None = None


def read_committed(cluster: ClusterConfig, topic: str, *, timeout_s: float = 60.0) -> dict[int, list[tuple]]:
    """partition -> [(key, value, headers, timestamp)] up to the partition's end, read_committed."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(cluster.confluent(**{"group.id": f"shoal-verify-{uuid.uuid4().hex[:8]}",
                                             "enable.auto.commit": False, "isolation.level": "read_committed",
                                             "check.crcs": True}))   # a damaged batch is an error, not a diff
    try:
        md = consumer.list_topics(topic, timeout=10)
        if md.topics[topic].error is not None:
            raise MirrorError(f"cluster {cluster.name!r}: cannot read {topic!r}: {md.topics[topic].error}")
        partitions = sorted(md.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out: dict[int, list[tuple]] = {p: [] for p in partitions}
        done = {p for p in partitions if ends[p] == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(partitions):
            if time.monotonic() > deadline:
                raise MirrorError(f"cluster {cluster.name!r}: reading {topic!r} did not reach the end in {timeout_s}s")
            msg = consumer.poll(0.5)
            if msg is None:
                for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
                    if tp.offset >= ends[tp.partition]:
                        done.add(tp.partition)
                continue
            if msg.error():
                raise MirrorError(f"cluster {cluster.name!r}: reading {topic!r}: {msg.error()}")
            out[msg.partition()].append((msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1]))
            if msg.offset() + 1 >= ends[msg.partition()]:
                done.add(msg.partition())
        return out
    finally:
        consumer.close()


def compare_topics(source: ClusterConfig, source_topic: str, target: ClusterConfig, target_topic: str) -> Comparison:
    src, tgt = read_committed(source, source_topic), read_committed(target, target_topic)
    total = sum(len(v) for v in src.values())
    for p in sorted(set(src) | set(tgt)):
        a, b = src.get(p, []), tgt.get(p, [])
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return Comparison(total, False, f"partition {p}, record {i}: source {x!r:.80} != target {y!r:.80}")
        if len(a) != len(b):
            return Comparison(total, False, f"partition {p}: {len(a)} source records, {len(b)} target records")
    return Comparison(total, True)


def read_range(cluster: ClusterConfig, topic: str, partition: int, start: int, end: int, *,
               timeout_s: float = 30.0) -> list[tuple[int, tuple]]:
    """Committed records of one partition with offsets in ``[start, end)``: ``[(offset, (key, value, headers,
    timestamp))]`` (markers and aborted records are absent, as for any read_committed consumer). For small ranges;
    large ones stream through :func:`iter_range` / :func:`compare_ranges`."""
    return list(iter_range(cluster, topic, partition, start, end, idle_timeout_s=timeout_s))


def iter_range(cluster: ClusterConfig, topic: str, partition: int, start: int, end: int, *,
               idle_timeout_s: float = 30.0) -> Iterator[tuple[int, tuple]]:
    """Stream the committed records of ``[start, end)`` in offset order. Fails only when the read makes no progress
    for ``idle_timeout_s`` (the clock restarts with every record), so a long range is never cut short."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    if end <= start:
        return
    consumer = Consumer(cluster.confluent(**{"group.id": f"shoal-verify-{uuid.uuid4().hex[:8]}",
                                             "enable.auto.commit": False, "isolation.level": "read_committed",
                                             "check.crcs": True}))   # a damaged batch is an error, not a diff
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + idle_timeout_s
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                position = consumer.position([TopicPartition(topic, partition)])[0].offset
                if position >= end:
                    return
                if time.monotonic() > deadline:
                    raise MirrorError(f"cluster {cluster.name!r}: reading {topic}-{partition} [{start}, {end}) "
                                      f"made no progress for {idle_timeout_s:.0f}s at offset {position}")
                continue
            if msg.error():
                raise MirrorError(f"cluster {cluster.name!r}: reading {topic}-{partition}: {msg.error()}")
            if msg.offset() >= end:
                return
            deadline = time.monotonic() + idle_timeout_s
            yield msg.offset(), (msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1])
    finally:
        consumer.close()


def compare_ranges(source: ClusterConfig, source_tp: tuple[str, int, int, int], target: ClusterConfig,
                   target_tp: tuple[str, int, int, int], *, idle_timeout_s: float = 30.0) -> Comparison:
    """Compare ``(topic, partition, start, end)`` on both sides record by record while streaming both: memory stays
    at one record per side however large the range."""
    src = iter_range(source, *source_tp, idle_timeout_s=idle_timeout_s)
    tgt = iter_range(target, *target_tp, idle_timeout_s=idle_timeout_s)
    count = 0
    for i, (a, b) in enumerate(zip_longest(src, tgt)):
        if a is None or b is None:
            rest = sum(1 for _ in (tgt if a is None else src)) + 1
            side = "target" if a is None else "source"
            return Comparison(count, False, f"the {side} has {rest} more record(s) after record {i}")
        if a[1] != b[1]:
            return Comparison(count, False, f"record {i}: source offset {a[0]} {a[1]!r:.80} != target offset "
                                            f"{b[0]} {b[1]!r:.80}")
        count += 1
    return Comparison(count, True)
