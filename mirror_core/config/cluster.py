"""One cluster's connection settings, validated at the edge, and the translation to each client library.

A cluster is described by a librdkafka-style dict, the format of Airflow's ``kafka`` connection extras:
``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``ssl.endpoint.identification.algorithm``, ``client.id``. The same dict drives confluent-kafka (passed through)
and kafka-python (translated by :func:`kafka_python_kwargs`). Unknown keys are refused by name, so a typo never
silently falls back to PLAINTEXT. Secrets never appear in ``repr`` or error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mirror_core.errors import ConfigError

SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password"})
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# what kafka_python_kwargs(..., data_plane=True) adds: Fetch responses up to 100 MB (kafka-python's default: 1 MB),
DEFAULT_RECEIVE_MESSAGE_MAX_BYTES = 100_000_000
RECONNECT_BACKOFF_MAX_MS = 1_000  # the Java client's reconnect.backoff.max.ms (kafka-python's default: 30 s)

# librdkafka key -> kafka-python keyword (None: understood, but has no kafka-python counterpart to set).
_KAFKA_PYTHON_KEYS: dict[str, str | None] = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": None,  # handled below: "none" disables hostname checks
}


@dataclass(frozen=True)
class ClusterConfig:
    """A named cluster and its librdkafka-style client settings (validated; secrets masked in ``repr``)."""

    name: str
    settings: Mapping[str, str] = field(repr=False)

    def __post_init__(self) -> None:
        validate_settings(self.name, self.settings)

    @property
    def bootstrap(self) -> str:
        return str(self.settings["bootstrap.servers"])

    def __repr__(self) -> str:
        return f"ClusterConfig(name={self.name!r}, settings={masked(self.settings)})"

    def confluent(self, **overrides: object) -> dict:
        """Config for confluent-kafka clients (librdkafka logs silenced; errors are reported by the caller)."""
        conf: dict = {"log_level": 0, **self.settings}
        conf.update(overrides)
        return conf

    def kafka_python(self, **overrides: object) -> dict:
        return {**kafka_python_kwargs(self.name, self.settings), **overrides}


def validate_settings(cluster: str, settings: Mapping[str, str]) -> None:
    unknown = sorted(set(settings) - set(_KAFKA_PYTHON_KEYS))
    if unknown:
        raise ConfigError(f"cluster {cluster!r}: unsupported client setting(s) {', '.join(unknown)}; supported: "
                          f"{', '.join(sorted(_KAFKA_PYTHON_KEYS))}")
    if not settings.get("bootstrap.servers"):
        raise ConfigError(f"cluster {cluster!r}: 'bootstrap.servers' is required")
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"cluster {cluster!r}: security.protocol {protocol!r} is not one of "
                          f"{', '.join(SECURITY_PROTOCOLS)}")
    if protocol.startswith("SASL"):
        mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", ""))).upper()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"cluster {cluster!r}: sasl.mechanism {mechanism or '(missing)'!r} is not one of "
                              f"{', '.join(SASL_MECHANISMS)}")
        missing = [k for k in ("sasl.username", "sasl.password") if not settings.get(k)]
        if missing:
            raise ConfigError(f"cluster {cluster!r}: {' and '.join(missing)} required for {protocol}")


def kafka_python_kwargs(cluster: str, settings: Mapping[str, str], *, data_plane: bool = False) -> dict:
    """Translate librdkafka-style settings into kafka-python keyword arguments (unknown keys refused by name,
    secrets never echoed).

    ``data_plane``: for the data plane's own network client (:class:`mirror_core.kafka.wire_client.WireClient`), add
    what it needs on top: a receive limit large enough for Fetch responses (kafka-python's default of 1,000,000
    bytes kills the connection on a larger one), and reconnect backoffs capped at the Java client's 1 s
    (``reconnect.backoff.max.ms``): kafka-python's 30 s cap kept a daemon from noticing for up to half a minute that
    a source cluster that had been down answered again.
    """
    validate_settings(cluster, settings)
    kwargs: dict = {}
    for key, value in settings.items():
        target = _KAFKA_PYTHON_KEYS[key]
        if target is not None:
            kwargs[target] = value
    kwargs["bootstrap_servers"] = [s.strip() for s in str(settings["bootstrap.servers"]).split(",") if s.strip()]
    if "security_protocol" in kwargs:
        kwargs["security_protocol"] = str(kwargs["security_protocol"]).upper()
    if "sasl_mechanism" in kwargs:
        kwargs["sasl_mechanism"] = str(kwargs["sasl_mechanism"]).upper()
    if str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        kwargs["ssl_check_hostname"] = False
    if data_plane:
        kwargs.setdefault("receive_message_max_bytes", DEFAULT_RECEIVE_MESSAGE_MAX_BYTES)
        kwargs.setdefault("reconnect_backoff_max_ms", RECONNECT_BACKOFF_MAX_MS)
    return kwargs


def masked(settings: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``settings`` safe to print or log."""
    return {k: ("****" if k in SECRET_KEYS else str(v)) for k, v in settings.items()}
