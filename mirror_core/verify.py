"""Record-by-record comparison of two topics as consumers see them (read_committed), for verification.

Independent of the copy path: it reads with confluent-kafka, not with Shoal's raw fetcher, and compares key, value,
headers, timestamp and order per partition.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from mirror_core.cluster import ClusterConfig
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
                                             "enable.auto.commit": False, "isolation.level": "read_committed"}))
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
    timestamp))]`` (markers and aborted records are absent, as for any read_committed consumer)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    if end <= start:
        return []
    consumer = Consumer(cluster.confluent(**{"group.id": f"shoal-verify-{uuid.uuid4().hex[:8]}",
                                             "enable.auto.commit": False, "isolation.level": "read_committed"}))
    out: list[tuple[int, tuple]] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                position = consumer.position([TopicPartition(topic, partition)])[0].offset
                if position >= end:
                    return out
                if time.monotonic() > deadline:
                    raise MirrorError(f"cluster {cluster.name!r}: reading {topic}-{partition} [{start}, {end}) "
                                      f"stalled at {position}")
                continue
            if msg.error():
                raise MirrorError(f"cluster {cluster.name!r}: reading {topic}-{partition}: {msg.error()}")
            if msg.offset() >= end:
                return out
            out.append((msg.offset(), (msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1])))
    finally:
        consumer.close()
