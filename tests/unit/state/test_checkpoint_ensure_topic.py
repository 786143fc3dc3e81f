"""``CheckpointStore.ensure_topic`` when the metadata that answered did not list the topic yet but the cluster has
it (created a moment ago, by an operator or another process): its settings are checked like any existing topic's.
Found by CI: a topic created with ``cleanup.policy=compact,delete`` just before was accepted unchecked, because
the create call's TOPIC_ALREADY_EXISTS was taken as "created with our settings"."""
from __future__ import annotations

import pytest

import mirror_core.kafka.topics as topics
from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.state.checkpoint import CheckpointStore

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


class UnevenMetadataAdmin(LaggingAdmin):
    """Like :class:`LaggingAdmin`, but the broker asked for the replication factor right after the metadata listed
    the topic is one that does not know it yet (``TopicAdmin.replication_factor`` answers None then: each metadata
    request may go to another broker, and a new topic reaches the brokers one after another)."""

    rf_unknown_for = 1

    def __init__(self, *_a, **_k):
        super().__init__()
        self.rf_calls = 0

    def replication_factor(self, topic):
        self.rf_calls += 1
        return None if self.rf_calls <= self.rf_unknown_for else 1


@pytest.mark.timeout(10)
def test_a_topic_that_existed_after_all_has_min_isr_checked_even_when_one_broker_lags(admin, monkeypatch):
    """Two daemons start at once; the other one (or an operator) created the topic with min.insync.replicas=2 on
    one replica: every checkpoint write would be refused for ever. A replication factor not known on the first
    ask must not skip the check that catches it."""
    monkeypatch.setattr(topics, "TopicAdmin", UnevenMetadataAdmin)
    UnevenMetadataAdmin.configs_by_topic = {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    with pytest.raises(ConfigError, match="min.insync.replicas=2 is above its replication factor"):
        _store().ensure_topic()
