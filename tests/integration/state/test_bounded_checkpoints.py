"""Bounded checkpoints against real brokers: a source partition of ~30,000 single-record transactions (a Kafka
Streams exactly-once app's shape) mirrored by the daemon through a checkpoint topic whose ``max.message.bytes`` is
16 kB. A map of that many irregular runs encodes to more than that, so a checkpoint carrying the whole map (format
3) would be refused with MESSAGE_TOO_LARGE and the lane would retry for ever; with sealed map segments the lane
copies to the end, a source group's offsets translate exactly, and the map is pruned below the source's log start
and the groups' offsets (a pruned offset is declined with a reason).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from mirror_core.kafka.group_admin import ConsumerGroupAdmin
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.group_translation import CommittedOffset, SyncStatus, plan_group_sync, translation_refusal
from mirror_core.state.checkpoint import CHECKPOINT_PARTITIONS, CheckpointStore, checkpoint_key, checkpoint_partition
from mirror_core.state.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG
from tests.integration.daemon.test_daemon import daemon_factory, include_prefix, source_ends, write_pipeline  # noqa: F401

TRANSACTIONS = 30_000
PRODUCERS = 8  # concurrent transactional producers: their records and markers interleave irregularly
LIMIT = 16 * 1024


def produce_single_record_transactions(cluster, topic: str, count: int, producers: int = PRODUCERS) -> None:
    """``count`` transactions of one record each, from ``producers`` transactional producers at once."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def work(k: int, n: int) -> None:
        try:
            p = Producer(cluster.config.confluent(**{"transactional.id": f"{topic}.gen.{k}", "linger.ms": 0}))
            p.init_transactions(30)
            for i in range(n):
                p.begin_transaction()
                p.produce(topic, key=b"k%d" % k, value=b"%d-%d" % (k, i), partition=0)
                p.commit_transaction(30)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"producer {k}: {exc}")

    threads = [threading.Thread(target=work, args=(k, count // producers + (k < count % producers)))
               for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def read_checkpoint(target_cluster, topic: str, pipeline: str, source_topic: str):
    with WireClient.for_cluster(target_cluster.config) as client:
        store = CheckpointStore(target_cluster.config, client, topic=topic)
        cp = store.read(pipeline, source_topic, 0)
        key = checkpoint_key(pipeline, source_topic, 0)
        partition = store.latest(checkpoint_partition(key))
        return cp, partition


def wait_for_checkpoint(target_cluster, topic: str, pipeline: str, source_cluster, source_topic: str, daemon,
                        predicate=lambda cp: True, timeout_s: float = 90.0):
    end = source_ends(source_cluster, source_topic, 1)[0]
    deadline = time.monotonic() + timeout_s
    while True:
        cp, _ = read_checkpoint(target_cluster, topic, pipeline, source_topic)
        if cp is not None and cp.position >= end and predicate(cp):
            return cp
        assert time.monotonic() < deadline, f"checkpoint {cp and cp.position} of {end}:\n{daemon.tail()}"
        assert daemon.alive, daemon.tail()
        time.sleep(0.5)


def wait_for_prune(target_cluster, topic: str, pipeline: str, source_cluster, source_topic: str, daemon,
                   timeout_s: float = 90.0):
    """The daemon prunes at a lane's first commit after it gathered the new floor (every ``prune_interval_s``;
    on a source with many groups that takes a while), and an idle lane does not commit: keep a trickle of source
    transactions coming until a checkpoint says the map was pruned."""
    deadline = time.monotonic() + timeout_s
    while True:
        produce_single_record_transactions(source_cluster, source_topic, 4, producers=1)
        try:
            return wait_for_checkpoint(target_cluster, topic, pipeline, source_cluster, source_topic, daemon,
                                       predicate=lambda c: c.map_pruned_below is not None, timeout_s=5)
        except AssertionError:
            if time.monotonic() > deadline or not daemon.alive:
                raise


def test_thirty_thousand_transactions_mirror_through_a_16k_checkpoint_topic(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic, checkpoints = f"{prefix}.txns", f"{prefix}.checkpoints"
    source_cluster.create_topic(topic, partitions=1)
    target_cluster.create_topic(checkpoints, CHECKPOINT_PARTITIONS,
                                {**CHECKPOINT_TOPIC_CONFIG, "max.message.bytes": str(LIMIT)})
    produce_single_record_transactions(source_cluster, topic, TRANSACTIONS)
    pipeline = f"bounded-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix),
                            checkpoint_topic=checkpoints, prune_interval_s=1)
    daemon = daemon_factory(config, "bounded-1").start()

    cp = wait_for_checkpoint(target_cluster, checkpoints, pipeline, source_cluster, topic, daemon)
    source = source_cluster.read_all(topic, timeout_s=60)
    target = target_cluster.read_all(f"dr.{topic}", timeout_s=60)
    assert len(source) == TRANSACTIONS
    assert [r.content() for r in target] == [r.content() for r in source]

    # what format 3 would have written: the whole map in the checkpoint value, over the topic's limit
    whole_value = dataclasses.replace(cp, map_segments=None).to_value()
    assert len(whole_value) > LIMIT, f"the map ({len(cp.offset_map)} runs) must outgrow {LIMIT} bytes"
    assert cp.map_segments is not None and cp.map_segments.count >= 2
    _, records = read_checkpoint(target_cluster, checkpoints, pipeline, topic)
    assert max(len(v) for v in records.values()) < LIMIT
    assert len(records[checkpoint_key(pipeline, topic, 0)]) < LIMIT // 2

    # source groups hold a record's offset and a marker's; the source log start moves past a third of the data
    held_record, held_gap = source[15_000].offset, source[20_000].offset + 1
    floor = source[10_000].offset
    commit_source_group(source_cluster, f"{prefix}.g1", topic, held_record)
    commit_source_group(source_cluster, f"{prefix}.g2", topic, held_gap)
    delete_source_records(source_cluster, topic, floor)
    cp = wait_for_prune(target_cluster, checkpoints, pipeline, source_cluster, topic, daemon)
    assert source[5_000].offset < cp.offset_map.start <= floor

    groups = ConsumerGroupAdmin(source_cluster.config)
    offsets = {g: groups.committed(g) for g in (f"{prefix}.g1", f"{prefix}.g2")}
    offsets["pruned"] = {(topic, 0): CommittedOffset(source[5_000].offset)}
    plan = plan_group_sync(offsets, {(topic, 0): cp}, {})
    by_group = {d.group: d for d in plan.decisions}
    target_by_offset = {r.offset: r for r in target_cluster.read_all(f"dr.{topic}", timeout_s=60)}
    for group, held in ((f"{prefix}.g1", held_record), (f"{prefix}.g2", held_gap)):
        decision = by_group[group]
        assert decision.status is SyncStatus.COMMIT, decision
        next_source = next(r for r in source if r.offset >= held)
        assert target_by_offset[decision.target_offset].content() == next_source.content()
    pruned = by_group["pruned"]
    assert pruned.status is SyncStatus.NOT_TRANSLATABLE and "pruned" in pruned.reason
    assert "pruned" in translation_refusal(cp, source[5_000].offset)

    # pruned segments are tombstoned: none below the map's start is live in the checkpoint topic
    _, records = read_checkpoint(target_cluster, checkpoints, pipeline, topic)
    starts = [json.loads(k)["map_segment"][3] for k in records if k.startswith(b'{"map_segment"')]
    assert starts and min(starts) == cp.offset_map.start
    assert "lane_error" not in daemon.log_text() and "lane_halted" not in daemon.log_text()


def commit_source_group(cluster, group: str, topic: str, offset: int) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(cluster.config.confluent())
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, offset)])]
    admin.alter_consumer_group_offsets(request)[group].result(timeout=30)


def delete_source_records(cluster, topic: str, before: int) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(cluster.config.confluent())
    admin.delete_records([TopicPartition(topic, 0, before)])[TopicPartition(topic, 0, before)].result(timeout=30)
