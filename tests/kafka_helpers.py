"""Test-side Kafka helpers: an independent reader and a plain producer, both confluent-kafka.

The reader is deliberately not Shoal's code: tests compare what Shoal wrote against what a stock consumer sees.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.topics import TopicAdmin


def count_requests(client) -> list[str]:
    """The names of the requests a :class:`~mirror_core.kafka.wire_client.WireClient` sends from now on (its
    ``send``: kafka-python's route, e.g. Metadata, ListOffsets, OffsetForLeaderEpoch)."""
    sent: list[str] = []
    real = client.send

    def send(node_id, request, *args, **kwargs):
        sent.append(type(request).__name__)
        return real(node_id, request, *args, **kwargs)

    client.send = send
    return sent


@dataclass(frozen=True)
class Record:
    """A record as a consumer sees it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    def content(self) -> tuple:
        """Everything a consumer would notice except the offset."""
        return (self.key, self.value, self.headers, self.timestamp)


class KafkaTestCluster:
    """One sandbox cluster as tests use it."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.name = config.name
        self.admin = TopicAdmin(config)

    @property
    def bootstrap(self) -> str:
        return self.config.bootstrap

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        """Create ``name`` (a test's own, unique name). An answer TOPIC_ALREADY_EXISTS can only come from this very
        create having reached the broker twice (a resend after a lost answer; seen once in CI under load), so it is
        success, not a failure of the test."""
        self.admin.create(name, partitions, config, exist_ok=True)
        return name

    def recreate_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 30.0) -> str:
        """Delete ``name`` and create it again (a new topic id, empty), waiting while the deletion is applied."""
        self.admin.delete(name)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.create_topic(name, partitions)
            except Exception:  # noqa: BLE001 - the deletion is still being applied
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def produce(self, topic: str, records: Iterable[tuple], *, partition: int | None = None,
                **conf: object) -> int:
        """Produce ``(key, value[, headers[, timestamp_ms]])`` tuples; returns how many were acknowledged."""
        from confluent_kafka import Producer

        acked, errors = [0], []

        def on_delivery(err, _msg):
            if err is None:
                acked[0] += 1
            else:
                errors.append(err.str())

        producer = Producer(self.config.confluent(**{"enable.idempotence": True, **conf}))
        for rec in records:
            key, value, headers, ts = (tuple(rec) + (None, None))[:4]
            kwargs = {"key": key, "value": value, "on_delivery": on_delivery}
            if headers:
                kwargs["headers"] = list(headers)
            if ts is not None:
                kwargs["timestamp"] = ts
            if partition is not None:
                kwargs["partition"] = partition
            producer.produce(topic, **kwargs)
            producer.poll(0)
        left = producer.flush(30)
        assert not errors and left == 0, f"produce to {self.name}/{topic} failed: {errors[:3]} ({left} unflushed)"
        return acked[0]

    def read_all(self, topic: str, *, isolation: str = "read_committed", timeout_s: float = 30.0) -> list[Record]:
        """Every record of every partition up to the current end, in offset order per partition."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self.config.confluent(**{
            "group.id": f"shoal-test-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": isolation}))
        try:
            md = consumer.list_topics(topic, timeout=10)
            partitions = sorted(md.topics[topic].partitions)
            ends = {}
            for p in partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                ends[p] = hi
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            out: list[Record] = []
            positions = {p: 0 for p in partitions}
            deadline = time.monotonic() + timeout_s
            while any(positions[p] < ends[p] for p in partitions):
                if time.monotonic() > deadline:
                    raise AssertionError(f"reading {self.name}/{topic} timed out at {positions} of {ends}")
                msg = consumer.poll(0.5)
                if msg is None:
                    # with read_committed, markers and aborted records never surface: use the position
                    for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
                        if tp.offset >= 0:
                            positions[tp.partition] = max(positions[tp.partition], tp.offset)
                    continue
                if msg.error():
                    raise AssertionError(f"reading {self.name}/{topic}: {msg.error()}")
                positions[msg.partition()] = msg.offset() + 1
                out.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                  tuple(msg.headers() or ()), msg.timestamp()[1]))
            return sorted(out, key=lambda r: (r.partition, r.offset))
        finally:
            consumer.close()


class PrivateKafkaCluster(KafkaTestCluster):
    """A :class:`KafkaTestCluster` of a private broker (:func:`private_broker`), which a test may stop and start
    again (``broker``: its :class:`~mirror_core.dev.sandbox.broker.SandboxBroker`; same ports and data on restart)."""

    def __init__(self, config: ClusterConfig, broker):
        super().__init__(config)
        self.broker = broker


def private_broker(name: str, tmp_path_factory, *, extra_properties: str = ""):
    """A private single-node Kafka 4 broker with the sandbox's settings plus ``extra_properties`` (lines of
    ``server.properties``), on free ports, for a test module that needs a broker configured unlike the shared ones;
    yields its :class:`PrivateKafkaCluster` and stops it afterwards (use from a module-scoped fixture)."""
    import contextlib
    import os

    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.dev.sandbox.broker import SandboxBroker
    from mirror_core.dev.sandbox.spec import DEFAULT_KAFKA_VERSION, ClusterSpec
    from tests.integration.daemon.test_daemon import free_port

    class _Broker(SandboxBroker):
        def _render_properties(self, tls_meta, users=None):
            return super()._render_properties(tls_meta, users) + extra_properties

    @contextlib.contextmanager
    def running():
        spec = ClusterSpec(name, DEFAULT_KAFKA_VERSION, free_port(), free_port())
        broker = _Broker(spec, tmp_path_factory.mktemp(name), sandbox_from_environ(os.environ).cache_dir)
        broker.start(timeout=120)
        try:
            yield PrivateKafkaCluster(ClusterConfig(name, {"bootstrap.servers": spec.bootstrap}), broker)
        finally:
            broker.stop()

    return running()
