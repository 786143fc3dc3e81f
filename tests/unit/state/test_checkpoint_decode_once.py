"""``CheckpointStore.read_all(whole_maps=False)`` — the daemon's lane round, every few seconds over every lane —
decodes a checkpoint value once, not at every read (issue #18: thousands of mostly unchanged checkpoints), and
still returns exactly what the topic holds: a changed value is decoded anew, other records are skipped."""

from __future__ import annotations

import pytest

import mirror_core.state.checkpoint as C
from mirror_core.config.cluster import ClusterConfig
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore, checkpoint_partition
from mirror_core.state.checkpoint_cache import _PartitionCache


def _checkpoint(partition: int, position: int) -> Checkpoint:
    offset_map = OffsetMap(position, position, [OffsetRun(0, position, 0)])
    return Checkpoint("p", "orders", partition, position, "orders", partition, position, "daemon", 1,
                      offset_map=offset_map)


def _store(monkeypatch, values: dict[bytes, bytes]) -> CheckpointStore:
    store = CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "t:9092"}), client=None)
    monkeypatch.setattr(store, "refresh", lambda *a, **k: None)
    store._caches = {p: _PartitionCache(0) for p in range(store.partitions)}
    for offset, (key, value) in enumerate(values.items()):
        store._caches[checkpoint_partition(key, store.partitions)].entries[key] = (offset, value)
    return store


@pytest.mark.timeout(10)
def test_read_all_decodes_each_value_once(monkeypatch):
    checkpoints = [_checkpoint(p, 10 + p) for p in range(20)]
    values = {cp.key: cp.to_value() for cp in checkpoints}
    values[b'{"lease": "orders-0"}'] = b"{}"  # a record of another kind sharing the topic
    store = _store(monkeypatch, values)
    decodes = []
    real = Checkpoint.from_value.__func__
    monkeypatch.setattr(C.Checkpoint, "from_value", classmethod(lambda cls, v: (decodes.append(v), real(cls, v))[1]))

    first = store.read_all("p", whole_maps=False)
    assert {ident: cp.position for ident, cp in first.items()} == {("p", "orders", p): 10 + p for p in range(20)}
    assert len(decodes) == 20
    assert store.read_all("p", whole_maps=False) == first
    assert len(decodes) == 20  # nothing changed: nothing decoded

    moved = _checkpoint(3, 99)
    part = checkpoint_partition(moved.key, store.partitions)
    store._caches[part].entries[moved.key] = (100, moved.to_value())
    again = store.read_all("p", whole_maps=False)
    assert again[("p", "orders", 3)].position == 99
    assert len(decodes) == 21
    assert store.read_all("other", whole_maps=False) == {}
