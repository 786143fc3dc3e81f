"""The standing fetch round's audit in the daemon (review of issue #18's follow-up): the audit is what turns a lane
missing from its broker's fetch session — never named, never fetched, its health ``copying`` and its lag gauge
frozen at its last value — into a log line and a repair. It must run on a bounded cadence of its own: a pipeline
with a long ``rescan_interval_s`` (an hour: a fixed topic list needs no frequent rescans) must not leave such a
lane silently stalled for an hour."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import copy_round

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}


class _Rounds:
    """Stands in for the daemon's StandingRound: records when its books are audited."""

    def __init__(self, client, clock):
        self.client, self.clock, self.audits = client, clock, []

    def sync(self, lanes):
        pass

    def audit(self):
        self.audits.append(self.clock[0])
        return []

    def send(self, *, rotation=0, stats=None):
        return NS(collected=False)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("rescan_s", [10.0, 3600.0])
def test_the_standing_rounds_books_are_audited_at_least_every_minute_whatever_the_rescan_interval(
        monkeypatch, rescan_s):
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "rescan_interval_s": rescan_s}),
                                   worker_id="me")
    clock = [1000.0]
    monkeypatch.setattr(copy_round, "time", NS(monotonic=lambda: clock[0]))   # the daemon's clock only
    daemon.source = NS(name="source")
    rounds = daemon._rounds = _Rounds(daemon.source, clock)
    for _ in range(600):                # ten minutes of rounds, one every second
        daemon._send_round([])
        clock[0] += 1.0
    gaps = [b - a for a, b in zip(rounds.audits, rounds.audits[1:], strict=False)]
    assert rounds.audits and rounds.audits[0] == 1000.0
    assert len(rounds.audits) >= 10 and max(gaps) <= 60.0, \
        f"audited at {rounds.audits[:5]}... (gaps up to {max(gaps, default=None)} s) with rescan_interval_s={rescan_s}"
