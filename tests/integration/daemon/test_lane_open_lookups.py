"""Lane opening at scale asks the brokers once per batch, not once per lane (issue #18, start-up): a daemon opening
2,000 lanes looked up 2,000 transaction coordinators and asked 2,000 OffsetsForLeaderEpoch, one request each. The
batched look-ups must answer exactly what the lone ones answer, and a lane that uses a batched answer still falls
back to asking the cluster itself when that answer is missing or stale."""

from __future__ import annotations

import pytest

from mirror_core.kafka.epochs import epoch_end_offset, epoch_ends_many
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from tests.kafka_helpers import count_requests


@pytest.mark.timeout(60)
def test_coordinators_found_together_are_the_ones_found_alone_and_a_hinted_writer_asks_none(target_cluster,
                                                                                             unique_name):
    ids = [unique_name(f"lane-{n}") for n in range(30)]
    with WireClient.for_cluster(target_cluster.config) as main, WireClient.for_cluster(target_cluster.config) as worker:
        sent = count_requests(main)
        together = main.find_coordinators(ids)
        assert sent == ["FindCoordinatorRequest"], "one request for all 30 keys"
        assert set(together) == set(ids)
        assert {key: entry.node_id for key, entry in together.items()} == {key: main.find_coordinator(key)
                                                                           for key in ids}
        worker_sent = count_requests(worker)
        worker.hint_coordinator(ids[0], together[ids[0]])
        writer = BatchWriter(worker, transactional_id=ids[0])
        writer.init_producer_id()
        assert writer.producer_id >= 0
        assert "FindCoordinatorRequest" not in worker_sent and "InitProducerIdRequest" in worker_sent
        # the hint is taken once: a look-up after (a writer that met NOT_COORDINATOR, say) asks the cluster
        assert worker.find_coordinator(ids[0]) == together[ids[0]].node_id
        assert worker_sent.count("FindCoordinatorRequest") == 1


@pytest.mark.timeout(60)
def test_epoch_ends_asked_together_are_the_ones_asked_alone(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 3)
    for p in range(3):
        source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(5 + p)], partition=p)
    asks = [(topic, p, 0) for p in range(3)] + [(topic, 1, 3), (topic, 9, 0), (f"{topic}.gone", 0, 0)]
    with WireClient.for_cluster(source_cluster.config) as client:
        sent = count_requests(client)
        together = epoch_ends_many(client, asks)
        assert sent.count("OffsetForLeaderEpochRequest") == 1, "one request for the partitions of one leader"
        assert together == {(t, p, e): epoch_end_offset(client, t, p, e) for t, p, e in asks[:3]}, \
            "a partition asked twice, one that does not exist and an unknown topic are left out (their lanes " \
            "ask alone); the others are answered as alone"
        assert [together[(topic, p, 0)].end_offset for p in range(3)] == [5, 6, 7]
        assert epoch_ends_many(client, [(topic, 1, 3)]) == {(topic, 1, 3): epoch_end_offset(client, topic, 1, 3)}
