"""Review of i14-tls-cpu on a REAL loopback TCP socket (the branch's unit tests script the socket, so the kernel's
SO_RCVLOWAT and CPython's timeout-mode poll are not exercised there): a TLS server on memory BIOs whose ciphertext
goes out in pieces the test chooses, with delays."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time

import pytest

from mirror_core.kafka.wire_channel import TlsChannel, tls_context
from tests.unit.kafka.test_wire_channel_records import material  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(60)


class Server(threading.Thread):
    def __init__(self, material, script):  # noqa: F811
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(material["cert"], material["key"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.script = script
        self.done = threading.Event()

    @property
    def port(self):
        return self.listener.getsockname()[1]

    def run(self):
        conn, _ = self.listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = conn.recv(65536)
            if not data:
                return
            self.incoming.write(data)
            try:
                self.tls.do_handshake()
                conn.sendall(self.outgoing.read())
                break
            except ssl.SSLWantReadError:
                conn.sendall(self.outgoing.read())
        self.script(self, conn)
        self.done.wait(30)
        conn.close()

    def records(self, *plaintexts) -> bytes:
        for p in plaintexts:
            self.tls.write(p)
        return self.outgoing.read()

    def close_notify(self) -> bytes:
        with contextlib.suppress(ssl.SSLWantReadError):
            self.tls.unwrap()
        return self.outgoing.read()


def _client(material, server, timeout=3.0):  # noqa: F811
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    channel = TlsChannel(sock, tls_context({"ssl.ca.location": material["ca"]}), "localhost")
    channel.handshake("localhost")
    return channel


def _read(channel, size):
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        got += channel.recv_into(view[got:])
    return bytes(out)


def test_a_large_record_trickling_in_small_segments_arrives_whole(material):  # noqa: F811
    body = bytes(range(256)) * 62   # 15872 bytes: one record, low-water mark in play

    def script(server, conn):
        data = server.records(body)
        for i in range(0, len(data), 700):
            conn.sendall(data[i:i + 700])
            time.sleep(0.005)

    server = Server(material, script)
    server.start()
    channel = _client(material, server)
    try:
        assert _read(channel, len(body)) == body
    finally:
        server.done.set()
        channel.close()


def test_a_peer_half_closing_mid_record_is_reported_at_once_not_after_the_timeout(material):  # noqa: F811
    def script(server, conn):
        data = server.records(b"y" * 15000)
        conn.sendall(data[:3000])
        time.sleep(0.3)
        conn.shutdown(socket.SHUT_WR)       # FIN with the record 12 kB short; the socket stays open

    server = Server(material, script)
    server.start()
    channel = _client(material, server, timeout=10.0)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionResetError):
            _read(channel, 15000)
        assert time.monotonic() - started < 3
    finally:
        server.done.set()
        channel.close()


def test_close_notify_with_the_data_then_a_silent_peer_is_reported_at_once(material):  # noqa: F811
    """Data and close_notify in one segment, TCP left open: the old channel raised on the next read at once; the
    branch waits on the socket for the timeout (10 s here, the request timeout in FastConnection)."""
    def script(server, conn):
        conn.sendall(server.records(b"last") + server.close_notify())

    server = Server(material, script)
    server.start()
    channel = _client(material, server, timeout=10.0)
    try:
        buffer = memoryview(bytearray(65536))    # FastConnection reads into its 64 KiB receive buffer
        got = 0
        while got < 4:
            got += channel.recv_into(buffer[got:])
        assert bytes(buffer[:got]) == b"last"
        started = time.monotonic()
        with pytest.raises(ConnectionResetError):
            channel.recv_into(buffer)
        assert time.monotonic() - started < 3
    finally:
        server.done.set()
        channel.close()
