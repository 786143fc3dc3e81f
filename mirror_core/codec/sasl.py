"""SASL client exchanges for the fast connection: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677).

Sans-I/O: a :class:`SaslExchange` turns the server's messages into the client's next ones; the caller
(:class:`mirror_core.kafka.fast_connection.FastConnection`) carries them in SaslAuthenticate requests
(:mod:`mirror_core.codec.sasl_messages`). Nothing here logs, and no message, error or ``repr`` holds the password
or a proof derived from it.

SCRAM, as Kafka's broker speaks it (``ScramSaslServer``): no channel binding (gs2 header ``n,,``), the user name
escaped (``=`` → ``=3D``, ``,`` → ``=2C``), at least 4096 iterations (Kafka refuses fewer when the
credential is created), the server's nonce must extend ours and its final ``v=`` signature is checked, so a
broker that does not know the password cannot pass for one that does.

Invariant: an exchange is used once; :meth:`SaslExchange.respond` raises :class:`SaslExchangeError` when the server
answers out of turn, and returns None when the client has nothing more to send.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 1_000_000     # a broker asking for more is not trusted with our CPU
_GS2_HEADER = b"n,,"


class SaslExchangeError(Exception):
    """The server's SASL message was malformed or did not prove it knows the credential (no secrets inside)."""


class SaslExchange:
    """One client side of a SASL exchange: :meth:`first` message, then :meth:`respond` to each server message."""

    mechanism: str

    def first(self) -> bytes:
        raise NotImplementedError

    def respond(self, server_message: bytes) -> bytes | None:
        raise NotImplementedError


class PlainExchange(SaslExchange):
    """PLAIN: one message, ``authzid NUL authcid NUL password`` (empty authzid); the server answers with nothing."""

    mechanism = "PLAIN"

    def __init__(self, username: str, password: str):
        self._message = b"\x00" + username.encode() + b"\x00" + password.encode()

    def __repr__(self) -> str:
        return "PlainExchange(****)"

    def first(self) -> bytes:
        return self._message

    def respond(self, server_message: bytes) -> bytes | None:
        return None


class ScramExchange(SaslExchange):
    """SCRAM-SHA-256 / SCRAM-SHA-512 client: client-first, client-final (with proof), then the server signature is
    verified. ``salted_cache`` (optional, shared by one connection's re-authentications) keeps the PBKDF2 result per
    (salt, iterations) so a re-authentication does not pay the 4096+ iterations again."""

    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str | None = None,
                 salted_cache: dict | None = None):
        if mechanism not in _SCRAM_HASHES:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        self.mechanism = mechanism
        self._hash = _SCRAM_HASHES[mechanism]
        self._username = username
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._cache = salted_cache if salted_cache is not None else {}
        self._client_first_bare = b""
        self._server_signature: bytes | None = None
        self._step = 0

    def __repr__(self) -> str:
        return f"ScramExchange({self.mechanism}, user={self._username!r}, step={self._step})"

    def first(self) -> bytes:
        if self._step != 0:
            raise SaslExchangeError("SCRAM exchange already started")
        self._step = 1
        self._client_first_bare = f"n={_saslname(self._username)},r={self._nonce}".encode()
        return _GS2_HEADER + self._client_first_bare

    def respond(self, server_message: bytes) -> bytes | None:
        if self._step == 1:
            self._step = 2
            return self._client_final(server_message)
        if self._step == 2:
            self._step = 3
            self._verify_server_final(server_message)
            return None
        raise SaslExchangeError(f"unexpected SCRAM message at step {self._step}")

    def _client_final(self, server_first: bytes) -> bytes:
        fields = _scram_fields(server_first)
        if "e" in fields:
            raise SaslExchangeError(f"server refused the SCRAM exchange: {fields['e']}")
        try:
            nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"], validate=True), int(fields["i"])
        except (KeyError, ValueError) as exc:
            raise SaslExchangeError(f"malformed SCRAM server-first message ({type(exc).__name__})") from None
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise SaslExchangeError("SCRAM server nonce does not extend the client nonce")
        if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
            raise SaslExchangeError(f"SCRAM iteration count {iterations} outside "
                                    f"{SCRAM_MIN_ITERATIONS}..{SCRAM_MAX_ITERATIONS}")
        key = (self._hash, salt, iterations)
        salted = self._cache.get(key)
        if salted is None:
            salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
            self._cache.clear()                  # one credential per connection: keep only the latest
            self._cache[key] = salted
        without_proof = b"c=" + base64.b64encode(_GS2_HEADER) + b",r=" + nonce.encode()
        auth_message = self._client_first_bare + b"," + server_first + b"," + without_proof
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return without_proof + b",p=" + base64.b64encode(proof)

    def _verify_server_final(self, server_final: bytes) -> None:
        fields = _scram_fields(server_final)
        if "e" in fields:
            raise SaslExchangeError(f"server refused the SCRAM proof: {fields['e']}")
        try:
            received = base64.b64decode(fields["v"], validate=True)
        except (KeyError, ValueError):
            raise SaslExchangeError("malformed SCRAM server-final message") from None
        if self._server_signature is None or not hmac.compare_digest(received, self._server_signature):
            raise SaslExchangeError("SCRAM server signature does not match: the broker did not prove it knows "
                                    "the credential")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


def new_exchange(mechanism: str, username: str, password: str, *, salted_cache: dict | None = None) -> SaslExchange:
    """The client exchange for ``mechanism`` (one of :data:`MECHANISMS`)."""
    if mechanism == "PLAIN":
        return PlainExchange(username, password)
    if mechanism in _SCRAM_HASHES:
        return ScramExchange(mechanism, username, password, salted_cache=salted_cache)
    raise ValueError(f"SASL mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}")


def _saslname(name: str) -> str:
    """RFC 5802 §5.1: ``=`` and ``,`` in a user name are sent as ``=3D`` and ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def _scram_fields(message: bytes) -> dict[str, str]:
    try:
        text = bytes(message).decode()
    except UnicodeDecodeError:
        raise SaslExchangeError("SCRAM server message is not UTF-8") from None
    fields = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslExchangeError("malformed SCRAM server message")
        fields.setdefault(key, value)
    return fields
