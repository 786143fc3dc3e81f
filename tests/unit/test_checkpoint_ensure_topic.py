"""``CheckpointStore.ensure_topic`` when the metadata that answered did not list the topic yet but the cluster has
it (created a moment ago, by an operator or another process): its settings are checked like any existing topic's.
Found by CI: a topic created with ``cleanup.policy=compact,delete`` just before was accepted unchecked, because
the create call's TOPIC_ALREADY_EXISTS was taken as "created with our settings"."""
from __future__ import annotations

import pytest

import mirror_core.topics as topics
from mirror_core.checkpoint import CheckpointStore
from mirror_core.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError

TOPIC = "_shoal_checkpoints"


class LaggingAdmin:
    """A cluster that has ``TOPIC`` with ``configs``, whose metadata lists it only from the ``listed_after``-th
    list_topics call on."""

    configs_by_topic: dict[str, str] = {}
    listed_after = 1
    partitions = 4

    def __init__(self, *_a, **_k):
        self.calls = 0

    def list_topics(self):
        self.calls += 1
        return {TOPIC: self.partitions} if self.calls > self.listed_after else {}

    def broker_count(self):
        return 1

    def create(self, topic, partitions, config, *, exist_ok=False, replication_factor=1):
        assert exist_ok and topic == TOPIC
        return False  # TOPIC_ALREADY_EXISTS

    def configs(self, topic):
        return dict(self.configs_by_topic)

    def replication_factor(self, topic):
        return 1


def _store(partitions=4):
    return CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "t:9092"}), client=None,
                           topic=TOPIC, partitions=partitions)


@pytest.fixture
def admin(monkeypatch):
    monkeypatch.setattr(topics, "TopicAdmin", LaggingAdmin)
    LaggingAdmin.configs_by_topic = {"cleanup.policy": "compact", "max.message.bytes": "10485760"}
    LaggingAdmin.listed_after, LaggingAdmin.partitions = 1, 4
    return LaggingAdmin


def test_a_topic_that_existed_after_all_has_its_settings_checked(admin):
    admin.configs_by_topic = {"cleanup.policy": "compact,delete"}
    with pytest.raises(ConfigError, match="cleanup.policy=compact,delete"):
        _store().ensure_topic()


def test_a_topic_that_existed_after_all_has_its_partition_count_checked(admin):
    admin.partitions = 2
    with pytest.raises(MirrorError, match="has 2 partitions, Shoal expects 4"):
        _store().ensure_topic()


def test_a_topic_that_existed_after_all_with_good_settings_is_accepted(admin):
    admin.listed_after = 3  # the metadata catches up only on the third ask
    _store().ensure_topic()


def test_a_topic_the_metadata_never_lists_is_a_clear_error(admin, monkeypatch):
    admin.listed_after = 10**9
    monkeypatch.setattr(CheckpointStore, "METADATA_CATCH_UP_S", 0.3)
    with pytest.raises(MirrorError, match="exists .* but its metadata did not list it within 0.3 s"):
        _store().ensure_topic()
