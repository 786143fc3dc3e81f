"""Connectivity check of one cluster: does it answer, who is it, what does it speak.

Used by the CLI (``shoal probe``), by preflight before any copy, and by tests. Failure to connect or to
authenticate becomes a :class:`~mirror_core.errors.ClusterUnavailableError` with one sentence naming the cluster,
never a client-library stack trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ClusterUnavailableError, ConfigError
from mirror_core.kafka.admin import ClusterAdmin


@dataclass(frozen=True)
class ClusterProbe:
    """What one cluster reported: its id, brokers, API version ranges and finalized feature levels."""

    cluster: str
    cluster_id: str | None
    brokers: tuple[str, ...]
    api_versions: dict[str, tuple[int, int]]
    finalized_features: dict[str, tuple[int, int]]

    def max_version(self, api: str) -> int:
        return self.api_versions[api][1]


def probe_cluster(cluster: ClusterConfig, *, timeout_s: float = 10.0) -> ClusterProbe:
    """Check reachability and credentials, then read versions and features; ClusterUnavailableError on failure."""
    from kafka import errors as kerr
    from kafka.admin import KafkaAdminClient

    check_reachable(cluster, timeout_s=timeout_s)
    try:
        admin = KafkaAdminClient(**cluster.kafka_python(request_timeout_ms=int(timeout_s * 1000)))
    except kerr.KafkaConfigurationError as exc:
        raise ConfigError(f"cluster {cluster.name!r}: {exc}") from None
    except kerr.KafkaError as exc:
        raise _unavailable(cluster, exc) from None
    try:
        described = admin.describe_cluster()
        features = admin.describe_features()
        versions = _api_version_ranges(admin)
    except kerr.KafkaError as exc:
        raise _unavailable(cluster, exc) from None
    finally:
        admin.close()
    brokers = tuple(sorted(f"{b['host']}:{b['port']}" for b in described.get("brokers", [])))
    finalized = {name: f["finalized"] for name, f in features.items() if "finalized" in f}
    return ClusterProbe(cluster.name, described.get("cluster_id"), brokers, versions, finalized)


def check_reachable(cluster: ClusterConfig, *, timeout_s: float = 10.0) -> None:
    """Metadata round trip with librdkafka, which reports authentication failures at once and precisely
    (kafka-python only times out on a wrong SCRAM password)."""
    from confluent_kafka import KafkaError, KafkaException

    errors: list[KafkaError] = []
    admin = ClusterAdmin(cluster, timeout_s=timeout_s, error_cb=errors.append).client
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        errors.append(exc.args[0])
        admin.poll(0.5)  # serve error_cb: the precise cause (e.g. SASL failure) arrives there
    auth = [e for e in errors if e.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)]
    if auth:
        raise _auth_failed(cluster)
    if errors:
        last = errors[-1]
        raise ClusterUnavailableError(cluster.name, cluster.bootstrap, f"not reachable: {last.str()}")


def _auth_failed(cluster: ClusterConfig) -> ClusterUnavailableError:
    user = cluster.settings.get("sasl.username", "?")
    mech = cluster.settings.get("sasl.mechanism", "?")
    reason = (f"authentication failed for user {user!r} with {mech}: check the username and password "
              "in the cluster's connection")
    return ClusterUnavailableError(cluster.name, cluster.bootstrap, reason, retriable=False)


def _api_version_ranges(admin) -> dict[str, tuple[int, int]]:
    """API name -> (min, max) from the negotiated ApiVersions response.

    kafka-python's public ``api_versions()`` raises on API keys newer than it knows (Kafka 4.4 reports key 93),
    so the ranges are read from the negotiated version data and unknown keys are kept as ``api_<key>``.
    """
    from kafka.protocol.api_key import ApiKey

    ranges: dict[str, tuple[int, int]] = {}
    for key, (lo, hi) in admin._manager.broker_version_data.api_versions.items():
        try:
            name = ApiKey(key).name
        except ValueError:
            name = f"api_{key}"
        ranges[name] = (lo, hi)
    return ranges


def _unavailable(cluster: ClusterConfig, exc: Exception) -> ClusterUnavailableError:
    from kafka import errors as kerr

    auth = isinstance(exc, kerr.SaslAuthenticationFailedError) or \
        "authentication" in str(exc).lower()
    if auth:
        return _auth_failed(cluster)
    return ClusterUnavailableError(cluster.name, cluster.bootstrap, f"not reachable ({type(exc).__name__}: {exc})")
