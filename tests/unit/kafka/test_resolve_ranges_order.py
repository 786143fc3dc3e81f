"""The order of ``resolve_ranges``' reads, against a scripted partition whose log grows between them (the
committer review of the batched resolution): a start time with no record at or after it when looked up must not
skip records stamped at or after it that are appended before the last stable offset is read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mirror_core.config.positions import PositionSpec
from mirror_core.errors import ConfigError
from mirror_core.kafka import resolve_positions

TP = ("t", 0)


class _GrowingLog:
    """A partition: LSO 10 until the first time lookup has been answered, then 15 (five records stamped after the
    asked time committed right after that lookup). Times: no record at or after ``FUTURE``."""

    FUTURE = 2_000_000_000_000

    def __init__(self):
        self.asked, self.lso = [], 10

    def lookup(self, client, tps, which):
        self.asked.append(which)
        if which == "earliest":
            return {tp: 0 for tp in tps}
        if which == "last_stable":
            return {tp: self.lso for tp in tps}
        answer = {tp: None if which >= self.FUTURE else 3 for tp in tps}
        self.lso = 15
        return answer


@pytest.fixture
def log(monkeypatch):
    scripted = _GrowingLog()
    monkeypatch.setattr(resolve_positions, "lookup_offsets", scripted.lookup)
    return scripted


CLIENT = SimpleNamespace(cluster_name="source")


def test_a_start_time_past_the_newest_record_starts_at_the_lso_read_before_the_lookup(log):
    got = resolve_positions.resolve_ranges(CLIENT, "t", [0], PositionSpec("timestamp", log.FUTURE),
                                           PositionSpec("latest"))
    assert got == {0: (10, 15)}, "the five records appended after the lookup must be copied, not skipped"


def test_an_end_time_is_judged_against_the_lso_read_after_the_lookup(log):
    assert resolve_positions.resolve_ranges(CLIENT, "t", [0], PositionSpec("earliest"),
                                            PositionSpec("timestamp", 1)) == {0: (0, 3)}
    log.lso = 10
    assert resolve_positions.resolve_ranges(CLIENT, "t", [0], PositionSpec("offset", 2),
                                            PositionSpec("timestamp", log.FUTURE)) == {0: (2, 10)}


def test_offsets_only_ask_the_log_start_and_the_lso_once_each(log):
    assert resolve_positions.resolve_ranges(CLIENT, "t", [0], PositionSpec("offset", 1),
                                            PositionSpec("offset", 4)) == {0: (1, 4)}
    assert log.asked == ["earliest", "last_stable"]
    with pytest.raises(ConfigError, match=r"cluster 'source' t-0: end 11 = offset 11 is past the last stable "
                                          r"offset 10"):
        resolve_positions.resolve_ranges(CLIENT, "t", [0], PositionSpec("offset", 1), PositionSpec("offset", 11))
