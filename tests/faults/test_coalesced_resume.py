"""Coalescing small batches (``--coalesce-small-batches``, the ``coalesced`` deep case) against the failures a lane
must survive: a copy stopped between a write and its checkpoint, resumed with coalescing on or off; a source of
one-record batches (uncompressed, or lz4) interleaved with committed and aborted transactions (markers and aborted
data split the runs).
What must hold is the mirror contract, not batch identity: every committed record once (exactly-once) or the
first run's copies reported as duplicates (at-least-once), in source order with key, value, headers and timestamp
intact, and the offset map translating every copied offset to where the record landed."""

from __future__ import annotations

import logging
import time

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from tests.copy_helpers import raw_batches

pytestmark = pytest.mark.timeout(240)

ROUNDS = 6     # each: 40 one-record batches, a committed transaction of 3, an aborted one of 2
PLAIN, COMMITTED, ABORTED = 40, 3, 2


class _Stopped(Exception):
    """The first run's process dying after an acknowledged write, before its checkpoint."""


def _fill(source_cluster, topic: str, transactional_id: str, codec: str = "none") -> list[tuple]:
    """The source: one-record batches between transactions; returns what a read_committed consumer sees."""
    from confluent_kafka import Producer

    plain = Producer(source_cluster.config.confluent(**{"linger.ms": 0, "batch.num.messages": 1,
                                                        "compression.type": codec, "enable.idempotence": True}))
    txn = Producer(source_cluster.config.confluent(**{"transactional.id": transactional_id, "linger.ms": 5,
                                                      "compression.type": codec}))
    txn.init_transactions(30)
    now = int(time.time() * 1000) - 60_000
    for r in range(ROUNDS):
        for i in range(PLAIN):
            plain.produce(topic, key=b"k%d-%d" % (r, i), value=b"plain-%d-%d;" % (r, i) * 8, partition=0,
                          headers=[("round", b"%d" % r)], timestamp=now + 1000 * r - i)   # deltas go backwards
            plain.flush(30)   # one batch per record
        for decided, count in (("commit", COMMITTED), ("abort", ABORTED)):
            txn.begin_transaction()
            for i in range(count):
                txn.produce(topic, key=b"t", value=b"%s-%d-%d;" % (decided.encode(), r, i) * 8, partition=0)
            txn.flush(30)
            txn.commit_transaction(30) if decided == "commit" else txn.abort_transaction(30)
    codecs = {v.codec.name.lower() for v in raw_batches(source_cluster, topic)}
    assert codecs == {codec}, f"the source's batches are {codecs}, not {codec} (values too small to compress?)"
    return [r.content() for r in source_cluster.read_all(topic)]


def _source_and_target(source_cluster, target_cluster, unique_name, codec: str = "none"):
    """(topic, target topic, pipeline, what a read_committed consumer of the source sees, the range end: past the
    last marker) for a filled source and an empty target."""
    topic = unique_name()
    target_topic, pipeline = f"dr.{topic}", f"p.{topic}"
    source_cluster.create_topic(topic)
    target_cluster.create_topic(target_topic)
    expected = _fill(source_cluster, topic, unique_name("txn"), codec)
    return topic, target_topic, pipeline, expected, raw_batches(source_cluster, topic)[-1].next_offset + 1


def _copier(source, target, store, pipeline: str, mode: DeliveryMode, coalesce: bool, *,
            commit_bytes: int = 64 * 1024 * 1024, window: int = 8192) -> CheckpointedCopier:
    # small answers and windows: many flushes, so a stop falls between a write and its checkpoint
    policy = CommitPolicy(commit_bytes=commit_bytes, commit_interval_ms=120_000)
    options = CopyOptions(fetch_max_bytes=2 * window, max_inflight_bytes=window,
                          coalesce_bytes=4096 if coalesce else 0)
    return CheckpointedCopier(source, target, store, pipeline=pipeline, mode=mode, policy=policy, options=options)


def _stop_after_writes(count: int):
    def progress(result) -> None:
        if result.records >= count:
            raise _Stopped
    return progress


def _read_settled(cluster, topic: str) -> list:
    """The partition as a read_committed consumer sees it once the last commit's marker is written: the coordinator
    answers EndTxn before it writes the markers, so a read right after a commit can stop at the old stable offset."""
    deadline = time.monotonic() + 15
    with WireClient.for_cluster(cluster.config) as client:
        while list_offsets(client, topic, 0, "last_stable") < list_offsets(client, topic, 0, "latest"):
            assert time.monotonic() < deadline, f"{topic}: a transaction stays open on the target"
            time.sleep(0.1)
    return cluster.read_all(topic)


def _assert_offset_map(result, source_cluster, topic, target_cluster, target_topic) -> None:
    """Every source record the resumed copy wrote sits at the target offset its offset map names."""
    by_offset = {r.offset: r.content() for r in _read_settled(target_cluster, target_topic)}
    checked = 0
    for record in source_cluster.read_all(topic):
        target_offset = result.offset_runs.translate(record.offset)
        if record.offset >= result.source_start and target_offset is not None:
            assert by_offset.get(target_offset) == record.content(), (record.offset, target_offset)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("resume_coalescing", [True, False], ids=["resume-coalesced", "resume-shallow"])
def test_at_least_once_stopped_before_its_checkpoint_reports_the_coalesced_copies_as_duplicates(
        source_cluster, target_cluster, unique_name, caplog, resume_coalescing):
    topic, target_topic, pipeline, expected, end = _source_and_target(source_cluster, target_cluster, unique_name)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        rng = PartitionRange(topic, 0, 0, end, target_topic, 0)
        with pytest.raises(_Stopped):
            _copier(source, target, store, pipeline, DeliveryMode.AT_LEAST_ONCE, True).copy(
                rng, _stop_after_writes(60))
        first_run = len(_read_settled(target_cluster, target_topic))
        assert 60 <= first_run < len(expected)
        merged = len(raw_batches(target_cluster, target_topic))
        assert merged < first_run / 4, f"{first_run} records in {merged} target batches: nothing was coalesced"
        session = _copier(source, target, store, pipeline, DeliveryMode.AT_LEAST_ONCE,
                          resume_coalescing).open_lane(topic, 0, target_topic, 0)
        with caplog.at_level(logging.WARNING, logger="mirror_core.engine.resume_landing"):
            result = session.copy(0, end)
    assert result.source_end == end
    on_target = [r.content() for r in _read_settled(target_cluster, target_topic)]
    assert on_target == expected[:first_run] + expected, "not the first run's copies followed by the whole source"
    assert session.duplicates_reported == first_run, \
        f"{first_run} records were copied twice, {session.duplicates_reported} reported"
    assert f"at-least-once resume found {first_run} record(s)" in caplog.text
    assert result.coalesced_batches > 0 or not resume_coalescing


@pytest.mark.parametrize("codec", ["none", "lz4"])
@pytest.mark.parametrize("resume_coalescing", [True, False], ids=["resume-coalesced", "resume-shallow"])
def test_exactly_once_stopped_mid_copy_resumes_to_an_exact_target_with_an_exact_offset_map(
        source_cluster, target_cluster, unique_name, resume_coalescing, codec):
    """``lz4``: compressed one-record batches, merged with their own codec (decompressed and compressed again)."""
    topic, target_topic, pipeline, expected, end = _source_and_target(source_cluster, target_cluster, unique_name,
                                                                       codec)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        rng = PartitionRange(topic, 0, 0, end, target_topic, 0)
        first = _copier(source, target, store, pipeline, DeliveryMode.EXACTLY_ONCE, True,
                        commit_bytes=2048, window=2048)   # windows committed before the stop
        with pytest.raises(_Stopped):
            first.copy(rng, _stop_after_writes(150))
        committed = len(_read_settled(target_cluster, target_topic))
        assert 0 < committed < len(expected), committed
        session = _copier(source, target, store, pipeline, DeliveryMode.EXACTLY_ONCE,
                          resume_coalescing).open_lane(topic, 0, target_topic, 0)
        result = session.copy(0, end)
    assert result.source_end == end
    assert [r.content() for r in _read_settled(target_cluster, target_topic)] == expected
    _assert_offset_map(result, source_cluster, topic, target_cluster, target_topic)
    codecs = {v.codec.name.lower() for v in raw_batches(target_cluster, target_topic)}
    assert codecs == {codec}, codecs
