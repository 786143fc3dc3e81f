"""A thin synchronous Kafka wire client for one cluster, built on kafka-python 3's protocol and network layer.

Shoal's data plane speaks the Kafka protocol directly (raw Fetch / Produce of record batches, InitProducerId,
transactions) instead of going through a consumer or producer that would decode and re-encode records. This
module is the only place that knows how kafka-python 3.0.x is put together; the fetcher and the writer sit on it.

What kafka-python 3.0.12 offers, and how we use it
--------------------------------------------------
- ``kafka.protocol.*`` classes are generated from Apache Kafka's JSON schemas
  (``kafka/protocol/schemas/resources/*.json``). Field names are the schema names in snake_case; nested structs are
  classes on the message (``FetchRequest.FetchTopic.FetchPartition``). A field outside the encoded version is simply
  not written, so one request object can carry both ``topic`` and ``topic_id`` and encode right at any version.
  ``records`` fields take ``bytes``/``bytearray``/``memoryview`` and are written verbatim; on decode they come back
  as one ``bytes`` copy per partition.
  Request classes we use: ``kafka.protocol.metadata``: ApiVersionsRequest, MetadataRequest, FindCoordinatorRequest;
  ``kafka.protocol.consumer``: FetchRequest, ListOffsetsRequest (+ IsolationLevel, OffsetSpec);
  ``kafka.protocol.producer``: ProduceRequest, InitProducerIdRequest, AddPartitionsToTxnRequest, EndTxnRequest.
- Version negotiation: every connection sends ApiVersions on connect (``kafka.net.connection.KafkaConnection``)
  and keeps a ``BrokerVersionData``. A request built without a version gets, when it is sent, the highest version
  both sides support within the request's own ``min_version=`` / ``max_version=`` keyword bounds; the response
  object carries ``API_VERSION``. So callers bound versions per request (e.g. ``ListOffsetsRequest(...,
  min_version=2)`` for READ_COMMITTED) and read the negotiated one from the response.
- Network: ``kafka.net.NetworkSelector`` is a small event loop; ``kafka.net.KafkaConnectionManager`` owns one
  ``KafkaConnection`` per node, bootstraps (ApiVersions + Metadata on a bootstrap address), keeps broker addresses
  in ``manager.cluster`` (``kafka.cluster.ClusterMetadata``) and does SSL and SASL (PLAIN, SCRAM-SHA-256/512,
  OAUTHBEARER, GSSAPI) during connect. ``manager.send(request, node_id)`` returns a ``kafka.future.Future`` of the
  parsed response; ``selector.run(fn, *args)`` drives the loop on the calling thread until it resolves (no IO
  thread is started here, so nothing runs between calls and there is nothing to join on close).
- The hot path bypasses all of the above: :meth:`WireClient.fast_connection` gives the writer and the fetcher a
  socket of our own per broker with hand-encoded Produce / Fetch (:mod:`mirror_core.kafka.fast_connection`, tested
  byte-identical to kafka-python's encoding), with its own TLS (``ssl.SSLObject``) and SASL (PLAIN, SCRAM) on
  secure clusters; kafka-python's per-request cost was most of the copy's CPU.
  There is no ``kafka.conn.BrokerConnection`` / ``kafka.client_async.KafkaClient`` any more (3.0 replaced them;
  ``kafka.net.KafkaNetClient`` is a compatibility shim over the manager).

Gotchas found on the way
------------------------
- ``receive_message_max_bytes`` defaults to 1,000,000 in the manager: any Fetch response larger than that kills
  the connection (``InvalidReceiveError``). We default it to 100 MB; fetch sizes must stay below it.
- A wrong password does not stop the bootstrap: ``KafkaConnection.initialize`` never raises, so the manager's
  auth-failure cache is never filled and the bootstrap retries until its deadline (``KafkaTimeoutError``). Worse,
  the broker often closes the socket before its SASL error response arrives ("socket disconnected"). We make one
  first connection ourselves and treat "ApiVersions answered, then the SASL exchange died" as a refused login.
- kafka-python's DEBUG logging prints SASL requests (``kafka.net.connection``) and raw frames
  (``kafka.protocol.parser``); a PLAIN frame holds the password. A logging filter installed here drops those
  records; this module itself logs no configuration values.
- The classic transaction protocol that kafka-python drives caps Produce at v9..v11, InitProducerId at v4,
  AddPartitionsToTxn and EndTxn at v3; Produce v12+ / EndTxn v5 mean "transaction version 2" (KIP-890).
- Fetch v13+ and Produce v13+ address topics by id only; their responses carry ``topic_id`` and no name.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as Errors
from kafka.net import KafkaConnectionManager, NetworkSelector
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest, MetadataRequest

from mirror_core.config.cluster import ClusterConfig, kafka_python_kwargs
from mirror_core.errors import (
    ClusterUnavailableError,
    ConfigError,
    FetchError,
    MirrorError,
    PartitionUnavailableError,
)
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.wire_channel import FastSecurity

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_TIMEOUT_MS = 30_000
REBOOTSTRAP_TIMEOUT_MS = 10_000  # a metadata request that found no known broker retries from the bootstrap list
COORDINATOR_KEYS_PER_REQUEST = 1_000  # keys in one batched FindCoordinator (find_coordinators)
REBOOTSTRAP_RETRY_TIMEOUT_MS = 2_000  # ... while the last re-bootstrap found no broker (the cluster is down)
METADATA_SLOT = -1  # metadata_connection's slot among a broker's fast connections (fetches use 0, 1, ...)


def partition_request_with_retries(client: WireClient, topic: str, partition: int, what: str, attempt, *,
                                   retry_timeout_s: float = 60.0):
    """``attempt()`` (one request about ``topic-partition`` to its leader), retried after leader moves and
    transient errors (metadata refreshed between tries) until ``retry_timeout_s``: then
    :class:`PartitionUnavailableError`; a non-retriable error at once as :class:`FetchError`. ``what`` names the
    request in those errors, e.g. ``"ListOffsets(earliest)"``."""
    backoff = Backoff(give_up_after=retry_timeout_s)
    while True:
        try:
            return attempt()
        except Errors.KafkaError as exc:
            if not is_retriable(type(exc)):
                raise FetchError(client.cluster_name, topic, partition, None,
                                 f"{what}: {type(exc).__name__}") from None
            client.invalidate(topic)
            if not backoff.wait():
                raise PartitionUnavailableError(client.cluster_name, topic, partition,
                                                f"{what}: {type(exc).__name__}") from None


class Backoff:
    """Capped exponential backoff with jitter and an overall give-up deadline (all times in seconds)."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0, give_up_after: float = 120.0):
        self.initial = initial
        self.cap = cap
        self.give_up_after = give_up_after
        self.reset()

    def reset(self) -> None:
        self._failures = 0
        self._started = None

    def wait(self) -> bool:
        """Sleep before the next attempt; False (without sleeping) once the deadline has passed."""
        now = time.monotonic()
        if self._started is None:
            self._started = now
        if now - self._started >= self.give_up_after:
            return False
        delay = min(self.cap, self.initial * 2 ** self._failures) * random.uniform(0.8, 1.2)
        self._failures += 1
        time.sleep(min(delay, max(0.0, self.give_up_after - (now - self._started))))
        return True

    @property
    def elapsed(self) -> float:
        """Seconds since the first :meth:`wait` (0 before it)."""
        return 0.0 if self._started is None else time.monotonic() - self._started


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


class _SaslSecretsFilter(logging.Filter):
    """Drops kafka-python DEBUG records that would print SASL frames (a PLAIN frame holds the password)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.endswith(("Send: %r", "Recv: %r")):
            return False
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        return not any(type(arg).__name__.startswith("Sasl") for arg in args)


for _name in ("kafka.net.connection", "kafka.protocol.parser"):
    logging.getLogger(_name).addFilter(_SaslSecretsFilter())


_AUTH_ERRORS = (Errors.SaslAuthenticationFailedError, Errors.IllegalSaslStateError,
                Errors.UnsupportedSaslMechanismError)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:300]


def is_retriable(error_type: type) -> bool:
    """Whether kafka-python classifies a broker error as worth retrying (leader moves, timeouts, ...)."""
    return bool(getattr(error_type, "retriable", False))


class WireClient:
    """Synchronous request/response access to one Kafka cluster.

    Invariants: all IO runs on the calling thread inside :meth:`send` / :meth:`metadata` (not thread-safe: one
    client per thread); partition leaders are cached until :meth:`invalidate` or a refresh; the topic id first
    seen for a topic is remembered so callers can detect a recreated topic.
    """

    def __init__(self, cluster_name: str, config: Mapping[str, str], *,
                 bootstrap_timeout_ms: int = DEFAULT_BOOTSTRAP_TIMEOUT_MS, client_id: str = "shoal",
                 fast_path: bool = True):
        kwargs = kafka_python_kwargs(cluster_name, config, data_plane=True)
        kwargs.setdefault("client_id", client_id)
        self.cluster_name = cluster_name
        self.bootstrap_servers = str(config["bootstrap.servers"])
        self.request_timeout_ms = kwargs.get("request_timeout_ms", 30_000)
        self._net = NetworkSelector(**kwargs)
        self._manager = KafkaConnectionManager(self._net, **kwargs)
        self._sasl = kwargs.get("security_protocol", "PLAINTEXT").startswith("SASL_")
        self._topics: dict[str, TopicMetadata] = {}
        # freshness of the cache: Metadata answers taken so far, and per cached topic the count when its answer came
        # (a stamp: a larger one is a later answer; see metadata_stamp / topic_metadata_since)
        self._metadata_answers = 0
        # (key type, key) → a FindCoordinator entry another look-up found (hint_coordinator): taken once
        self._coordinator_hints: dict[tuple[int, str], Any] = {}
        self._topic_answer: dict[str, int] = {}
        self._client_id = kwargs["client_id"]
        # the hand-encoded hot path (mirror_core.kafka.fast_connection): every security protocol and SASL mechanism
        # Shoal's cluster settings accept, no proxies
        self._fast_enabled = fast_path and not any("proxy" in key for key in kwargs)
        try:
            self._fast_security = FastSecurity.from_settings(config) if self._fast_enabled else None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cluster {cluster_name!r}: TLS settings unusable ({_one_line(exc)}); check "
                              "ssl.ca.location, ssl.certificate.location and ssl.key.location") from None
        # (broker, slot) -> connection: slot 0 is the usual one; a fetch round may spread one broker's partitions
        # over more slots where one connection's window per round trip is below the link (see send_round)
        self._fast: dict[tuple[int, int], FastConnection] = {}
        self._metadata_node: int | None = None   # the broker metadata_connection asks while it answers
        self._closed = False
        self._rebootstrap_failed = False   # the last re-bootstrap (metadata) found no broker: see metadata()
        # run by close() while the client can still send: the fetch sessions its rounds opened are closed there
        # (mirror_core.kafka.broker_fetch.round_sessions registers that), so every owner that closes the client closes
        # them
        self._close_hooks: list[Callable[[WireClient], object]] = []
        first_error = self._first_contact(bootstrap_timeout_ms)
        try:
            self._manager.bootstrap(bootstrap_timeout_ms)
        except Exception as exc:  # noqa: BLE001 - every bootstrap failure means the same thing to the caller
            self.close()
            raise self._unavailable(exc, first_error) from None

    @classmethod
    def for_cluster(cls, cluster: ClusterConfig, **kwargs) -> WireClient:
        return cls(cluster.name, cluster.settings, **kwargs)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def on_close(self, hook: Callable[[WireClient], object]) -> None:
        """Call ``hook(self)`` when the client is closed, before its connections go: best-effort goodbyes to the
        brokers (closing fetch sessions). A hook bounds its own time and its errors are logged, never raised."""
        self._close_hooks.append(hook)

    def close(self) -> None:
        if self._closed:
            return
        hooks, self._close_hooks = self._close_hooks, []
        try:
            for hook in hooks:
                try:
                    hook(self)
                except Exception as exc:  # noqa: BLE001 - a goodbye that fails must not stop the close
                    log.debug("cluster %r: close hook failed: %s", self.cluster_name, _one_line(exc))
        finally:  # even interrupted (KeyboardInterrupt), the connections go
            self._closed = True
            for conn in self._fast.values():
                conn.close()
            self._fast.clear()
            try:
                self._manager.close()
                self._net.poll(timeout_ms=0)
            finally:
                self._net.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- versions --------------------------------------------------------------------------------------------

    @property
    def broker_version(self) -> tuple[int, ...] | None:
        return self._manager.broker_version

    def api_version(self, request_or_class, max_version: float = float("inf")) -> int:
        """The version a request would be sent at to the bootstrap broker (each node negotiates its own)."""
        return self._manager.broker_version_data.api_version(request_or_class, max_version=max_version)

    # -- requests --------------------------------------------------------------------------------------------

    def send(self, node_id: int | None, request, *, timeout_ms: int | None = None):
        """Send ``request`` to ``node_id`` (None: least loaded node) and return the parsed response.

        Raises kafka-python errors for transport trouble (retriable ones have ``retriable = True``) and
        :class:`ClusterUnavailableError` (non-retriable) when authentication or authorization to connect fails.
        """
        if self._closed:
            raise MirrorError(f"wire client for cluster {self.cluster_name!r} is closed")
        if node_id is None:
            node_id = self._manager.least_loaded_node()
            if node_id is None:
                raise Errors.NodeNotReadyError(f"no broker of cluster {self.cluster_name!r} is reachable now")
        try:
            return self._net.run(self._manager.send, request, node_id, timeout_ms)
        except _AUTH_ERRORS as exc:
            raise self._unavailable(exc) from None

    def send_async(self, node_id: int, request, timeout_ms: int | None = None):
        """Queue ``request`` for ``node_id`` and return a kafka-python Future at once (several may be in flight);
        :meth:`wait` drives the network loop on this thread until a given one is answered."""
        if self._closed:
            raise MirrorError(f"wire client for cluster {self.cluster_name!r} is closed")
        return self._net.call_soon_with_future(self._manager.send, request, node_id, timeout_ms)

    def wait(self, future, *, timeout_s: float | None = None) -> None:
        """Drive the network loop until ``future`` is resolved (or ``timeout_s`` passed: it may then be unresolved);
        authentication failures become :class:`ClusterUnavailableError`, other errors stay on the future."""
        if not future.is_done:
            self._net.poll(future=future, timeout_ms=None if timeout_s is None else max(0, int(timeout_s * 1000)))
        if future.failed() and isinstance(future.exception, _AUTH_ERRORS):
            raise self._unavailable(future.exception) from None

    def fast_connection(self, node_id: int, slot: int = 0, *, timeout_s: float | None = None
                        ) -> FastConnection | None:
        """This client's own hand-encoded connection to ``node_id`` for Produce / Fetch
        (:mod:`mirror_core.kafka.fast_connection`; TLS and SASL as the cluster settings say), made on first use and
        again after a failure; None when the client was made with ``fast_path=False`` (or reaches the cluster through
        a proxy), and the caller uses :meth:`send` / :meth:`send_async`. ``slot``: which of several connections
        to the broker (each its own socket, so its own TCP window; the kafka-python route has only one).
        Raises kafka-python's retriable errors when the broker cannot be reached, and
        :class:`ClusterUnavailableError` (not retriable) when it refuses our certificate check or login.
        ``timeout_s``: bounds connecting and every request of a connection made now (a goodbye at close); else the
        connect timeout is 10 s and requests use the client's request timeout."""
        if not self._fast_enabled:
            return None
        if self._closed:
            raise MirrorError(f"wire client for cluster {self.cluster_name!r} is closed")
        conn = self._fast.get((node_id, slot))
        if conn is not None and not conn.closed:
            return conn
        broker = self._manager.cluster.broker_metadata(node_id)
        if broker is None:
            raise Errors.NodeNotReadyError(f"no address known for broker {node_id} of cluster {self.cluster_name!r}")
        bounds = {} if timeout_s is None else {"connect_timeout_s": max(timeout_s, 0.01)}
        conn = FastConnection(broker.host, broker.port, client_id=self._client_id, node_id=node_id,
                              request_timeout_s=self.request_timeout_ms / 1000 if timeout_s is None
                              else max(timeout_s, 0.01), security=self._fast_security,
                              cluster_name=self.cluster_name, **bounds)
        self._fast[(node_id, slot)] = conn
        return conn

    def metadata_connection(self) -> tuple[FastConnection | None, bool]:
        """This client's own connection for whole-cluster Metadata (:mod:`mirror_core.kafka.topic_counts`), on a slot of
        its own (``METADATA_SLOT``) so it never waits behind a Fetch long-polling on the broker's usual
        connection; kept on one broker while it works, another (the least loaded) once it failed. Returns
        ``(connection, made now)``, or ``(None, False)`` without a fast path (the caller uses :meth:`send`).
        Raises like :meth:`fast_connection`, and ``NodeNotReadyError`` when no broker is known reachable."""
        if not self._fast_enabled:
            return None, False
        node = self._metadata_node
        conn = self._fast.get((node, METADATA_SLOT)) if node is not None else None
        if conn is not None and not conn.closed:
            return conn, False
        node = self._manager.least_loaded_node()
        if node is None:
            raise Errors.NodeNotReadyError(f"no broker of cluster {self.cluster_name!r} is reachable now")
        self._metadata_node = node
        return self.fast_connection(node, METADATA_SLOT), True

    def _first_contact(self, timeout_ms: int) -> BaseException | None:
        """Connect once to the first bootstrap address so a refused login fails fast.

        kafka-python's bootstrap retries an authentication failure like any connection error until its deadline
        (the failure is only cached for connections that raise, and ``initialize`` never does), so we look at the
        first connection's own outcome: auth errors raise :class:`ClusterUnavailableError` now, anything else is
        returned to enrich the message should the bootstrap time out.
        """
        node_id = self._manager.cluster.bootstrap_brokers()[0].node_id

        async def connected(conn):
            return await conn

        conn = None
        try:
            conn = self._manager.get_connection(node_id, timeout_ms=timeout_ms, refresh_metadata_on_err=False,
                                                reset_backoff_on_connect=False)
            self._net.run(connected, conn)
        except _AUTH_ERRORS as exc:
            self.close()
            raise self._unavailable(exc) from None
        except Exception as exc:  # noqa: BLE001 - reported if the bootstrap fails too
            # Brokers close the socket after a failed SASL exchange, often before the error response gets
            # through: a connection that passed ApiVersions and then died was refused at login.
            if self._sasl and conn is not None and conn.broker_version_data is not None:
                self.close()
                raise self._unavailable(Errors.SaslAuthenticationFailedError(
                    "connection closed by the broker during SASL authentication")) from None
            return exc
        self._manager.close(node_id)
        self._manager.reset_backoff(node_id)
        return None

    def _unavailable(self, exc: BaseException, hint: BaseException | None = None) -> ClusterUnavailableError:
        auth = isinstance(exc, _AUTH_ERRORS)
        if auth:
            reason = f"authentication failed ({type(exc).__name__}); check sasl.mechanism, username and password"
        elif isinstance(exc, Errors.KafkaTimeoutError):
            reason = "no bootstrap broker answered (unreachable, wrong address or wrong security.protocol)"
            if hint is not None:
                reason += f"; first attempt: {_one_line(hint)}"
        else:
            reason = _one_line(exc)
        return ClusterUnavailableError(self.cluster_name, self.bootstrap_servers, reason, retriable=not auth)

    # -- metadata --------------------------------------------------------------------------------------------

    def metadata(self, topics: list[str]) -> dict[str, TopicMetadata]:
        """Fetch metadata for ``topics`` (never auto-creates), update the leader cache and return it."""
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=t, topic_id=None) for t in topics],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
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
