"""The daemon sized for a declared link (``link_mbps``): one fetch request per source broker per round, one round
in flight, so a round must carry ~9 × bandwidth × round trip to keep the link 90 % busy (issue #14: the daemon
catching up a backlog over a 200 ms, 20 MB/s link stayed at 76 % with its fixed 16 MiB rounds)."""

from __future__ import annotations

import logging
import time

import pytest

from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon import events
from mirror_core.daemon.loop import ShallowMirrorDaemon
from mirror_core.errors import ClusterUnavailableError, ConfigError
from mirror_core.model.preflight_rules import LINK_ROUND_CAP, SourceLink, round_bytes_for_link

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "s:9092"}, "target": {"bootstrap.servers": "t:9092"},
        "include": "orders", "metrics_port": 0}


def test_a_round_keeps_the_link_ninety_percent_busy_within_memory():
    size = round_bytes_for_link(link_bytes_per_s=20e6, rtt_s=0.2, floor=16 << 20)
    assert size == 36_000_000                                     # 9 × 20 MB/s × 0.2 s
    assert 20e6 * size / (20e6 * 0.2 + size) >= 0.9 * 20e6        # TP = B·D / (B·RTT + D)
    assert round_bytes_for_link(link_bytes_per_s=20e6, rtt_s=0.001, floor=16 << 20) == 16 << 20  # never below
    assert round_bytes_for_link(link_bytes_per_s=1e9, rtt_s=0.2, floor=16 << 20) == LINK_ROUND_CAP  # memory


def test_link_mbps_is_optional_and_checked():
    assert pipeline_config_from_mapping(BASE).link_mbps is None
    assert pipeline_config_from_mapping({**BASE, "link_mbps": 20}).link_mbps == 20
    for bad in (0, -5, "fast"):
        with pytest.raises(ConfigError, match="link_mbps"):
            pipeline_config_from_mapping({**BASE, "link_mbps": bad})


def _daemon(monkeypatch, links, **extra) -> ShallowMirrorDaemon:
    import mirror_core.kafka.round_trips as round_trips

    def measure(source, *, timeout_s):
        if isinstance(links, Exception):
            raise links
        return links

    monkeypatch.setattr(round_trips, "measure_links", measure)
    daemon = ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, **extra}), worker_id="w")
    daemon._size_for_link()
    return daemon


def test_the_daemon_sizes_its_rounds_for_the_slowest_broker(monkeypatch):
    daemon = _daemon(monkeypatch, [SourceLink(1, 102400, 0.05), SourceLink(2, 102400, 0.2)], link_mbps=20)
    assert daemon._fetch_sizes == (36_000_000, 36_000_000)  # one busy partition may fill the round alone


def test_unmeasured_links_keep_the_configured_sizes(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=events.log.name)
    for links in ([], ClusterUnavailableError("source", "s:9092", "metadata: timed out")):
        caplog.clear()
        daemon = _daemon(monkeypatch, links, link_mbps=20)
        assert daemon._fetch_sizes == (16 << 20, 4 << 20)
        assert "link_not_measured" in caplog.text  # said, not raised: the daemon runs on the configured sizes


def test_without_a_declared_link_nothing_is_measured(monkeypatch):
    import mirror_core.kafka.round_trips as round_trips

    monkeypatch.setattr(round_trips, "measure_links", lambda *a, **k: pytest.fail("measured without link_mbps"))
    daemon = ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="w")
    daemon._size_for_link()
    assert daemon._fetch_sizes == (16 << 20, 4 << 20)


def test_the_link_is_measured_beside_the_start_and_waited_for_by_the_first_fetch(monkeypatch):
    """Over a 200 ms link the measurement took 1.9 of the ~7 s before the daemon's first fetch, run before the group
    join and topic scan; now it runs beside them and only a lane's first fetch waits for its sizes."""
    import threading

    import mirror_core.kafka.round_trips as round_trips

    release, began = threading.Event(), threading.Event()

    def slow_measure(source, *, timeout_s):
        began.set()
        assert release.wait(10)
        return [SourceLink(1, 102400, 0.2)]

    monkeypatch.setattr(round_trips, "measure_links", slow_measure)
    daemon = ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "link_mbps": 20}), worker_id="w")
    daemon._size_for_link()                 # returns while the measurement runs
    assert began.wait(5)
    taken: list = []
    reader = threading.Thread(target=lambda: taken.append(daemon._fetch_sizes))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not taken  # the first fetch waits for the measured sizes, not the configured ones
    release.set()
    reader.join(5)
    assert taken == [(36_000_000, 36_000_000)]


def test_a_probe_that_breaks_is_not_measured_never_a_lane_failure(monkeypatch, caplog):
    """The sizes are first read where a lane opens, on a lane worker: an error raised there would be the lane's
    (retrying, then stalled, for ever, the lanes kept from the group's other members). Any failure of the probe is
    "not measured", as an unanswered probe is: the configured sizes stay, and the log says why."""
    caplog.set_level(logging.WARNING, logger=events.log.name)
    daemon = _daemon(monkeypatch, RuntimeError("probe bug"), link_mbps=20)
    assert daemon._fetch_sizes == (16 << 20, 4 << 20)
    assert "link_not_measured" in caplog.text and "probe bug" in caplog.text


def test_a_lane_waits_for_a_slow_probe_only_so_long(monkeypatch, caplog):
    import threading

    import mirror_core.daemon.loop as loop
    import mirror_core.kafka.round_trips as round_trips

    release = threading.Event()
    monkeypatch.setattr(loop, "LINK_SIZING_WAIT_S", 0.2)
    monkeypatch.setattr(round_trips, "measure_links",
                        lambda source, *, timeout_s: release.wait(10) and [SourceLink(1, 102400, 0.2)])
    caplog.set_level(logging.WARNING, logger=events.log.name)
    daemon = ShallowMirrorDaemon(pipeline_config_from_mapping({**BASE, "link_mbps": 20}), worker_id="w")
    daemon._size_for_link()
    assert daemon._fetch_sizes == (16 << 20, 4 << 20)   # the probe still runs: the configured sizes, said once
    monkeypatch.setattr(loop, "LINK_SIZING_WAIT_S", 30)
    began = time.monotonic()
    assert daemon._fetch_sizes == (16 << 20, 4 << 20)
    assert time.monotonic() - began < 1   # nobody waits again (the main thread sizes each round from it)
    assert caplog.text.count("link_sizing_late") == 1
    release.set()
    daemon._sizes_measured.result(5)
    assert daemon._fetch_sizes == (36_000_000, 36_000_000)   # lanes opened after it ended take its sizes
