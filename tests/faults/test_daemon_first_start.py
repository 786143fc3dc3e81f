"""Hole: a daemon fixed a new partition's start ("latest": the last stable offset at first sight) in memory only and
wrote the lane's first checkpoint with its first commit, which needs data. Stopped before that (killed while the
partition was still idle, or between a first write and its commit), the next start chose "latest" anew, so what
the source received in between was never copied — silently, in exactly-once mode too. Now the daemon stores the
start as the lane's first checkpoint (a transaction of its own) before it copies anything, and every later holder
resumes there."""

from __future__ import annotations

import time

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    QUICK_GROUP,
    checkpoints,
    contents,
    daemon_factory,
    include_prefix,
    quick_group_source,
    wait_caught_up,
    wait_for,
    write_pipeline,
)


def test_a_daemon_stopped_before_its_first_copy_resumes_where_it_started_not_at_a_new_latest(
        sandbox, quick_group_source, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    source_cluster = quick_group_source
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"old", b"before-%d" % i) for i in range(10)])  # "latest": not copied
    pipeline = f"first-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), new_partitions="latest",
                            **QUICK_GROUP)  # killed and restarted
    first = daemon_factory(config, "first").start()
    wait_for(lambda: "event=lane_opened" in first.log_text(), 60, "the lane opened", daemons=(first,))
    time.sleep(1.0)  # a round or two with nothing to copy
    first.kill()
    source_cluster.produce(topic, [(b"k", b"after-%d" % i) for i in range(25)])  # while no daemon runs

    second = daemon_factory(config, "second").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(second,))
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == 35
    values = [c[1] for _p, c in contents(target_cluster, target_topic)]
    assert values == [b"after-%d" % i for i in range(25)], \
        f"target holds {len(values)} records; the 25 produced after the pipeline adopted the partition were expected"
