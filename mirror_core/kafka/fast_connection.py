"""The fast connection: hand-encoded Produce / Fetch on a socket of our own, the data plane's hot path without
kafka-python's event loop.

Why (``docs/performance.md``): one partition takes one batch per Produce request, so the shallow copy pays a
request encode, a response decode and several event-loop turns per batch. In kafka-python 3 that is ~0.3 ms of CPU
per request (generic schema encoder for the header, per-request tasks, timers and coroutines in its selector). Here
a request is a list of buffers handed to one ``sendmsg`` (the record batches are not copied; the messages are
encoded by :mod:`mirror_core.codec.produce_messages` and :mod:`mirror_core.codec.fetch_messages`), and responses are
received as whole frames (:mod:`mirror_core.kafka.response_frames`).

Scope: :class:`FastConnection` speaks PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL (PLAIN, SCRAM-SHA-256/512):
TLS through ``ssl.SSLObject`` and memory BIOs, so a request stays a list of buffers up to the encryption
(:mod:`mirror_core.kafka.wire_channel`), SASL and KIP-368 re-authentication between requests by
:mod:`mirror_core.kafka.fast_login`. :meth:`mirror_core.kafka.wire_client.WireClient.fast_connection` hands one out
per broker (``WireClient(..., fast_path=False)`` turns it off; clusters reached through a proxy stay on kafka-python;
those three mechanisms are the only ones Shoal's cluster settings accept). Failures come back as kafka-python's
retriable errors (``KafkaConnectionError``, ``RequestTimedOutError``) on the request's future, so callers retry as
before; a failed connection is closed and every request in flight on it fails with it (a new one is made on the next
use). A refused certificate or login is :class:`~mirror_core.errors.ClusterUnavailableError` (not retriable), raised
where the connection is made or re-authenticated.

Invariants: requests on one connection are answered in send order (Kafka processes a connection's requests one at
a time), so responses are matched to the oldest request in flight and a correlation-id mismatch closes the
connection; a future is resolved exactly once; a broker's throttle time delays the next send on that connection;
a request sent with ``defer=True`` is in ``_in_flight`` at once but its bytes wait in ``_unsent`` until
:meth:`FastConnection.flush`, the next undeferred send (which sends them first) or the next read, so the send
order is the queue order and no read ever waits for an answer to a request not yet sent.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable, Sequence

import kafka.errors as Errors
from kafka.future import Future

from mirror_core.codec.fetch_messages import (
    API_FETCH,
    FETCH_FLEXIBLE,
    FETCH_VERSIONS,
    FetchResponseData,
    decode_fetch_response,
    encode_fetch_request,
)
from mirror_core.codec.kafka_primitives import API_VERSIONS, HEADER, I32, Reader, decode_api_versions, request_header
from mirror_core.codec.produce_messages import (
    API_PRODUCE,
    PRODUCE_DECODERS,
    PRODUCE_FLEXIBLE,
    PRODUCE_VERSIONS,
    ProduceTopicData,
    encode_one_partition_request,
    encode_produce_request,
)
from mirror_core.kafka import request_trace
from mirror_core.kafka.fast_login import SaslLogin
from mirror_core.kafka.response_frames import ResponseFrames
from mirror_core.kafka.wire_channel import FastSecurity, HandshakeRefused, PlainChannel, TlsChannel

_DEFER_MAX_PARTS = 256             # deferred request buffers per connection before a send goes out anyway (IOV_MAX)


class _FastFuture(Future):
    __slots__ = ("conn",)


class FastConnection(SaslLogin, ResponseFrames):
    """One socket to one broker, PLAINTEXT or TLS, SASL-authenticated or not: pipelined Produce and Fetch requests,
    answered in order.

    Single-threaded and blocking: :meth:`send` writes a whole request, :meth:`wait` reads responses in order until
    the given future is resolved. See the module docstring for the invariants.

    Security (``security``, a :class:`~mirror_core.kafka.wire_channel.FastSecurity`): TLS wraps the socket before the
    first request (:class:`~mirror_core.kafka.wire_channel.TlsChannel`, hostname verified against ``host``); SASL runs
    after ApiVersions: SaslHandshake v1, then SaslAuthenticate v1/v2 rounds of the mechanism's exchange
    (:mod:`mirror_core.codec.sasl`). KIP-368: when the broker grants a session lifetime, the connection re-authenticates
    between requests once 85-95 % of it has passed (the Java client's jitter): :meth:`send` first lets the requests
    in flight finish (their futures resolve), then runs the exchange again on the same connection. A refused
    certificate or login raises :class:`~mirror_core.errors.ClusterUnavailableError` (not retriable) naming
    ``cluster_name``, the broker, and for SASL the mechanism and user.
    """

    def __init__(self, host: str, port: int, *, client_id: str | None = "shoal", node_id: int | None = None,
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 30.0,
                 security: FastSecurity | None = None, cluster_name: str | None = None,
                 reauthenticate: bool = True):
        self.node_id = node_id
        self.address = (host, port)
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.security = security or FastSecurity()
        self.cluster_name = cluster_name
        self.reauthenticate = reauthenticate     # False only to show what a broker does without it (tests)
        self._correlation_id = 0
        # (correlation id, future, decoder, flexible response header, timeout in s) per request, in send order
        self._in_flight: collections.deque = collections.deque()
        # request buffers sent with ``defer=True`` and not yet handed to the kernel (their requests are already in
        # ``_in_flight``): they leave together with the next :meth:`flush`, the next undeferred send, or before any
        # read, so nothing ever waits for the answer to a request still held here
        self._unsent: list = []
        self._unsent_timeout_s = request_timeout_s
        self._versions: dict[tuple[int, int, int], int] = {}   # (api key, low, high) -> version, see version()
        self._throttled_until = 0.0
        self._init_receive_buffer()
        self._reauth_at: float | None = None     # monotonic time of the next re-authentication (KIP-368)
        self._salted: dict = {}                  # SCRAM's PBKDF2 result, reused by re-authentications
        self.authentications = 0
        self.session_lifetime_ms = 0
        self.bytes_sent = 0                      # request bytes handed to the channel (before TLS), all requests
        self.closed = False
        try:
            self._sock = socket.create_connection(self.address, timeout=connect_timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._timeout_s = self._sock.gettimeout()
        except OSError as exc:
            self.closed = True
            raise Errors.KafkaConnectionError(f"connecting to {host}:{port}: {exc}") from None
        self._channel = PlainChannel(self._sock)
        try:
            if self.security.tls:
                channel = TlsChannel(self._sock, self.security.ssl_context, host)
                try:
                    channel.handshake(f"{host}:{port}")
                except (OSError, ssl.SSLError) as exc:
                    raise Errors.KafkaConnectionError(f"{self!r}: TLS handshake: {exc}") from None
                self._channel = channel
            self.api_versions = self._handshake()
            if self.security.sasl:
                self._authenticate()
        except HandshakeRefused as exc:
            self.close()
            raise self._refused(exc) from None
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"FastConnection(node={self.node_id}, {self.address[0]}:{self.address[1]})"

    @property
    def tls_version(self) -> str | None:
        """The negotiated TLS version ("TLSv1.3"), None on a plain connection."""
        return self._channel.version if isinstance(self._channel, TlsChannel) else None

    # -- versions --------------------------------------------------------------------------------------------

    def _handshake(self) -> dict[int, tuple[int, int]]:
        future = self.send([request_header(API_VERSIONS, 0, self._next_correlation_id(), self.client_id, False, 0)],
                           decode_api_versions, flexible_response=False, correlation_id=self._correlation_id)
        self.wait(future)
        if future.failed():
            raise future.exception
        return future.value

    def version(self, api_key: int, low: int, high: int) -> int:
        """The highest version of ``api_key`` in [low, high] this broker supports (remembered per question: the
        broker's versions are fixed for the connection's life)."""
        known = self._versions.get((api_key, low, high))
        if known is not None:
            return known
        broker = self.api_versions.get(api_key)
        if broker is None or broker[0] > high or broker[1] < low:
            raise Errors.IncompatibleBrokerVersion(
                f"broker {self.address} supports api {api_key} at {broker}, we need {low}-{high}")
        self._versions[(api_key, low, high)] = version = min(high, broker[1])
        return version

    def _next_correlation_id(self) -> int:
        self._correlation_id = (self._correlation_id + 1) % 2**31
        return self._correlation_id

    # -- requests --------------------------------------------------------------------------------------------

    def produce(self, *, transactional_id: str | None, acks: int, timeout_ms: int,
                topic_data: Sequence[ProduceTopicData], max_version: int = PRODUCE_VERSIONS[1],
                request_timeout_ms: int | None = None, defer: bool = False) -> Future:
        """Send a ProduceRequest; the future's value is a :class:`ProduceResult`. ``defer``: see :meth:`send`."""
        self._maybe_reauthenticate()
        version = self.version(API_PRODUCE, PRODUCE_VERSIONS[0], min(max_version, PRODUCE_VERSIONS[1]))
        correlation_id = self._next_correlation_id()
        parts = encode_produce_request(version, correlation_id, self.client_id, transactional_id=transactional_id,
                                       acks=acks, timeout_ms=timeout_ms, topic_data=topic_data)
        return self.send(parts, PRODUCE_DECODERS[version], flexible_response=version >= PRODUCE_FLEXIBLE,
                         correlation_id=correlation_id, timeout_ms=request_timeout_ms,
                         nbytes=4 + I32.unpack_from(parts[0], 0)[0], defer=defer)

    def produce_one(self, *, transactional_id: str | None, acks: int, timeout_ms: int, topic: str, partition: int,
                    records: bytearray | memoryview, max_version: int, request_timeout_ms: int | None) -> Future:
        """:meth:`produce` with ``defer=True`` of one batch to one partition (a one-partition write's request, one per
        batch of a one-record-batch copy): the same bytes and the same bookkeeping in fewer steps. ``records`` is a
        ``bytearray`` or a one-dimensional byte ``memoryview`` (the writer's batches), so its ``len`` is its size.
        Anything but the plain case (no version negotiated yet, a re-authentication or a throttle due, the trace on,
        an empty batch, a closed connection, the deferred buffers nearly full) takes :meth:`produce`."""
        n = len(records)
        version = self._versions.get((API_PRODUCE, PRODUCE_VERSIONS[0], min(max_version, PRODUCE_VERSIONS[1])))
        reauth_at = self._reauth_at
        if (version is None or not n or self.closed or self._throttled_until or request_trace.ACTIVE is not None
                or len(self._unsent) + 3 > _DEFER_MAX_PARTS
                or (reauth_at is not None and time.monotonic() >= reauth_at)):
            return self.produce(transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
                                topic_data=[(topic, [(partition, records)])], max_version=max_version,
                                request_timeout_ms=request_timeout_ms, defer=True)
        self._correlation_id = correlation_id = (self._correlation_id + 1) % 2**31
        parts = encode_one_partition_request(version, correlation_id, self.client_id, transactional_id, acks,
                                             timeout_ms, topic, partition, records, n)
        future = _FastFuture()
        future.conn = self
        timeout_s = self.request_timeout_s if request_timeout_ms is None else request_timeout_ms / 1000
        self._unsent += parts
        self._unsent_timeout_s = timeout_s
        self.bytes_sent += 4 + I32.unpack_from(parts[0], 0)[0]
        self._in_flight.append((correlation_id, future, PRODUCE_DECODERS[version], version >= PRODUCE_FLEXIBLE,
                                timeout_s))
        return future

    def fetch_async(self, *, min_version: int, max_version: int, request_timeout_ms: int | None = None,
                    **fields) -> Future:
        """Send a FetchRequest (see :func:`encode_fetch_request` for ``fields``); the future's value is a
        :class:`FetchResponseData` once :meth:`wait` read it, or a kafka-python error on transport failure."""
        self._maybe_reauthenticate()
        version = self.version(API_FETCH, max(min_version, FETCH_VERSIONS[0]), min(max_version, FETCH_VERSIONS[1]))
        correlation_id = self._next_correlation_id()
        data = encode_fetch_request(version, correlation_id, self.client_id, **fields)
        return self.send([data], lambda frame: decode_fetch_response(version, frame),
                         flexible_response=version >= FETCH_FLEXIBLE, correlation_id=correlation_id,
                         timeout_ms=request_timeout_ms)

    def fetch(self, **kwargs) -> FetchResponseData:
        """One FetchRequest round trip (arguments as :meth:`fetch_async`); raises on transport failure like
        ``WireClient.send`` (kafka-python errors)."""
        future = self.fetch_async(**kwargs)
        self.wait(future)
        if future.failed():
            raise future.exception
        return future.value

    def send_encoded(self, request, version: int, decoder: Callable[[memoryview], object], *,
                     flexible_response: bool) -> Future:
        """Send a request kafka-python encodes (a small, rare one: a rescan's Metadata) at ``version``; ``decoder``
        reads the answer after its header, as for our own requests. Resolved in :meth:`wait`."""
        self._maybe_reauthenticate()
        correlation_id = self._next_correlation_id()
        request.API_VERSION = version
        request.with_header(correlation_id=correlation_id, client_id=self.client_id)
        return self.send([bytes(request.encode(framed=True, header=True))], decoder,
                         flexible_response=flexible_response, correlation_id=correlation_id)

    def send(self, parts, decoder: Callable[[memoryview], object], *, flexible_response: bool,
             correlation_id: int, timeout_ms: int | None = None, nbytes: int | None = None,
             defer: bool = False) -> Future:
        """Write one framed request (a list of buffers) and queue its decoder; the future resolves in :meth:`wait`.
        ``nbytes``: the request's size if the caller knows it (else the parts are measured). ``defer``: keep the
        buffers until :meth:`flush` (or the next undeferred send, or the next read), so several requests queued
        between two waits leave in one ``sendmsg``; the caller must keep them unchanged until then."""
        future = _FastFuture()
        future.conn = self
        if self.closed:
            return future.failure(Errors.KafkaConnectionError(f"{self!r} is closed"))
        if self._throttled_until:
            delay = self._throttled_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._throttled_until = 0.0
        timeout_s = self.request_timeout_s if timeout_ms is None else timeout_ms / 1000
        if nbytes is None:
            nbytes = sum(memoryview(part).nbytes for part in parts)
        if defer and len(self._unsent) + len(parts) <= _DEFER_MAX_PARTS:
            self._unsent += parts
            self._unsent_timeout_s = timeout_s   # the socket timeout their write will run under (see flush)
        else:
            if self._unsent:   # the deferred requests leave first: the broker answers in send order
                self.flush()
                if self.closed:
                    return future.failure(Errors.KafkaConnectionError(f"{self!r} is closed"))
            try:
                self._set_timeout(timeout_s)
                self._channel.send(parts)
            except (OSError, ssl.SSLError) as exc:
                self._fail(_transport_error(exc, self))
                return future.failure(_transport_error(exc, self))
            if request_trace.ACTIVE is not None:
                request_trace.ACTIVE.writes.append((time.perf_counter(), id(self), 1))
        self.bytes_sent += nbytes
        self._in_flight.append((correlation_id, future, decoder, flexible_response, timeout_s))
        if request_trace.ACTIVE is not None:
            self._trace_send(parts, correlation_id, nbytes)
        return future

    def _trace_send(self, parts, correlation_id: int, nbytes: int | None) -> None:
        api_key = HEADER.unpack_from(parts[0], 0)[1] if len(parts[0]) >= HEADER.size else -1
        size = sum(memoryview(part).nbytes for part in parts) if nbytes is None else nbytes
        request_trace.ACTIVE.sends.append((time.perf_counter(), id(self), api_key, correlation_id, size,
                                           len(self._in_flight)))

    def flush(self) -> None:
        """Hand the deferred requests to the kernel (one ``sendmsg``); on failure the connection fails and every
        request in flight on it with it."""
        if not self._unsent:
            return
        parts, self._unsent = self._unsent, []
        try:
            self._set_timeout(self._unsent_timeout_s)
            self._channel.send(parts)
        except (OSError, ssl.SSLError) as exc:
            self._fail(_transport_error(exc, self))
            return
        if request_trace.ACTIVE is not None:
            request_trace.ACTIVE.writes.append((time.perf_counter(), id(self), -1))

    def answered(self, future: Future, *, ask: bool = True) -> bool:
        """Whether ``future`` is resolved, after reading (never waiting for) the answers that already arrived:
        those whole in the receive buffer and, on a plain socket, what the kernel holds already (``ask=False``:
        only those in the buffer, no system call; for a caller that asked the kernel a moment ago, as one
        ``readv`` takes every answer that had arrived)."""
        if future.is_done:
            return True
        if self._unsent or not self._in_flight or self.closed:
            return False
        # TLS: only what _rbuf holds
        asked = not (ask and self._timeout_s and isinstance(self._channel, PlainChannel))
        rbuf = self._rbuf
        while self._in_flight:
            have = self._rend - self._rstart   # _frame_buffered, inline (a few times per batch of a copy)
            if have < 4 or have < 4 + I32.unpack_from(rbuf, self._rstart)[0]:
                if asked:
                    return False
                self._read_ready()   # one non-blocking read, only when the buffer has no whole answer
                asked = True
                continue
            self._read_one()
            if future.is_done:
                return True
        return False

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet (a new request's answer comes after all of theirs)."""
        return len(self._in_flight)

    def wait(self, future: Future, *, timeout_s: float | None = None) -> None:
        """Read responses in order until ``future`` is resolved (it fails if the connection does). ``timeout_s``:
        at most that long in all, each request's own timeout notwithstanding; past it the connection fails (its
        unread answers would otherwise wait ahead of the next request's), and ``future`` with it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not future.is_done:
            if not self._in_flight:
                future.failure(Errors.KafkaConnectionError(f"{self!r}: no answer pending for this request"))
                return
            self._read_one(deadline)

    def _read_one(self, deadline: float | None = None) -> None:
        """Read the oldest request's response. Its timeout runs from now, when we start waiting for it, not from
        when it was sent: a request sent ahead (a prefetch while the caller writes, or one queued behind another's
        long poll) is not failed for our own delay in reading; the clock measures only the broker's silence."""
        if self._unsent:
            self.flush()
            if self.closed:
                return
        correlation_id, future, decoder, flexible, timeout_s = self._in_flight[0]
        if deadline is not None:
            timeout_s = min(timeout_s, deadline - time.monotonic())
            if timeout_s <= 0:
                self._fail(Errors.RequestTimedOutError(f"{self!r}: no answer in time"))
                return
        trace = request_trace.ACTIVE
        if trace is not None:
            began, ready = time.perf_counter(), self._answer_ready()
        try:
            if timeout_s != self._timeout_s:
                self._set_timeout(timeout_s)
            frame = self._receive_frame()
            if trace is not None:
                trace.answers.append((began, time.perf_counter(), id(self), correlation_id, ready))
        except (OSError, ssl.SSLError, Errors.KafkaError) as exc:
            self._fail(_transport_error(exc, self))
            return
        self._in_flight.popleft()
        view = memoryview(frame)
        (received,) = I32.unpack_from(view, 0)
        if received != correlation_id:
            error = Errors.KafkaConnectionError(f"{self!r}: correlation id {received}, expected {correlation_id}")
            future.failure(error)
            self._fail(error)
            return
        try:
            if not flexible:
                pos = 4
            elif len(view) > 4 and view[4] == 0:        # the usual empty tag buffer of a v1 response header
                pos = 5
            else:
                reader = Reader(view, 4)
                reader.skip_tags()
                pos = reader.pos
            value = decoder(view[pos:])
        except (ValueError, IndexError, struct.error) as exc:
            error = Errors.KafkaProtocolError(f"{self!r}: undecodable response: {exc}")
            future.failure(error)
            self._fail(error)
            return
        throttle = getattr(value, "throttle_time_ms", 0)
        if throttle:
            self._throttled_until = time.monotonic() + throttle / 1000
        future.success(value)

    def _set_timeout(self, timeout_s: float) -> None:
        """``settimeout`` only when the value changes: each call is an ``ioctl`` in CPython, and nearly every
        request of a copy uses the same timeout (only this class sets the socket's timeout after connecting)."""
        if timeout_s != self._timeout_s:
            self._sock.settimeout(timeout_s)
            self._timeout_s = timeout_s

    def _fail(self, error: BaseException) -> None:
        in_flight, self._in_flight = self._in_flight, collections.deque()
        self.close()
        for entry in in_flight:
            if not entry[1].is_done:
                entry[1].failure(error)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._reauth_at = None
            self._rstart = self._rend = 0            # unread bytes of a closed connection answer nothing
            self._unsent = []
            with contextlib.suppress(OSError):
                self._sock.close()
        while self._in_flight:
            future = self._in_flight.popleft()[1]
            if not future.is_done:
                future.failure(Errors.KafkaConnectionError(f"{self!r} closed"))


def _transport_error(exc: BaseException, conn: FastConnection) -> Errors.KafkaError:
    if isinstance(exc, Errors.KafkaError):
        return exc
    if isinstance(exc, TimeoutError):
        return Errors.RequestTimedOutError(f"{conn!r}: no answer in time")
    return Errors.KafkaConnectionError(f"{conn!r}: {exc}")
