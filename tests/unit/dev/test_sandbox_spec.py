"""Broker properties the sandbox renders (pure)."""

from __future__ import annotations

import pytest

from mirror_core.dev.sandbox.spec import (
    CLUSTERS,
    FAST_TIMERS,
    QUORUM_CLUSTERS,
    ClusterSpec,
    render_quorum_node_properties,
    render_server_properties,
)


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_every_cluster_gets_the_fast_timers_and_its_own_ports(name):
    spec = CLUSTERS[name]
    tls = {"keystore": "/x/broker.p12", "password": "pw"} if spec.secure_port else None
    props = _props(render_server_properties(spec, data_dir="/data", tls=tls))
    for key, value in FAST_TIMERS.items():
        assert props[key] == value
    assert props["auto.create.topics.enable"] == "false"
    assert props["process.roles"] == "broker,controller"
    assert f"127.0.0.1:{spec.port}" in props["listeners"]
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{spec.controller_port}"


def test_ports_never_collide_between_clusters():
    ports = [p for spec in CLUSTERS.values() for p in spec.ports()]
    ports += [p for spec in QUORUM_CLUSTERS.values() for p in spec.ports()]
    assert len(ports) == len(set(ports))


@pytest.mark.parametrize("name", ["source", "target"])
def test_secure_listener_is_sasl_ssl_plain_and_scram_with_the_keystore(name):
    spec = CLUSTERS[name]
    props = _props(render_server_properties(spec, data_dir="/d", tls={"keystore": "/k.p12", "password": "s3cret"},
                                            users={"shoal": "pw-1", "alice": "pw-2"}))
    assert "SECURE:SASL_SSL" in props["listener.security.protocol.map"]
    assert f"SECURE://localhost:{spec.secure_port}" in props["advertised.listeners"]
    assert props["listener.name.secure.sasl.enabled.mechanisms"] == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    assert props["listener.name.secure.plain.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="pw-2" user_shoal="pw-1";')
    for scram in ("scram-sha-256", "scram-sha-512"):
        assert "ScramLoginModule" in props[f"listener.name.secure.{scram}.sasl.jaas.config"]
    assert props["listener.name.secure.ssl.keystore.location"] == "/k.p12"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_extra_properties_of_a_private_broker_come_last():
    spec = ClusterSpec("private", CLUSTERS["source"].version, 1, 2, extra=(("connections.max.reauth.ms", "3000"),
                                                                            ("log.cleaner.backoff.ms", "10")))
    props = _props(render_server_properties(spec, data_dir="/d"))
    assert props["connections.max.reauth.ms"] == "3000" and props["log.cleaner.backoff.ms"] == "10"


def test_secure_listener_without_tls_material_is_refused():
    with pytest.raises(ValueError, match="source"):
        render_server_properties(CLUSTERS["source"], data_dir="/d", tls=None)


def test_legacy_cluster_runs_kafka_39_with_reload4j():
    assert CLUSTERS["legacy"].version.startswith("3.9.")
    assert CLUSTERS["legacy"].maven_profile == "kafka3"
    assert CLUSTERS["source"].major >= 4 and CLUSTERS["source"].maven_profile == "kafka4"


def test_ports_stay_below_the_ephemeral_range():
    """A port in 32768+ can be taken at random by any client socket on the machine, failing a start."""
    assert all(p < 32768 for spec in CLUSTERS.values() for p in spec.ports())
    assert all(p < 32768 for spec in QUORUM_CLUSTERS.values() for p in spec.ports())


@pytest.mark.parametrize("name", sorted(QUORUM_CLUSTERS))
def test_a_replicated_cluster_is_a_controller_only_node_and_brokers_that_keep_writing_on_one_replica(name):
    spec = QUORUM_CLUSTERS[name]
    controller = _props(render_quorum_node_properties(spec.controller(), data_dir="/d"))
    assert controller["process.roles"] == "controller" and "PLAINTEXT" not in controller["listeners"]
    assert controller["controller.quorum.voters"] == f"1@127.0.0.1:{spec.controller_port}"
    brokers = [_props(render_quorum_node_properties(node, data_dir="/d")) for node in spec.brokers()]
    assert len(brokers) >= 2 and [b["node.id"] for b in brokers] == [str(i) for i in range(2, 2 + len(brokers))]
    for props, port in zip(brokers, spec.broker_ports, strict=True):
        assert props["process.roles"] == "broker" and props["listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
        assert props["controller.quorum.voters"] == controller["controller.quorum.voters"]
        assert props["min.insync.replicas"] == "1"
        assert int(props["offsets.topic.replication.factor"]) <= 2
        assert int(props["transaction.state.log.replication.factor"]) <= 2
        for key, value in FAST_TIMERS.items():
            assert props[key] == value


def test_a_new_cluster_id_never_starts_with_a_dash():
    """``kafka-storage format -t -xUu…`` reads such an id as an option and fails: seen on a private test broker."""
    from mirror_core.dev.sandbox.broker import new_cluster_id

    draws = iter([b"\xfb" + bytes(15), b"\x00" * 16])  # the first encodes to "-w…", the second to "AAAA…"
    assert new_cluster_id(lambda: next(draws)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert all(not new_cluster_id().startswith("-") for _ in range(500))
