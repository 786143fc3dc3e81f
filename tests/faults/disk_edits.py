"""Editing a private broker's log segment in place, the way a damaged disk (or a segment copied by hand) changes
it: the broker serves fetches from the segment file through the page cache, so the changed bytes are what a reader
gets. Used by the fault tests of corrupt batches; only for brokers a test owns
(:func:`tests.kafka_helpers.private_broker`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from mirror_core.codec.batch_codec import walk_batches


def first_segment(cluster, topic: str, partition: int = 0) -> Path:
    return cluster.broker.data_dir / f"{topic}-{partition}" / "00000000000000000000.log"


def overwrite(segment: Path, position: int, data: bytes) -> None:
    """Write ``data`` at ``position`` of ``segment`` and sync it (nothing else changes: no CRC is resealed)."""
    with open(segment, "r+b") as f:
        f.seek(position)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def edit_stored_batch(cluster, topic: str, base_offset: int, at: int, width: int,
                      change: Callable[[bytes], bytes], partition: int = 0) -> bytes:
    """Replace bytes ``at``..``at + width`` of the stored batch at ``base_offset`` by ``change(old)`` (its CRC left as
    it was); returns the new bytes."""
    segment = first_segment(cluster, topic, partition)
    data = segment.read_bytes()
    position = 0
    for view in walk_batches(data)[0]:
        if view.base_offset == base_offset:
            new = change(data[position + at:position + at + width])
            overwrite(segment, position + at, new)
            return new
        position += view.size
    raise AssertionError(f"no batch at offset {base_offset} in {segment}")
