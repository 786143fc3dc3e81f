"""Topic administration on one cluster, the topics part of its admin facade (:mod:`mirror_core.kafka.admin`).

Small, blocking helpers with errors that name the cluster and topic. Used by the CLI, the demo and preflight.
"""

from __future__ import annotations

from collections.abc import Mapping

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.kafka.wire_client import WireClient


class TopicAdmin:
    """Create, describe and delete topics on one cluster."""

    def __init__(self, cluster: ClusterConfig, *, timeout_s: float = 30.0, admin: ClusterAdmin | None = None):
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._facade = admin if admin is not None else ClusterAdmin(cluster, timeout_s=timeout_s)
        self._admin = self._facade.client

    def list_topics(self) -> dict[str, int]:
        """Topic name -> partition count."""
        md = self._admin.list_topics(timeout=self.timeout_s)
        return {name: len(t.partitions) for name, t in md.topics.items()}

    def replication_factor(self, topic: str) -> int | None:
        """How many replicas ``topic``'s partitions have (the smallest; None when the topic is unknown)."""
        md = self._admin.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
        if md is None or md.error is not None or not md.partitions:
            return None
        return min(len(p.replicas) for p in md.partitions.values())

    def broker_count(self) -> int:
        return len(self._admin.list_topics(timeout=self.timeout_s).brokers)

    def exists(self, topic: str) -> bool:
        return topic in self.list_topics()

    def create(self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None,
               *, exist_ok: bool = False, replication_factor: int = 1) -> bool:
        """Create ``topic``; True when this call created it, False when it already existed (``exist_ok``): then its
        settings are whatever its creator gave it, not ``config``."""
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import NewTopic

        new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                       config=dict(config or {}))
        fut = self._admin.create_topics([new], operation_timeout=self.timeout_s)[topic]
        try:
            fut.result(timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - confluent raises KafkaException wrapping KafkaError
            err = exc.args[0] if exc.args else None
            if exist_ok and getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise MirrorError(f"cluster {self.cluster.name!r}: could not create topic {topic!r}: {exc}") from None
        return True

    def topic_id(self, topic: str) -> str | None:
        """The topic id the broker serves for ``topic`` (None when it does not know the topic)."""
        from confluent_kafka import TopicCollection

        try:
            return str(self._admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=self.timeout_s)
                       .topic_id)
        except Exception:  # noqa: BLE001 - unknown topic
            return None

    def recreate(self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> None:
        """Delete ``topic`` if present and create it anew, returning only once the broker serves the *new* topic.

        A broker applies metadata after its controller: right after a restart it can still lead the old topic's
        partitions for a moment, and a produce by name then lands in the old log and is deleted with it. So this
        waits until the broker reports a topic id different from the old one, with a leader for every partition.
        """
        import time

        old_id = self.topic_id(topic)
        self.delete(topic)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.create(topic, partitions, config)
                break
            except MirrorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        while True:
            current = self.topic_id(topic)
            if current is not None and current != old_id and self.list_topics().get(topic) == partitions:
                return
            if time.monotonic() > deadline:
                raise MirrorError(f"cluster {self.cluster.name!r}: recreated topic {topic!r} is not served yet "
                                  f"(broker still reports topic id {current})")
            time.sleep(0.2)

    def delete(self, topic: str, *, missing_ok: bool = True) -> None:
        from confluent_kafka import KafkaError

        fut = self._admin.delete_topics([topic], operation_timeout=self.timeout_s)[topic]
        try:
            fut.result(timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001
            err = exc.args[0] if exc.args else None
            if missing_ok and getattr(err, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return
            raise MirrorError(f"cluster {self.cluster.name!r}: could not delete topic {topic!r}: {exc}") from None

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow ``topic`` to ``total`` partitions (Kafka never shrinks a topic)."""
        from confluent_kafka.admin import NewPartitions

        fut = self._admin.create_partitions([NewPartitions(topic, total)], operation_timeout=self.timeout_s)[topic]
        try:
            fut.result(timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001
            raise MirrorError(f"cluster {self.cluster.name!r}: could not grow {topic!r} to {total} partitions: "
                              f"{exc}") from None

    def configs(self, topic: str) -> dict[str, str]:
        """The topic's configs (:meth:`~mirror_core.kafka.admin.ClusterAdmin.topic_configs`: a topic created a
        moment ago is asked again for a few seconds)."""
        return self._facade.topic_configs(topic)


def topic_metadata_or_error(client: WireClient, topic: str):
    """Topic metadata, or a one-line ConfigError naming cluster and topic when it does not exist."""
    import kafka.errors as Errors

    try:
        return client.topic_metadata(topic, refresh=True)
    except Errors.UnknownTopicOrPartitionError:
        raise ConfigError(f"topic {topic!r} does not exist on cluster {client.cluster_name!r}") from None
    except Errors.TopicAuthorizationFailedError:
        raise ConfigError(f"not authorized to describe topic {topic!r} on cluster {client.cluster_name!r}") from None
