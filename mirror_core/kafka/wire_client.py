"""A thin synchronous Kafka wire client for one cluster, built on kafka-python 3's protocol and network layer.

Shoal's data plane speaks the Kafka protocol directly (raw Fetch / Produce of record batches, InitProducerId,
transactions) instead of going through a consumer or producer that would decode and re-encode records. This
module is the only place that knows how kafka-python 3.0.x is put together; the fetcher and the writer sit on it.
Its metadata cache and coordinator look-ups are :mod:`mirror_core.kafka.cluster_metadata` (a part of
:class:`WireClient`); retrying requests, :mod:`mirror_core.kafka.retries`.

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
import ssl
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import kafka.errors as Errors
from kafka.net import KafkaConnectionManager, NetworkSelector

from mirror_core.config.cluster import ClusterConfig, kafka_python_kwargs
from mirror_core.errors import ClusterUnavailableError, ConfigError, MirrorError
from mirror_core.kafka.cluster_metadata import ClusterMetadata, TopicMetadata
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.on_thread import on_thread
from mirror_core.kafka.wire_channel import FastSecurity

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_TIMEOUT_MS = 30_000
METADATA_SLOT = -1  # metadata_connection's slot among a broker's fast connections (fetches use 0, 1, ...)


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


class WireClient(ClusterMetadata):
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
        # (broker, 0) -> a connection being made on a thread of its own (prepare_fast_connections); taken by
        # fast_connection on first use. Only the Future is shared with that thread: it builds a FastConnection of
        # its own and touches nothing of this client's
        self._preparing: dict[tuple[int, int], Future] = {}
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
        self._close_first_contact()

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
            for prepared in self._preparing.values():
                _close_when_made(prepared)
            self._preparing.clear()
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
        prepared = self._preparing.get((node_id, slot))
        if prepared is not None:
            try:
                failure = prepared.exception() if timeout_s is None else None   # waits for one still being made
            finally:   # taken out only now: interrupted while waiting, close() still finds it
                del self._preparing[(node_id, slot)]
            if timeout_s is None and failure is None and not prepared.result().closed:
                conn = self._fast[(node_id, slot)] = prepared.result()
                return conn
            _close_when_made(prepared)   # failed, or made with other bounds
            if isinstance(failure, MirrorError) and not failure.retriable:
                raise failure   # a refused login or certificate: not tried again (a lockout counts each try)
        broker = self._manager.cluster.broker_metadata(node_id)
        if broker is None:
            raise Errors.NodeNotReadyError(f"no address known for broker {node_id} of cluster {self.cluster_name!r}")
        conn = self._new_fast_connection(node_id, broker, timeout_s)
        self._fast[(node_id, slot)] = conn
        return conn

    def prepare_fast_connections(self, node_ids) -> None:
        """Start making the fast connections to ``node_ids`` (slot 0), each on a thread of its own, while the
        caller goes on; :meth:`fast_connection` takes them on first use (waiting for one still being made). Over a
        long link a connection's set-up (TCP, TLS, ApiVersions, SASL) costs seconds: ``shoal copy`` starts the
        leaders' while it resolves its ranges and preflight describes the topic. A set-up refused for good (login,
        certificate) raises its error where the connection is first used; one that failed otherwise is made again
        there (and its error raised as usual)."""
        if not self._fast_enabled or self._closed:
            return
        for node_id in set(node_ids):
            if (node_id, 0) in self._preparing or (node_id, 0) in self._fast:
                continue
            broker = self._manager.cluster.broker_metadata(node_id)
            if broker is not None:
                try:
                    self._preparing[(node_id, 0)] = on_thread(self._new_fast_connection, node_id, broker, None,
                                                                    name="shoal-connect")
                except RuntimeError as exc:   # no thread to be had: only a head start is lost
                    log.debug("cluster %r broker %s: not connecting ahead (%s)", self.cluster_name, node_id, exc)
                    return

    def _new_fast_connection(self, node_id: int, broker, timeout_s: float | None) -> FastConnection:
        """Connect to ``broker`` (its address from the metadata) as the cluster settings say; touches nothing of the
        client's state (it may run on a thread of its own, :meth:`prepare_fast_connections`)."""
        bounds = {} if timeout_s is None else {"connect_timeout_s": max(timeout_s, 0.01)}
        return FastConnection(broker.host, broker.port, client_id=self._client_id, node_id=node_id,
                              request_timeout_s=self.request_timeout_ms / 1000 if timeout_s is None
                              else max(timeout_s, 0.01), security=self._fast_security,
                              cluster_name=self.cluster_name, **bounds)

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

        A connection that succeeds is left open for the bootstrap, which asks its Metadata over it (a connection
        already made to a bootstrap broker is the one kafka-python's bootstrap takes) and closes it; closing it here
        made the bootstrap connect again: one more TCP (and TLS and SASL) set-up per client, ~1.2 s over a 200 ms
        link with SASL_SSL. Should the bootstrap pick another bootstrap broker, :meth:`_close_first_contact` closes
        this one after it.
        """
        node_id = self._first_contact_node = self._manager.cluster.bootstrap_brokers()[0].node_id

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
        return None

    def _close_first_contact(self) -> None:
        """After the bootstrap: the first contact's connection, unless the bootstrap used (and closed) it."""
        self._manager.close(self._first_contact_node)   # nothing when the bootstrap closed it
        self._manager.reset_backoff(self._first_contact_node)

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


def _close_when_made(prepared: Future) -> None:
    """Close the connection ``prepared`` makes, whenever it is made (now if it is), unless making it failed."""
    def close(done: Future) -> None:
        if done.exception() is None:
            done.result().close()

    prepared.add_done_callback(close)
