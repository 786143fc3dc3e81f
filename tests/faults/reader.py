"""An independent READ_COMMITTED reader (confluent-kafka's consumer, not Shoal's fetch path) for fault tests."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, TopicPartition


def committed_records(config: dict, topic: str, partition: int = 0, *, start: int | None = None,
                      timeout_s: float = 30.0) -> list[tuple[int, bytes | None, bytes | None, tuple, int]]:
    """Every committed record of ``topic-partition`` up to the current end, as
    ``(offset, key, value, headers, timestamp)``, read by librdkafka with isolation.level=read_committed."""
    import time

    consumer = Consumer({**config, "group.id": f"shoal-fault-reader-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        first = low if start is None else max(start, low)
        consumer.assign([TopicPartition(topic, partition, first)])
        out = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    break
                raise RuntimeError(f"reader {topic}-{partition}: {msg.error()}")
            out.append((msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1]))
        else:
            raise TimeoutError(f"reader {topic}-{partition}: no end of partition within {timeout_s}s")
        return out
    finally:
        consumer.close()


def payloads(records) -> list[tuple]:
    """What a consumer compares across clusters: key, value, headers, timestamp (offsets differ by design)."""
    return [r[1:] for r in records]
