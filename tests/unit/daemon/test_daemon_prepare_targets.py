"""The daemon's target preparation for new topics (issue 18's batched start-up): preflights run side by side, and
what one topic's trouble does to the others and to what the operator sees."""
from __future__ import annotations

import logging

import pytest

import mirror_core.daemon.loop as D
from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.errors import MirrorError

BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}


class Admin:
    def __init__(self, *_a, **_k):
        pass

    def list_topics(self):
        return {}


@pytest.mark.timeout(20)
def test_every_topic_whose_preflight_failed_unexpectedly_is_named_not_only_the_first(monkeypatch, caplog):
    """Two topics fail with errors that are not refusals (the cluster, not the topic): the rescan fails with the
    first, as before, and each is logged with its own topic — before, the second was never told anywhere."""
    import mirror_core.kafka.topics as topics

    monkeypatch.setattr(topics, "TopicAdmin", Admin)
    failures = {"orders.a": ConnectionError("target gone for orders.a"),
                "orders.c": TimeoutError("describe timed out for orders.c"),
                "orders.d": MirrorError("orders.d: refused by the preflight")}

    def prepare(self, topic, target_topic, partitions, existing, admin):
        if topic in failures:
            raise failures[topic]

    monkeypatch.setattr(D.ShallowMirrorDaemon, "_prepare_target", prepare)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    unprepared = [(t, f"dr.{t}", 1) for t in ("orders.a", "orders.b", "orders.c", "orders.d")]
    with caplog.at_level(logging.INFO, logger="shoal.daemon"):
        passed, unexpected = daemon._prepare_targets(unprepared)
    assert passed == [("orders.b", "dr.orders.b", 1)]
    assert unexpected is failures["orders.a"]
    failed = [r.getMessage() for r in caplog.records if "event=preflight_failed" in r.getMessage()]
    assert len(failed) == 2, failed
    assert any("topic=orders.a " in m and "target gone for orders.a" in m for m in failed), failed
    assert any("topic=orders.c " in m and "describe timed out for orders.c" in m for m in failed), failed
    refused = [r.getMessage() for r in caplog.records if "event=preflight_refused" in r.getMessage()]
    assert len(refused) == 1 and "topic=orders.d " in refused[0], refused
