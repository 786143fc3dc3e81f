"""Hole: the writer retried a failing write for up to 120 s inside a transaction whose timeout was 60 s. The
coordinator aborted the transaction under it and bumped the producer epoch, the writer's next answer was
INVALID_PRODUCER_EPOCH, and the lane was dropped as "fenced: a newer writer owns these partitions" — no other
writer existed. Now retries inside a transaction end (retriable) well before its timeout, the bounds are
configuration with a validated relation, and a fencing-shaped answer is classified by re-initialising with the
writer's own producer id and epoch: a timed-out transaction is retriable, only a real fencing stops the writer.

The failures are real: a target topic whose ``min.insync.replicas`` (2) exceeds its replication factor (1), which
the broker answers with the retriable NOT_ENOUGH_REPLICAS for as long as it lasts; a transaction left open past its
timeout (the coordinator's abort, up to ``transaction.abort.timed.out.transaction.cleanup.interval.ms`` = 10 s
later); and a second writer of the same transactional.id.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin.transactions import DescribeTransactionsRequest

from mirror_core.codec.batch_prepare import prepare_for_target
from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.errors import ProducerFencedError, TransactionTimedOutError
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch
from mirror_core.state.checkpoint import CHECKPOINT_PARTITIONS
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    assert_exact,
    daemon_factory,
    include_prefix,
    wait_caught_up,
    wait_for,
    write_pipeline,
)
from tests.kafka_helpers import KafkaTestCluster

TXN_TIMEOUT_MS = 4000
COORDINATOR_ABORT_S = TXN_TIMEOUT_MS / 1000 + 10 + 1  # timeout + the broker's abort-check interval + slack


@pytest.fixture(scope="module")
def replicated_target(sandbox):
    """A replicated target cluster (a controller, brokers 2 and 3), fresh for this module and stopped at its end:
    ``min.insync.replicas`` is only enforced up to a partition's replica count, so a single-node target never
    answers NOT_ENOUGH_REPLICAS."""
    cluster = sandbox.replicated("replicated-target")
    cluster.wipe()
    cluster.start()
    try:  # Shoal would create its checkpoint topic with one replica, unavailable while either broker is down
        admin = AdminClient(cluster.client_config())
        admin.create_topics([NewTopic(CHECKPOINT_TOPIC, CHECKPOINT_PARTITIONS, 2, config={
            "cleanup.policy": "compact", "min.insync.replicas": "1"})])[CHECKPOINT_TOPIC].result(30)
        yield cluster
    finally:
        cluster.stop()


def test_a_write_retried_past_the_transaction_timeout_ends_true_and_exact(
        sandbox, source_cluster, replicated_target, unique_name, tmp_path, daemon_factory):  # noqa: F811
    target_cluster = KafkaTestCluster(ClusterConfig("target", replicated_target.client_config()))
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    admin = AdminClient(replicated_target.client_config())  # on both brokers: every acks=all write needs both
    admin.create_topics([NewTopic(target_topic, 1, 2, config={"min.insync.replicas": "2"})])[target_topic].result(30)
    leader = wait_for(lambda: getattr(admin.list_topics(target_topic, timeout=10).topics[target_topic].partitions
                                      .get(0), "leader", -1) in (2, 3) and
                      admin.list_topics(target_topic, timeout=10).topics[target_topic].partitions[0].leader,
                      20, "a leader for the target partition")
    follower = ({2, 3} - {leader}).pop()
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    pipeline = f"ttl-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            target=replicated_target.client_config(), transaction_timeout_ms=TXN_TIMEOUT_MS,
                            write_retry_s=1.5, config_sync_interval_s=3600)
    daemon = daemon_factory(config, "ttl-1").start()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=(daemon,))

    replicated_target.broker(follower).stop()  # the ISR shrinks to one: NOT_ENOUGH_REPLICAS for as long as it is down
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(50, 80)])
    wait_for(lambda: "NotEnoughReplicas" in daemon.log_text(), 20, "the refused write", daemons=(daemon,))
    started = time.monotonic()
    # what the Shoal page and `shoal lanes status` show meanwhile: the holder writes the lane's live state into a
    # health record of its own when the lane starts retrying
    health = wait_for(lambda: _health_record(target_cluster, pipeline, f"{target_topic}-0"), 20,
                      "a health record with the lane's retrying state", daemons=(daemon,))
    assert health.state in ("retrying", "stalled") and health.attempts >= 1 and health.holder == "ttl-1", health
    # longer than a transaction may live: the coordinator would have aborted it
    time.sleep(max(0.0, COORDINATOR_ABORT_S - (time.monotonic() - started)))
    replicated_target.broker(follower).start()
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(80, 100)])

    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, timeout_s=45, daemons=(daemon,))
    assert assert_exact(source_cluster, target_cluster, topic, target_topic) == 100
    log = daemon.log_text()
    assert "reason=fenced" not in log and "was fenced" not in log, \
        "nobody else wrote the lane: a retried write must not be reported as a fencing\n" + daemon.tail()
    assert "event=lane_error" in log and "NotEnoughReplicas" in log, daemon.tail()
    assert daemon.alive
    # copying again: the record is cleared (a tombstone), so the page shows the lane copying
    wait_for(lambda: _health_record(target_cluster, pipeline, f"{target_topic}-0") is None or None, 20,
             "the health record cleared", daemons=(daemon,))


def _health_record(target_cluster, pipeline: str, lane: str):
    from mirror_core.state.checkpoint import CheckpointStore
    from mirror_core.state.lane_health_records import read_health_records

    with WireClient.for_cluster(target_cluster.config) as client:
        return read_health_records(CheckpointStore(target_cluster.config, client), pipeline).get(lane)


def _one_batch_per_record(source_cluster, source: WireClient, topic: str, records: int) -> list:
    for i in range(records):
        source_cluster.produce(topic, [(b"k", b"v%d" % i)])
    return list(RawBatchFetcher(source, topic, 0, 0, records))


def _outgoing(topic: str, view) -> OutgoingBatch:
    return OutgoingBatch(topic, 0, prepare_for_target(view).data, source_offset=view.base_offset)


# states of a transaction the coordinator has not finished aborting: in PrepareAbort (and PrepareEpochFence) its
# epoch is bumped but the abort markers may not be on the data partitions yet, and until a partition has its marker
# it still takes the old epoch's writes
NOT_YET_ABORTED = ("Ongoing", "PrepareAbort", "PrepareEpochFence")


def _wait_aborted_by_coordinator(client: WireClient, transactional_id: str) -> None:
    """Until the coordinator (asked with DescribeTransactions, not through the writer) has aborted the transaction
    on its timeout, markers written (CompleteAbort)."""
    coordinator = client.find_coordinator(transactional_id)
    deadline = time.monotonic() + COORDINATOR_ABORT_S + 5
    while client.send(coordinator, DescribeTransactionsRequest(transactional_ids=[transactional_id])) \
            .transaction_states[0].transaction_state in NOT_YET_ABORTED:
        assert time.monotonic() < deadline, "the coordinator never aborted the timed-out transaction"
        time.sleep(0.5)


@pytest.fixture(params=["target", pytest.param("legacy", marks=pytest.mark.crossversion)])
def txn_target(request, target_cluster):
    """The Kafka 4 target, and Kafka 3.9 (whose coordinator refuses the writer's own re-init after a timeout)."""
    return target_cluster if request.param == "target" else request.getfixturevalue("legacy_cluster")


def test_a_timed_out_transaction_is_retriable_and_a_real_fencing_is_not(source_cluster, txn_target, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    txn_target.create_topic(topic)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(txn_target.config) as target:
        views = _one_batch_per_record(source_cluster, source, topic, 4)
        timed_out = BatchWriter(target, transactional_id=f"shoal.test.{uuid.uuid4().hex[:8]}",
                                transaction_timeout_ms=2000, retry_timeout_s=3)
        timed_out.begin_transaction()
        timed_out.write([_outgoing(topic, views[0])])
        _wait_aborted_by_coordinator(target, timed_out.transactional_id)
        with pytest.raises(TransactionTimedOutError) as info:
            timed_out.write([_outgoing(topic, views[1])])
        assert info.value.retriable and "fenced" not in str(info.value) and "2000 ms" in str(info.value)

        fenced = BatchWriter(target, transactional_id=f"shoal.test.{uuid.uuid4().hex[:8]}",
                             transaction_timeout_ms=60_000)
        fenced.begin_transaction()
        fenced.write([_outgoing(topic, views[2])])
        BatchWriter(target, transactional_id=fenced.transactional_id).init_producer_id()  # a newer writer
        with pytest.raises(ProducerFencedError):
            fenced.write([_outgoing(topic, views[3])])
    assert txn_target.read_all(topic) == [], "both transactions were aborted, nothing committed"
