"""The fast path's byte channel alone: CPU per GB of receiving and sending through ``PlainChannel`` and
``TlsChannel`` over TCP loopback (a measurement aid, not a test).

A peer thread in this process serves the other end (a Python ``ssl`` server socket for TLS, TLS 1.3 with the
sandbox's throw-away CA) and the figure is the **calling thread's** CPU clock (``time.thread_time``), so the
peer's encryption/decryption is not counted. Receive: the peer sends ``--megabytes`` in TLS records of
``--record-bytes`` plaintext (writes of that size; Kafka brokers send records of up to 16 KiB, ~10 KiB on average in
the link bench), the caller reads 1 MiB frames the way ``FastConnection._recv_exact`` does. Send: the caller sends
requests of 32 KiB record batches (``--batch-bytes``) totalling 1 MiB each, the peer reads and drops them.
``--pace-mb-s`` paces the receive peer like a link (the reader then waits and wakes for each arrival).
``--ssl-socket`` adds the alternative the fast path does not take, measured the same way: ``ssl.SSLSocket``
(OpenSSL reads and writes the socket itself; no ``sendmsg``, so a request is joined and sent with ``sendall``).

    .venv/bin/python -m bench.tls_channel_bench --megabytes 200 --repeat 3 [--ssl-socket]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path

FRAME = 1 << 20


def _material(home: Path) -> dict:
    from mirror_core.dev.sandbox.tls import pem_server_material

    return pem_server_material(home)


class SocketTlsChannel:
    """The comparison, not the library's channel: TLS through ``ssl.SSLSocket``. OpenSSL reads the socket itself,
    one record at a time (a 5-byte header read, then the body: two ``recv`` per record), and writes each record with
    its own ``send``; a request's buffers are joined first (``SSLSocket`` has no ``sendmsg``)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str):
        self.sock = context.wrap_socket(sock, server_hostname=server_hostname)

    def send(self, parts) -> None:
        self.sock.sendall(b"".join(parts))

    def recv_into(self, view: memoryview, need: int = 1) -> int:
        n = self.sock.recv_into(view)
        if n == 0:
            raise ConnectionResetError("TLS session closed by the peer")
        return n

    def close(self) -> None:
        self.sock.close()


def _pair(material: dict | None, peer, ssl_socket: bool = False) -> tuple[object, threading.Thread]:
    """(client channel, peer thread running ``peer(server_socket)``); ``ssl_socket``: :class:`SocketTlsChannel`
    instead of the library's ``TlsChannel``."""
    from mirror_core.kafka.wire_channel import PlainChannel, TlsChannel, tls_context

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        listener.close()
        if material is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(material["cert"], material["key"])
            conn = context.wrap_socket(conn, server_side=True)
        with conn:
            peer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(30)
    if material is None:
        return PlainChannel(sock), thread
    if ssl_socket:
        return SocketTlsChannel(sock, tls_context({"ssl.ca.location": material["ca"]}), "localhost"), thread
    channel = TlsChannel(sock, tls_context({"ssl.ca.location": material["ca"]}), "localhost")
    channel.handshake("localhost:0")
    return channel, thread


def receive(material: dict | None, total: int, record_bytes: int, pace_mb_s: float = 0.0,
            ssl_socket: bool = False) -> float:
    """CPU-s per GB of receiving ``total`` bytes in 1 MiB frames (the peer paced at ``pace_mb_s`` if set)."""
    payload = memoryview(os.urandom(record_bytes))

    def peer(conn):
        sent, start = 0, time.monotonic()
        while sent < total:
            conn.sendall(payload)
            sent += len(payload)
            if pace_mb_s:
                ahead = start + sent / (pace_mb_s * 1e6) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    channel, thread = _pair(material, peer, ssl_socket)
    frame = bytearray(FRAME)
    view = memoryview(frame)
    received = 0
    start = time.thread_time()
    while received < total:
        want = min(FRAME, total - received)
        got = 0
        while got < want:
            got += channel.recv_into(view[got:want], want - got)
        received += got
    cpu = time.thread_time() - start
    thread.join(30)
    channel.close()
    return cpu / (total / 1e9)


def send(material: dict | None, total: int, batch_bytes: int, ssl_socket: bool = False) -> float:
    """CPU-s per GB of sending ``total`` bytes as 1 MiB requests of ``batch_bytes`` buffers."""
    data = memoryview(bytearray(os.urandom(FRAME)))
    parts = [data[i:i + batch_bytes] for i in range(0, FRAME, batch_bytes)]

    def peer(conn):
        sink = bytearray(1 << 18)
        with contextlib.suppress(OSError):
            while conn.recv_into(sink):         # until the caller closes
                pass

    channel, thread = _pair(material, peer, ssl_socket)
    sent = 0
    start = time.thread_time()
    while sent < total:
        channel.send([b"\x00\x10\x00\x00header", *parts])
        sent += FRAME + 10
    cpu = time.thread_time() - start
    channel.close()
    thread.join(30)
    return cpu / (total / 1e9)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tls_channel_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--record-bytes", type=int, default=10_000)
    parser.add_argument("--batch-bytes", type=int, default=32 * 1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pace-mb-s", type=float, default=0.0,
                        help="pace the receive peer (a link: data arrives in small pieces, the reader waits)")
    parser.add_argument("--ssl-socket", action="store_true",
                        help="also measure TLS through ssl.SSLSocket (rows 'receive sslsock', 'send sslsock')")
    args = parser.parse_args(argv)
    total = args.megabytes * 1_000_000
    with tempfile.TemporaryDirectory() as home:
        material = _material(Path(home))
        results: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            channels = [("plain", None, False), ("tls", material, False)]
            if args.ssl_socket:
                channels.append(("sslsock", material, True))
            for name, mat, sslsock in channels:
                results.setdefault(f"receive {name}", []).append(
                    receive(mat, total, args.record_bytes, args.pace_mb_s, sslsock))
            for name, mat, sslsock in channels:
                results.setdefault(f"send {name}", []).append(send(mat, total, args.batch_bytes, sslsock))
    for name, values in results.items():
        print(f"{name:14s} CPU-s/GB median {statistics.median(values):5.2f}  runs "
              + " ".join(f"{v:.2f}" for v in values))
    for way in ("receive", "send"):
        plain = statistics.median(results[f"{way} plain"])
        for name in ("tls", "sslsock") if args.ssl_socket else ("tls",):
            tls = statistics.median(results[f"{way} {name}"])
            print(f"{way}: {name} adds {tls - plain:.2f} CPU-s/GB ({tls / plain:.1f}x)")


if __name__ == "__main__":
    main()
