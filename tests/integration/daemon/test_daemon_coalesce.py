"""The daemon with ``coalesce_bytes`` (the pipeline file's opt-in deep case): a backlog of one-record batches plus
live load with source transactions, a SIGKILL in the middle, a restart: the target holds every committed record once,
in order, in far fewer batches than the source."""

from __future__ import annotations

import time

import pytest

from tests.copy_helpers import raw_batches
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory and quick_group_source are fixtures
    QUICK_GROUP,
    LoadProducer,
    assert_exact,
    daemon_factory,
    include_prefix,
    quick_group_source,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

BACKLOG = 1500   # one-record batches per partition before the daemon starts


@pytest.mark.timeout(240)
def test_daemon_coalescing_a_one_record_backlog_survives_a_kill_and_stays_exact(
        sandbox, quick_group_source, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    source_cluster = quick_group_source
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=2)
    for p in range(2):
        source_cluster.produce(topic, [(b"k%d" % i, b"backlog-%d-%d" % (p, i), [("p", b"%d" % p)])
                                       for i in range(BACKLOG)], partition=p,
                               **{"batch.num.messages": 1, "linger.ms": 0})
    pipeline = f"coal-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), coalesce_bytes=16384,
                            commit_bytes=64 * 1024, **QUICK_GROUP)
    daemon = daemon_factory(config, "coal-1")
    load = LoadProducer(source_cluster, [topic], rate=400, seed=5)
    load.start()
    daemon.start()
    wait_for(lambda: "event=copied" in daemon.log_text(), 60, "copying", daemons=(daemon,))
    time.sleep(0.5)
    daemon.kill()                          # mid-backlog or mid-load: the restart resumes from the checkpoints
    daemon.start()
    time.sleep(2)
    load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 2}, daemons=(daemon,))
    copied = assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}")
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()
    source_batches = sum(len(raw_batches(source_cluster, topic, p)) for p in range(2))
    target_batches = sum(len(raw_batches(target_cluster, f"dr.{topic}", p)) for p in range(2))
    assert copied >= 2 * BACKLOG
    assert target_batches < source_batches / 4, f"{target_batches} target batches for {source_batches} source ones"
