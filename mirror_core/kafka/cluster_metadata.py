"""What a :class:`~mirror_core.kafka.wire_client.WireClient` knows of its cluster: topic metadata (partition leaders,
leader epochs, topic ids) and group / transaction coordinators, cached and looked up (:class:`ClusterMetadata`).

Invariants: a topic's metadata is cached until :meth:`ClusterMetadata.invalidate`, a refresh, or an error on it (a
topic or partition error, a partition without a leader: dropped, so the next look-up asks); every Metadata answer
is stamped (:meth:`ClusterMetadata.metadata_stamp`) so callers can insist on one taken after a given moment; a
look-up that finds no known broker starts over once from the bootstrap addresses (the Java client's
``metadata.recovery.strategy=rebootstrap``), shortly only while the last such try found nobody; a coordinator hint
is taken once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as Errors
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest, MetadataRequest

REBOOTSTRAP_TIMEOUT_MS = 10_000  # a metadata request that found no known broker retries from the bootstrap list
COORDINATOR_KEYS_PER_REQUEST = 1_000  # keys in one batched FindCoordinator (find_coordinators)
REBOOTSTRAP_RETRY_TIMEOUT_MS = 2_000  # ... while the last re-bootstrap found no broker (the cluster is down)


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int            # -1 when there is no leader
    leader_epoch: int      # -1 when the broker did not say
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID | None   # None before Metadata v10 (Kafka 2.8)
    error_code: int
    partitions: dict[int, PartitionMetadata] = field(default_factory=dict)


def _topic_id_or_none(value) -> uuid.UUID | None:
    if value is None or value == uuid.UUID(int=0):
        return None
    return value

def _metadata_request(topics: Sequence[str]) -> MetadataRequest:
    """Metadata for ``topics`` by name, never auto-creating them."""
    return MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=t, topic_id=None) for t in topics],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


class ClusterMetadata:
    """The metadata side of :class:`~mirror_core.kafka.wire_client.WireClient` (a mixin: it asks through the
    client's ``send`` and ``api_version``, and keeps its caches, ``_topics``, ``_topic_answer``,
    ``_metadata_answers``, ``_coordinator_hints``, ``_rebootstrap_failed``, in the client, beside kafka-python's
    ``_manager``, which learns broker addresses and coordinators from the answers)."""

    def metadata(self, topics: list[str]) -> dict[str, TopicMetadata]:
        """Fetch metadata for ``topics`` (never auto-creates), update the leader cache and return it."""
        request = _metadata_request(topics)
        try:
            response = self.send(None, request)
        except (Errors.NodeNotReadyError, Errors.KafkaConnectionError):
            # every broker this client knows may be gone (stopped, replaced): start over from the bootstrap
            # addresses once, like the Java client's metadata.recovery.strategy=rebootstrap. After a re-bootstrap
            # that found nobody (the cluster is down), the next ones only look whether it is back: a caller's
            # loop (the daemon's) must not wait the full timeout on every look-up through a long outage
            timeout_ms = REBOOTSTRAP_RETRY_TIMEOUT_MS if self._rebootstrap_failed else REBOOTSTRAP_TIMEOUT_MS
            try:
                self._manager.bootstrap(timeout_ms, refresh=True)
            except Exception:
                self._rebootstrap_failed = True
                raise
            self._rebootstrap_failed = False
            response = self.send(None, request)
        self._manager.cluster.update_metadata(response)  # learn broker addresses for new leaders
        self._metadata_answers += 1
        result = {}
        for t in response.topics:
            parts = {
                p.partition_index: PartitionMetadata(
                    partition=p.partition_index, leader=p.leader_id, leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replica_nodes), isr=tuple(p.isr_nodes), error_code=p.error_code)
                for p in t.partitions
            }
            meta = TopicMetadata(name=t.name, topic_id=_topic_id_or_none(t.topic_id), error_code=t.error_code,
                                 partitions=parts)
            result[t.name] = meta
            self._topics[t.name] = meta
            self._topic_answer[t.name] = self._metadata_answers
        return result

    def broker_ids(self) -> list[int]:
        """The brokers of the cluster as the last Metadata answer listed them."""
        return sorted(broker.node_id for broker in self._manager.cluster.brokers()
                      if isinstance(broker.node_id, int) and broker.node_id >= 0)

    def topic_known_by(self, node_id: int, topic: str) -> str | None:
        """Whether broker ``node_id`` itself knows ``topic`` now: its topic id ("" when it gives none), or None when
        it answers that the topic does not exist. One broker's view, asked of that broker: the caches are not
        updated from it (a broker behind on metadata must not overwrite the cluster's view). Raises kafka-python
        errors for transport trouble."""
        response = self.send(node_id, _metadata_request([topic]))
        for t in response.topics:
            if t.name != topic:
                continue
            if t.error_code == Errors.UnknownTopicOrPartitionError.errno:
                return None
            if t.error_code:
                raise Errors.for_code(t.error_code)(topic)
            topic_id = _topic_id_or_none(t.topic_id)
            return str(topic_id) if topic_id else ""
        return None

    def metadata_stamp(self) -> int:
        """A stamp of this client's metadata: the count of Metadata answers taken so far (a later answer has a
        larger stamp). Keep it when cached metadata stops being trusted; :meth:`topic_metadata_since` then
        accepts only an answer taken after it."""
        return self._metadata_answers

    def topic_metadata_since(self, topic: str, stamp: int) -> TopicMetadata:
        """The topic's metadata from an answer taken after ``stamp`` (:meth:`metadata_stamp`): the cached one when
        it is that fresh, else asked for now. So the partitions of one topic that all need a fresh look-up (a
        daemon opening 2,000 lanes of 40 topics, a leader move) share one answer per topic, not one per partition."""
        fresh = topic in self._topics and self._topic_answer.get(topic, -1) > stamp
        return self.topic_metadata(topic, refresh=not fresh)

    def topic_metadata(self, topic: str, *, refresh: bool = False) -> TopicMetadata:
        """Cached metadata for one topic, fetched when missing or when ``refresh``; raises on a topic error."""
        meta = None if refresh else self._topics.get(topic)
        if meta is None:
            meta = self.metadata([topic]).get(topic)
        if meta is None:
            raise Errors.UnknownTopicOrPartitionError(topic)
        if meta.error_code:
            self._topics.pop(topic, None)
            raise Errors.for_code(meta.error_code)(topic)
        return meta

    def leader_for(self, topic: str, partition: int, *, refresh: bool = False) -> tuple[int, int]:
        """(leader node id, leader epoch) of a partition; raises a retriable error when there is none yet."""
        meta = self.topic_metadata(topic, refresh=refresh)
        part = meta.partitions.get(partition)
        if part is None:
            self._topics.pop(topic, None)
            raise Errors.UnknownTopicOrPartitionError(f"{topic}-{partition}")
        if part.leader < 0:
            self._topics.pop(topic, None)
            raise Errors.LeaderNotAvailableError(f"{topic}-{partition}")
        return part.leader, part.leader_epoch

    def invalidate(self, topic: str) -> None:
        """Forget cached metadata of ``topic`` so the next lookup asks the cluster (after NOT_LEADER etc.)."""
        self._topics.pop(topic, None)

    def find_coordinators(self, keys: Sequence[str], key_type: CoordinatorType = CoordinatorType.TRANSACTION, *,
                          timeout_s: float | None = None) -> dict[str, Any]:
        """Many coordinators in few requests (FindCoordinator v4+, KIP-699: up to
        :data:`COORDINATOR_KEYS_PER_REQUEST` keys each): key → the answer's entry, for the keys answered without
        an error (a key still loading, say, is left out: its owner looks it up itself). Empty when the broker's
        FindCoordinator is older than v4 (one key per request). The entries are for :meth:`hint_coordinator` on
        this or another client of the cluster: a daemon opening 2,000 lanes asks once, not 2,000 times.
        ``timeout_s``: all the requests together end within it (raising the timeout, or returning what was found
        when the time ran out between requests), for a caller that must not wait a whole request timeout."""
        if not keys or self.api_version(FindCoordinatorRequest) < 4:
            return {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        found: dict[str, Any] = {}
        keys = list(keys)
        for begin in range(0, len(keys), COORDINATOR_KEYS_PER_REQUEST):
            chunk = keys[begin:begin + COORDINATOR_KEYS_PER_REQUEST]
            timeout_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if timeout_ms is not None and timeout_ms <= 0:
                return found
            try:
                response = self.send(None, FindCoordinatorRequest(key=chunk[0], key_type=int(key_type),
                                                                  coordinator_keys=chunk), timeout_ms=timeout_ms)
            except Errors.KafkaError:
                if found:  # a later chunk failed: keep what the earlier ones found (the rest ask alone)
                    return found
                raise
            if response.API_VERSION < 4:  # negotiated down by the node that answered: nothing batched
                return found
            for entry in response.coordinators:
                if entry.error_code == 0:
                    found[entry.key] = entry
        return found

    def hint_coordinator(self, key: str, entry: Any, key_type: CoordinatorType = CoordinatorType.TRANSACTION
                         ) -> None:
        """Let the next :meth:`find_coordinator` of ``key`` on this client take ``entry`` (from
        :meth:`find_coordinators`, possibly another client's) instead of asking. Used once: a caller that meets
        NOT_COORDINATOR (or any retriable error) looks the key up again, and that look-up asks the cluster."""
        self._coordinator_hints[(int(key_type), key)] = entry

    def find_coordinator(self, key: str, key_type: CoordinatorType = CoordinatorType.TRANSACTION) -> int:
        """Node id of the group or transaction coordinator for ``key`` (raises retriable errors while loading);
        a hint left by :meth:`hint_coordinator` is taken (once) instead of a request."""
        hint = self._coordinator_hints.pop((int(key_type), key), None)
        if hint is not None:
            self._manager.cluster.add_coordinator(hint, key_type, key, synthesize_node_id=False)
            return hint.node_id
        request = FindCoordinatorRequest(key=key, key_type=int(key_type), coordinator_keys=[key])
        response = self.send(None, request)
        entry = response.coordinators[0] if response.API_VERSION >= 4 else response
        error = Errors.for_code(entry.error_code)
        if error is not Errors.NoError:
            raise error(key)
        self._manager.cluster.add_coordinator(entry, key_type, key, synthesize_node_id=False)
        return entry.node_id
