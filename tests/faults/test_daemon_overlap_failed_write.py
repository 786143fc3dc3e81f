"""The daemon sends its next fetch round before writing this one (overlap). A lane whose write fails while that
round is in flight must not take the round's answer for a position it never committed: it reopens at its
checkpoint, and once the target accepts the data again the lane ends exact — nothing skipped, nothing twice.

The failure is real: the target topic's ``max.message.bytes`` is lowered under a running daemon and a record larger
than that arrives between small ones, so the lane's write is rejected (MESSAGE_TOO_LARGE) while the daemon's next
round (the small records after it) is in flight; then the limit is lifted and the daemon's retry goes through.
"""

from __future__ import annotations

import random

import pytest

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    daemon_factory,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)
from tests.integration.kafka.test_topic_config_sync_kafka import alter

TARGET_LIMIT = 20_000


@pytest.mark.timeout(240)
def test_a_lane_failing_while_the_next_round_is_in_flight_resumes_exact(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    noise = random.Random(5)
    plain = {"compression.type": "none", "linger.ms": 0, "batch.size": 4096}
    source_cluster.produce(topic, [(b"a%d" % i, noise.randbytes(100)) for i in range(200)], **plain)
    pipeline = f"ovd-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            config_sync_interval_s=3600, partition_fetch_max_bytes=16_384, fetch_max_bytes=16_384)
    daemon = daemon_factory(config, "ovd-1").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))

    alter(target_cluster, target_topic, {"max.message.bytes": str(TARGET_LIMIT)})
    source_cluster.produce(topic, [(b"b%d" % i, noise.randbytes(100)) for i in range(300)]
                           + [(b"big", noise.randbytes(TARGET_LIMIT + 4000))]
                           + [(b"c%d" % i, noise.randbytes(100)) for i in range(600)], **plain)
    wait_for(lambda: "MESSAGE_SIZE_TOO_LARGE" in daemon.log_text(), 60, "the rejected write", daemons=(daemon,))
    alter(target_cluster, target_topic, delete=("max.message.bytes",))
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, timeout_s=120, daemons=(daemon,))
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()

    source = [r.content() for r in source_cluster.read_all(topic)]
    target = [r.content() for r in target_cluster.read_all(target_topic)]
    assert len(target) == len(source) == 1101
    assert target == source, "the target is not the source record for record (skipped or duplicated)"
