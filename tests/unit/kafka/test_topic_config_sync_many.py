"""The daemon's periodic config sync of many topics (issue #18): one admin client and one DescribeConfigs call per
cluster for all topics, not two admin clients per topic on the main thread — and still each topic's own outcome:
a missing or failing topic is named alone, the others are synced, changes are applied only where needed."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace as NS

import pytest
from confluent_kafka import KafkaError, KafkaException

import mirror_core.kafka.topic_config_sync as tcs
from mirror_core.model.preflight_rules import DataFacts, TopicState, plan_target_configs

BASE = {"cleanup.policy": "delete", "retention.ms": "604800000", "retention.bytes": "-1",
        "compression.type": "producer", "max.message.bytes": "1048588", "delete.retention.ms": "86400000",
        "min.compaction.lag.ms": "0", "max.compaction.lag.ms": "9223372036854775807",
        "min.cleanable.dirty.ratio": "0.5", "message.timestamp.before.max.ms": "9223372036854775807",
        "message.timestamp.after.max.ms": "3600000", "message.timestamp.type": "CreateTime"}


def _entries(values: dict[str, str], overrides=()) -> dict:
    return {k: NS(value=v, source=1 if k in overrides else 5, synonyms={}) for k, v in values.items()}


class Cluster:
    """One cluster's topics as DescribeConfigs answers them (a dict of entries, or an exception to raise)."""

    def __init__(self, name: str, topics: dict):
        self.name, self.topics = name, topics
        self.admins, self.describe_calls, self.altered = 0, [], []

    def confluent(self):
        return {"bootstrap.servers": self.name, "__cluster": self}


class Admin:
    def __init__(self, conf):
        self.cluster = conf["__cluster"]
        self.cluster.admins += 1

    def describe_configs(self, resources, request_timeout=None):
        self.cluster.describe_calls.append(sorted(r.name for r in resources))
        out = {}
        for r in resources:
            f = concurrent.futures.Future()
            found = self.cluster.topics.get(r.name, KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            f.set_exception(found) if isinstance(found, Exception) else f.set_result(found)
            out[r] = f
        return out

    def incremental_alter_configs(self, resources, request_timeout=None):
        out = {}
        for r in resources:
            self.cluster.altered.append((r.name, sorted(e.name for e in r.incremental_configs)))
            f = concurrent.futures.Future()
            f.set_result(None)
            out[r] = f
        return out


@pytest.mark.timeout(20)
def test_many_topics_are_synced_through_one_admin_client_and_one_describe_per_cluster(monkeypatch):
    import confluent_kafka.admin as admin_module

    monkeypatch.setattr(admin_module, "AdminClient", Admin)
    in_sync_target = plan_target_configs(TopicState("src", "a", 1, BASE), DataFacts(now_ms=0))[0]
    source = Cluster("src", {
        "a": _entries(BASE),
        "b": _entries({**BASE, "retention.ms": "3600000"}, overrides={"retention.ms"}),   # lowered on the source
        "c": KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT)),                    # its describe fails
        "e": _entries(BASE),
    })
    target = Cluster("dst", {f"dr.{t}": _entries({**BASE, **in_sync_target}, overrides=in_sync_target)
                             for t in ("a", "b", "c")})                                   # dr.e is missing
    pairs = [(t, f"dr.{t}") for t in ("a", "b", "c", "d", "e")]                           # d: gone from the source
    results = tcs.sync_many_topic_configs(source, target, pairs)
    assert (source.admins, target.admins) == (1, 1)
    assert source.describe_calls == [["a", "b", "c", "d", "e"]]
    assert target.describe_calls == [["dr.a", "dr.b", "dr.c", "dr.d", "dr.e"]]
    assert results["a"] == []
    assert [c.key for c in results["b"]] == ["retention.ms"] and results["b"][0].new_value == "3600000"
    assert target.altered == [("dr.b", ["retention.ms"])]
    for topic, cluster, named, says in (("c", "src", "c", "DescribeConfigs failed"),
                                        ("d", "src", "d", "source topic does not exist"),
                                        ("e", "dst", "dr.e", "target topic of src/e does not exist")):
        error = results[topic]
        assert isinstance(error, tcs.TopicConfigSyncError), (topic, error)
        assert (error.cluster, error.topic) == (cluster, named) and says in str(error), error
    assert results["c"].retriable
