"""Consumer groups of one cluster, the groups part of its admin facade (:mod:`mirror_core.kafka.admin`): list,
describe, read and commit offsets (the group sync's and the prune watch's I/O; the decisions are
:mod:`mirror_core.model.group_translation`).
"""

from __future__ import annotations

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.model.group_translation import (
    CommittedOffset,
    PartitionDecision,
    TargetGroup,
    TopicPartitionKey,
)

REQUEST_TIMEOUT_S = 30.0


class ConsumerGroupAdmin:
    """Consumer groups of one cluster through confluent-kafka's AdminClient; errors name the cluster and group."""

    def __init__(self, cluster: ClusterConfig, *, timeout_s: float = REQUEST_TIMEOUT_S,
                 admin: ClusterAdmin | None = None):
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._wait_s = timeout_s + 10  # past the request timeout, so the client's own error (with its reason) wins
        self._facade = admin if admin is not None else ClusterAdmin(cluster, timeout_s=timeout_s)
        self._admin = self._facade.client

    def list_group_ids(self) -> list[str]:
        try:
            result = self._admin.list_consumer_groups(request_timeout=self.timeout_s).result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001 - confluent raises KafkaException wrapping a KafkaError
            raise self._facade.failure("list consumer groups", exc) from None
        if result.errors:  # a partial list would silently leave groups behind
            raise self._facade.failure("list the consumer groups", result.errors[0])
        return [listing.group_id for listing in result.valid]

    def committed(self, group: str) -> dict[TopicPartitionKey, CommittedOffset]:
        """The group's committed offsets (stable: offsets of an open transaction are waited for)."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        request = [ConsumerGroupTopicPartitions(group)]
        try:
            future = self._admin.list_consumer_group_offsets(request, require_stable=True,
                                                             request_timeout=self.timeout_s)[group]
            result = future.result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001
            raise self._facade.failure("read the committed offsets", exc, group) from None
        out = {}
        for tp in result.topic_partitions or ():
            if tp.error is not None:
                raise self._facade.failure(f"read the committed offset of {tp.topic}-{tp.partition}", tp.error, group)
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = CommittedOffset(tp.offset, tp.metadata or None)
        return out

    def committed_many(self, groups: list[str], partitions: list[TopicPartitionKey]
                       ) -> dict[str, dict[TopicPartitionKey, CommittedOffset]]:
        """Each group's committed offsets for ``partitions`` only, all groups asked at once (one request per
        group, in flight together: a source with thousands of groups costs about one round trip, not thousands)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        futures = {}
        for group in groups:
            try:
                futures[group] = self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group, wanted)], require_stable=True,
                    request_timeout=self.timeout_s)[group]
            except Exception as exc:  # noqa: BLE001
                raise self._facade.failure("read the committed offsets", exc, group) from None
        out: dict[str, dict[TopicPartitionKey, CommittedOffset]] = {}
        for group, future in futures.items():
            try:
                result = future.result(timeout=self._wait_s)
            except Exception as exc:  # noqa: BLE001
                raise self._facade.failure("read the committed offsets", exc, group) from None
            held = out[group] = {}
            for tp in result.topic_partitions or ():
                if tp.error is not None:
                    raise self._facade.failure(f"read the committed offset of {tp.topic}-{tp.partition}", tp.error,
                                               group)
                if tp.offset >= 0:
                    held[(tp.topic, tp.partition)] = CommittedOffset(tp.offset, tp.metadata or None)
        return out

    def describe(self, groups: list[str]) -> dict[str, TargetGroup]:
        """State and members of each group, with its committed offsets (a group never seen is Dead, no offsets)."""
        if not groups:
            return {}
        futures = self._facade.describe_groups(groups)
        out = {}
        for group in groups:
            try:
                description = futures[group].result(timeout=self._wait_s)
            except Exception as exc:  # noqa: BLE001
                raise self._facade.failure("describe the consumer group", exc, group) from None
            committed = {tp: c.offset for tp, c in self.committed(group).items()}
            out[group] = TargetGroup(state=description.state.name, members=len(description.members),
                                     committed=committed)
        return out

    def commit(self, group: str, offsets: list[PartitionDecision]) -> None:
        """Commit the decisions' target offsets for ``group`` (the broker refuses it if the group has members).

        The source's leader epoch is not carried over: it means nothing on the target's partitions."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        partitions = [TopicPartition(d.target_topic, d.target_partition, d.target_offset, metadata=d.metadata)
                      if d.metadata else TopicPartition(d.target_topic, d.target_partition, d.target_offset)
                      for d in offsets]
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            future = self._admin.alter_consumer_group_offsets(request, request_timeout=self.timeout_s)[group]
            result = future.result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001
            raise self._facade.failure("commit offsets", exc, group) from None
        for tp in result.topic_partitions or ():
            if tp.error is not None:
                raise self._facade.failure(f"commit offset {tp.offset} on {tp.topic}-{tp.partition}", tp.error, group)
