"""What one exactly-once lane commit costs on the target, counted on the wire (real brokers): one
AddPartitionsToTxn for the lane's data and checkpoint partitions together, and the transaction coordinator looked
up once per writer, not before every coordinator request. Each saved request is a target round trip saved per lane
per round, which is what a daemon round with many lanes waits on."""

from __future__ import annotations

from collections import Counter

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier
from mirror_core.kafka.wire_client import WireClient
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore


@pytest.mark.timeout(60)
def test_a_lane_commit_adds_its_partitions_in_one_request_and_finds_the_coordinator_once(
        source_cluster, target_cluster, unique_name):
    topic = unique_name("rt")
    target_topic = f"dr.{topic}"
    source_cluster.create_topic(topic)
    for n in range(3):  # three source batches: one per round below (batches are copied whole)
        source_cluster.produce(topic, [(b"k%d-%d" % (n, i), b"v" * 100) for i in range(100)])
    run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic).raise_if_refused()
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=f"rt-{topic.rsplit('.', 1)[-1]}",
                                    owner="copy", policy=CommitPolicy(1 << 20, 60_000))
        session = copier.open_lane(topic, 0, target_topic, 0)
        sent: Counter = Counter()
        added: list[set] = []  # the partitions each AddPartitionsToTxn request named
        real_send = target.send

        def counting_send(node, request, **kwargs):  # a spy: every request still goes to the broker
            kind = type(request).__name__.replace("Request", "")
            sent[kind] += 1
            if kind == "AddPartitionsToTxn":
                added.append({(t.name, p) for t in request.v3_and_below_topics for p in t.partitions})
            return real_send(node, request, **kwargs)

        target.send = counting_send
        for start, end in ((0, 100), (100, 200), (200, 300)):  # three rounds of one lane, one commit each
            result = session.copy(start, end)
            assert (result.source_end, result.commits) == (end, 1)
    # data and checkpoint partition in one request per commit (a request the coordinator answers
    # CONCURRENT_TRANSACTIONS, the previous commit's markers still being written, is sent again: the same pair)
    assert len(added) >= 3 and all(len(tps) == 2 and (target_topic, 0) in tps for tps in added), added
    assert sent["EndTxn"] == 3, sent
    assert sent["FindCoordinator"] == 0, sent  # found when the lane was opened, kept since
    assert [r.content() for r in target_cluster.read_all(target_topic)] == \
        [r.content() for r in source_cluster.read_all(topic)]
