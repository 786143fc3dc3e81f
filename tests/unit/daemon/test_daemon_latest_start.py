"""``new_partitions: latest`` fixes a discovered lane's start at first sight (ShallowMirrorDaemon._fix_latest_starts);
the real-broker case is tests/faults/test_latest_start_at_first_sight.py."""

from __future__ import annotations

import logging

import pytest

import mirror_core.daemon.loop as D
import mirror_core.kafka.list_offsets as list_offsets
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon.lane_state import LaneState
from tests.unit.daemon.test_daemon_idle_rounds import BASE


def _states(daemon, n):
    daemon.source = object()  # the source client run() makes (lookup_offsets is replaced)
    return [LaneState("orders", p, "orders", f"orders-{p}", health=daemon._new_health()) for p in range(n)]


@pytest.mark.timeout(10)
def test_starts_are_fixed_in_one_lookup_and_a_chosen_start_is_kept(monkeypatch):
    asked = []
    monkeypatch.setattr(list_offsets, "lookup_offsets",
                        lambda client, tps, which: asked.append((list(tps), which)) or {tp: 100 + tp[1] for tp in tps})
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "new_partitions": "latest"}), worker_id="me")
    states = _states(daemon, 3)
    states[2].start = 7
    daemon._fix_latest_starts(states)
    assert asked == [([("orders", 0), ("orders", 1), ("orders", 2)], "last_stable")]
    assert [s.start for s in states] == [100, 101, 7]


@pytest.mark.timeout(10)
def test_a_failed_lookup_leaves_the_start_to_the_open_and_says_so(monkeypatch, caplog):
    def fail(*_a):
        raise ConnectionError("source down")

    monkeypatch.setattr(list_offsets, "lookup_offsets", fail)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "new_partitions": "latest"}), worker_id="me")
    states = _states(daemon, 2)
    with caplog.at_level(logging.WARNING, logger="shoal.daemon"):
        daemon._fix_latest_starts(states)
    assert [s.start for s in states] == [None, None]
    assert "event=start_lookup_failed lanes=2 first=orders-0" in caplog.text and "source down" in caplog.text
