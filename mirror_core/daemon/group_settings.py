"""How a daemon's membership consumer joins its pipeline's group: the protocol, the settings, the group's timeouts.

The ``consumer`` protocol (KIP-848: the broker computes the assignment) on Kafka 4 brokers, the classic protocol with
the ``cooperative-sticky`` assignor on older ones (:func:`choose_protocol`); the librdkafka settings of a consumer
used for membership only — it never commits and never fetches (:func:`consumer_settings`); with KIP-848 the
session timeout and heartbeat interval are the group's, set broker-side as configs of the group
(:func:`apply_group_timeouts`). The membership itself: :mod:`mirror_core.daemon.membership`.
"""

from __future__ import annotations

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import daemon_group_id as group_id
from mirror_core.errors import ConfigError

MAX_POLL_INTERVAL_MS = 300_000  # the group's rebalance timeout: the revocation wait must stay far below it
PROTOCOLS = ("auto", "consumer", "classic")


def choose_protocol(requested: str, broker_version: tuple[int, ...] | None) -> str:
    """``consumer`` (KIP-848) on Kafka 4+ brokers, ``classic`` (cooperative-sticky) before; an explicit choice wins.
    (Kafka 3.7–3.9 advertise the KIP-848 API but do not enable it by default, so the version decides, not the API
    list.)"""
    if requested not in PROTOCOLS:
        raise ConfigError(f"group_protocol {requested!r} is not one of {', '.join(PROTOCOLS)}")
    if requested != "auto":
        return requested
    return "consumer" if broker_version is not None and broker_version >= (4, 0) else "classic"


def consumer_settings(source: ClusterConfig, pipeline: str, worker_id: str, protocol: str, *,
                      classic_session_timeout_ms: int | None = None, metadata_refresh_ms: int | None = None) -> dict:
    """librdkafka settings of the membership consumer: never commits, never fetches (everything it is assigned is
    paused), client.id = the worker id (what `shoal mirror status` and lag tools show).

    ``metadata_refresh_ms``: how often librdkafka refreshes the subscribed topics' metadata. With the classic
    protocol a partition added to a subscribed topic is assigned only after the leader's next refresh (librdkafka's
    default is 5 minutes); the daemon sets it to its rescan interval (at most those 5 minutes), so new partitions
    become lanes as fast as new topics do. Not set with the consumer protocol: there the broker notices new
    partitions itself, and with a long interval (a rescan interval of an hour) librdkafka never applied the
    broker's assignment — the daemon subscribed, the broker computed the assignment, no lane was held."""
    settings = {
        "group.id": group_id(pipeline),
        "client.id": worker_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        "fetch.wait.max.ms": 500,
        "queued.max.messages.kbytes": 64,  # should a fetch ever slip in before the pause: little memory
        "log_level": 3,
    }
    if metadata_refresh_ms and protocol != "consumer":
        settings["topic.metadata.refresh.interval.ms"] = max(1000, min(300_000, int(metadata_refresh_ms)))
    if protocol == "consumer":
        settings["group.protocol"] = "consumer"  # session and heartbeat are the broker's (group configs)
    else:
        settings["group.protocol"] = "classic"
        settings["partition.assignment.strategy"] = "cooperative-sticky"
        if classic_session_timeout_ms:
            settings["session.timeout.ms"] = classic_session_timeout_ms
            settings["heartbeat.interval.ms"] = max(100, classic_session_timeout_ms // 5)
    return source.confluent(**settings)


def apply_group_timeouts(source: ClusterConfig, pipeline: str, session_timeout_ms: int, *,
                         timeout_s: float = 15.0) -> None:
    """KIP-848: a group's session timeout and heartbeat interval are broker-side; set them as configs of this
    pipeline's group (``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms`` = a quarter of it).
    The broker refuses values outside its ``group.consumer.min/max.session.timeout.ms`` and
    ``group.consumer.min.heartbeat.interval.ms``: a :class:`ConfigError` names them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from mirror_core.kafka.admin import ClusterAdmin

    group = group_id(pipeline)
    heartbeat_ms = max(100, session_timeout_ms // 4)
    entries = [ConfigEntry("consumer.session.timeout.ms", str(session_timeout_ms),
                           incremental_operation=AlterConfigOpType.SET),
               ConfigEntry("consumer.heartbeat.interval.ms", str(heartbeat_ms),
                           incremental_operation=AlterConfigOpType.SET)]
    admin = ClusterAdmin(source, timeout_s=timeout_s, log_level=3)
    futures = admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                              incremental_configs=entries)])
    for future in futures.values():
        try:
            future.result(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - turned into a sentence an operator can act on
            raise ConfigError(
                f"cluster {source.name!r} refused the session timeout {session_timeout_ms} ms (heartbeat "
                f"{heartbeat_ms} ms) for group {group!r}: {exc}; the broker bounds them with "
                "group.consumer.min.session.timeout.ms / group.consumer.max.session.timeout.ms and "
                "group.consumer.min.heartbeat.interval.ms (defaults 45 s / 60 s / 5 s)") from None
