"""Offset translation is exact for every source offset, checked offset by offset against the records themselves.

Two sources, each copied exactly-once in two resumed copies with small commits (so the target carries the mirror's
own transaction markers and the map has runs of several shifts), and the map read back from the checkpoint store:

- committed and aborted transactions interleaved with plain batches (commit/abort markers and aborted data);
- a compacted topic after the log cleaner ran (holes at the start, middle and end of batches, an empty batch).

For every source offset ``s`` in ``[start, position]``: a committed record lands at ``translate(s)`` with the same
key, value, headers and timestamp; a gap translates to the target offset of the next copied record, or
``target_next`` when none follows. The inverse maps every target offset back the same way.
"""

from __future__ import annotations

import time
import uuid

import pytest

from mirror_core.codec.batch_codec import BatchKind
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore
from tests.copy_helpers import raw_batches

CLEANER_DEADLINE_S = 90.0


def _copy_in_two_steps(source_cluster, target_cluster, topic: str, target_topic: str, pipeline: str) -> dict:
    """Exactly-once copy to the middle of each partition, then resumed to the end; the checkpoints read back."""
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        partitions = sorted(source.topic_metadata(topic, refresh=True).partitions)
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic).raise_if_refused()
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=pipeline, mode=DeliveryMode.EXACTLY_ONCE,
                                    policy=CommitPolicy(commit_bytes=1024, commit_interval_ms=60_000))
        for p in partitions:
            start = list_offsets(source, topic, p, "earliest")
            end = list_offsets(source, topic, p, "last_stable")
            for stop in ((start + end) // 2, end):
                copier.copy(PartitionRange(topic, p, start, stop, target_topic, p))
        checkpoints = store.read_all(pipeline)
    assert {k[2] for k in checkpoints} == set(partitions)
    return {k[2]: cp for k, cp in checkpoints.items()}


def _check_every_offset(source_cluster, target_cluster, topic: str, target_topic: str, checkpoints: dict) -> dict:
    """The offset-by-offset check; returns per partition the source gaps it walked over."""
    source = source_cluster.read_all(topic)  # read_committed: what a consumer of the source can see
    target = target_cluster.read_all(target_topic)
    gaps = {}
    for p, cp in checkpoints.items():
        m = cp.offset_map
        assert (m.position, m.target_next) == (cp.position, cp.target_next)
        src = [r for r in source if r.partition == p and m.start <= r.offset < m.position]
        tgt = [r for r in target if r.partition == cp.target_partition]
        assert [r.content() for r in tgt] == [r.content() for r in src], f"partition {p}: the copy itself"
        assert src, f"partition {p}: nothing copied"
        partner = {s.offset: t.offset for s, t in zip(src, tgt, strict=True)}  # independent of the map
        by_target_offset = {t.offset: t for t in tgt}
        by_source_offset = {s.offset: s for s in src}
        assert tgt[-1].offset < m.target_next, "no copied record at or past target_next"

        gaps[p] = []
        following = None  # the next copied source offset at or after s, walking down
        expected_down = {}
        for s in range(m.position, m.start - 1, -1):
            if s in partner:
                following = s
            expected_down[s] = partner[following] if following is not None else m.target_next
        for s in range(m.start, m.position + 1):
            t = m.translate(s)
            assert t == expected_down[s], f"partition {p}: translate({s}) = {t}, expected {expected_down[s]}"
            if s in by_source_offset:
                assert by_target_offset[t].content() == by_source_offset[s].content(), (p, s, t)
            elif s < m.position:
                gaps[p].append(s)
        assert m.translate(m.position + 1) is None
        if m.start > 0:
            assert m.translate(m.start - 1) is None

        # the inverse (failback): every target offset from the first copied record to target_next
        back = {t: s for s, t in partner.items()}
        following = None
        for t in range(m.target_next, tgt[0].offset - 1, -1):
            if t in back:
                following = t
            expected = back[following] if following is not None else m.position
            assert m.inverse(t) == expected, f"partition {p}: inverse({t}) = {m.inverse(t)}, expected {expected}"
        assert m.inverse(m.target_next + 1) is None
    return gaps


# -- transactions ----------------------------------------------------------------------------------------------


def _fill_with_transactions(cluster, topic: str, partitions: int) -> None:
    """Plain batches (lz4 and none), committed and aborted transactions, and plain records produced while an
    aborted transaction is open (so aborted batches sit between committed ones); the log ends on a marker."""
    from confluent_kafka import Producer

    cluster.create_topic(topic, partitions=partitions)
    t0 = int(time.time() * 1000) - 60_000
    txn = Producer(cluster.config.confluent(**{"transactional.id": f"{topic}.txn", "linger.ms": 20}))
    txn.init_transactions(10)
    seq = iter(range(1_000_000))

    def plain(tag: bytes, n: int, **conf) -> None:
        for p in range(partitions):
            cluster.produce(topic, [(b"%s-%d" % (tag, i), b"%s:%d" % (tag, next(seq)), [("t", tag)], t0 + i)
                                    for i in range(n)], partition=p, **{"linger.ms": 20, **conf})

    def transactional(tag: bytes, n: int) -> None:
        for p in range(partitions):
            for i in range(n):
                txn.produce(topic, key=b"%s-%d" % (tag, i), value=b"%s:%d" % (tag, next(seq)), partition=p,
                            headers=[("t", tag)], timestamp=t0 + 1000 + i)
        txn.flush()

    plain(b"plain-a", 30, **{"compression.type": "lz4"})
    for round_ in range(4):
        txn.begin_transaction()
        transactional(b"txn-%d" % round_, 7)
        if round_ % 2:  # aborted: with committed plain records in the middle of it
            plain(b"between-%d" % round_, 5, **{"compression.type": "none"})
            transactional(b"ABORTED-%d" % round_, 6)
            txn.abort_transaction(10)
        else:
            txn.commit_transaction(10)
        plain(b"plain-%d" % round_, 9, **{"compression.type": "zstd" if round_ % 2 else "none"})
    txn.begin_transaction()
    transactional(b"last", 4)
    txn.commit_transaction(10)


def test_translation_is_exact_across_transactions(source_cluster, target_cluster):
    topic = f"shoal-test.translation.txn.{uuid.uuid4().hex[:8]}"
    target_topic = f"{topic}.dr"
    _fill_with_transactions(source_cluster, topic, partitions=2)
    checkpoints = _copy_in_two_steps(source_cluster, target_cluster, topic, target_topic, f"tr.{topic}")
    gaps = _check_every_offset(source_cluster, target_cluster, topic, target_topic, checkpoints)

    everything = source_cluster.read_all(topic, isolation="read_uncommitted")
    for p, cp in checkpoints.items():
        seen = {r.offset for r in everything if r.partition == p}
        aborted = [s for s in gaps[p] if s in seen]
        markers = [s for s in gaps[p] if s not in seen]
        assert len(aborted) == 2 * (7 + 6) and len(markers) == 5, (p, aborted, markers)
        assert cp.offset_map.position - 1 in markers, "the log ends on a commit marker: position is past it"
        shifts = {run.shift for run in cp.offset_map}
        assert len(shifts) > 3, f"the map should have runs of several shifts: {cp.offset_map}"


# -- compaction holes ------------------------------------------------------------------------------------------

COMPACTED = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
             "min.compaction.lag.ms": "0", "delete.retention.ms": "86400000"}


def _layout(batches) -> list[tuple]:
    return [(b.base_offset, b.last_offset_delta, b.records_count, b.attributes) for b in batches]


@pytest.fixture(scope="module")
def cleaned_compacted_topic(source_cluster):
    """A compacted source the cleaner has left with holes at the start, middle and end of batches and an empty
    batch (the technique of test_copy_compacted: one segment, rolled by a late record, cleaned in one pass)."""
    topic = f"shoal-test.translation.compacted.{uuid.uuid4().hex[:8]}"
    source_cluster.create_topic(topic, config=COMPACTED)
    t0 = int(time.time() * 1000) - 5_000
    hdr = [("h", b"x")]
    one_batch = {"linger.ms": 200, "batch.size": 1_000_000}
    source_cluster.produce(topic, [(b"a", b"a1", hdr, t0), (b"c", b"c1", hdr, t0 + 1), (b"b", b"b1", [], t0 + 2),
                                   (b"e", b"e1", [], t0 + 3), (b"t", b"t1", hdr, t0 + 4)],
                           **one_batch, **{"compression.type": "zstd"})
    source_cluster.produce(topic, [(b"f", b"f1", hdr, t0 + 10), (b"g", b"g1", [], t0 + 11),
                                   (b"h", b"h1", [], t0 + 12)], **one_batch, **{"compression.type": "none"})
    source_cluster.produce(topic, [(b"d", b"d1", hdr, t0 + 20)], **one_batch)
    source_cluster.produce(topic, [(b"a", b"a2", hdr, t0 + 30), (b"b", b"b2", [], t0 + 31),
                                   (b"g", b"g2", hdr, t0 + 32), (b"d", b"d2", [], t0 + 33),
                                   (b"t", None, hdr, t0 + 34)], **one_batch, **{"compression.type": "lz4"})
    source_cluster.produce(topic, [(b"roll", b"r", [], None)], **one_batch)  # rolls the segment: cleanable

    deadline = time.monotonic() + CLEANER_DEADLINE_S
    previous = None
    while True:
        batches = raw_batches(source_cluster, topic)
        cleaned = any(b.has_offset_holes and b.classify() is BatchKind.DATA for b in batches) and \
            any(b.classify() is BatchKind.EMPTY for b in batches)
        if cleaned and previous == _layout(batches):
            break
        previous = _layout(batches) if cleaned else None
        assert time.monotonic() < deadline, f"the cleaner of {topic} did not run within {CLEANER_DEADLINE_S:.0f}s"
        time.sleep(0.25)
    return topic


def test_translation_is_exact_across_compaction_holes(cleaned_compacted_topic, source_cluster, target_cluster):
    topic = cleaned_compacted_topic
    target_topic = f"{topic}.dr.{uuid.uuid4().hex[:6]}"
    checkpoints = _copy_in_two_steps(source_cluster, target_cluster, topic, target_topic, f"tr.{target_topic}")
    gaps = _check_every_offset(source_cluster, target_cluster, topic, target_topic, checkpoints)
    # holes at the start (0), middle (2, 4 of the zstd batch; 6 of the plain one), end (4), the empty batch (8)
    assert gaps[0] == [0, 2, 4, 6, 8], gaps
