"""The source cluster down for longer than the daemon group's session timeout, under live load.

The daemons' consumer group lives on the SOURCE cluster (mirror_core/daemon/membership.py), so a source outage takes
away both what they copy and their group coordinator. The source here is a private single-node broker of this module
(the shared sandbox brokers are never stopped), with the sandbox's lowered KIP-848 minimums; the pipeline lowers its
group's session timeout. Two daemon processes share a live topic; the broker is stopped for several session
timeouts, then started again. What a user must see:

- meanwhile, the daemons say so: an event naming the source cluster as unreachable, the lanes retrying with that
  reason in ``/readyz``, and ``/readyz`` failing (503) while the source stays unreachable — not silence;
- afterwards, without a restart of any daemon: every partition held by exactly one of the two processes again (the
  group as the coordinator sees it, and the daemons' own lane states agree), copying resumes;
- the target is exact (an independent READ_COMMITTED reader: no gap, no duplicate, no aborted data).
"""

from __future__ import annotations

import json
import time

import pytest

from mirror_core.errors import MirrorError
from mirror_core.kafka.daemon_group import describe_group
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    LoadProducer,
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)
from tests.kafka_helpers import private_broker

pytestmark = [pytest.mark.timeout(240), pytest.mark.faults]

SESSION_MS = 3000
OUTAGE_S = 10.0          # three session timeouts and more
PARTITIONS = 4


@pytest.fixture(scope="module")
def outage_source(session_sandbox, tmp_path_factory):
    """A private Kafka 4 source broker (lowered KIP-848 minimums, as the sandbox sets them) this module may stop."""
    session_sandbox.ensure("target")
    with private_broker("outage-source", tmp_path_factory) as cluster:
        yield cluster


def readiness(daemon) -> tuple[int, dict] | None:
    try:
        status, body = daemon.get("/readyz")
    except OSError:
        return None
    return status, json.loads(body)


def held_by_group(source, pipeline: str, topic: str, workers: set[str]) -> dict[int, str] | None:
    """Partition → worker when the group (as its coordinator says) has exactly ``workers`` as members and gives
    every partition to exactly one of them."""
    try:
        group = describe_group(source.config, pipeline, timeout_s=5)
    except MirrorError:
        return None
    if {m.worker for m in group.members} != workers:
        return None
    holders = group.holders()
    assigned = {p: holders.get((topic, p), []) for p in range(PARTITIONS)}
    if any(len(w) != 1 for w in assigned.values()):
        return None
    return {p: w[0] for p, w in assigned.items()}


def lanes_owned(daemon) -> int | None:
    """How many lanes the daemon says it holds (``shoal_lanes_owned``)."""
    try:
        return int(daemon.metrics()[("shoal_lanes_owned", ())])
    except (OSError, AssertionError, KeyError):
        return None


def held_once_and_agreed(source, pipeline: str, topic: str, daemons) -> dict[int, str] | None:
    """The group gives every partition to exactly one of ``daemons``, each gets some, and each daemon holds as many
    lanes as the group gave it."""
    holders = held_by_group(source, pipeline, topic, {d.worker_id for d in daemons})
    if holders is None or set(holders.values()) != {d.worker_id for d in daemons}:
        return None
    for d in daemons:
        if lanes_owned(d) != sum(1 for w in holders.values() if w == d.worker_id):
            return None
    return holders


def test_source_down_longer_than_the_session_timeout(sandbox, outage_source, target_cluster, unique_name, tmp_path,
                                                     daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic = f"{prefix}.t"
    outage_source.create_topic(topic, partitions=PARTITIONS)
    pipeline = f"srcout-{prefix.rsplit('.', 1)[-1]}"
    daemons = []
    for name in ("a", "b"):
        port = free_port()
        config = write_pipeline(tmp_path / f"{name}.yaml", sandbox, pipeline, include_prefix(prefix),
                                source=dict(outage_source.config.settings), membership="group",
                                group_session_timeout_ms=SESSION_MS, metrics_port=port)
        daemons.append(daemon_factory(config, f"srcout-{name}", port).start())
    load = LoadProducer(outage_source, [topic], rate=400, seed=91)
    load.start()
    wait_for(lambda: held_once_and_agreed(outage_source, pipeline, topic, daemons), 60, "both daemons holding lanes",
             daemons=tuple(daemons))
    wait_for(lambda: all("event=copied" in d.log_text() for d in daemons), 30, "both copying",
             daemons=tuple(daemons))
    load.stop()   # a producer of the source would only fail through the outage

    broker = outage_source.broker
    log_before = {d.worker_id: len(d.log_text()) for d in daemons}
    source_not_ready = {d.worker_id: None for d in daemons}   # a /readyz 503 body naming the source
    down_at = time.monotonic()
    try:
        assert broker.stop(timeout=20)
        while time.monotonic() - down_at < OUTAGE_S:
            for d in daemons:
                assert d.alive, f"{d.worker_id} exited during the source outage:\n{d.tail()}"
                got = readiness(d)
                if got is not None and got[0] == 503 and "source" in got[1]:
                    source_not_ready[d.worker_id] = got[1]["source"]
            time.sleep(1.0)
    finally:
        broker.start(timeout=90)
    back_at = time.monotonic()

    load = LoadProducer(outage_source, [topic], rate=400, seed=92)
    load.start()
    for d in daemons:
        wait_for(lambda d=d: "event=source_reachable" in d.log_text()[log_before[d.worker_id]:]
                 and readiness(d) is not None and readiness(d)[0] == 200, 60,
                 f"{d.worker_id} saying the source is back, and ready again", daemons=(d,))
    after = wait_for(lambda: held_once_and_agreed(outage_source, pipeline, topic, daemons), 60,
                     "every partition held by exactly one daemon again", daemons=tuple(daemons))
    rejoined_s = time.monotonic() - back_at
    for d in daemons:
        said = d.log_text()[log_before[d.worker_id]:]
        # the event comes from the daemon loop, which waits on the dead cluster's metadata look-ups (about 10 s
        # each); /readyz is served on its own thread and says it sooner
        assert "event=source_unreachable cluster=" in said and \
            said.index("event=source_unreachable") < said.index("event=source_reachable"), \
            f"{d.worker_id} never said the source was unreachable:\n{d.tail()}"
        assert source_not_ready[d.worker_id] is not None and "unreachable" in source_not_ready[d.worker_id], \
            f"{d.worker_id}'s /readyz never failed naming the source"
        # the group's consumer repeats its connection errors many times a second: logged once per code per 30 s
        assert said.count("event=membership_error") <= 8, \
            f"{d.worker_id} logged {said.count('event=membership_error')} membership errors"
    time.sleep(2)
    load.stop()
    wait_caught_up(outage_source, target_cluster, pipeline, {topic: PARTITIONS}, daemons=tuple(daemons))
    assert all(d.alive for d in daemons), "no daemon needed a restart"
    assert_exact(outage_source, target_cluster, topic, f"dr.{topic}")
    print(f"held after the outage: {after}; source back and every daemon ready {rejoined_s:.1f}s after the broker")
