"""Hole: the daemon's retention watch assessed only lanes whose position the copy loop had reported, and a lane
reports one only once it has opened. A held lane whose open keeps failing — here the target's transaction
coordinator never answers, so every exactly-once open ends in a retriable error — was left out of every assessment:
no ``shoal_retention_*`` series, no ``event=retention_at_risk``, while the source's retention deleted what the lane
had not copied. The promise is the opposite: Shoal tells you *before* retention deletes what you have not copied,
and a lane that cannot copy is exactly the one at risk. Now a failed lane is placed at the best position known: its
checkpoint as the daemon last read it (no request: the target may be what fails), else — it starts at the earliest
— the log start.

The target is a private single-node KRaft broker configured so its transaction coordinator never answers
(``transaction.state.log.replication.factor`` above its broker count); the source is the sandbox's, with a topic
whose retention (10 minutes) is far below the daemon's at-risk threshold.
"""

from __future__ import annotations

import time

import pytest
import yaml

from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore, checkpoint_partition
from tests.integration.daemon.test_daemon import daemon_factory, free_port, wait_for  # noqa: F401 - daemon_factory: fixture

RETENTION_MS = 600_000



def _put_checkpoint(cluster, cp: Checkpoint) -> None:
    """The lane's checkpoint as a handoff leaves it (owner daemon), written plainly (no coordinator needed)."""
    from confluent_kafka import Producer

    with WireClient.for_cluster(cluster.config) as client:
        store = CheckpointStore(cluster.config, client)
        store.ensure_topic()
    errors: list[str] = []
    producer = Producer(cluster.config.confluent(**{"enable.idempotence": True, "linger.ms": 0}))
    producer.produce(store.topic, key=cp.key, value=cp.to_value(), partition=checkpoint_partition(cp.key),
                     on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not errors, errors


@pytest.mark.timeout(180)
def test_a_lane_that_cannot_open_is_still_watched_for_retention(source_cluster, no_coordinator_target, unique_name,
                                                                  tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=2, config={"retention.ms": str(RETENTION_MS)})
    source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(40)], partition=0)
    source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(40)], partition=1)
    pipeline = f"unopened-{prefix.rsplit('.', 1)[-1]}"
    # partition 1 was handed off at offset 25 (its checkpoint exists); partition 0 has none and starts at the earliest
    _put_checkpoint(no_coordinator_target, Checkpoint(
        pipeline=pipeline, topic=topic, partition=1, position=25, target_topic=f"dr.{topic}", target_partition=1,
        target_next=25, owner="daemon", owner_epoch=1, updated_ms=int(time.time() * 1000)))
    port = free_port()
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": pipeline, "source": dict(source_cluster.config.settings),
        "target": dict(no_coordinator_target.config.settings), "include": f"{prefix}\\..+", "naming": "prefix:dr.",
        "mode": "exactly-once", "commit_interval_ms": 200, "poll_interval_ms": 50, "rescan_interval_s": 1,
        "write_retry_s": 2, "retention_interval_s": 2, "metrics_port": port}))  # at risk below 1 h (default)
    daemon = daemon_factory(config, "unopened", port).start()

    wait_for(lambda: all(f"event=lane_error topic={topic} partition={p} " in daemon.log_text() for p in (0, 1)), 90,
             "both lanes' opens failing", daemons=(daemon,))
    assert "event=lane_opened" not in daemon.log_text(), "the target's coordinator was expected never to answer"

    def at_risk():
        m = daemon.metrics()
        statuses = {p: status for (name, labels), v in m.items() if name == "shoal_retention_status" and v == 1
                    for p, status, t in [(dict(labels)["partition"], dict(labels)["status"], dict(labels)["topic"])]
                    if t == topic}
        return statuses if set(statuses) == {"0", "1"} else None

    statuses = wait_for(at_risk, 60, "a retention verdict for both lanes that cannot open", daemons=(daemon,))
    assert all(s != "SAFE" for s in statuses.values()), \
        f"{RETENTION_MS // 1000} s of retention on uncopied data was called safe: {statuses}"
    log = daemon.log_text()
    # partition 1 assessed at its checkpoint (offset 25), partition 0 from the log start (it has no checkpoint)
    assert f"topic={topic} partition=1 position=25 " in log, daemon.tail()
    assert f"topic={topic} partition=0 position=log_start " in log, daemon.tail()
    rc, _seconds = daemon.terminate()
    assert rc == 0, daemon.tail()
