"""Review finding: the landing rule read the gap between the checkpoint and the new landing READ_COMMITTED, so
another producer's transaction left open on the mirrored target partition blocked the lane (and, in the daemon,
every lane) until that transaction timed out. Now the target's last stable offset is looked up first and an open
foreign transaction in the gap halts the lane at once, naming it."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

from tests.copy_helpers import shoal


def test_a_foreign_transaction_open_on_the_target_partition_halts_at_once(source_cluster, target_cluster,
                                                                         unique_name):
    topic = unique_name()
    pipeline = f"p.{topic}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(30)])
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(30, 60)])
    args = ("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic", f"dr.{topic}",
            "--pipeline", pipeline)
    assert shoal(*args, "--to", "30").returncode == 0
    foreign = Producer(target_cluster.config.confluent(**{
        "transactional.id": f"foreign-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": 90000}))
    foreign.init_transactions(30)
    foreign.begin_transaction()
    foreign.produce(f"dr.{topic}", key=b"intruder", value=b"open", partition=0)
    foreign.flush(30)
    try:
        started = time.monotonic()
        resumed = shoal(*args, timeout=120)
        took = time.monotonic() - started
        message = " ".join(resumed.stderr.split())
        assert resumed.returncode != 0, resumed.stdout
        assert "another producer's transaction is open at offset" in message and f"dr.{topic}-0" in message
        assert took < 30, f"the lane waited {took:.0f}s on the foreign transaction"
    finally:
        foreign.abort_transaction(30)
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == [b"v%d" % i for i in range(30)]
