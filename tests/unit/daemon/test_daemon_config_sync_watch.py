"""The daemon's periodic config sync runs on a thread of its own (issue #18): a sync slow on a large cluster
(2.4 s for 838 topics) held every fetch round while it ran. The rescan hands the list over and returns; every
outcome is still logged and counted, naming the topic; a newer list replaces a waiting one; a failed sync is
retried by the next one; a stopped watch syncs nothing more."""

from __future__ import annotations

import logging
import threading

import pytest

from mirror_core.daemon.config_sync import ConfigSyncWatch
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.errors import MirrorError
from tests.unit.daemon.test_daemon_rescan import Source, rescan_daemon


class SlowSync:
    """sync_many_topic_configs that blocks until ``release`` is set, recording the lists it was given."""

    def __init__(self, answer=None):
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[list[tuple[str, str]]] = []
        self.answer = answer

    def __call__(self, source, target, pairs):
        self.calls.append(list(pairs))
        self.started.set()
        assert self.release.wait(10)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(pairs) if self.answer else {topic: [] for topic, _ in pairs}


def _watch(sync) -> ConfigSyncWatch:
    from mirror_core.config.pipeline_file import pipeline_config_from_mapping
    from tests.unit.daemon.test_daemon_rescan import BASE

    cfg = pipeline_config_from_mapping(BASE)
    return ConfigSyncWatch(cfg.source, cfg.target, DaemonMetrics(), sync=sync)


@pytest.mark.timeout(20)
def test_the_rescan_does_not_wait_for_a_slow_config_sync(monkeypatch):
    source = Source({"orders.a": 2})
    daemon = rescan_daemon(monkeypatch, source)
    monkeypatch.undo()  # the real _sync_configs (rescan_daemon records them); keep its target preparation
    daemon.prepared = []
    monkeypatch.setattr(daemon, "_prepare_targets", lambda unprepared: (list(unprepared), None))
    slow = SlowSync()
    daemon.config_sync = _watch(slow)
    monkeypatch.setattr("mirror_core.kafka.topic_config_sync.sync_many_topic_configs", slow)  # whoever calls it
    daemon._next_config_sync = float("inf")
    daemon._rescan()  # the topic gets its lanes
    daemon._next_config_sync = 0.0  # the sync comes due
    done = threading.Event()
    runner = threading.Thread(target=lambda: (daemon._rescan(), done.set()), daemon=True)
    runner.start()
    try:
        assert slow.started.wait(5), "the due sync was not started"
        assert done.wait(2), "the rescan (the main thread) waited for the config sync"
    finally:
        slow.release.set()
    assert daemon.config_sync.idle(5) and slow.calls == [[("orders.a", "dr.orders.a")]]
    daemon.config_sync.stop()


@pytest.mark.timeout(20)
def test_every_outcome_is_logged_and_counted_naming_the_topic(caplog):
    def answer(pairs):
        return {"a": ["retention.ms: 1 -> 2"], "b": MirrorError("cluster 'target': topic 'dr.b' does not exist")}

    slow = SlowSync(answer)
    slow.release.set()
    watch = _watch(slow)
    with caplog.at_level(logging.INFO, logger="shoal.daemon"):
        watch.submit([("a", "dr.a"), ("b", "dr.b")])
        assert watch.idle(5)
    text = caplog.text
    assert "event=config_synced topic=a target_topic=dr.a change='retention.ms: 1 -> 2'" in text
    assert "event=config_sync_failed topic=b target_topic=dr.b error=cluster 'target': topic 'dr.b'" in text
    assert watch.metrics.registry.get_sample_value("shoal_errors_total", {"kind": "config_sync"}) == 1
    watch.stop()


@pytest.mark.timeout(20)
def test_a_failed_sync_is_logged_and_the_next_one_runs(caplog):
    slow = SlowSync(OSError("target unreachable"))
    slow.release.set()
    watch = _watch(slow)
    with caplog.at_level(logging.INFO, logger="shoal.daemon"):
        watch.submit([("a", "dr.a")])
        assert watch.idle(5)
        slow.answer = None
        watch.submit([("a", "dr.a")])
        assert watch.idle(5)
    assert "event=config_sync_failed source=" in caplog.text and "OSError: target unreachable" in caplog.text
    assert watch.syncs == 2 and len(slow.calls) == 2
    watch.stop()


@pytest.mark.timeout(20)
def test_a_newer_list_replaces_a_waiting_one_and_a_stopped_watch_syncs_nothing_more():
    slow = SlowSync()
    watch = _watch(slow)
    watch.submit([("a", "dr.a")])
    assert slow.started.wait(5)
    watch.submit([("a", "dr.a"), ("b", "dr.b")])  # waits behind the running sync ...
    watch.submit([("a", "dr.a"), ("b", "dr.b"), ("c", "dr.c")])  # ... and is replaced by the newer view
    slow.release.set()
    assert watch.idle(5)
    assert slow.calls == [[("a", "dr.a")], [("a", "dr.a"), ("b", "dr.b"), ("c", "dr.c")]]
    watch.stop()
    watch.submit([("d", "dr.d")])
    assert watch.idle(1) and len(slow.calls) == 2
