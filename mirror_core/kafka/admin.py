"""One cluster's admin facade: the one place Shoal builds a confluent-kafka ``AdminClient``.

:class:`ClusterAdmin` is built from a :class:`~mirror_core.config.cluster.ClusterConfig` (plus client overrides such
as ``log_level`` or ``error_cb``) and a timeout, and answers for that cluster: its metadata and brokers, topic and
broker configs (describe, alter), admin-API offsets, consumer group descriptions, and through its parts the topic
administration (:attr:`ClusterAdmin.topics`, :class:`~mirror_core.kafka.topics.TopicAdmin`) and the consumer
groups (:attr:`ClusterAdmin.groups`, :class:`~mirror_core.kafka.group_admin.ConsumerGroupAdmin`). Failures it turns
into errors name the cluster (:meth:`ClusterAdmin.failure`, :func:`describe_kafka_error`); the calls that answer
per resource (DescribeConfigs, ListOffsets, DescribeConsumerGroups of many) hand back the client's futures, so one
resource's failure stays its own. confluent-kafka is imported when a facade is built, never at import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ClusterUnavailableError, ConfigError, MirrorError

if TYPE_CHECKING:
    from mirror_core.kafka.group_admin import ConsumerGroupAdmin
    from mirror_core.kafka.topics import TopicAdmin

DEFAULT_TIMEOUT_S = 30.0
_FILE_SETTINGS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")


class ClusterAdmin:
    """confluent-kafka's AdminClient for one cluster, with its timeout; errors name the cluster.

    ``client_settings`` override the cluster's confluent-kafka settings for this client only (``log_level=3`` where
    a caller reports the failures itself, ``error_cb`` to collect the client's own errors)."""

    def __init__(self, cluster: ClusterConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, **client_settings: object):
        """A setting librdkafka refuses while building the client (a TLS file that is not there, say) is a
        :class:`ConfigError` naming the cluster, not librdkafka's exception."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        self.cluster = cluster
        self.timeout_s = timeout_s
        try:
            self.client = AdminClient(cluster.confluent(**client_settings))
        except KafkaException as exc:
            missing = [f"{key} {cluster.settings[key]}" for key in _FILE_SETTINGS
                       if cluster.settings.get(key) and not os.path.exists(str(cluster.settings[key]))]
            reason = f"no such file: {', '.join(missing)}" if missing else \
                f"client settings unusable ({describe_kafka_error(exc)}); check its ssl.* and sasl.* settings"
            raise ConfigError(f"cluster {cluster.name!r}: {reason}") from None

    # -- its parts ------------------------------------------------------------------------------------------------

    @cached_property
    def topics(self) -> TopicAdmin:
        """Create, describe and delete topics through this client."""
        from mirror_core.kafka.topics import TopicAdmin

        return TopicAdmin(self.cluster, timeout_s=self.timeout_s, admin=self)

    @cached_property
    def groups(self) -> ConsumerGroupAdmin:
        """The cluster's consumer groups through this client."""
        from mirror_core.kafka.group_admin import ConsumerGroupAdmin

        return ConsumerGroupAdmin(self.cluster, timeout_s=self.timeout_s, admin=self)

    def failure(self, what: str, error: object, group: str | None = None) -> MirrorError:
        """``cluster 'x' (bootstrap): could not <what>[ of group 'g']: <the client's error>``."""
        where = f" of group {group!r}" if group is not None else ""
        return MirrorError(f"cluster {self.cluster.name!r} ({self.cluster.bootstrap}): could not {what}{where}: "
                           f"{describe_kafka_error(error)}")

    # -- cluster description ----------------------------------------------------------------------------------------

    def metadata(self, topic: str | None = None):
        """The client's metadata (all topics, or ``topic`` only) with the brokers; a cluster that does not answer
        is a :class:`ClusterUnavailableError` naming it."""
        try:
            if topic is None:
                return self.client.list_topics(timeout=self.timeout_s)
            return self.client.list_topics(topic, timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - KafkaException: transport or timeout
            what = "metadata" if topic is None else f"metadata for {topic!r}"
            raise ClusterUnavailableError(self.cluster.name, self.cluster.bootstrap, f"{what}: {exc}") from None

    # -- configs ----------------------------------------------------------------------------------------------------

    def describe_configs(self, resources: Sequence, *, request_timeout: float | None = None) -> dict:
        """DescribeConfigs of ``resources`` (confluent ``ConfigResource``): resource → future of its entries."""
        if request_timeout is None:
            return self.client.describe_configs(list(resources))
        return self.client.describe_configs(list(resources), request_timeout=request_timeout)

    def incremental_alter_configs(self, resources: Sequence, *, request_timeout: float | None = None) -> dict:
        """IncrementalAlterConfigs of ``resources`` (each with its ``incremental_configs``): resource → future."""
        if request_timeout is None:
            return self.client.incremental_alter_configs(list(resources))
        return self.client.incremental_alter_configs(list(resources), request_timeout=request_timeout)

    def topic_configs(self, topic: str) -> dict[str, str]:
        """The topic's configs. A topic created a moment ago may not be known yet to the broker that answers
        DescribeConfigs (metadata propagates after the controller): that answer is retried for a few seconds."""
        import time

        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import ConfigResource

        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        deadline = time.monotonic() + 5.0
        while True:
            try:
                entries = self.describe_configs([res])[res].result(timeout=self.timeout_s)
                return {k: v.value for k, v in entries.items()}
            except KafkaException as exc:
                unknown = exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if not unknown or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def broker_config(self, broker_id: int, name: str, *, request_timeout: float | None = None) -> str | None:
        """Broker ``broker_id``'s value of config ``name`` (None when it has none); the client's error when the
        broker cannot be asked (e.g. not authorized to describe broker configs)."""
        from confluent_kafka.admin import ConfigResource

        resource = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
        entries = self.describe_configs([resource], request_timeout=request_timeout)[resource].result(
            timeout=self.timeout_s)
        entry = entries.get(name)
        return entry.value if entry is not None else None

    # -- offsets and groups -----------------------------------------------------------------------------------------

    def list_offsets(self, specs: dict, **options: object) -> dict:
        """ListOffsets through the admin API (confluent ``TopicPartition`` → ``OffsetSpec``; ``options`` such as
        ``isolation_level``): partition → future of its answer, asked within the facade's timeout."""
        return self.client.list_offsets(specs, request_timeout=self.timeout_s, **options)

    def settled_offsets(self, asks: Sequence[dict], *, settle_s: float | None = None,
                        unsettled: dict | None = None, **options: object) -> list[dict]:
        """Several ListOffsets (each a ``list_offsets`` argument) sent together: their answers, in order, each
        partition → its result. A partition answered with a transient error is asked again for ``settle_s``
        (default: the facade's timeout), then its error is raised (KafkaException), as is any other error at once.
        ``unsettled``: given, such a partition is recorded there instead (partition → ``NAME: text``, see
        :func:`describe_kafka_error`) and left out of the answers, so one deleted topic or silent broker does not
        hide the other partitions' answers (a status display).

        Transient: a topic created a moment ago is answered NOT_LEADER_OR_FOLLOWER (or LEADER_NOT_AVAILABLE,
        UNKNOWN_TOPIC_OR_PARTITION) by the broker its leader is on until that broker has applied the controller's
        record, and a moved leader answers the same. librdkafka's admin ListOffsets does not retry these, and does
        not mark them retriable, so they are named here."""
        import time
        from concurrent.futures import TimeoutError as FutureTimeout

        from confluent_kafka import KafkaException

        deadline = time.monotonic() + (self.timeout_s if settle_s is None else settle_s)
        answers: list[dict] = [{} for _ in asks]
        pending = [dict(specs) for specs in asks]
        pause = 0.05
        while True:
            asked = time.monotonic()
            sent = [(i, self.list_offsets(specs, **options)) for i, specs in enumerate(pending) if specs]
            pending = [{} for _ in asks]
            for i, futures in sent:
                for tp, future in futures.items():
                    try:
                        answers[i][tp] = future.result(timeout=max(0.1, deadline - time.monotonic()) + 5.0)
                    except Exception as exc:  # noqa: BLE001 - recorded in ``unsettled`` when given, else raised
                        if isinstance(exc, KafkaException) and _transient_offsets_error(exc) \
                                and time.monotonic() <= deadline:
                            pending[i][tp] = asks[i][tp]
                        elif unsettled is None:
                            raise
                        elif isinstance(exc, FutureTimeout):
                            unsettled[tp] = f"no answer in {time.monotonic() - asked:.0f} s"
                        else:
                            unsettled[tp] = describe_kafka_error(exc)
            if not any(pending):
                return answers
            time.sleep(pause)
            pause = min(1.0, pause * 2)

    def describe_groups(self, groups: list[str]) -> dict:
        """DescribeConsumerGroups: group → future of its description (state, members and their assignments)."""
        return self.client.describe_consumer_groups(groups, request_timeout=self.timeout_s)


def _transient_offsets_error(exc: Exception) -> bool:
    """A ListOffsets answer that a moment's wait mends (see :meth:`ClusterAdmin.settled_offsets`)."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    code = error.code() if callable(getattr(error, "code", None)) else None
    return bool(getattr(error, "retriable", lambda: False)()) or code in {
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT}


def describe_kafka_error(error: object) -> str:
    """``NAME: text`` for a confluent KafkaError, or the KafkaError inside a KafkaException; else ``str``."""
    args = getattr(error, "args", None)
    if isinstance(error, Exception) and args and hasattr(args[0], "name"):
        error = args[0]
    if callable(getattr(error, "name", None)) and callable(getattr(error, "str", None)):
        return f"{error.name()}: {error.str()}"
    return str(error) or type(error).__name__
