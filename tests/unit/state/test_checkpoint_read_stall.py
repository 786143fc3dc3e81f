"""The checkpoint reader ends in progress or a named error when its partition was truncated below the last stable
offset it measured (CheckpointStore._refresh_partition): before, it fetched an empty answer for ever."""

from __future__ import annotations

import pytest

import mirror_core.state.checkpoint_cache as checkpoint_module
from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import CheckpointReadStalledError
from mirror_core.kafka.fetcher import FetchResult
from mirror_core.state.checkpoint import CheckpointStore


class _TruncatedLog:
    """A partition whose log now ends at ``log_end``: fetching at the end answers nothing, as a broker does."""

    log_end = 3

    def __init__(self, client, topic, partition, start, end, **_kwargs):
        self.position, self.end = start, end
        self.fetches = 0

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def fetch(self) -> FetchResult:
        self.fetches += 1
        assert self.fetches < 50, "the reader keeps fetching an empty partition"
        self.position = max(self.position, self.log_end)
        return FetchResult([], self.position, self.log_end, self.log_end, 0)


def test_a_checkpoint_partition_truncated_below_the_measured_lso_ends_in_a_named_error(monkeypatch):
    monkeypatch.setattr(checkpoint_module, "RawBatchFetcher", _TruncatedLog)
    measured = {"earliest": 0, "last_stable": 10}  # the LSO stays above the log end: the broker lags, say
    monkeypatch.setattr(checkpoint_module, "list_offsets", lambda _c, _t, _p, which: measured[which])
    store = CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "127.0.0.1:1"}), client=None)
    with pytest.raises(CheckpointReadStalledError, match=r"reading \[3, 10\) made no progress.*ends at 3"):
        store._refresh_partition(0, 0, 10)
    assert store.cache_resets == 5


def test_after_the_truncation_a_fresh_measurement_reads_to_the_new_end(monkeypatch):
    monkeypatch.setattr(checkpoint_module, "RawBatchFetcher", _TruncatedLog)
    monkeypatch.setattr(checkpoint_module, "list_offsets", lambda _c, _t, _p, which: {"earliest": 0,
                                                                                      "last_stable": 3}[which])
    store = CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "127.0.0.1:1"}), client=None)
    store._refresh_partition(0, 0, 10)
    assert store._caches[0].next_offset == 3
