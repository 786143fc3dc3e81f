"""Round trips to a cluster's brokers (the median of a few ApiVersions requests of our own) and each broker's
``socket.send.buffer.bytes``: what link sizing, the link preflight and the retention model's ETA start from.
"""

from __future__ import annotations

import ssl
import time

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.model.preflight_rules import (
    SourceLink,
)


def kafka_round_trip_s(host: str, port: int, *, timeout_s: float = 30.0, samples: int = 3,
                       tls: ssl.SSLContext | None = None, sasl: bool = False) -> float:
    """The median time of ``samples`` ApiVersions v0 requests (after one to warm the connection up): a
    Kafka-level round trip, which also counts whatever sits between us and the broker (a proxy, a tunnel).
    ``tls``: the listener's TLS (SSL, SASL_SSL). ``sasl``: a SASL listener answers one ApiVersions before its
    handshake and closes the connection at a second, so each sample gets a connection of its own: they are opened
    side by side (over a 200 ms link one TCP and TLS set-up after another cost ~1.8 s), then timed one after
    another, so no sample queues behind another's."""
    import contextlib
    import socket
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    from mirror_core.codec.kafka_primitives import API_VERSIONS, request_header

    def connected(stack: contextlib.ExitStack):
        sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
        return sock if tls is None else stack.enter_context(tls.wrap_socket(sock, server_hostname=host))

    def timed(sock, correlation_id: int) -> float:
        started = time.monotonic()
        sock.sendall(request_header(API_VERSIONS, 0, correlation_id, "shoal-preflight", False, 0))
        header = _recv_exact(sock, 4)
        _recv_exact(sock, int.from_bytes(header, "big"))
        return time.monotonic() - started

    times = []
    if sasl:
        with contextlib.ExitStack() as stack:
            def opened(_sample: int):
                inner = contextlib.ExitStack()
                stack.push(inner)   # closed with the others, whichever thread opened it, even half-opened
                return connected(inner)

            with ThreadPoolExecutor(max_workers=samples, thread_name_prefix="shoal-rtt") as pool:
                socks = list(pool.map(opened, range(samples)))
            times = [timed(sock, 1) for sock in socks]
    else:
        with contextlib.ExitStack() as stack:
            sock = connected(stack)
            timed(sock, 1)  # warm-up
            times += [timed(sock, i + 2) for i in range(samples)]
    return statistics.median(times)


def _recv_exact(sock, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        out += chunk
    return bytes(out)


def measure_links(source: ClusterConfig, *, timeout_s: float = 30.0,
                  admin: ClusterAdmin | None = None) -> list[SourceLink]:
    """Each source broker's ``socket.send.buffer.bytes`` (DescribeConfigs) and round trip
    (:func:`kafka_round_trip_s`). A broker that cannot be asked is left out (logged). ``admin``: a client of
    ``source`` to reuse (over a long link a new one costs its connection set-up again)."""
    import logging

    from mirror_core.kafka.wire_channel import tls_context

    admin = admin or ClusterAdmin(source, timeout_s=timeout_s)
    brokers = admin.metadata().brokers
    protocol = str(source.settings.get("security.protocol", "PLAINTEXT")).upper()
    tls = tls_context(source.settings) if protocol in ("SSL", "SASL_SSL") else None
    links = []
    for broker_id, broker in sorted(brokers.items()):
        try:
            value = admin.broker_config(broker_id, "socket.send.buffer.bytes", request_timeout=timeout_s)
            send_buffer = int(value) if value is not None else None
            rtt = kafka_round_trip_s(broker.host, broker.port, timeout_s=timeout_s, tls=tls,
                                     sasl=protocol.startswith("SASL_"))
        except Exception as exc:  # noqa: BLE001 - one broker's trouble does not stop the copy's preflight
            logging.getLogger(__name__).info("cluster %r broker %s: link not measured (%s)", source.name,
                                             broker_id, exc)
            continue
        links.append(SourceLink(broker_id, send_buffer, rtt))
    return links
