"""The checkpoint store's per-partition cache (``_PartitionCache``), against a brute-force oracle.

The oracle is what a fresh reader does: fold every record still in the log (offset >= log start) into "last value
per key", tombstones removing keys. The cache instead folds records as they arrive and prunes when the log start
moves; both must agree after any interleaving of appends and log-start moves, and the cache's order must be the
order of last writes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mirror_core.state.checkpoint_cache import _PartitionCache

# one step: ("write", key, value or None for a tombstone) or ("delete", how far to move the log start forward)
_write = st.tuples(st.just("write"), st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                   st.one_of(st.none(), st.binary(min_size=1, max_size=3)))
_delete = st.tuples(st.just("delete"), st.integers(0, 6))


def _oracle(log: list[tuple[int, bytes, bytes | None]], log_start: int) -> dict[bytes, tuple[int, bytes]]:
    folded: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in log:
        if offset >= log_start:
            folded.pop(key, None)
            folded[key] = (offset, value)
    return {key: (offset, value) for key, (offset, value) in folded.items() if value is not None}


@settings(max_examples=300)
@given(st.lists(st.one_of(_write, _delete), max_size=60))
def test_cache_equals_a_fresh_fold_of_what_is_left_in_the_log(steps):
    log: list[tuple[int, bytes, bytes | None]] = []
    log_start = 0
    cache = _PartitionCache(0)
    for step in steps:
        if step[0] == "write":
            _, key, value = step
            log.append((len(log), key, value))
            cache.apply(len(log) - 1, key, value)
            cache.next_offset = len(log)
        else:
            log_start = min(len(log), log_start + step[1])  # delete_records never goes past the end
            cache.prune_below(log_start)
        expected = _oracle(log, log_start)
        assert cache.entries == expected
        assert list(cache.entries) == list(expected), "entries stay in order of their last write"
        assert [offset for offset, _ in cache.entries.values()] == sorted(o for o, _ in cache.entries.values())
        assert cache.log_start == log_start <= cache.next_offset


def test_tombstone_removes_and_a_rewrite_moves_the_key_to_the_end():
    cache = _PartitionCache(10)
    cache.apply(10, b"a", b"1")
    cache.apply(11, b"b", b"1")
    cache.apply(12, b"a", b"2")
    assert list(cache.entries.items()) == [(b"b", (11, b"1")), (b"a", (12, b"2"))]
    cache.apply(13, b"b", None)
    assert cache.entries == {b"a": (12, b"2")}
    cache.prune_below(12)
    assert cache.entries == {b"a": (12, b"2")}, "the surviving entry is at the new log start"
    cache.prune_below(13)
    assert cache.entries == {}
