"""A failed daemon lane was reset without aborting its open transaction. Until the lane was reopened (its
InitProducerId fences it) or the broker's transaction timeout (60 s) struck, that transaction held back the last
stable offset of every partition it had written: READ_COMMITTED readers of the mirrored topic, and of the lane's
``__shoal_checkpoints`` partition when the failure came after the checkpoint write, saw nothing past it. A daemon
stopped after such a failure left it hanging for the whole timeout. Now a failed lane aborts its transaction at
once (best effort, bounded).

The failure is real: the target topic's ``max.message.bytes`` is lowered under a running daemon, and one source
transaction brings small batches (accepted, inside the lane's transaction) and then a batch the target rejects
(MESSAGE_TOO_LARGE); the daemon is stopped right after it logged the lane error.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    daemon_factory,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)
from tests.integration.kafka.test_topic_config_sync_kafka import alter

TARGET_LIMIT = 20_000


def _stable_and_end(target_cluster, topic: str) -> tuple[int, int]:
    with WireClient.for_cluster(target_cluster.config) as client:
        return list_offsets(client, topic, 0, "last_stable"), list_offsets(client, topic, 0, "latest")


def _small_batches_then_one_too_large(source_cluster, topic: str) -> None:
    """One committed source transaction: small records (sent as their own batch first), then one record larger
    than the target accepts; the daemon fetches them together, so they share one lane transaction."""
    producer = Producer(source_cluster.config.confluent(**{
        "transactional.id": f"test-{topic}", "batch.size": 16384, "linger.ms": 0}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(topic, key=b"s%d" % i, value=b"small-%d" % i)
    producer.flush(30)
    producer.produce(topic, key=b"big", value=bytes(3 * TARGET_LIMIT))
    producer.commit_transaction(30)


def test_a_failed_lane_does_not_leave_its_transaction_open(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    pipeline = f"abort-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            config_sync_interval_s=3600)  # the lowered limit must stay
    daemon = daemon_factory(config, "abort-1").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))

    alter(target_cluster, target_topic, {"max.message.bytes": str(TARGET_LIMIT)})
    before = _stable_and_end(target_cluster, target_topic)
    _small_batches_then_one_too_large(source_cluster, topic)
    wait_for(lambda: "event=lane_error" in daemon.log_text(), 30, "the lane error", daemons=(daemon,))
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()
    assert "BatchRejectedError" in daemon.log_text() and "MESSAGE_SIZE_TOO_LARGE" in daemon.log_text(), daemon.tail()

    stable, end = _stable_and_end(target_cluster, target_topic)
    assert end > before[1], "the small batches were written inside the lane's transaction before the rejection"
    deadline = time.monotonic() + 5
    while stable < end and time.monotonic() < deadline:
        time.sleep(0.1)
        stable, end = _stable_and_end(target_cluster, target_topic)
    assert stable == end, (f"{target_topic}-0: last stable offset {stable} held below the high watermark {end} "
                           "by the failed lane's open transaction")
    values = [r.value for r in target_cluster.read_all(target_topic)]
    assert values == [b"v%d" % i for i in range(50)], "the aborted records stay invisible"
