"""The daemon's Prometheus metrics and its HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``).

``/healthz`` is liveness only (the process loop runs); lane trouble is readiness: ``/readyz`` answers 503 while any
lane is ``halted`` or ``stalled`` (:mod:`mirror_core.model.lane_status`), with every lane's state in its JSON body, so
an orchestrator alerts without restarting a daemon whose other lanes are fine — and while the daemon's consumer group
never formed (``group_problem``: subscribed to a non-empty selection, never assigned anything; the body says what to
check), since such a daemon holds no lane and copies nothing, and while the source cluster answers nothing
(``source_problem``, :mod:`mirror_core.kafka.source_reachability`; the sentence under ``"source"``).

Names follow Prometheus conventions and what MirrorMaker 2 operators look for: records and bytes copied, replication
latency, record age, lag per partition, deep batches, errors by kind; retention margins come from
:mod:`mirror_core.services.retention_metrics`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mirror_core.model.lane_status import NOT_READY, REASONS, STATES

LABELS = ("topic", "partition")
LANE_LABELS = ("pipeline", "topic", "partition")


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
        self.lane_state = Gauge("shoal_lane_state", "1 for each lane's current state and reason (copying, retrying, "
                                "stalled, halted, retired; reason from a fixed set)", (*LANE_LABELS, "state", "reason"),
                                registry=r)
        self.lane_attempts = Gauge("shoal_lane_retry_attempts", "Failed attempts since the lane last made progress",
                                   LANE_LABELS, registry=r)
        self.lane_failing_since = Gauge("shoal_lane_failing_since_timestamp_seconds", "When the lane's current run "
                                        "of failures began, or when it halted (0: not failing)", LANE_LABELS,
                                        registry=r)
        self.lane_halt_offset = Gauge("shoal_lane_halt_offset", "A halted lane's offsets: its committed source "
                                      "position and the end of the range its reason names", (*LANE_LABELS, "bound"),
                                      registry=r)
        self.group_joined = Gauge("shoal_group_joined", "1 once this daemon's membership of its pipeline's consumer "
                                  "group received an assignment (possibly empty), 0 while it has not: a group that "
                                  "never forms (protocol not supported, group ACL missing) holds no lane",
                                  registry=r)
        self.group_problem: str | None = None  # why the group has not formed (set by the daemon loop), for /readyz
        self.source_reachable = Gauge("shoal_source_reachable", "0 while the source cluster answers nothing this "
                                      "daemon asks (fetches, metadata, the group's coordinator), 1 otherwise",
                                      registry=r)
        self.source_reachable.set(1)
        self.source_problem = None  # callable → the sentence while the source is unreachable, else None; /readyz
        self.healthy = True
        self.last_loop = time.monotonic()
        self._lanes_lock = threading.Lock()
        self._lanes: dict[str, dict] = {}
        self._lane_series: dict[str, set[tuple]] = {}  # lane → its lane-state series now set

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

    def publish_lanes(self, pipeline: str, lanes: dict[str, dict]) -> None:
        """Replace the lane states shown in metrics and ``/readyz``: lane → ``LaneHealth.as_dict()`` plus topic
        and partition. One ``shoal_lane_state`` series per lane (the old state's series is removed)."""
        series = {name: self._set_lane(pipeline, lane) for name, lane in lanes.items()}
        with self._lanes_lock:
            kept = set().union(*series.values())
            for stale in set().union(*self._lane_series.values()) - kept:
                self._remove_series(stale)
            self._lane_series = series
            self._lanes = {name: {"lane": name, "pipeline": pipeline, **lane} for name, lane in lanes.items()}

    def update_lanes(self, pipeline: str, lanes: dict[str, dict]) -> None:
        """Like :meth:`publish_lanes` for ``lanes`` only (the lanes whose state changed); the others stay as shown."""
        for name, lane in lanes.items():
            series = self._set_lane(pipeline, lane)
            with self._lanes_lock:
                for stale in self._lane_series.get(name, set()) - series:
                    self._remove_series(stale)
                self._lane_series[name] = series
                self._lanes[name] = {"lane": name, "pipeline": pipeline, **lane}

    def _set_lane(self, pipeline: str, lane: dict) -> set[tuple]:
        """Set one lane's series; returns them."""
        series = set()
        labels = (pipeline, lane["topic"], str(lane["partition"]))
        state = lane["state"] if lane["state"] in STATES else "copying"
        reason = lane["reason"] if lane["reason"] in REASONS else "unknown"
        series.add(("state", *labels, state, reason))
        self.lane_state.labels(*labels, state, reason).set(1)
        self.lane_attempts.labels(*labels).set(lane["attempts"])
        self.lane_failing_since.labels(*labels).set((lane["since_ms"] or 0) / 1000)
        for bound, value in (("position", lane["position"]), ("range_end", lane["range_end"])):
            if state == "halted" and value is not None:
                series.add(("offset", *labels, bound))
                self.lane_halt_offset.labels(*labels, bound).set(value)
        return series

    def _remove_series(self, stale: tuple) -> None:
        gauge = self.lane_state if stale[0] == "state" else self.lane_halt_offset
        with contextlib.suppress(KeyError):  # never set in this process
            gauge.remove(*stale[1:])

    def readiness(self) -> tuple[bool, dict]:
        """(ready, JSON body): not ready while any lane is halted or stalled, or the group has not formed."""
        with self._lanes_lock:
            lanes = sorted(self._lanes.values(), key=lambda lane: lane["lane"])
        blocking = [lane["lane"] for lane in lanes if lane["state"] in NOT_READY]
        problem = self.group_problem
        source = self.source_problem() if self.source_problem is not None else None
        ready = not blocking and problem is None and source is None
        body = {"ready": ready, "not_ready_lanes": blocking, "lanes": lanes}
        if problem is not None:
            body["group"] = problem
        if source is not None:
            body["source"] = source
        return ready, body


def serve_metrics(metrics: DaemonMetrics, port: int, *, host: str = "127.0.0.1",
                  stale_after_s: float = 60.0) -> ThreadingHTTPServer:
    """Start ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` in a daemon thread (loopback by default; a
    container binds 0.0.0.0 so its probes and Prometheus reach it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.startswith("/metrics"):
                body, status, ctype = metrics.render(), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/readyz"):
                ready, report = metrics.readiness()
                body, status, ctype = json.dumps(report).encode(), (200 if ready else 503), "application/json"
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

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="shoal-metrics", daemon=True).start()
    return server
