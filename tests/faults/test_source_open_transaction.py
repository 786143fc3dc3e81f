"""A transaction left open on the source, under a daemon lane that has caught up to it.

A READ_COMMITTED reader cannot pass the source's last stable offset (LSO): the first offset of the oldest open
transaction. A producer that began a transaction and hangs or went away (KIP-664's "hanging transactions", or a
transaction.max.timeout.ms raised for a batch job) holds every record written after it behind the LSO. The daemon
measures its lag to the LSO, so before this test its lane sat ``copying`` with lag 0 and ``/readyz`` answered 200
while the source's high watermark grew: a silent stall.

What a user must see: once the LSO has stayed at the same offset below the high watermark for longer than the
pipeline's ``open_transaction_alert_s``, the lane turns ``stalled`` with reason ``source_transaction_open`` and a
message naming the source cluster, topic, partition and the offset the transaction holds (in the command that aborts
it), ``/readyz`` answers 503, and the log has an event saying so. Once the transaction is decided (committed here),
the lane copies everything behind it, the target is exact, and the lane is ready again without a restart. Both ways
a lane comes to the held offset: caught up before the transaction began (an answer with nothing new notes the hold),
and started after it, the copy itself reaching the offset (under fetch sessions the broker never names the partition
again while nothing changes, so the hold must be noted on that copy's answer: a committer review found it was not).
The alarm must come from the daemon's own due time, well before its 30 s walk of every lane.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.faults.test_daemon_source_outage import readiness
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    assert_exact,
    daemon_factory,
    free_port,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.faults]

ALERT_S = 3


@pytest.mark.parametrize("daemon_first", [True, False], ids=["caught-up-before", "started-behind"])
def test_a_lane_held_up_by_an_open_source_transaction_turns_stalled_naming_the_offset(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory, daemon_first):  # noqa: F811
    from confluent_kafka import Producer

    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k", b"before-%d" % i) for i in range(10)])
    pipeline = f"opentxn-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port,
                            open_transaction_alert_s=ALERT_S)
    daemon = daemon_factory(config, "opentxn", port)
    if daemon_first:
        daemon.start()
        wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))

    # a transaction begun at offset 10 and left open (the broker would abort it only after its timeout: 5 min)
    txn = Producer(source_cluster.config.confluent(**{"transactional.id": f"hanging-{uuid.uuid4().hex[:8]}",
                                                      "transaction.timeout.ms": 300_000}))
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, key=b"t", value=b"in-the-open-transaction")
    assert txn.flush(30) == 0
    held_at = 10
    source_cluster.produce(topic, [(b"k", b"behind-%d" % i) for i in range(20)])   # behind the open transaction
    held_since = time.monotonic()
    if not daemon_first:
        daemon.start()

    seen = []

    def stalled_lane():
        got = readiness(daemon)
        seen[:] = [got]
        if got is None or got[0] != 503:
            return None
        lanes = [lane for lane in got[1]["lanes"] if lane["state"] == "stalled"]
        return lanes[0] if lanes else None

    try:
        lane = wait_for(stalled_lane, ALERT_S + 15, "the lane turning stalled behind the open transaction",
                        daemons=(daemon,))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast /readyz: {seen}") from None
    waited = time.monotonic() - held_since
    assert waited >= ALERT_S - 1, f"stalled after {waited:.1f} s, before open_transaction_alert_s ({ALERT_S} s)"
    assert lane["reason"] == "source_transaction_open", lane
    assert lane["position"] == held_at, lane
    for part in ("cluster 'source'", f"last stable offset at {held_at}",
                 f"kafka-transactions.sh --bootstrap-server <source> abort --topic {topic} --partition 0 "
                 f"--start-offset {held_at}"):
        assert part in lane["message"], f"{part!r} not in the lane's message: {lane['message']}"
    said = daemon.log_text()
    assert "event=source_transaction_open" in said and f"offset={held_at}" in said, daemon.tail()

    txn.commit_transaction(30)
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))
    wait_for(lambda: (readiness(daemon) or (0,))[0] == 200, 30, "the lane ready again", daemons=(daemon,))
    assert "event=source_transaction_decided" in daemon.log_text(), daemon.tail()
    assert assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}") == 31
    assert daemon.alive, "no restart was needed"
