"""SaslHandshake v1 and SaslAuthenticate v1-v2 frames, hand-encoded (pure bytes).

The exchanges these frames carry (PLAIN, SCRAM-SHA-256/512) are computed by :mod:`mirror_core.codec.sasl`; the
connection that sends them, and re-authenticates by them (KIP-368), is
:class:`mirror_core.kafka.fast_connection.FastConnection`. Tested byte-identical against kafka-python
(``tests/unit/codec/test_sasl.py``). The auth bytes hold a credential: nothing here copies or keeps them beyond the
request.
"""

from __future__ import annotations

from typing import NamedTuple

from mirror_core.codec.kafka_primitives import I32, Reader, encode_string, request_header, uvarint

API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36
SASL_HANDSHAKE_VERSION = 1       # v1: the exchange itself travels in SaslAuthenticate requests
SASL_AUTHENTICATE_VERSIONS = (1, 2)   # v1+ answers with session_lifetime_ms (KIP-368); v2 is flexible
SASL_AUTHENTICATE_FLEXIBLE = 2


def encode_sasl_handshake_request(correlation_id: int, client_id: str | None, mechanism: str) -> bytes:
    """A framed SaslHandshakeRequest v1 (header v1, the mechanism name)."""
    body = encode_string(mechanism, compact=False)
    return request_header(API_SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, correlation_id, client_id, False,
                          len(body)) + body


class SaslHandshakeResult(NamedTuple):
    error_code: int
    mechanisms: list[str]


def decode_sasl_handshake_response(frame: memoryview) -> SaslHandshakeResult:
    r = Reader(frame)
    error_code = r.i16()
    return SaslHandshakeResult(error_code, [r.string(False) for _ in range(max(r.array(False), 0))])


def encode_sasl_authenticate_request(version: int, correlation_id: int, client_id: str | None,
                                     auth_bytes: bytes) -> list:
    """A framed SaslAuthenticateRequest v1 or v2 as a list of buffers (the auth bytes are not copied into the
    header: they hold a credential, and nothing here keeps them longer than the send)."""
    if not SASL_AUTHENTICATE_VERSIONS[0] <= version <= SASL_AUTHENTICATE_VERSIONS[1]:
        raise ValueError(f"SaslAuthenticateRequest v{version} is not hand-encoded")
    flexible = version >= SASL_AUTHENTICATE_FLEXIBLE
    length = uvarint(len(auth_bytes) + 1) if flexible else I32.pack(len(auth_bytes))
    tail = b"\x00" if flexible else b""
    header = request_header(API_SASL_AUTHENTICATE, version, correlation_id, client_id, flexible,
                            len(length) + len(auth_bytes) + len(tail))
    return [header + length, auth_bytes, tail]


class SaslAuthenticateResult(NamedTuple):
    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int


def decode_sasl_authenticate_response(version: int, frame: memoryview) -> SaslAuthenticateResult:
    flexible = version >= SASL_AUTHENTICATE_FLEXIBLE
    r = Reader(frame)
    error_code = r.i16()
    message = r.string(flexible)
    auth = r.bytes_view(flexible)
    lifetime = r.i64()
    if flexible:
        r.skip_tags()
    return SaslAuthenticateResult(error_code, message, b"" if auth is None else bytes(auth), lifetime)
