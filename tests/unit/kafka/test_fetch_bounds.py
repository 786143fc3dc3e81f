"""Which fetched batches belong to a range ``[start, end)``, and what a resumed copy makes of a batch that
straddles its start. Pure: batches are built with kafka-python's builders; the copier writes into a recording
writer, no broker."""

from __future__ import annotations

import pytest

from mirror_core.codec.batch_codec import Codec, walk_batches
from mirror_core.engine.copier import CopyOptions, FetchedOnce, RangeCopier
from mirror_core.kafka.fetcher import FetchResult, batches_reaching_below
from mirror_core.model.ranges import PartitionRange
from tests.unit.codec.test_batch_codec import RECORDS, build, decoded, legacy

pytestmark = pytest.mark.unit

codecs = pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD],
                                 ids=lambda c: c.name.lower())
LEGACY_ROWS = [(d, ts, key, value, []) for d, ts, key, value, _ in RECORDS]


def test_v2_batches_starting_at_the_end_belong_to_the_next_range():
    views, _ = walk_batches(build(base_offset=100) + build(base_offset=106) + build(base_offset=112))
    assert [v.base_offset for v in batches_reaching_below(views, 100, 106)] == [100]
    assert [v.base_offset for v in batches_reaching_below(views, 103, 107)] == [100, 106]
    assert batches_reaching_below(views, 100, 100) == []


@pytest.mark.parametrize("magic", [0, 1])
def test_a_legacy_wrapper_whose_last_offset_passes_the_end_still_belongs_to_the_range(magic):
    """The wrapper holds 306..311 and its offset field says 311: a range ending at 308 needs its first two."""
    views, _ = walk_batches(build(base_offset=300)
                            + legacy(magic, Codec.GZIP, LEGACY_ROWS, 306) + build(base_offset=312))
    assert [v.base_offset for v in views] == [300, 311, 312]
    assert [v.base_offset for v in batches_reaching_below(views, 300, 308)] == [300, 311]
    assert [v.base_offset for v in batches_reaching_below(views, 300, 306)] == [300]
    assert [v.base_offset for v in batches_reaching_below(views, 307, 308)] == [300, 311]


class RecordingWriter:
    """Stands in for the target: batches land densely from 0, in order."""

    def __init__(self):
        self.batches: list[bytes] = []
        self.next = 0

    def write(self, outgoing):
        bases = []
        for batch in outgoing:
            self.batches.append(bytes(batch.data))
            bases.append(self.next)
            self.next += decoded_count(batch.data)
        return bases


def decoded_count(data) -> int:
    return int.from_bytes(bytes(data[57:61]), "big")


class Named:
    cluster_name = "t"


def copy_fetched(buf: bytes, start: int, *, resume: bool):
    views, _ = walk_batches(buf)
    writer = RecordingWriter()
    fetched = FetchResult(views, views[-1].next_offset, 0, 0, 0)
    rng = PartitionRange("s", 0, start, fetched.next_offset, "t", 0)
    result = RangeCopier(Named(), Named(), writer, CopyOptions()).copy(
        rng, fetcher=FetchedOnce(fetched, start), resume=resume)
    return result, [r for batch in writer.batches for r in decoded(batch)]


@codecs
def test_a_resumed_copy_trims_the_head_of_a_first_batch_straddling_its_start(codec):
    source = build(codec=codec, base_offset=1000) + build(codec=codec, base_offset=1006)
    result, got = copy_fetched(source, 1004, resume=True)
    expected = [r for batch in (build(codec=codec), build(codec=codec)) for r in decoded(batch)][4:]
    assert [r[1:] for r in got] == [r[1:] for r in expected]
    assert (result.source_start, result.source_end, result.records, result.deep_batches) == (1004, 1012, 8, 1)
    assert result.offset_runs[0].source_start == 1004


@codecs
def test_a_fresh_copy_still_copies_a_first_batch_straddling_its_start_whole(codec):
    result, got = copy_fetched(build(codec=codec, base_offset=1000), 1004, resume=False)
    assert len(got) == 6 and result.deep_batches == 0
    assert (result.source_start, result.source_end) == (1000, 1006)


@pytest.mark.parametrize("magic", [0, 1])
def test_a_fresh_copy_starts_a_whole_legacy_wrapper_at_its_first_inner_offset(magic):
    result, got = copy_fetched(legacy(magic, Codec.GZIP, LEGACY_ROWS, 300), 303, resume=False)
    assert len(got) == 6 and result.source_start == 300
    result, got = copy_fetched(legacy(magic, Codec.GZIP, LEGACY_ROWS, 300), 303, resume=True)
    assert len(got) == 3 and result.source_start == 303 and result.offset_runs[0].source_start == 303
