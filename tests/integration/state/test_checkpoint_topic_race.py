"""Two daemons starting at once both find no checkpoint topic and both create it: one create wins, the other gets
TOPIC_ALREADY_EXISTS and must then check — and accept — the winner's topic (good settings), even though the
metadata or DescribeConfigs may not know it yet. Real target broker (the sandbox's)."""

from __future__ import annotations

import threading

import pytest

import mirror_core.kafka.topics as topics
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG

PARTITIONS = 3
ROUNDS = 3


@pytest.mark.timeout(120)
def test_two_stores_creating_the_checkpoint_topic_at_once_both_accept_it(target_cluster, unique_name, monkeypatch):
    created: list[bool] = []  # what each create call answered (False: TOPIC_ALREADY_EXISTS, the race)
    real_create = topics.TopicAdmin.create

    def create(self, *args, **kwargs):
        created.append(real_create(self, *args, **kwargs))
        return created[-1]

    monkeypatch.setattr(topics.TopicAdmin, "create", create)
    for _ in range(ROUNDS):
        topic = unique_name("checkpoints")
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def ensure(topic=topic, start=start, errors=errors):
            store = CheckpointStore(target_cluster.config, client=None, topic=topic, partitions=PARTITIONS)
            start.wait(timeout=30)
            try:
                store.ensure_topic()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=ensure) for _ in range(2)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not any(thread.is_alive() for thread in threads), "ensure_topic hung"
            assert errors == [], f"a store refused the other's good checkpoint topic: {errors}"
            configs = target_cluster.admin.configs(topic)
            assert configs["cleanup.policy"] == CHECKPOINT_TOPIC_CONFIG["cleanup.policy"]
            assert target_cluster.admin.list_topics()[topic] == PARTITIONS
        finally:
            target_cluster.admin.delete(topic)
    assert False in created, f"no store lost the race in {ROUNDS} rounds (creates answered {created}): not tested"
