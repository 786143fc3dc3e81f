"""The daemon's Prometheus metrics and its HTTP endpoint (``/metrics``, ``/healthz``).

Names follow Prometheus conventions and what MirrorMaker 2 operators look for: records and bytes copied, replication
latency, record age, lag per partition, deep batches, errors by kind; retention margins come from
:mod:`mirror_core.metrics`.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LABELS = ("topic", "partition")


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("shoal_records_copied_total", "Records copied to the target", LABELS, registry=r)
        self.bytes = Counter("shoal_bytes_copied_total", "Raw batch bytes produced to the target", LABELS, registry=r)
        self.batches = Counter("shoal_batches_copied_total", "Record batches produced to the target", LABELS,
                               registry=r)
        self.deep = Counter("shoal_deep_batches_total", "Batches that had to be decompressed (named deep cases)",
                            LABELS, registry=r)
        self.errors = Counter("shoal_errors_total", "Errors by kind", ("kind",), registry=r)
        self.latency = Histogram("shoal_replication_latency_seconds",
                                 "Time from a batch's newest record timestamp to its commit on the target", LABELS,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300), registry=r)
        self.record_age = Gauge("shoal_record_age_seconds", "Age of the newest copied record at its commit", LABELS,
                                registry=r)
        self.lag = Gauge("shoal_lag_records", "Offsets between the mirror position and the source's last stable "
                         "offset", LABELS, registry=r)
        self.position = Gauge("shoal_position_offset", "Next source offset to copy", LABELS, registry=r)
        self.lanes = Gauge("shoal_lanes_owned", "Lanes this daemon process holds", registry=r)
        self.halted = Gauge("shoal_lanes_halted", "Lanes stopped for good (recreated source topic, data lost before "
                            "it was copied) until an operator acts", registry=r)
        self.fetch_rounds = Counter("shoal_fetch_rounds_total", "Fetch rounds (each asks every source broker once "
                                    "for all of its held partitions)", registry=r)
        self.fetch_requests = Counter("shoal_fetch_requests_total", "Fetch requests sent to source brokers",
                                      registry=r)
        self.fetch_partitions = Counter("shoal_fetch_partitions_total", "Partitions asked for, summed over fetch "
                                        "requests", registry=r)
        self.config_changes = Counter("shoal_topic_config_changes_total", "Topic configs synced from source to target",
                                      ("topic",), registry=r)
        self.healthy = True
        self.last_loop = time.monotonic()

    def observe_copy(self, topic: str, partition: int, result, newest_timestamp_ms: int | None) -> None:
        labels = (topic, str(partition))
        self.records.labels(*labels).inc(result.records)
        self.bytes.labels(*labels).inc(result.bytes)
        self.batches.labels(*labels).inc(result.batches)
        self.deep.labels(*labels).inc(result.deep_batches)
        if newest_timestamp_ms is not None and result.records:
            age = max(0.0, time.time() - newest_timestamp_ms / 1000)
            self.latency.labels(*labels).observe(age)
            self.record_age.labels(*labels).set(age)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve_metrics(metrics: DaemonMetrics, port: int, *, stale_after_s: float = 60.0) -> ThreadingHTTPServer:
    """Start ``/metrics`` and ``/healthz`` on ``port`` (127.0.0.1 unless bound otherwise) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.startswith("/metrics"):
                body, status, ctype = metrics.render(), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/healthz"):
                fresh = time.monotonic() - metrics.last_loop < stale_after_s
                ok = metrics.healthy and fresh
                body = b"ok\n" if ok else b"unhealthy\n"
                status, ctype = (200 if ok else 503), "text/plain"
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):  # keep access logs out of the daemon's log
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="shoal-metrics", daemon=True).start()
    return server
