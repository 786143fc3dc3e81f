"""A compacted source after the log cleaner has run: batches with offset holes, empty batches and delete-horizon
batches, as a real broker leaves them, copied by Shoal and compared by an independent reader (confluent-kafka,
read_committed): key, value, headers, timestamp and order; and the offset map translates every copied offset."""

from __future__ import annotations

import time
import uuid

import pytest

from mirror_core.codec.batch_codec import BatchKind
from tests.copy_helpers import copy_topic, raw_batches

CLEANER_DEADLINE_S = 90.0

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",  # the active segment is never cleaned: a record >100 ms (by timestamp) later rolls it
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "86400000",  # tombstones survive the test, in a batch with the delete-horizon bit
}
LOG_END = 15

# What a consumer of the cleaned source sees: (offset, key, value).
EXPECTED_SOURCE = [(1, b"c", b"c1"), (3, b"e", b"e1"), (5, b"f", b"f1"), (7, b"h", b"h1"), (9, b"a", b"a2"),
                   (10, b"b", b"b2"), (11, b"g", b"g2"), (12, b"d", b"d2"), (13, b"t", None), (14, b"roll", b"r")]


def _layout(batches) -> list[tuple]:
    return [(b.base_offset, b.last_offset_delta, b.records_count, b.attributes) for b in batches]


def _describe(batches) -> str:
    return "; ".join(f"@{b.base_offset} delta={b.last_offset_delta} count={b.records_count} "
                     f"kind={b.classify().value} holes={b.has_offset_holes} horizon={b.delete_horizon}"
                     for b in batches)


def _wait_for_cleaned_layout(cluster, topic: str) -> list:
    """Raw batches once the cleaner has left a batch with holes, an empty batch and a delete-horizon batch, and
    two fetches in a row agree (the cleaner swaps segments one group at a time)."""
    deadline = time.monotonic() + CLEANER_DEADLINE_S
    previous = None
    while True:
        batches = raw_batches(cluster, topic)
        complete = (any(b.has_offset_holes and b.classify() is BatchKind.DATA for b in batches)
                    and any(b.classify() is BatchKind.EMPTY for b in batches)
                    and any(b.delete_horizon for b in batches))
        if complete and previous == _layout(batches):
            return batches
        previous = _layout(batches) if complete else None
        if time.monotonic() > deadline:
            raise AssertionError(f"after {CLEANER_DEADLINE_S:.0f}s the cleaner of {cluster.name}/{topic} has not "
                                 "left a batch with holes, an empty batch and a delete-horizon batch; raw batches: "
                                 f"{_describe(batches)}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def compacted_source(source_cluster):
    """A source topic the log cleaner has compacted, its raw batches (proven by a raw fetch) and what a source
    consumer reads from it:

    ``@0-4`` zstd, keeps c@1, e@3 (holes at the start, middle and end) · ``@5-7`` uncompressed, keeps f@5, h@7 (a
    hole in the middle) · ``@8`` empty (d superseded; the last batch of its producer, kept for its sequence
    state) · ``@9-13`` lz4 with a tombstone, delete-horizon bit set · ``@14`` the record that rolled the segment.
    """
    topic = f"shoal-test.copy_compacted.{uuid.uuid4().hex[:8]}"
    source_cluster.create_topic(topic, config=COMPACTED)
    # Every produce() call is its own idempotent producer (own producer id); linger puts a call's records in one
    # batch. Timestamps lie within 100 ms of each other so everything shares one segment; the last record (now)
    # rolls it, and the cleaner then cleans the whole log in one pass.
    t0 = int(time.time() * 1000) - 5_000
    hdr = [("h", b"x"), ("empty", b""), ("null", None)]
    one_batch = {"linger.ms": 200, "batch.size": 1_000_000}
    # offsets 0-4: a, b, t are superseded later
    source_cluster.produce(topic, [(b"a", b"a1", hdr, t0), (b"c", b"c1", hdr, t0 + 1), (b"b", b"b1", [], t0 + 2),
                                   (b"e", b"e1", [], t0 + 3), (b"t", b"t1", hdr, t0 + 4)],
                           **one_batch, **{"compression.type": "zstd"})
    # offsets 5-7: g is superseded later
    source_cluster.produce(topic, [(b"f", b"f1", hdr, t0 + 10), (b"g", b"g1", [], t0 + 11),
                                   (b"h", b"h1", [], t0 + 12)], **one_batch, **{"compression.type": "none"})
    # offset 8: the only (so the last) batch of its producer; d is superseded later
    source_cluster.produce(topic, [(b"d", b"d1", hdr, t0 + 20)], **one_batch)
    # offsets 9-13: the newer values and a tombstone for t
    source_cluster.produce(topic, [(b"a", b"a2", hdr, t0 + 30), (b"b", b"b2", [], t0 + 31),
                                   (b"g", b"g2", hdr, t0 + 32), (b"d", b"d2", [], t0 + 33),
                                   (b"t", None, hdr, t0 + 34)], **one_batch, **{"compression.type": "lz4"})
    # offset 14: 5 s later by timestamp, so the segment holding 0-13 rolls and becomes cleanable
    source_cluster.produce(topic, [(b"roll", b"r", [], None)], **one_batch)

    batches = _wait_for_cleaned_layout(source_cluster, topic)
    layout = _describe(batches)
    holes = [b for b in batches if b.has_offset_holes and b.classify() is BatchKind.DATA]
    assert [(b.base_offset, b.next_offset, b.records_count, b.compressed) for b in holes] == \
        [(0, 5, 2, True), (5, 8, 2, False)], layout
    assert [(b.base_offset, b.next_offset) for b in batches if b.classify() is BatchKind.EMPTY] == [(8, 9)], layout
    assert [(b.base_offset, b.records_count) for b in batches if b.delete_horizon] == [(9, 5)], layout
    src = source_cluster.read_all(topic)
    assert [(r.offset, r.key, r.value) for r in src] == EXPECTED_SOURCE, "a source consumer sees the compacted log"
    return topic, batches, src


def test_cleaned_compacted_topic_with_holes_empty_and_horizon_batches(compacted_source, source_cluster,
                                                                       target_cluster):
    topic, batches, src = compacted_source

    results = copy_topic(source_cluster, target_cluster, topic)
    assert len(results) == 1
    result = results[0]
    tgt = target_cluster.read_all(topic)
    assert [r.content() for r in tgt] == [r.content() for r in src], "key, value, headers, timestamp, order"
    assert (result.source_start, result.source_end, result.records) == (0, LOG_END, len(src))
    assert result.deep_batches == sum(b.has_offset_holes and b.classify() is BatchKind.DATA for b in batches), \
        "exactly the batches with holes are re-encoded (deep)"
    for s, t in zip(src, tgt, strict=True):
        assert result.offset_runs.translate(s.offset) == t.offset, (s, t, result.offset_runs)
    copied = {r.offset for r in src}
    assert all(result.offset_runs.translate(o) is None for o in range(LOG_END) if o not in copied), \
        f"holes and the empty batch were never copied: {result.offset_runs}"

    # the target got only dense data batches; its own cleaner keeps its own horizon (segment.ms is not mirrored,
    # so the target's segment does not roll during the test)
    target_raw = raw_batches(target_cluster, topic)
    assert not any(b.has_offset_holes or b.delete_horizon or b.classify() is not BatchKind.DATA
                   for b in target_raw), _describe(target_raw)


def test_ranges_split_at_a_compaction_boundary_copy_everything(compacted_source, source_cluster, target_cluster):
    topic, _, src = compacted_source
    target_topic = f"{topic}.split"
    # [0, 9) ends right after the empty batch; the next range starts where the first one says it ended
    first = copy_topic(source_cluster, target_cluster, topic, target_topic, start=0, end=9)[0]
    second = copy_topic(source_cluster, target_cluster, topic, target_topic, start=first.source_end, end=LOG_END,
                        preflight=False)[0]
    assert [r.content() for r in target_cluster.read_all(target_topic)] == [r.content() for r in src]
    assert (first.source_end, first.records, second.records) == (9, 4, 6)
