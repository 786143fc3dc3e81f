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

from mirror_core.checkpoint import CheckpointStore
from mirror_core.checkpointed import CheckpointedCopier, CommitPolicy, DeliveryMode
from mirror_core.copier import CopyOptions, PartitionRange
from mirror_core.errors import BatchRejectedError
from mirror_core.fetcher import list_offsets
from mirror_core.kafka_wire import WireClient
from mirror_core.preflight import run_preflight
from tests.integration.test_topic_config_sync_kafka import alter

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
    with caplog.at_level(logging.INFO, logger="mirror_core.fetcher"), pytest.raises(BatchRejectedError) as failed:
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
