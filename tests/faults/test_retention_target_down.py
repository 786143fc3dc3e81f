"""Hole: the daemon's retention watch went blind exactly when the target went down. Its assessment paces the copy
estimate by the slower of the source's and the target's round trips (``copy_round_trip``), and measuring the target
raised when the target did not answer: every assessment failed (``event=retention_failed``), so no lane — not the
ones whose commits now fail, not the ones that cannot open — got a verdict, while the source's retention went on
deleting what the lanes had not copied. A target that does not answer is the main reason lanes stop copying: the
watch must still assess from the source alone (the verdict is about the source's retention) and say how it paced.

Real source (the sandbox's), a target that is down (a port nobody listens on), the daemon's RetentionWatch."""

from __future__ import annotations

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.model.retention import Status
from tests.integration.daemon.test_daemon import free_port

RETENTION_MS = 600_000  # 10 minutes: far below the watch's default at-risk threshold (1 h)


@pytest.mark.timeout(120)
def test_retention_is_assessed_while_the_target_is_down(source_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic, partitions=1, config={"retention.ms": str(RETENTION_MS)})
    source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(40)], partition=0)
    target_down = ClusterConfig("target-down", {"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    watch = RetentionWatch(source_cluster.config, target_down, DaemonMetrics(), interval_s=60, fetch_bytes=1 << 20)
    watch.positions.behind((topic, 0), 10)  # a lane whose commits fail now: 30 records not copied

    statuses = watch.assess_once()

    assert [(s.topic, s.partition) for s in statuses] == [(topic, 0)]
    assert statuses[0].status is not Status.SAFE, \
        f"{RETENTION_MS // 1000} s of retention on uncopied data was called safe: {statuses[0]}"
    shown = {status.value for status in Status
             if watch.metrics.registry.get_sample_value(
                 "shoal_retention_status", {"topic": topic, "partition": "0", "status": status.value}) == 1.0}
    assert shown == {statuses[0].status.value}, "the verdict is not in the metrics the operator watches"
