"""Overlap (fetch the next range while the previous one is written) must not weaken exactly-once: a write that fails
while the next fetch is outstanding leaves the target an exact prefix of the source, the checkpoint at or below
the failed batch, and a rerun ends exact — nothing skipped, nothing twice.

The failure is real: the target topic's ``max.message.bytes`` is lowered, and one record in the middle of the
partition is larger than that, so its write is rejected (MESSAGE_TOO_LARGE) while the copier's prefetch of the
batches after it is in flight (fetches of several write windows, a commit per window: many fetches and commits
happen before it, some inside the answer that holds the big record).
Checked against a deliberately broken variant (the checkpoint taken at the fetcher's position including a fetch
answered but not yet written): that variant commits past the big record, and the rerun misses it.
"""

from __future__ import annotations

import logging
import random

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import BatchRejectedError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore
from tests.integration.kafka.test_topic_config_sync_kafka import alter

TARGET_LIMIT = 20_000


def _copy(source_cluster, target_cluster, topic: str, target_topic: str, pipeline: str):
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        end = list_offsets(source, topic, 0, "last_stable")
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(
            source, target, store, pipeline=pipeline, mode=DeliveryMode.EXACTLY_ONCE,
            options=CopyOptions(fetch_max_bytes=65_536, max_inflight_bytes=16_384),
            policy=CommitPolicy(commit_bytes=16_384, commit_interval_ms=60_000))
        return copier.copy(PartitionRange(topic, 0, 0, end, target_topic, 0))


@pytest.mark.timeout(120)
def test_a_write_failing_while_the_next_fetch_is_outstanding_skips_and_duplicates_nothing(
        source_cluster, target_cluster, unique_name, caplog):
    topic = unique_name()
    target_topic = f"ov.{topic}"
    source_cluster.create_topic(topic)
    noise = random.Random(7)
    plain = {"compression.type": "none", "linger.ms": 0, "batch.size": 4096}
    source_cluster.produce(topic, [(b"a%d" % i, b"%d:" % i + noise.randbytes(150)) for i in range(1500)], **plain)
    source_cluster.produce(topic, [(b"big", noise.randbytes(TARGET_LIMIT + 4000))], **plain)
    source_cluster.produce(topic, [(b"b%d" % i, b"%d:" % i + noise.randbytes(150)) for i in range(1500)], **plain)
    run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic,
                  start_offsets={0: 0}).raise_if_refused()
    alter(target_cluster, target_topic, {"max.message.bytes": str(TARGET_LIMIT)})
    source = [r.content() for r in source_cluster.read_all(topic)]
    big_at = next(i for i, r in enumerate(source) if r[0] == b"big")

    pipeline = f"ov-{topic.rsplit('.', 1)[-1]}"
    with caplog.at_level(logging.INFO, logger="mirror_core.kafka.fetcher"), pytest.raises(BatchRejectedError) as failed:
        _copy(source_cluster, target_cluster, topic, target_topic, pipeline)
    assert "MESSAGE_SIZE_TOO_LARGE" in str(failed.value) or "MessageSizeTooLarge" in str(failed.value)
    assert "dropping the fetch outstanding at offset" in caplog.text, \
        "the failed write did not happen while the next fetch was outstanding: the test drives nothing"

    partial = [r.content() for r in target_cluster.read_all(target_topic)]
    assert 0 < len(partial) <= big_at, f"committed {len(partial)} records; the big one is record {big_at}"
    assert partial == source[:len(partial)], "the committed target is not an exact prefix of the source"

    alter(target_cluster, target_topic, delete=("max.message.bytes",))
    result = _copy(source_cluster, target_cluster, topic, target_topic, pipeline)
    assert result.source_start >= len(partial)  # resumed at the checkpoint, not from the start
    copied = [r.content() for r in target_cluster.read_all(target_topic)]
    assert copied == source, (f"after the rerun the target has {len(copied)} records, the source {len(source)} "
                              "(skipped or duplicated)")


@pytest.mark.timeout(180)
def test_one_partition_failing_while_the_next_round_is_in_flight_leaves_every_partition_exact(
        source_cluster, target_cluster, unique_name, caplog):
    """Concurrent copy of 4 partitions: partition 2's big record is rejected while the next multi-partition fetch
    round is in flight; every partition's target is an exact prefix of its source, and a rerun ends exact."""
    from mirror_core.engine.concurrent_copy import ConcurrentCopy, lane_share_writer

    topic = unique_name()
    target_topic = f"ovc.{topic}"
    source_cluster.create_topic(topic, partitions=4)
    noise = random.Random(11)
    plain = {"compression.type": "none", "linger.ms": 0, "batch.size": 4096}
    for p in range(4):
        source_cluster.produce(topic, [(b"a%d" % i, noise.randbytes(150)) for i in range(600)], partition=p, **plain)
    source_cluster.produce(topic, [(b"big", noise.randbytes(TARGET_LIMIT + 4000))], partition=2, **plain)
    for p in range(4):
        source_cluster.produce(topic, [(b"b%d" % i, noise.randbytes(150)) for i in range(600)], partition=p, **plain)
    run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic,
                  start_offsets=dict.fromkeys(range(4), 0)).raise_if_refused()
    alter(target_cluster, target_topic, {"max.message.bytes": str(TARGET_LIMIT)})
    source = _partitions(source_cluster.read_all(topic))
    pipeline = f"ovc-{topic.rsplit('.', 1)[-1]}"

    def copy_all():
        with WireClient.for_cluster(source_cluster.config) as src, \
                WireClient.for_cluster(target_cluster.config) as tgt:
            store = CheckpointStore(target_cluster.config, tgt)
            store.ensure_topic()
            options = CopyOptions(fetch_max_bytes=32_768, max_inflight_bytes=16_384)
            copier = CheckpointedCopier(src, tgt, store, pipeline=pipeline, mode=DeliveryMode.EXACTLY_ONCE,
                                        options=options, policy=CommitPolicy(commit_bytes=16_384))
            ranges = [PartitionRange(topic, p, 0, list_offsets(src, topic, p, "last_stable"), target_topic, p)
                      for p in range(4)]
            writers = [lane_share_writer(copier.open_lane(topic, p, target_topic, p), r) for p, r in enumerate(ranges)]
            return ConcurrentCopy(src, options, writers, ranges).run()

    with caplog.at_level(logging.INFO, logger="mirror_core.engine.concurrent_copy"), \
            pytest.raises(BatchRejectedError, match=r"-2 "):
        copy_all()
    assert "dropping the fetch round in flight unread" in caplog.text, "no round was in flight: the test drives nothing"
    partial = _partitions(target_cluster.read_all(target_topic))
    big_at = next(i for i, r in enumerate(source[2]) if r[0] == b"big")
    assert len(partial.get(2, [])) <= big_at
    for p, records in partial.items():
        assert records == source[p][:len(records)], f"partition {p}: not an exact prefix of the source"

    alter(target_cluster, target_topic, delete=("max.message.bytes",))
    copy_all()
    assert _partitions(target_cluster.read_all(target_topic)) == source


def _partitions(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.content())
    return out
