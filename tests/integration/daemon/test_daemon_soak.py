"""Long soak of the continuous mirror daemon (opt-in: ``-m soak``; excluded from the default run).

Two daemon processes share one pipeline under a steady producer load (plain lz4 batches plus committed and aborted
source transactions) for ``SHOAL_SOAK_SECONDS`` (default 600). Every ``SHOAL_SOAK_CHAOS_S`` seconds (default 30)
one daemon, chosen at random, is SIGKILLed or SIGTERMed and started again; every third round a new topic matching
the regex is created and joins the load. At the end the producers stop, the daemons catch up, and every topic's
target equals its source exactly (independent read_committed reader on both sides).

    SHOAL_KEEP_SANDBOX=1 .venv/bin/python -m pytest tests/integration/daemon/test_daemon_soak.py -m soak -q -s
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    QUICK_GROUP,
    LoadProducer,
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    no_hanging_transaction,
    quick_group_source,
    wait_caught_up,
    write_pipeline,
)

pytestmark = pytest.mark.soak

SOAK_SECONDS = float(os.environ.get("SHOAL_SOAK_SECONDS", "600"))
CHAOS_EVERY_S = float(os.environ.get("SHOAL_SOAK_CHAOS_S", "30"))


def test_daemon_soak_two_workers_with_chaos(sandbox, target_cluster, unique_name, tmp_path,
                                            daemon_factory, quick_group_source):  # noqa: F811
    source_cluster = quick_group_source
    prefix = unique_name()
    topics = {f"{prefix}.t0": 4}
    source_cluster.create_topic(f"{prefix}.t0", partitions=4)
    pipeline = f"soak-{prefix.rsplit('.', 1)[-1]}"
    daemons = []
    for name in ("soak-a", "soak-b"):
        port = free_port()
        config = write_pipeline(tmp_path / f"{name}.yaml", sandbox, pipeline, include_prefix(prefix),
                                metrics_port=port, commit_interval_ms=500, **QUICK_GROUP)  # chaos: kills
        daemons.append(daemon_factory(config, name, port).start())
    load = LoadProducer(source_cluster, list(topics), rate=1500, txn_every_s=2.0, seed=99)
    load.start()
    rng = random.Random(20261123)
    started = time.monotonic()
    rounds, kills, terms = 0, 0, 0
    try:
        while time.monotonic() - started < SOAK_SECONDS:
            time.sleep(CHAOS_EVERY_S)
            rounds += 1
            for d in daemons:
                assert d.alive, f"daemon {d.worker_id} died:\n{d.tail()}"
            victim = rng.choice(daemons)
            if rng.random() < 0.7:
                victim.kill()
                kills += 1
            else:
                rc, seconds = victim.terminate(timeout=60)
                assert rc == 0, victim.tail()
                terms += 1
            time.sleep(rng.uniform(0.5, 5.0))
            victim.start()
            if rounds % 3 == 0:
                topic = f"{prefix}.t{len(topics)}"
                source_cluster.create_topic(topic, partitions=2)
                topics[topic] = 2
                load.add_topic(topic)
    finally:
        produced = load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, topics, timeout_s=300, daemons=tuple(daemons))
    total = 0
    for topic, partitions in topics.items():
        total += assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}")
        assert no_hanging_transaction(target_cluster, f"dr.{topic}", partitions)
    for d in daemons:
        status, _ = d.get("/healthz")
        assert status == 200
        rc, _ = d.terminate(timeout=60)
        assert rc == 0
    print(f"soak: {SOAK_SECONDS:.0f}s, {produced} records produced, {total} committed records mirrored exactly "
          f"across {len(topics)} topics; {kills} SIGKILLs, {terms} SIGTERMs")
