"""The hand-encoded fast path over TLS and SASL, against real brokers.

What an operator would notice: a copy over SASL_SSL lands byte-identical records sections and runs on Shoal's own
connections (not kafka-python's); a wrong CA, a wrong host name or a wrong password is one clear error naming the
cluster, the broker and (for SASL) the mechanism and user, never the password; a copy that outlives the broker's
``connections.max.reauth.ms`` re-authenticates on the same connections instead of being cut off.

The shared ``source`` cluster's secure listener offers SCRAM-SHA-512 only until it is restarted with the current
spec, and its session lifetime is unlimited; so PLAIN, SCRAM-SHA-256, the hostname check and re-authentication run
against a private single-node broker started by this module (the sandbox machinery, its own directory and free
ports, a certificate for ``localhost`` only, ``connections.max.reauth.ms`` of a few seconds).
"""

from __future__ import annotations

import logging
import time

import kafka.errors as Errors
import pytest

from mirror_core.codec.batch_codec import RECORDS_OFFSET
from mirror_core.codec.fetch_messages import FetchPartitionSpec, FetchTopicSpec
from mirror_core.config.cluster import ClusterConfig
from mirror_core.dev.sandbox.broker import SandboxBroker
from mirror_core.dev.sandbox.spec import DEFAULT_KAFKA_VERSION, ClusterSpec
from mirror_core.engine.copier import CopyOptions, RangeCopier
from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_channel import FastSecurity
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from tests.conftest import unavailable
from tests.copy_helpers import raw_batches
from tests.integration.daemon.test_daemon import free_port
from tests.kafka_helpers import KafkaTestCluster

pytestmark = [pytest.mark.security, pytest.mark.timeout(180)]

REAUTH_MS = 3000
WRONG = "not-the-password-7731"


# -- fixtures ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def private_broker(session_sandbox, tmp_path_factory):
    """A single-node broker whose SASL_SSL listener enables PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, carries a
    certificate for ``localhost`` only and limits sessions to REAUTH_MS."""
    sandbox = session_sandbox.ensure("source", "target")
    spec = ClusterSpec("private-secure", DEFAULT_KAFKA_VERSION, free_port(), free_port(), secure_port=free_port(),
                       heap="-Xms96m -Xmx384m", tls_names=("localhost",),
                       extra=(("connections.max.reauth.ms", str(REAUTH_MS)),))
    broker = SandboxBroker(spec, tmp_path_factory.mktemp("private-secure-broker"), sandbox.cache_dir)
    try:
        broker.start(timeout=150)
        yield broker
    finally:
        broker.stop()


def _secure_settings(broker: SandboxBroker, mechanism: str, password: str | None = None) -> dict[str, str]:
    secure = broker.info()["secure"]
    return {"bootstrap.servers": secure["bootstrap"], "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": "shoal", "sasl.password": password or secure["users"]["shoal"],
            "ssl.ca.location": secure["ssl.ca.location"]}


@pytest.fixture(scope="module")
def private_plain(private_broker) -> KafkaTestCluster:
    return KafkaTestCluster(ClusterConfig("private", {"bootstrap.servers": private_broker.spec.bootstrap}))


@pytest.fixture
def secure_target_cluster(sandbox) -> KafkaTestCluster:
    if "secure" not in sandbox.broker("target").info():
        unavailable("the target cluster runs without its SASL_SSL listener (started before the spec had one): "
                    "restart it with `shoal sandbox down target && shoal sandbox up`")
    return KafkaTestCluster(ClusterConfig("target-secure", sandbox.client_config("target", secure=True)))


def _fast(settings: dict[str, str], cluster: str, host: str | None = None, **kwargs) -> FastConnection:
    """A fast connection to the first bootstrap broker, or to ``host`` at its port."""
    address = settings["bootstrap.servers"].split(",")[0]
    name, port = address.rsplit(":", 1)
    return FastConnection(host or name, int(port), security=FastSecurity.from_settings(settings),
                          cluster_name=cluster, **kwargs)


def _fill(cluster: KafkaTestCluster, topic: str, partitions: int = 1) -> None:
    cluster.create_topic(topic, partitions)
    for p in range(partitions):
        cluster.produce(topic, [(b"k%d" % i, b"plain-%d-%d" % (p, i) * 20, [("h", b"%d" % i)]) for i in range(150)],
                        partition=p, **{"linger.ms": 5})
        for codec in ("lz4", "zstd"):
            cluster.produce(topic, [(None, b"%s-%d-%d" % (codec.encode(), p, i) * 30) for i in range(300)],
                            partition=p, **{"compression.type": codec, "linger.ms": 20})


def _records_sections(cluster: KafkaTestCluster, topic: str, partition: int) -> list[bytes]:
    return [bytes(b.buffer[RECORDS_OFFSET:]) for b in raw_batches(cluster, topic, partition) if not b.control]


def _copy(source: WireClient, target: WireClient, topic: str, target_topic: str, partitions: int,
          options: CopyOptions | None = None) -> None:
    copier = RangeCopier(source, target, options=options or CopyOptions())
    for p in range(partitions):
        end = list_offsets(source, topic, p, "last_stable")
        copier.copy(PartitionRange(topic, p, list_offsets(source, topic, p, "earliest"), end, target_topic, p))


def _assert_fast_tls(client: WireClient, topic: str) -> FastConnection:
    leader = client.leader_for(topic, 0)[0]
    conn = client.fast_connection(leader)
    assert conn is not None and conn.tls_version in ("TLSv1.2", "TLSv1.3"), "the copy must use the fast path"
    return conn


# -- the shared source's secure listener --------------------------------------------------------------------------

@pytest.mark.parametrize("destination", ["source-secure", "target-secure"])
def test_copy_over_sasl_ssl_is_byte_identical_on_the_fast_path(destination, request, source_cluster, target_cluster,
                                                              secure_source_cluster, unique_name):
    dst = (secure_source_cluster if destination == "source-secure"
           else request.getfixturevalue("secure_target_cluster"))
    plain_dst = source_cluster if destination == "source-secure" else target_cluster
    topic, copy = unique_name(), unique_name("copy")
    _fill(source_cluster, topic, partitions=2)
    plain_dst.create_topic(copy, 2)
    with WireClient.for_cluster(secure_source_cluster.config) as source, WireClient.for_cluster(dst.config) as target:
        _copy(source, target, topic, copy, 2)
        fetch_conn, produce_conn = _assert_fast_tls(source, topic), _assert_fast_tls(target, copy)
        assert fetch_conn.authentications == 1 and produce_conn.authentications == 1
    for p in range(2):
        src = _records_sections(source_cluster, topic, p)
        assert len(src) >= 3
        assert _records_sections(plain_dst, copy, p) == src, "records sections must be byte-identical"
    assert [r.content() for r in plain_dst.read_all(copy)] == [r.content() for r in source_cluster.read_all(topic)]


def test_an_unknown_ca_is_refused_naming_cluster_and_broker(secure_source_cluster):
    settings = {k: v for k, v in secure_source_cluster.config.settings.items() if k != "ssl.ca.location"}
    with pytest.raises(ClusterUnavailableError) as info:
        _fast(settings, "prod-eu")
    message = str(info.value)
    assert not info.value.retriable
    assert "cluster 'prod-eu'" in message and secure_source_cluster.bootstrap in message
    assert "certificate verification failed" in message and "ssl.ca.location" in message


def test_a_wrong_scram_password_on_the_fast_connection_names_cluster_mechanism_and_user(secure_source_cluster):
    settings = dict(secure_source_cluster.config.settings, **{"sasl.password": WRONG})
    with pytest.raises(ClusterUnavailableError) as info:
        _fast(settings, "source-secure")
    message = str(info.value)
    assert not info.value.retriable
    assert "cluster 'source-secure'" in message and "SCRAM-SHA-512" in message and "'shoal'" in message
    assert WRONG not in message and "refused" in message


# -- a private broker: every mechanism, the hostname check, re-authentication --------------------------------------

@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_each_mechanism_logs_in_and_copies_on_the_fast_path_without_logging_the_password(
        mechanism, private_broker, private_plain, unique_name, caplog):
    topic, copy = unique_name(), unique_name("copy")
    _fill(private_plain, topic)
    private_plain.create_topic(copy)
    settings = _secure_settings(private_broker, mechanism)
    with caplog.at_level(logging.DEBUG), WireClient("private-secure", settings) as client:
        _copy(client, client, topic, copy, 1)
        assert _assert_fast_tls(client, copy).authentications == 1
    assert _records_sections(private_plain, copy, 0) == _records_sections(private_plain, topic, 0)
    assert caplog.records, "DEBUG logging was not captured"
    assert settings["sasl.password"] not in caplog.text


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_is_refused_naming_cluster_and_mechanism(mechanism, private_broker):
    with pytest.raises(ClusterUnavailableError) as info:
        _fast(_secure_settings(private_broker, mechanism, password=WRONG), "prod-eu")
    message = str(info.value)
    assert not info.value.retriable
    assert "cluster 'prod-eu'" in message and f"SASL {mechanism} login as 'shoal'" in message
    assert WRONG not in message


def test_a_host_name_the_certificate_does_not_carry_is_refused(private_broker):
    settings = _secure_settings(private_broker, "SCRAM-SHA-512")
    with pytest.raises(ClusterUnavailableError) as info:
        _fast(settings, "prod-eu", host="127.0.0.1")     # the certificate names "localhost" only
    message = str(info.value)
    assert not info.value.retriable
    assert "cluster 'prod-eu'" in message and f"127.0.0.1:{private_broker.spec.secure_port}" in message
    assert "hostname verification failed" in message and "'127.0.0.1'" in message
    # the same broker by the name on its certificate is fine, unless the operator turned the check off
    _fast(settings, "prod-eu").close()
    _fast(dict(settings, **{"ssl.endpoint.identification.algorithm": "none"}), "prod-eu", host="127.0.0.1").close()


def _fetch_once(conn: FastConnection, topic: str):
    return conn.fetch(min_version=4, max_version=12, max_wait_ms=0, min_bytes=1, max_bytes=4096, isolation_level=0,
                      topics=[FetchTopicSpec(topic, None, [FetchPartitionSpec(0, -1, 0, 4096)])])


def test_the_broker_cuts_a_connection_that_outlives_its_session(private_broker, private_plain, unique_name):
    """The control for the next test: without re-authentication the broker drops the connection at its next
    request once the session expired, so a surviving connection proves the re-authentication worked."""
    topic = private_plain.create_topic(unique_name())
    conn = _fast(_secure_settings(private_broker, "SCRAM-SHA-256"), "private-secure", reauthenticate=False)
    assert 0 < conn.session_lifetime_ms <= REAUTH_MS
    _fetch_once(conn, topic)
    time.sleep(REAUTH_MS / 1000 + 0.5)
    with pytest.raises(Errors.KafkaConnectionError):
        _fetch_once(conn, topic)
    assert conn.closed


def test_a_connection_idle_past_its_session_logs_in_again_before_its_next_request(private_broker, private_plain,
                                                                                 unique_name):
    topic = private_plain.create_topic(unique_name())
    conn = _fast(_secure_settings(private_broker, "PLAIN"), "private-secure")
    _fetch_once(conn, topic)
    time.sleep(REAUTH_MS / 1000 + 0.5)
    _fetch_once(conn, topic)
    assert conn.authentications == 2 and not conn.closed
    conn.close()


def test_a_copy_longer_than_the_session_re_authenticates_on_the_same_connections(private_broker, private_plain,
                                                                                  unique_name):
    topic, copy = unique_name(), unique_name("copy")
    private_plain.create_topic(topic)
    # ~1.5 MB in ~100 batches of 16 kB: a few batches per fetch, so requests keep coming all through the copy
    private_plain.produce(topic, [(b"k%d" % i, b"%06d" % i * 170) for i in range(1500)],
                          **{"linger.ms": 5, "batch.size": 16384})
    private_plain.create_topic(copy)
    settings = _secure_settings(private_broker, "SCRAM-SHA-512")
    with WireClient("private-secure", settings) as source, WireClient("private-secure", settings) as target:
        fetch_conn, produce_conn = source.fast_connection(1), target.fast_connection(1)
        started = time.monotonic()
        # at 300 kB/s about 5 s of copying: longer than the 3 s sessions
        _copy(source, target, topic, copy, 1, CopyOptions(fetch_max_bytes=64 * 1024, max_inflight_bytes=128 * 1024,
                                                           throttle_bytes_per_s=300_000))
        assert time.monotonic() - started > 1.5 * REAUTH_MS / 1000
        assert source.fast_connection(1) is fetch_conn and not fetch_conn.closed, "the fetch connection was cut"
        assert target.fast_connection(1) is produce_conn and not produce_conn.closed, "the produce connection was cut"
        assert fetch_conn.authentications >= 2 and produce_conn.authentications >= 2
    assert _records_sections(private_plain, copy, 0) == _records_sections(private_plain, topic, 0)
    assert len(private_plain.read_all(copy)) == 1500
