"""What a sandbox cluster is: name, Kafka version, ports, heap, and the broker properties it runs with.

Pure: renders ``server.properties`` text from a :class:`ClusterSpec`; starting and stopping live in
:mod:`mirror_core.dev.sandbox.broker`. The shared sandbox clusters are single KRaft nodes (broker and controller in one
JVM) on loopback. A :class:`QuorumSpec` is a replicated cluster for tests that need leader changes: one
controller-only node plus brokers (a quorum of combined nodes would lose its majority when two of three stop), one
JVM per node (:mod:`mirror_core.dev.sandbox.quorum`). The timers are the fast ones from DESIGN.md §6 so tests never wait
on broker defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KAFKA_VERSION = "4.4.0"
LEGACY_KAFKA_VERSION = "3.9.2"
SCRAM_MECHANISM = "SCRAM-SHA-512"          # what the sandbox's client configs use by default
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")   # enabled on every secure listener
TLS_NAMES = ("localhost", "127.0.0.1")     # the names the secure listener's certificate carries

# Broker settings every sandbox cluster shares (DESIGN.md §6).
FAST_TIMERS = {
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "log.cleaner.backoff.ms": "500",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    # KIP-848 groups take their session timeout and heartbeat interval from the broker (defaults 45 s / 5 s, and
    # nothing below these minimums is accepted): lowered, so a pipeline's daemon group (`group_session_timeout_ms`,
    # set as a group config) can detect a dead daemon in seconds in tests. Defaults stay Kafka's.
    "group.consumer.min.session.timeout.ms": "2000",
    "group.consumer.min.heartbeat.interval.ms": "250",
}
SINGLE_NODE = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "log.cleaner.threads": "1",
}


@dataclass(frozen=True)
class ClusterSpec:
    """One named single-node KRaft cluster of the sandbox.

    ``port`` is the PLAINTEXT client listener, ``controller_port`` the KRaft controller listener and, when set,
    ``secure_port`` a SASL_SSL listener (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for the same users) whose
    certificate, from a throw-away CA, carries ``tls_names``. ``extra`` broker properties go last (a test's
    private broker, e.g. a short ``connections.max.reauth.ms``).
    """

    name: str
    version: str
    port: int
    controller_port: int
    secure_port: int | None = None
    heap: str = "-Xms128m -Xmx512m"
    tls_names: tuple[str, ...] = TLS_NAMES
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_bootstrap(self) -> str | None:
        # The certificate is issued for "localhost"; clients verify it, so this address uses that name.
        return f"localhost:{self.secure_port}" if self.secure_port else None

    @property
    def maven_profile(self) -> str:
        return "kafka4" if self.major >= 4 else "kafka3"

    @property
    def main_class(self) -> str:
        return "kafka.Kafka"

    def ports(self) -> list[int]:
        return [p for p in (self.port, self.controller_port, self.secure_port) if p]


# Every port stays below Linux's ephemeral range (32768+), so a client socket can never be holding one of them.
CLUSTERS: dict[str, ClusterSpec] = {
    spec.name: spec
    for spec in (
        ClusterSpec("source", DEFAULT_KAFKA_VERSION, 19092, 19093, secure_port=19094),
        ClusterSpec("target", DEFAULT_KAFKA_VERSION, 29092, 29093, secure_port=29094),
        ClusterSpec("legacy", LEGACY_KAFKA_VERSION, 24092, 24093),
    )
}
DEFAULT_CLUSTERS = ("source", "target")


def render_server_properties(spec: ClusterSpec, *, data_dir: str, tls: dict[str, str] | None = None,
                             users: dict[str, str] | None = None) -> str:
    """The broker's ``server.properties`` for ``spec``; ``tls`` holds keystore settings for the secure listener,
    ``users`` its user names and passwords (PLAIN reads them from the listener's JAAS line; the SCRAM credentials
    of the same users are created through the Admin API once the broker runs)."""
    listeners = [f"PLAINTEXT://127.0.0.1:{spec.port}", f"CONTROLLER://127.0.0.1:{spec.controller_port}"]
    advertised = [f"PLAINTEXT://127.0.0.1:{spec.port}"]
    protocol_map = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{spec.controller_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": data_dir,
    }
    if spec.secure_port:
        if tls is None:
            raise ValueError(f"cluster {spec.name!r} has a secure listener but no TLS material was given")
        listeners.append(f"SECURE://127.0.0.1:{spec.secure_port}")
        advertised.append(f"SECURE://{spec.secure_bootstrap}")
        protocol_map.append("SECURE:SASL_SSL")
        prefix = "listener.name.secure."
        plain_users = "".join(f' user_{name}="{password}"' for name, password in sorted((users or {}).items()))
        props.update({
            f"{prefix}sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            f"{prefix}plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required{plain_users};",
            **{f"{prefix}{mechanism.lower()}.sasl.jaas.config":
               "org.apache.kafka.common.security.scram.ScramLoginModule required;"
               for mechanism in SASL_MECHANISMS if mechanism.startswith("SCRAM")},
            f"{prefix}ssl.keystore.type": "PKCS12",
            f"{prefix}ssl.keystore.location": tls["keystore"],
            f"{prefix}ssl.keystore.password": tls["password"],
            f"{prefix}ssl.key.password": tls["password"],
        })
    props["listeners"] = ",".join(listeners)
    props["advertised.listeners"] = ",".join(advertised)
    props["listener.security.protocol.map"] = ",".join(protocol_map)
    props.update(SINGLE_NODE)
    props.update(FAST_TIMERS)
    props.update(spec.extra)
    header = f"# Generated by `shoal sandbox up` for cluster {spec.name!r} (Kafka {spec.version}). Do not edit.\n"
    return header + "".join(f"{k}={v}\n" for k, v in props.items())


@dataclass(frozen=True)
class QuorumNodeSpec(ClusterSpec):
    """One JVM of a :class:`QuorumSpec` cluster: the controller-only node (``port`` = its controller listener) or
    a broker (``port`` = its PLAINTEXT listener, ``controller_port`` = the controller's, which it only dials)."""

    node_id: int = 1
    controller_only: bool = False
    brokers: int = 2

    def ports(self) -> list[int]:
        return [self.port]


@dataclass(frozen=True)
class QuorumSpec:
    """A replicated KRaft cluster: node 1 is the controller-only node, nodes 2.. are brokers. Internal topics are
    replicated to at most two brokers with ``min.insync.replicas=1``, so a partition stays writable on one broker
    and an unclean leader election can be forced by a test."""

    name: str
    version: str
    controller_port: int
    broker_ports: tuple[int, ...]
    heap: str = "-Xms96m -Xmx384m"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.broker_ports)

    def controller(self) -> QuorumNodeSpec:
        return QuorumNodeSpec(f"{self.name}-1", self.version, self.controller_port, self.controller_port,
                              heap=self.heap, node_id=1, controller_only=True, brokers=len(self.broker_ports))

    def brokers(self) -> list[QuorumNodeSpec]:
        return [QuorumNodeSpec(f"{self.name}-{node_id}", self.version, port, self.controller_port, heap=self.heap,
                               node_id=node_id, brokers=len(self.broker_ports))
                for node_id, port in enumerate(self.broker_ports, start=2)]

    def ports(self) -> list[int]:
        return [self.controller_port, *self.broker_ports]


QUORUM_CLUSTERS: dict[str, QuorumSpec] = {
    spec.name: spec
    for spec in (
        # the truncation fault tests' source: started by that test module only, never by `shoal sandbox up`
        QuorumSpec("replicated", DEFAULT_KAFKA_VERSION, 25093, (25092, 25192)),
        # a replicated target, so a follower can leave the ISR (the transaction-timeout fault test's only)
        QuorumSpec("replicated-target", DEFAULT_KAFKA_VERSION, 25293, (25292, 25392)),
    )
}


def render_quorum_node_properties(node: QuorumNodeSpec, *, data_dir: str) -> str:
    """``server.properties`` of one node of a :class:`QuorumSpec` cluster."""
    controller = f"CONTROLLER://127.0.0.1:{node.controller_port}"
    props: dict[str, str] = {
        "node.id": str(node.node_id),
        "controller.quorum.voters": f"1@127.0.0.1:{node.controller_port}",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": data_dir,
    }
    if node.controller_only:
        props.update({"process.roles": "controller", "listeners": controller,
                      "listener.security.protocol.map": "CONTROLLER:PLAINTEXT"})
    else:
        listener = f"PLAINTEXT://127.0.0.1:{node.port}"
        props.update({"process.roles": "broker", "listeners": listener, "advertised.listeners": listener,
                      "inter.broker.listener.name": "PLAINTEXT",
                      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"})
    props.update(SINGLE_NODE)
    replicas = str(min(2, node.brokers))
    props.update({
        "default.replication.factor": replicas,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "share.coordinator.state.topic.replication.factor": replicas,
        "min.insync.replicas": "1",
    })
    props.update(FAST_TIMERS)
    header = (f"# Generated for node {node.node_id} of the replicated sandbox cluster {node.name.rsplit('-', 1)[0]!r} "
              f"(Kafka {node.version}). Do not edit.\n")
    return header + "".join(f"{k}={v}\n" for k, v in props.items())
