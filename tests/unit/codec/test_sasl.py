"""SASL client exchanges (mirror_core.codec.sasl): the RFC 7677 SCRAM-SHA-256 example, PLAIN's one message, and a server
that cannot prove it knows the credential is refused. Plus the SaslHandshake / SaslAuthenticate requests and
responses of the fast connection are byte-identical to kafka-python's."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from mirror_core.codec.sasl import PlainExchange, SaslExchangeError, ScramExchange, new_exchange
from mirror_core.codec.sasl_messages import (
    decode_sasl_authenticate_response,
    decode_sasl_handshake_response,
    encode_sasl_authenticate_request,
    encode_sasl_handshake_request,
)

# RFC 7677 §3: user "user", password "pencil"
RFC_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_exchange(**kwargs) -> ScramExchange:
    return ScramExchange("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE, **kwargs)


def test_scram_sha_256_matches_the_rfc_7677_example():
    exchange = _rfc_exchange()
    assert exchange.first() == b"n,,n=user,r=" + RFC_NONCE.encode()
    assert exchange.respond(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert exchange.respond(RFC_SERVER_FINAL) is None


def test_a_re_authentication_reuses_the_salted_password_and_gives_the_same_proof():
    cache: dict = {}
    for _ in range(2):
        exchange = _rfc_exchange(salted_cache=cache)
        exchange.first()
        assert exchange.respond(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
        assert len(cache) == 1


@pytest.mark.parametrize("server_final, reason", [
    (b"v=" + base64.b64encode(b"\x00" * 32), "signature does not match"),
    (b"e=invalid-proof", "invalid-proof"),
    (b"garbage", "malformed"),
])
def test_a_server_that_cannot_prove_the_credential_is_refused(server_final, reason):
    exchange = _rfc_exchange()
    exchange.first()
    exchange.respond(RFC_SERVER_FIRST)
    with pytest.raises(SaslExchangeError, match=reason):
        exchange.respond(server_final)


@pytest.mark.parametrize("server_first, reason", [
    (b"r=someone-elses-nonce,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "nonce"),
    (RFC_SERVER_FIRST.replace(b"i=4096", b"i=1000"), "iteration count 1000"),
    (RFC_SERVER_FIRST.replace(b"i=4096", b"i=99999999"), "iteration count"),
    (b"r=" + RFC_NONCE.encode() + b"x,i=4096", "malformed"),
])
def test_a_suspicious_server_first_message_is_refused(server_first, reason):
    exchange = _rfc_exchange()
    exchange.first()
    with pytest.raises(SaslExchangeError, match=reason):
        exchange.respond(server_first)


def test_user_names_are_escaped_and_sha_512_has_its_own_proof_length():
    exchange = ScramExchange("SCRAM-SHA-512", "a=b,c", "pw", nonce="N")
    assert exchange.first() == b"n,,n=a=3Db=2Cc,r=N"
    final = exchange.respond(b"r=Nserver,s=" + base64.b64encode(b"salt") + b",i=4096")
    assert len(base64.b64decode(final.split(b",p=")[1])) == 64


def test_plain_is_one_message_and_no_repr_shows_the_password():
    plain = new_exchange("PLAIN", "shoal", "s3cret-pw")
    assert isinstance(plain, PlainExchange)
    assert plain.first() == b"\x00shoal\x00s3cret-pw" and plain.respond(b"") is None
    scram = new_exchange("SCRAM-SHA-256", "shoal", "s3cret-pw")
    assert "s3cret-pw" not in repr(plain) + repr(scram)
    with pytest.raises(ValueError, match="GSSAPI"):
        new_exchange("GSSAPI", "u", "p")


# -- the requests and responses on the wire ---------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


def _theirs(request, version: int, correlation_id: int, client_id: str | None) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(framed=True, header=True))


@settings(max_examples=100, deadline=None)
@given(correlation_id=st.integers(0, 2**31 - 1), client_id=st.one_of(st.none(), names), mechanism=names)
def test_sasl_handshake_request_is_byte_identical(correlation_id, client_id, mechanism):
    ours = encode_sasl_handshake_request(correlation_id, client_id, mechanism)
    assert ours == _theirs(SaslHandshakeRequest(mechanism=mechanism), 1, correlation_id, client_id)


@settings(max_examples=100, deadline=None)
@given(version=st.integers(1, 2), correlation_id=st.integers(0, 2**31 - 1), client_id=st.one_of(st.none(), names),
       auth=st.binary(max_size=300))
def test_sasl_authenticate_request_is_byte_identical(version, correlation_id, client_id, auth):
    ours = b"".join(encode_sasl_authenticate_request(version, correlation_id, client_id, auth))
    assert ours == _theirs(SaslAuthenticateRequest(auth_bytes=auth), version, correlation_id, client_id)


@settings(max_examples=100, deadline=None)
@given(version=st.integers(1, 2), error=st.integers(-1, 100), message=st.one_of(st.none(), names),
       auth=st.binary(max_size=200), lifetime=st.integers(0, 2**40))
def test_sasl_authenticate_response_decodes_like_kafka_python(version, error, message, auth, lifetime):
    encoded = bytes(SaslAuthenticateResponse(error_code=error, error_message=message, auth_bytes=auth,
                                             session_lifetime_ms=lifetime).encode(version=version))
    assert decode_sasl_authenticate_response(version, memoryview(encoded)) == (error, message, auth, lifetime)


@given(error=st.integers(-1, 100), mechanisms=st.lists(names, max_size=4))
def test_sasl_handshake_response_decodes_like_kafka_python(error, mechanisms):
    encoded = bytes(SaslHandshakeResponse(error_code=error, mechanisms=mechanisms).encode(version=1))
    assert decode_sasl_handshake_response(memoryview(encoded)) == (error, mechanisms)
