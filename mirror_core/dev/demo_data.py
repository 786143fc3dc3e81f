"""Realistic demo data for the local embedded default: order events with keys, headers and compression.

Used by ``shoal demo`` (the README's main job) and by tests and benchmarks that need believable traffic.
Deterministic for a given seed, so a run can be compared record by record.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import MirrorError

DEMO_TOPIC = "demo.orders"


@dataclass(frozen=True)
class ProducedSummary:
    topic: str
    records: int
    end_offsets: dict[int, int]  # partition -> high watermark after producing


def demo_record(i: int, rng: random.Random) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    customer = f"customer-{rng.randrange(500):04d}"
    order = {
        "order_id": f"o-{i:08d}",
        "customer": customer,
        "items": [{"sku": f"sku-{rng.randrange(2000):05d}", "qty": rng.randint(1, 5)}
                  for _ in range(rng.randint(1, 4))],
        "total_cents": rng.randint(199, 99999),
        "currency": rng.choice(["EUR", "USD", "GBP"]),
    }
    headers = [("source-system", b"shop-web"), ("trace-id", f"{rng.getrandbits(64):016x}".encode())]
    return customer.encode(), json.dumps(order, separators=(",", ":")).encode(), headers


def produce_demo_data(cluster: ClusterConfig, topic: str, records: int, *, seed: int = 7,
                      compression: str = "zstd", progress=None) -> ProducedSummary:
    """Produce ``records`` order events keyed by customer; returns the partitions' end offsets."""
    from confluent_kafka import Producer

    rng = random.Random(seed)
    failures: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(f"{msg.topic()}-{msg.partition()}: {err.str()}")

    producer = Producer(cluster.confluent(**{"enable.idempotence": True, "compression.type": compression,
                                             "linger.ms": 20, "batch.size": 65536}))
    for i in range(records):
        key, value, headers = demo_record(i, rng)
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        if progress is not None and i % 1000 == 0:
            progress(i)
    remaining = producer.flush(60)
    if failures or remaining:
        raise MirrorError(f"cluster {cluster.name!r}: {len(failures) + remaining} demo record(s) not delivered to "
                          f"{topic}: {'; '.join(failures[:3])}")
    if progress is not None:
        progress(records)
    return ProducedSummary(topic, records, end_offsets(cluster, topic))


def end_offsets(cluster: ClusterConfig, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(cluster.confluent(**{"group.id": "shoal-inspect", "enable.auto.commit": False}))
    try:
        md = consumer.list_topics(topic, timeout=10)
        partitions = sorted(md.topics[topic].partitions)
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def produce_demo_transactions(cluster: ClusterConfig, topic: str, *, transactions: int = 6) -> None:
    """Order corrections written transactionally: every other transaction is aborted (its records must never be
    copied), so the demo exercises markers and aborted data as real traffic does."""
    from confluent_kafka import Producer

    producer = Producer(cluster.confluent(**{"transactional.id": f"shoal-demo-{topic}"}))
    producer.init_transactions(30)
    for n in range(transactions):
        producer.begin_transaction()
        for i in range(25):
            producer.produce(topic, key=f"customer-{i:04d}".encode(),
                             value=json.dumps({"correction": n, "line": i, "aborted": n % 2 == 1}).encode())
        producer.flush(30)
        if n % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
