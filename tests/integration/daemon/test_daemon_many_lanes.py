"""Many busy lanes at once: the daemon opens and commits its lanes side by side on its lane workers
(``commit_workers``), and the target stays exact — every committed source record once, in order, per partition,
judged by an independent reader (``KafkaTestCluster.read_all``) after the producers stopped."""

from __future__ import annotations

import pytest

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    LoadProducer,
    assert_exact,
    daemon_factory,
    include_prefix,
    no_hanging_transaction,
    wait_caught_up,
    write_pipeline,
)

PARTITIONS = 24


@pytest.mark.timeout(300)
def test_many_busy_lanes_commit_side_by_side_and_the_target_stays_exact(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic, partitions=PARTITIONS)
    load = LoadProducer(source_cluster, [topic], rate=3000, seed=14, value_bytes=(50, 300))
    load.start()
    pipeline = f"many-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), commit_workers=6,
                            commit_interval_ms=100)
    daemon = daemon_factory(config, "many-1").start()
    try:
        wait_caught_up(source_cluster, target_cluster, pipeline, {topic: PARTITIONS}, timeout_s=60,
                       daemons=(daemon,))  # copying while the load runs: every lane busy in every round
    finally:
        produced = load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: PARTITIONS}, timeout_s=90, daemons=(daemon,))
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()
    copied = assert_exact(source_cluster, target_cluster, topic, target_topic)
    assert copied >= produced > 0
    assert no_hanging_transaction(target_cluster, target_topic, PARTITIONS)
    log = daemon.log_text()
    assert log.count("event=lane_opened") == PARTITIONS, "each lane opened once: no lane failed or was reopened"
    assert "event=lane_error" not in log
    dropped = [line for line in log.splitlines() if "event=lane_dropped" in line]
    assert all(line.endswith("reason=shutdown") for line in dropped), dropped  # only when it stopped
