"""SASL login and KIP-368 re-authentication on a :class:`~mirror_core.kafka.fast_connection.FastConnection`.

SaslHandshake v1, then SaslAuthenticate v1/v2 rounds (:mod:`mirror_core.codec.sasl_messages`) carrying the
mechanism's exchange (:mod:`mirror_core.codec.sasl`: PLAIN, SCRAM-SHA-256/512), run after ApiVersions. When the
broker grants a session lifetime, the connection re-authenticates between requests once 85-95 % of it has passed
(the Java client's jitter): the next request first lets the requests in flight finish (their futures resolve), then
runs the exchange again on the same connection.

Invariants: an exchange runs only with nothing in flight; a refused login is :class:`HandshakeRefused` here and
:class:`~mirror_core.errors.ClusterUnavailableError` (not retriable, naming the cluster, the broker, the mechanism
and user) where the connection is made or re-authenticated; on a re-authentication a transport failure stays a
kafka-python retriable error (a new connection logs in afresh). SCRAM's salted password is kept per connection and
reused by its re-authentications.
"""

from __future__ import annotations

import random
import time

import kafka.errors as Errors

from mirror_core.codec.sasl import SaslExchangeError, new_exchange
from mirror_core.codec.sasl_messages import (
    API_SASL_AUTHENTICATE,
    SASL_AUTHENTICATE_FLEXIBLE,
    SASL_AUTHENTICATE_VERSIONS,
    decode_sasl_authenticate_response,
    decode_sasl_handshake_response,
    encode_sasl_authenticate_request,
    encode_sasl_handshake_request,
)
from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka.wire_channel import HandshakeRefused


class SaslLogin:
    """The SASL side of :class:`~mirror_core.kafka.fast_connection.FastConnection` (a mixin: it runs on the
    connection's own ``send``, ``wait``, ``version``, ``_read_one`` and ``_fail``, and keeps its state in the
    connection's ``security``, ``_salted``, ``_reauth_at``, ``authentications`` and ``session_lifetime_ms``)."""

    def _authenticate(self, *, again: bool = False) -> None:
        """SaslHandshake v1 + SaslAuthenticate rounds; raises :class:`HandshakeRefused` on a refused login and
        kafka-python's retriable errors on transport trouble. Only called with nothing in flight. On a first
        login a connection the broker closes mid-exchange counts as refused (brokers often close before their
        error response is out); on a re-authentication (``again``) it is a transport failure, retried on a new
        connection that logs in afresh."""
        sec = self.security
        who = f"SASL {sec.sasl_mechanism} login as {sec.sasl_username!r}"
        correlation_id = self._next_correlation_id()
        handshake = self._round_trip(
            [encode_sasl_handshake_request(correlation_id, self.client_id, sec.sasl_mechanism)],
            decode_sasl_handshake_response, False, correlation_id, who, again)
        if handshake.error_code:
            enabled = ", ".join(handshake.mechanisms) or "none"
            raise HandshakeRefused("sasl", self._where(), f"{who} refused: the broker does not enable "
                                   f"{sec.sasl_mechanism} on this listener (enabled: {enabled})")
        version = self.version(API_SASL_AUTHENTICATE, *SASL_AUTHENTICATE_VERSIONS)
        exchange = new_exchange(sec.sasl_mechanism, sec.sasl_username, sec.sasl_password,
                                salted_cache=self._salted)
        started = time.monotonic()
        message: bytes | None = exchange.first()
        while message is not None:
            correlation_id = self._next_correlation_id()
            answer = self._round_trip(
                encode_sasl_authenticate_request(version, correlation_id, self.client_id, message),
                lambda frame, v=version: decode_sasl_authenticate_response(v, frame),
                version >= SASL_AUTHENTICATE_FLEXIBLE, correlation_id, who, again)
            if answer.error_code:
                error = Errors.for_code(answer.error_code).__name__
                raise HandshakeRefused("sasl", self._where(), f"{who} refused ({error}: "
                                       f"{answer.error_message or 'no message'}); check sasl.mechanism, "
                                       "sasl.username and sasl.password")
            try:
                message = exchange.respond(answer.auth_bytes)
            except SaslExchangeError as exc:
                raise HandshakeRefused("sasl", self._where(), f"{who} failed: {exc}") from None
        self.session_lifetime_ms = max(answer.session_lifetime_ms, 0)
        self.authentications += 1
        self._reauth_at = (started + self.session_lifetime_ms / 1000 * random.uniform(0.85, 0.95)
                           if self.session_lifetime_ms and self.reauthenticate else None)

    def _round_trip(self, parts, decoder, flexible: bool, correlation_id: int, who: str, again: bool):
        future = self.send(parts, decoder, flexible_response=flexible, correlation_id=correlation_id)
        self.wait(future)
        if future.failed():
            if isinstance(future.exception, Errors.KafkaConnectionError) and not again:
                raise HandshakeRefused("sasl", self._where(), f"{who}: the broker closed the connection during "
                                       "authentication (refused login?); check sasl.mechanism, sasl.username "
                                       "and sasl.password") from None
            raise future.exception
        return future.value

    def _maybe_reauthenticate(self) -> None:
        if self._reauth_at is not None and not self.closed and time.monotonic() >= self._reauth_at:
            self._reauthenticate()

    def _reauthenticate(self) -> None:
        """KIP-368, between requests: drain what is in flight, then authenticate again on this connection."""
        while self._in_flight and not self.closed:
            self._read_one()
        if self.closed:
            return
        try:
            self._authenticate(again=True)
        except HandshakeRefused as exc:
            self._fail(Errors.KafkaConnectionError(f"{self!r}: re-authentication refused"))
            raise self._refused(exc) from None

    def _where(self) -> str:
        return f"broker {self.address[0]}:{self.address[1]}"

    def _refused(self, exc: HandshakeRefused) -> ClusterUnavailableError:
        return ClusterUnavailableError(self.cluster_name or "?", f"{self.address[0]}:{self.address[1]}",
                                       exc.reason, retriable=False)
