"""Bounded memory (DESIGN §3.8) when most fetched bytes are not copied: a source partition where large aborted
transactions sit between small committed ones. READ_COMMITTED still returns the aborted batches, so each Fetch
answer is mostly aborted data around one small committed batch. The copier re-stamps batches in the answer's buffer
instead of copying them; a small batch waiting there keeps its whole answer alive, so the copier must count the
answer, not the batch. Before the fix it counted ~100 bytes per answer and, with no flush until the kept bytes
filled the write window, held every answer of the range at once (here: peak ~5 MiB against a ~1.3 MiB budget; a
backfill's 4 MiB window over 4 MiB answers would hold ~40,000 of them).

The copy is the backfill's (CheckpointedCopier.copy's lane session, exactly-once, its own fetcher on the fast
path); the peak of Python allocations while it copies (after the lane is opened) is compared with
CopyOptions.budget_bytes, and source and target are compared with the independent READ_COMMITTED reader.
"""

from __future__ import annotations

import tracemalloc

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore

FETCH_MAX = 128 * 1024
WINDOW = 1024 * 1024
ROUNDS = 40  # each: one aborted transaction of about one answer, then one small committed record
# what the copy's own objects (clients, protocol parsing, the offset map, logging) allocate besides the data
SLACK = 512 * 1024


def _fill(source_cluster, topic: str, transactional_id: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(source_cluster.config.confluent(**{
        "transactional.id": transactional_id, "linger.ms": 5, "compression.type": "none"}))
    producer.init_transactions(30)
    for i in range(ROUNDS):
        producer.begin_transaction()
        for j in range(9):
            producer.produce(topic, key=b"aborted", value=b"A%d-%d:" % (i, j) + b"a" * 14_000, partition=0)
        producer.flush(30)
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, key=b"kept", value=b"committed-%d" % i, partition=0)
        producer.flush(30)
        producer.commit_transaction(30)


@pytest.mark.timeout(180)
def test_answers_of_mostly_aborted_data_are_not_held_behind_small_pending_batches(
        source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"mem.{topic}"
    source_cluster.create_topic(topic)
    _fill(source_cluster, topic, unique_name("txn"))
    run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic,
                  start_offsets={0: 0}).raise_if_refused()
    options = CopyOptions(fetch_max_bytes=FETCH_MAX, max_inflight_bytes=WINDOW)

    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        assert source.fast_connection(source.leader_for(topic, 0)[0]) is not None, \
            "the fast path (answers as writable frames, batches re-stamped in place) is what this test drives"
        end = list_offsets(source, topic, 0, "last_stable")
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=f"mem-{topic.rsplit('.', 1)[-1]}",
                                    mode=DeliveryMode.EXACTLY_ONCE, options=options,
                                    policy=CommitPolicy(commit_bytes=WINDOW, commit_interval_ms=60_000))
        # the lane is opened first: reading the shared checkpoint topic is not the copy's data (nor its budget)
        lane = copier.open_lane(topic, 0, target_topic, 0)
        tracemalloc.start()
        try:
            result = lane.copy(0, end)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()

    assert end > ROUNDS * 10, "the source should hold the aborted transactions and their markers"
    assert result.records == ROUNDS and result.source_end == end
    assert peak <= options.budget_bytes + SLACK, (
        f"peak Python allocation {peak / 2**20:.2f} MiB during the copy, budget "
        f"{options.budget_bytes / 2**20:.2f} MiB (+ {SLACK / 2**20:.2f} MiB slack): fetched answers pile up")
    source_records = [r.content() for r in source_cluster.read_all(topic)]
    assert [r.content() for r in target_cluster.read_all(target_topic)] == source_records
    assert len(source_records) == ROUNDS and all(value.startswith(b"committed-") for _k, value, *_ in source_records)
