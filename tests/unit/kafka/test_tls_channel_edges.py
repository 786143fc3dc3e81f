"""Review of i14-tls-cpu (receive TLS by whole records): cases the branch's own tests do not cover."""

from __future__ import annotations

import pytest

from tests.unit.kafka.test_wire_channel_records import connected, material, whole  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


def test_close_notify_in_the_same_segment_as_the_data_is_reported_without_waiting_for_more(material):  # noqa: F811
    """The broker's last data record and its close_notify arrive in one segment, and the TCP FIN does not follow
    at once (a half-closing proxy, or the FIN still on its way). The old channel delivered the data, then the next
    read raised ConnectionResetError at once (OpenSSL keeps answering SSL_ERROR_ZERO_RETURN). The branch reads the
    close_notify in the same call as the data (n == 0 with got > 0 -> break), and the next call sees an empty BIO and
    nothing pending, so it goes back to the socket and waits — for a FIN or the request timeout — although the
    session is already known to be closed."""
    channel, peer = connected(material, whole)
    peer.send_records(b"last words")
    peer.close_notify()
    peer.pieces = [b"".join(peer.pieces)]     # tickets, the data record and close_notify: one segment
    buffer = bytearray(100)
    assert bytes(buffer[:channel.recv_into(memoryview(buffer))]) == b"last words"
    # ScriptedPeer raises AssertionError("... waited for bytes the peer never sent") where a socket would block
    with pytest.raises(ConnectionResetError, match="TLS session closed"):
        channel.recv_into(memoryview(buffer))


def test_a_record_header_announcing_more_than_tls_allows_fails_at_once(material):  # noqa: F811
    """A record header whose length exceeds what TLS permits (2**14 + 2048 for TLS 1.2 ciphertext, 2**14 + 256 for
    TLS 1.3) can never be followed by a valid record: OpenSSL rejects it as soon as it reads the header (the old
    channel handed every received byte to the BIO, so the error came at once). The branch first waits until the
    announced length has arrived (SO_RCVLOWAT raised to ~18 kB), i.e. until the request timeout on a real socket,
    before OpenSSL sees the header: a garbled stream (a middlebox, a non-TLS peer) is reported late and as a
    timeout instead of a TLS error."""
    import ssl

    channel, peer = connected(material, whole)
    peer.pieces = [bytes([23, 3, 3, 0xFF, 0xFF]) + b"x" * 100]   # the rest never comes
    with pytest.raises(ssl.SSLError):
        channel.recv_into(memoryview(bytearray(1000)))
