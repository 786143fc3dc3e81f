"""One librdkafka-style dict per cluster, validated, translated for kafka-python, secrets masked."""

from __future__ import annotations

import pytest

from mirror_core.config.cluster import ClusterConfig, kafka_python_kwargs
from mirror_core.errors import ConfigError

SCRAM = {"bootstrap.servers": "a:9093,b:9093", "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "shoal", "sasl.password": "hunter2", "ssl.ca.location": "/ca.pem"}


def test_translation_for_kafka_python():
    kw = kafka_python_kwargs("dr", SCRAM)
    assert kw == {"bootstrap_servers": ["a:9093", "b:9093"], "security_protocol": "SASL_SSL",
                  "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "shoal",
                  "sasl_plain_password": "hunter2", "ssl_cafile": "/ca.pem"}


def test_hostname_verification_can_be_disabled_explicitly():
    kw = kafka_python_kwargs("dr", {**SCRAM, "ssl.endpoint.identification.algorithm": "none"})
    assert kw["ssl_check_hostname"] is False


def test_unknown_key_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"cluster 'dr'.*sasl\.pasword"):
        ClusterConfig("dr", {**SCRAM, "sasl.pasword": "typo"})


@pytest.mark.parametrize("missing", ["sasl.username", "sasl.password"])
def test_sasl_needs_credentials(missing):
    settings = {k: v for k, v in SCRAM.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        ClusterConfig("dr", settings)


def test_bad_protocol_and_mechanism_are_named():
    with pytest.raises(ConfigError, match="TLS"):
        ClusterConfig("dr", {"bootstrap.servers": "a:1", "security.protocol": "TLS"})
    with pytest.raises(ConfigError, match="GSSAPI"):
        ClusterConfig("dr", {**SCRAM, "sasl.mechanism": "GSSAPI"})


def test_bootstrap_is_required():
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        ClusterConfig("dr", {})


def test_secrets_never_in_repr():
    text = repr(ClusterConfig("dr", SCRAM))
    assert "hunter2" not in text and "****" in text and "shoal" in text
