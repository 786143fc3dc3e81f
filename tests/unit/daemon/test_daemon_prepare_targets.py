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
    import mirror_core.kafka.admin as admins
    import mirror_core.kafka.topics as topics

    monkeypatch.setattr(topics, "TopicAdmin", Admin)
    monkeypatch.setattr(admins, "ClusterAdmin", Admin)
    failures = {"orders.a": ConnectionError("target gone for orders.a"),
                "orders.c": TimeoutError("describe timed out for orders.c"),
                "orders.d": MirrorError("orders.d: refused by the preflight")}

    def prepare(self, topic, target_topic, partitions, existing, admin, source_admin):
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


@pytest.mark.timeout(20)
def test_the_preflights_of_one_rescan_share_one_source_admin_client(monkeypatch):
    """Each preflight made its own source admin client: one more connection set-up (TCP, TLS, SASL) to the far
    source per new topic (~0.4 s at 200 ms in the clear, ~1.2 s over SASL_SSL)."""
    import mirror_core.daemon.rescans as rescans
    import mirror_core.kafka.admin as admins
    import mirror_core.kafka.topics as topics

    made = []

    class SourceAdmin(Admin):
        def __init__(self, cluster, **_k):
            made.append(cluster.name)

    seen = []

    def preflight(source, target, topic, **kwargs):
        seen.append(kwargs.get("source_admin"))
        return type("Report", (), {"raise_if_refused": lambda self: None, "created": False})()

    monkeypatch.setattr(topics, "TopicAdmin", Admin)
    monkeypatch.setattr(admins, "ClusterAdmin", SourceAdmin)
    monkeypatch.setattr(rescans, "run_preflight", preflight)
    daemon = D.ShallowMirrorDaemon(pipeline_config_from_mapping(BASE), worker_id="me")
    passed, unexpected = daemon._prepare_targets([(t, f"dr.{t}", 1) for t in ("orders.a", "orders.b", "orders.c")])
    assert unexpected is None and len(passed) == 3
    assert len(made) == 1 and len(seen) == 3 and all(admin is seen[0] for admin in seen), (made, seen)
    assert isinstance(seen[0], SourceAdmin)
