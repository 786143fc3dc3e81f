"""Hole: one deleted source topic blinded the daemon's retention watch to every lane. An assessment asks the source
about every topic with a lane behind, and a topic the source no longer has raised ConfigError for the whole
assessment (``event=retention_failed``, the gauges frozen at their last values) — until the daemon had confirmed the
deletion and halted or retired that topic's lanes, and for good if it never could (a lane left behind at a
position the watch still held). Deleting a topic must not hide the retention risk of the others: the missing topic
is left out and named (``event=retention_skipped``), the rest are assessed.

Real source (the sandbox's): one topic with 10 minutes of retention and uncopied data, one created and deleted."""

from __future__ import annotations

import logging
import time

import pytest

from mirror_core.config.cluster import ClusterConfig
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.daemon.retention_watch import RetentionWatch
from mirror_core.model.retention import Status

RETENTION_MS = 600_000  # 10 minutes: far below the watch's default at-risk threshold (1 h)


@pytest.mark.timeout(120)
def test_a_deleted_topic_does_not_blind_the_watch_to_the_others(source_cluster, unique_name, caplog):
    kept, deleted = unique_name(), unique_name()
    source_cluster.create_topic(kept, partitions=1, config={"retention.ms": str(RETENTION_MS)})
    source_cluster.produce(kept, [(b"k", b"v%d" % i) for i in range(40)], partition=0)
    source_cluster.create_topic(deleted, partitions=1)
    source_cluster.produce(deleted, [(b"k", b"x")], partition=0)
    source_cluster.admin.delete(deleted)
    deadline = time.monotonic() + 30  # gone from the broker's metadata (it follows the controller a moment later)
    while deleted in source_cluster.admin.list_topics():
        assert time.monotonic() < deadline, f"{deleted} still listed 30 s after its deletion"
        time.sleep(0.2)
    target = ClusterConfig("target", dict(source_cluster.config.settings))  # answers: only its round trip is used
    watch = RetentionWatch(source_cluster.config, target, DaemonMetrics(), interval_s=60, fetch_bytes=1 << 20)
    watch.positions.behind((kept, 0), 10)     # 30 records not copied
    watch.positions.behind((deleted, 0), 0)   # its lane not yet halted by the daemon

    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        statuses = watch.assess_once()

    assert [(s.topic, s.partition) for s in statuses] == [(kept, 0)]
    assert statuses[0].status is not Status.SAFE, statuses[0]
    assert watch.metrics.registry.get_sample_value(
        "shoal_retention_status", {"topic": kept, "partition": "0", "status": statuses[0].status.value}) == 1.0
    assert f"event=retention_skipped topic={deleted} partition=all reason=not_on_source" in caplog.text
