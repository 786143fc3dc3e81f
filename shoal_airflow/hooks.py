"""``ShoalKafkaHook``: an Airflow ``kafka`` connection (librdkafka settings in its extras, the format of
apache-airflow-providers-apache-kafka) turned into Shoal's validated :class:`~mirror_core.config.cluster.ClusterConfig`.

The cluster is named after the connection id, so plans and ledgers name clusters, never settings. Every secret in
the extras is registered with Airflow's secrets masker before anything can log it; ``ClusterConfig`` masks them in
its ``repr`` as well. Connections come from ``AIRFLOW_CONN_<ID>`` or the UI, never from DAG code.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

# Extras the Kafka provider's own clients understand but that have no place in a Shoal cluster (consumer group
# options of the provider's consumer operators): ignored rather than refused, so one connection serves both.
IGNORED_EXTRAS = frozenset({"group.id", "auto.offset.reset", "enable.auto.commit", "session.timeout.ms"})


def mask_cluster_secrets(settings: Mapping[str, Any]) -> None:
    """Register every secret value of ``settings`` with Airflow's secrets masker (logs, XCom, rendered fields)."""
    from mirror_core.config.cluster import SECRET_KEYS

    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - Airflow 2 layout
        from airflow.utils.log.secrets_masker import mask_secret
    for key, value in settings.items():
        if value and (key in SECRET_KEYS or "password" in key or "secret" in key):
            mask_secret(str(value), key)


class ShoalKafkaHook(KafkaBaseHook):
    """A Kafka connection as a Shoal cluster. Invariant: :meth:`get_cluster` returns only validated settings whose
    secrets are already masked."""

    hook_name = "Shoal Kafka cluster"

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(kafka_config_id=kafka_config_id, **kwargs)

    def get_settings(self) -> dict[str, str]:
        """The connection's extras as librdkafka settings (strings), secrets masked, unknown keys refused."""
        from mirror_core.errors import ConfigError

        conn = self.get_connection(self.kafka_config_id)
        if conn.conn_type and conn.conn_type != "kafka":
            raise ConfigError(f"connection {self.kafka_config_id!r} is of type {conn.conn_type!r}; Shoal needs a "
                              "'kafka' connection (librdkafka settings in its extras)")
        extras = conn.extra_dejson
        if not isinstance(extras, Mapping) or not extras:
            raise ConfigError(f"connection {self.kafka_config_id!r} has no extras; put the librdkafka settings "
                              "(bootstrap.servers, security.protocol, ...) in them")
        mask_cluster_secrets(extras)
        callbacks = sorted(k for k in extras if k.endswith("_cb"))
        if callbacks:
            raise ConfigError(f"connection {self.kafka_config_id!r}: callback setting(s) {', '.join(callbacks)} are "
                              "not supported by Shoal's data plane")
        return {str(k): str(v) for k, v in extras.items() if k not in IGNORED_EXTRAS}

    def get_cluster(self):
        """The validated :class:`~mirror_core.config.cluster.ClusterConfig`, named after the connection id."""
        from mirror_core.config.cluster import ClusterConfig

        return ClusterConfig(self.kafka_config_id, self.get_settings())

    def test_connection(self) -> tuple[bool, str]:
        try:
            from mirror_core.services.clusters import count_topics

            topics = count_topics(self.get_cluster(), timeout_s=10)
        except Exception as exc:  # noqa: BLE001 - the UI shows the reason
            return False, str(exc)
        return True, f"connected: {topics} topics"


def clusters_of(conn_ids: Iterable[str]) -> dict[str, Any]:
    """conn id -> ClusterConfig, each validated and masked."""
    return {cid: ShoalKafkaHook(cid).get_cluster() for cid in dict.fromkeys(conn_ids)}


def write_clusters_file(clusters: Mapping[str, Any], directory: str | os.PathLike | None = None) -> Path:
    """The backfill job's clusters file (``{name: settings}``), created 0600 before any secret is written to it.
    The caller deletes it when the job has ended."""
    fd, name = tempfile.mkstemp(prefix="shoal-clusters-", suffix=".json", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        body = {c.name: dict(c.settings) for c in clusters.values()}
        os.write(fd, json.dumps(body).encode())
    finally:
        os.close(fd)
    return Path(name)
