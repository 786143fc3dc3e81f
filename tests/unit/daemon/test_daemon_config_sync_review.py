"""Review of the config sync off the main thread (issue #18, commit 601c196, branch review-configsync).

- The watch's batched sync plans from a describe made before it applies; the main thread's one-topic repair
  (``_repaired_by_config_sync``) may run in between. Before 601c196 both ran on the main thread, one after the
  other; now the batch can apply its older plan *after* the repair, lowering a bound the repair just raised
  (``max.message.bytes``: the source raised it twice) — the rejected batch is refused again, after a repair, and
  the lane halts.
- An exception escaping one sync's bookkeeping ended the thread for good: every later ``submit`` waited forever,
  nothing logged, nothing counted (before 601c196 it failed that rescan, logged and counted, and the next one ran).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from types import SimpleNamespace as NS

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.daemon.config_sync import ConfigSyncWatch
from mirror_core.daemon.lane_state import LaneState
from mirror_core.daemon.metrics import DaemonMetrics
from mirror_core.errors import BatchRejectedError
from tests.unit.daemon.test_daemon_rescan import BASE
from tests.unit.kafka.test_topic_config_sync_many import BASE as CONFIGS


def _entry(value, override=True):
    return NS(value=value, source=1 if override else 5, synonyms={})


class World:
    """Both clusters' topic configs, by bootstrap server (BASE: source a:9092, target b:9092). DescribeConfigs on
    the target from the watch's thread answers, then holds until ``release`` (the batch between plan and apply)."""

    def __init__(self):
        self.topics = {"a:9092": {"orders.a": {k: _entry(v, False) for k, v in CONFIGS.items()}},
                       "b:9092": {"dr.orders.a": {k: _entry(v) for k, v in CONFIGS.items()}}}
        self.batch_planned, self.release = threading.Event(), threading.Event()

    def admin(self, conf):
        world, server = self, conf["bootstrap.servers"]

        class Admin:
            def describe_configs(self, resources, request_timeout=None):
                out = {}
                for r in resources:
                    f = concurrent.futures.Future()
                    f.set_result(dict(world.topics[server][r.name]))  # a snapshot, as the broker answers
                    out[r] = f
                if server == "b:9092" and threading.current_thread().name == "shoal-config-sync":
                    world.batch_planned.set()
                    assert world.release.wait(10)
                return out

            def incremental_alter_configs(self, resources, request_timeout=None):
                out = {}
                for r in resources:
                    for e in r.incremental_configs:
                        world.topics[server][r.name][e.name] = _entry(e.value)
                    f = concurrent.futures.Future()
                    f.set_result(None)
                    out[r] = f
                return out

        return Admin()


@pytest.mark.timeout(30)
def test_the_batched_sync_does_not_undo_a_repair_made_while_it_ran(monkeypatch):
    import confluent_kafka.admin as admin_module

    world = World()
    monkeypatch.setattr(admin_module, "AdminClient", world.admin)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    world.topics["a:9092"]["orders.a"]["max.message.bytes"] = _entry("2000000")  # raised on the source
    daemon.config_sync.submit([("orders.a", "dr.orders.a")])  # the periodic sync: plans 1048588 -> 2000000
    assert world.batch_planned.wait(5)
    # meanwhile: the source raised it again, a 3 MB batch was written and copied, the target refused it
    world.topics["a:9092"]["orders.a"]["max.message.bytes"] = _entry("4000000")
    state = LaneState("orders.a", 0, "dr.orders.a", "dr.orders.a-0", health=daemon._new_health())
    rejected = BatchRejectedError("target", "dr.orders.a", 0, 100, "MESSAGE_SIZE_TOO_LARGE")
    repair = threading.Thread(target=lambda: repaired.append(daemon._repaired_by_config_sync(state, rejected)),
                              daemon=True)
    repaired: list[bool] = []
    repair.start()  # the main thread's repair (may wait for the batch: it must not be undone by it)
    repair.join(1)
    world.release.set()
    repair.join(10)
    assert daemon.config_sync.idle(10) and repaired == [True]
    daemon.config_sync.stop()
    assert world.topics["b:9092"]["dr.orders.a"]["max.message.bytes"].value == "4000000", \
        "the batched sync applied its older plan after the repair: the target's bound was lowered again"


@pytest.mark.timeout(20)
def test_a_sync_that_fails_unexpectedly_does_not_end_the_watch(caplog):
    answers = [lambda pairs: {}, lambda pairs: {topic: [] for topic, _ in pairs}]  # the first: a topic missing
    calls = []

    def sync(source, target, pairs):
        calls.append(list(pairs))
        return answers[len(calls) - 1](pairs)

    cfg = pipeline_config_from_mapping(BASE)
    watch = ConfigSyncWatch(cfg.source, cfg.target, DaemonMetrics(), sync=sync)
    with caplog.at_level(logging.INFO, logger="shoal.daemon"):
        watch.submit([("a", "dr.a")])
        assert watch.idle(5)
        watch.submit([("a", "dr.a")])
        assert watch.idle(5), "the watch's thread had ended: the next sync never ran"
    assert len(calls) == 2 and "event=config_sync_failed" in caplog.text
    assert watch.metrics.registry.get_sample_value("shoal_errors_total", {"kind": "config_sync"}) == 1
    watch.stop()


@pytest.mark.timeout(30)
def test_a_rejection_the_periodic_sync_repaired_meanwhile_is_retried_not_halted(monkeypatch):
    """Before 601c196 the periodic sync ran on the main thread between rounds: never while a lane's batch was on
    its way to the target. Now it can raise the target's bound after the target refused a batch and before the
    main thread's repair looks: the repair finds nothing to change and the lane halted, although the target now
    takes the batch."""
    import confluent_kafka.admin as admin_module

    world = World()
    world.release.set()
    monkeypatch.setattr(admin_module, "AdminClient", world.admin)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    world.topics["a:9092"]["orders.a"]["max.message.bytes"] = _entry("4000000")  # raised on the source
    rejected = BatchRejectedError("target", "dr.orders.a", 0, 100, "MESSAGE_SIZE_TOO_LARGE")  # a 3 MB batch: refused
    daemon.config_sync.submit([("orders.a", "dr.orders.a")])  # the periodic sync, on its thread, meanwhile
    assert daemon.config_sync.idle(10)
    assert world.topics["b:9092"]["dr.orders.a"]["max.message.bytes"].value == "4000000"
    state = LaneState("orders.a", 0, "dr.orders.a", "dr.orders.a-0", health=daemon._new_health())
    assert daemon._repaired_by_config_sync(state, rejected), \
        "the lane halts: its repair found the target already raised (by the periodic sync, after the refusal)"
    assert not daemon._repaired_by_config_sync(state, rejected)  # the same batch refused again: halts, as before
    daemon.config_sync.stop()
