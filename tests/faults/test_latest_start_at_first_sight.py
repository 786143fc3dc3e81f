"""Hole: ``new_partitions: latest`` starts a partition without checkpoint at its last stable offset "at first sight"
(LaneState.start), but the daemon fixed that start only when the lane first *opened* — which can be long after it
first saw the partition: the target down, the group slow to assign, a fence refused, or, as here, a lease-based
daemon of the previous release still holding the lane. Everything the partition received in between was skipped,
recorded nowhere. Now the start is fixed when the lane is discovered.

The delay is real: a lease record of an older (lease-based) daemon on the lane, live for a few seconds, which a
group daemon honours (lease_compat) before it opens the lane."""

from __future__ import annotations

import time

from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.leases import Lease, LeaseStore
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    contents,
    daemon_factory,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

LEASE_S = 12  # how long the older daemon's lease keeps the new daemon off the lane


def test_latest_starts_where_the_partition_was_first_seen_not_where_its_lane_first_opened(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"old", b"before-%d" % i) for i in range(10)])  # "latest": not copied
    pipeline = f"latest-{prefix.rsplit('.', 1)[-1]}"
    with WireClient.for_cluster(target_cluster.config) as client:
        store = CheckpointStore(target_cluster.config, client)
        store.ensure_topic()
        LeaseStore(store, target_cluster.config.confluent()).write(
            Lease(pipeline, f"{target_topic}-0", "older-daemon", int(time.time() * 1000) + LEASE_S * 1000))
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), new_partitions="latest")
    daemon = daemon_factory(config, "latest").start()
    wait_for(lambda: f"event=lane_discovered topic={topic} partition=0" in daemon.log_text(), 60,
             "the partition discovered", daemons=(daemon,))
    assert "event=lane_opened" not in daemon.log_text(), "the older daemon's lease was expected to hold the lane"
    source_cluster.produce(topic, [(b"k", b"while-held-%d" % i) for i in range(25)])  # after first sight
    wait_for(lambda: "event=lane_opened" in daemon.log_text(), LEASE_S + 60, "the lane opened once the lease ended",
             daemons=(daemon,))
    source_cluster.produce(topic, [(b"k", b"after-%d" % i) for i in range(5)])
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))
    values = [c[1] for _p, c in contents(target_cluster, target_topic)]
    assert values == [b"while-held-%d" % i for i in range(25)] + [b"after-%d" % i for i in range(5)], (
        f"target holds {len(values)} records: what the partition received after the daemon first saw it, before "
        "its lane could open, was expected too")
    rc, _seconds = daemon.terminate()
    assert rc == 0, daemon.tail()
