"""The target cluster down for minutes under load: bounded memory, nothing lost, the daemon resumes by itself,
and SIGTERM during the outage still ends the process promptly.

Two pipelines mirror the same source topic into two target topics while the target broker is stopped for
``SHOAL_OUTAGE_S`` seconds (default 150: longer than the writer's own 120 s of retries, so the daemon goes through
its reopen-with-backoff path too). Meanwhile the source keeps receiving far more data than one fetch round may hold.
Pipeline B rides the outage out: its resident memory stays flat, and once the broker is back it catches up without
help. Pipeline A gets SIGTERM in the middle of the outage: it cannot commit, so it stops within its grace period;
restarted after the outage it resumes from its last checkpoint. Both targets end up exactly the source.

It stops the shared target broker, so it runs alone like the other broker-restart test.
"""

from __future__ import annotations

import os
import time

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    LoadProducer,
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    no_hanging_transaction,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

OUTAGE_S = float(os.environ.get("SHOAL_OUTAGE_S", "150"))
GRACE_S = 5
FETCH_BOUND = 1 << 20  # fetch_max_bytes of both pipelines: what one round may hold


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_target_down_for_minutes(sandbox, session_sandbox, source_cluster, target_cluster, unique_name, tmp_path,
                                 daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=2)
    daemons = {}
    for name in ("a", "b"):
        port = free_port()
        config = write_pipeline(
            tmp_path / f"{name}.yaml", sandbox, f"outage-{name}-{prefix.rsplit('.', 1)[-1]}", include_prefix(prefix),
            naming=f"prefix:dr{name}.", metrics_port=port, fetch_max_bytes=FETCH_BOUND,
            partition_fetch_max_bytes=FETCH_BOUND // 2, commit_bytes=FETCH_BOUND, shutdown_grace_s=GRACE_S)
        daemons[name] = daemon_factory(config, f"outage-{name}", port).start()
    a, b = daemons["a"], daemons["b"]
    pipelines = {name: f"outage-{name}-{prefix.rsplit('.', 1)[-1]}" for name in daemons}
    # ~1.6 MB/s of incompressible values: the outage leaves far more on the source than one round may hold
    load = LoadProducer(source_cluster, [topic], rate=2000, seed=77, value_bytes=(600, 1000), txn_every_s=2.0)
    load.start()
    for d in (a, b):
        wait_for(lambda d=d: "event=copied" in d.log_text(), 30, f"{d.worker_id} copying", daemons=(d,))
    time.sleep(5)
    baseline = max(rss_mib(b.proc.pid) for _ in range(3) if not time.sleep(0.5))

    broker = session_sandbox.sandbox.broker("target")
    bytes_before = load.produced_bytes
    peak, sigterm = baseline, None
    down_at = time.monotonic()
    try:
        assert broker.stop(timeout=20)
        while time.monotonic() - down_at < OUTAGE_S:
            assert b.alive, f"daemon b exited during the outage:\n{b.tail()}"
            peak = max(peak, rss_mib(b.proc.pid))
            if sigterm is None and time.monotonic() - down_at > min(30.0, OUTAGE_S / 3):
                sigterm = a.terminate(timeout=GRACE_S + 25)  # (exit code, seconds)
            time.sleep(2)
    finally:
        broker.start(timeout=90)
    outage_s = time.monotonic() - down_at
    outage_mb = (load.produced_bytes - bytes_before) / 1e6

    term_rc, term_s = sigterm
    assert term_rc == 0, a.tail()
    assert term_s < GRACE_S + 10, f"SIGTERM during the outage took {term_s:.1f}s\n{a.tail()}"
    assert "event=shutdown_forced" in a.log_text(), "the round in progress cannot commit with the target down"
    # nothing buffered across the outage: memory did not follow the data piling up on the source
    assert outage_mb > 40 * FETCH_BOUND / 1e6, outage_mb
    assert peak - baseline < 40, f"daemon b grew from {baseline:.0f} to {peak:.0f} MiB during the outage"

    a = daemon_factory(a.config, "outage-a2", a.metrics_port).start()  # resumes from its last checkpoint
    time.sleep(5)
    load.stop()
    for name, d in (("a", a), ("b", b)):
        wait_caught_up(source_cluster, target_cluster, pipelines[name], {topic: 2}, timeout_s=180, daemons=(d,))
    assert b.alive, f"daemon b exited:\n{b.tail()}"
    for name in daemons:
        assert_exact(source_cluster, target_cluster, topic, f"dr{name}.{topic}")
        assert no_hanging_transaction(target_cluster, f"dr{name}.{topic}", 2)
    errors = sum(v for k, v in b.metrics().items() if k[0] == "shoal_errors_total")
    assert errors > 0  # the outage was seen (and retried), not slept through
    for d in (a, b):
        rc, _ = d.terminate()
        assert rc == 0, d.tail()
    print(f"target down {outage_s:.0f}s while {outage_mb:.0f} MB arrived on the source; daemon b RSS "
          f"{baseline:.0f} -> peak {peak:.0f} MiB; SIGTERM during the outage: exit {term_rc} after {term_s:.1f}s; "
          f"{errors:.0f} errors retried")
