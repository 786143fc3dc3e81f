"""The fast connection's TLS channel (mirror_core.kafka.wire_channel) against a local TLS server on a socket pair: a
request of many buffers (small header pieces gathered, large batches sliced) arrives whole and in order; a host
name the certificate does not carry and an unknown CA are refused with a sentence naming the host. The plain
channel on real TCP: a frame read with its need wakes at a raised low-water mark, and the answer after it is not
kept waiting by that mark."""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest

from mirror_core.dev.sandbox.tls import pem_server_material
from mirror_core.kafka.wire_channel import FastSecurity, HandshakeRefused, PlainChannel, TlsChannel, tls_context


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    home = tmp_path_factory.mktemp("tls")
    return pem_server_material(home)


def _echo_server(material, sock: socket.socket, expect: int) -> threading.Thread:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(material["cert"], material["key"])

    def serve():
        try:
            with context.wrap_socket(sock, server_side=True) as tls:
                got = bytearray()
                while len(got) < expect:
                    got += tls.recv(65536)
                tls.sendall(got)
        except (ssl.SSLError, OSError):
            sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _channel(material, hostname: str, expect: int, **settings) -> tuple[TlsChannel, threading.Thread]:
    client, server = socket.socketpair()
    client.settimeout(10)
    thread = _echo_server(material, server, expect)
    context = tls_context({"ssl.ca.location": material["ca"], **settings})
    return TlsChannel(client, context, hostname), thread


def test_a_request_of_many_buffers_arrives_whole_and_in_order(material):
    big = memoryview(bytearray(os.urandom(700_000)))
    parts = [b"\x00\x00\x00\x10header", b"t" * 20, big[:300_000], b"mid", bytearray(os.urandom(20_000)),
             big[300_000:], b"", b"tail" * 5000, b"end"]
    expected = b"".join(bytes(p) for p in parts)
    channel, thread = _channel(material, "localhost", len(expected))
    channel.handshake("localhost:0")
    assert channel.version in ("TLSv1.2", "TLSv1.3")
    channel.send(parts)
    received = bytearray(len(expected))
    view, got = memoryview(received), 0
    while got < len(expected):
        got += channel.recv_into(view[got:])
    assert received == expected
    thread.join(10)
    with pytest.raises(ConnectionResetError):
        channel.recv_into(memoryview(bytearray(10)))
    channel.close()


def test_a_host_name_the_certificate_does_not_carry_is_refused(material):
    channel, thread = _channel(material, "127.0.0.1", 1)
    with pytest.raises(HandshakeRefused) as info:
        channel.handshake("127.0.0.1:9093")
    assert info.value.stage == "tls" and "hostname verification failed" in str(info.value)
    assert "'127.0.0.1'" in str(info.value) and "127.0.0.1:9093" in str(info.value)
    channel.close()
    thread.join(10)


def test_hostname_verification_can_be_turned_off_but_the_chain_is_still_checked(material):
    channel, thread = _channel(material, "127.0.0.1", 1, **{"ssl.endpoint.identification.algorithm": "none"})
    channel.handshake("127.0.0.1:9093")
    channel.send([b"x"])
    channel.close()
    thread.join(10)
    client, server = socket.socketpair()
    thread = _echo_server(material, server, 1)
    no_ca = tls_context({"ssl.endpoint.identification.algorithm": "none"})   # the system store: not our CA
    with pytest.raises(HandshakeRefused, match="ssl.ca.location"):
        TlsChannel(client, no_ca, "localhost").handshake("localhost:9093")
    client.close()
    thread.join(10)


def test_security_from_settings_keeps_the_password_out_of_repr(material):
    security = FastSecurity.from_settings({"bootstrap.servers": "b:1", "security.protocol": "sasl_ssl",
                                           "sasl.mechanism": "scram-sha-256", "sasl.username": "u",
                                           "sasl.password": "pw-123", "ssl.ca.location": material["ca"]})
    assert security.tls and security.sasl and security.sasl_mechanism == "SCRAM-SHA-256"
    assert "pw-123" not in repr(security)
    assert not FastSecurity.from_settings({"bootstrap.servers": "b:1"}).tls


def test_plain_channel_reads_a_frame_at_its_need_then_a_small_answer_at_once():
    """Real TCP on loopback: the peer sends a 600 kB frame in 1448-byte writes, then (after the reader asked for it)
    a 10-byte answer. The frame is read with its need (the mark rises, so the reader wakes per many segments); the
    small answer must come back at once, i.e. the mark went back to 1: a mark left high would hold it until the
    socket's timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    client.settimeout(5)
    frame = os.urandom(600_000)
    asked = threading.Event()

    def peer():
        for i in range(0, len(frame), 1448):
            server.sendall(frame[i:i + 1448])
        asked.wait(10)
        server.sendall(b"0123456789")

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    channel = PlainChannel(client)
    received = bytearray(len(frame))
    view, got, reads, marks = memoryview(received), 0, 0, set()
    while got < len(frame):
        got += channel.recv_into(view[got:], len(frame) - got)
        reads += 1
        marks.add(client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
    assert received == frame
    assert max(marks) >= 4096, marks                    # the need raised the mark
    asked.set()
    small = bytearray(64)
    n = channel.recv_into(memoryview(small))            # no need: the mark is 1 again, 10 bytes wake the reader
    assert bytes(small[:n]) == b"0123456789"
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    thread.join(10)
    channel.close()
    server.close()


def test_a_full_send_buffer_waits_under_the_socket_timeout_then_fails_as_a_timeout():
    """The plain channel writes with os.writev on the non-blocking descriptor first (no poll per request); when the
    peer stops reading and the send buffer fills, the write must wait under the socket's timeout and fail as a
    timeout, not as BlockingIOError at once; a peer that reads slowly gets every byte in order."""
    client, server = socket.socketpair()
    client.settimeout(0.5)
    channel = PlainChannel(client)
    payload = memoryview(os.urandom(8 << 20))
    with pytest.raises(TimeoutError):
        channel.send([payload[:1 << 20], payload[1 << 20:]])
    client.close()
    server.close()

    client, server = socket.socketpair()
    client.settimeout(5)
    channel = PlainChannel(client)
    received = bytearray()

    def slow_reader():
        while len(received) < len(payload):
            received.extend(server.recv(65536))

    thread = threading.Thread(target=slow_reader, daemon=True)
    thread.start()
    channel.send([payload[:3], payload[3:5 << 20], payload[5 << 20:]])
    thread.join(10)
    assert bytes(received) == bytes(payload)
    client.close()
    server.close()
