"""Review of i18-outage: docs/daemon-membership.md "When the source is unreachable" says "Each daemon's consumer
keeps its assignment meanwhile (librdkafka retries the coordinator; nothing is revoked or lost on the client side)"
and "Held lanes stay held". That was measured with the KIP-848 protocol only (the private Kafka 4 source picks
``consumer`` under ``group_protocol: auto``). A source older than Kafka 4 gets the classic protocol, where
librdkafka's own session timer (SESSTMOUT: "Consumer group session timed out ... without a successful response from
the group coordinator ... revoking assignment and rejoining group") loses the assignment after
``session.timeout.ms`` with no coordinator: every lane is dropped during the outage and re-opened after it.

Same scenario as tests/faults/test_daemon_source_outage.py, one daemon, ``group_protocol: classic`` (classic's
broker minimum session timeout is 6 s), the source broker (private) down for about three session timeouts.
Asserts the behaviour docs/daemon-membership.md now documents for the classic protocol: the lost assignment is
reported as a session timeout while the coordinator was unreachable (not "the group gave them to others": the
coordinator is down, nobody was given anything), the lanes are taken again once the source returns, and the target
is exact.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.test_daemon_source_outage import outage_source  # noqa: F401 - module fixture (private broker)
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

pytestmark = [pytest.mark.timeout(200), pytest.mark.faults]

CLASSIC_SESSION_MS = 6000   # group.min.session.timeout.ms default
OUTAGE_S = 20.0
PARTITIONS = 2


def test_classic_group_retakes_its_lanes_after_a_source_outage(sandbox, outage_source, target_cluster,  # noqa: F811
                                                              unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic = f"{prefix}.t"
    outage_source.create_topic(topic, partitions=PARTITIONS)
    pipeline = f"clsout-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "a.yaml", sandbox, pipeline, include_prefix(prefix),
                            source=dict(outage_source.config.settings), group_protocol="classic",
                            group_session_timeout_ms=CLASSIC_SESSION_MS, metrics_port=port)
    daemon = daemon_factory(config, "clsout-a", port).start()
    load = LoadProducer(outage_source, [topic], rate=200, seed=17)
    load.start()
    wait_for(lambda: daemon.log_text().count("event=lane_acquired") >= PARTITIONS, 60, "both lanes held",
             daemons=(daemon,))
    wait_for(lambda: "event=copied" in daemon.log_text(), 30, "copying", daemons=(daemon,))
    load.stop()

    before = len(daemon.log_text())
    broker = outage_source.broker
    try:
        assert broker.stop(timeout=20)
        time.sleep(OUTAGE_S)
        during = daemon.log_text()[before:]
    finally:
        broker.start(timeout=90)
    wait_for(lambda: "event=source_reachable" in daemon.log_text()[before:], 60, "the source back",
             daemons=(daemon,))
    load = LoadProducer(outage_source, [topic], rate=200, seed=18)
    load.start()
    time.sleep(2)
    load.stop()
    wait_caught_up(outage_source, target_cluster, pipeline, {topic: PARTITIONS}, daemons=(daemon,))
    assert_exact(outage_source, target_cluster, topic, f"dr.{topic}")   # the data side holds either way
    lost = [line for line in during.splitlines() if "event=group_assignment_lost" in line]
    assert lost, "classic protocol: librdkafka's session timer should drop the assignment during the outage"
    wrong = [line for line in lost if "gave them to others" in line or "coordinator on the source was unreachable"
             not in line]
    assert not wrong, ("the coordinator was down, nobody was given the partitions; the lost assignment must say the "
                       "session timed out while it was unreachable:\n" + "\n".join(wrong[:4]))
    after = daemon.log_text()[before:]
    last_drop = max(after.rfind("event=lane_dropped"), after.rfind("event=group_assignment_lost"))
    assert after[last_drop:].count("event=lane_acquired") >= PARTITIONS, "the lanes were not taken again"
