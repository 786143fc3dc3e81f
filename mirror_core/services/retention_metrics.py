"""Prometheus gauges for retention deadlines, as plain functions the daemon and the guard DAG call.

``register_retention_gauges(registry)`` once per registry, then ``update_retention_gauges(statuses)`` after each
assessment: every registered set is replaced by the latest verdicts (partitions no longer assessed disappear); the
daemon sets and removes one partition's verdict at a time (``set_retention_verdict``, ``remove_retention_verdict``).
Gauges carry ``topic`` and ``partition`` labels; "never" is ``+Inf`` (no deadline, or an ETA that never comes) and
a LOST partition's margin is ``-Inf``, as Prometheus represents them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from mirror_core.model.retention import RetentionStatus, Status

LABELS = ("topic", "partition")


@dataclass(frozen=True)
class RetentionGauges:
    margin: Gauge
    time_to_loss: Gauge
    eta: Gauge
    unmirrored_bytes: Gauge
    lost_offsets: Gauge
    status: Gauge


_registered: list[RetentionGauges] = []
_lock = threading.Lock()


def register_retention_gauges(registry: CollectorRegistry) -> RetentionGauges:
    """Create the retention gauges in ``registry`` and have :func:`update_retention_gauges` keep them current."""
    def gauge(name: str, doc: str, labels: tuple[str, ...] = LABELS) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    gauges = RetentionGauges(
        margin=gauge("shoal_retention_margin_seconds",
                     "Time to loss minus catch-up ETA; negative: the copy will not make it (-Inf: LOST)"),
        time_to_loss=gauge("shoal_retention_time_to_loss_seconds",
                           "Lower bound on the time until the source deletes the oldest unmirrored record"),
        eta=gauge("shoal_retention_catchup_eta_seconds", "Time for the copy to reach the log end (+Inf: never)"),
        unmirrored_bytes=gauge("shoal_retention_unmirrored_bytes", "Bytes between the mirror position and the log end"),
        lost_offsets=gauge("shoal_retention_lost_offsets", "Offsets deleted before they were copied"),
        status=gauge("shoal_retention_status", "1 for the partition's current status, 0 for the others",
                     (*LABELS, "status")),
    )
    with _lock:
        _registered.append(gauges)
    return gauges


def update_retention_gauges(statuses: Iterable[RetentionStatus], gauges: RetentionGauges | None = None) -> None:
    """Replace the values of ``gauges`` (default: every registered set) with these verdicts."""
    statuses = list(statuses)
    with _lock:
        targets = [gauges] if gauges is not None else list(_registered)
        for g in targets:
            for metric in (g.margin, g.time_to_loss, g.eta, g.unmirrored_bytes, g.lost_offsets, g.status):
                metric.clear()
            for s in statuses:
                labels = (s.topic, str(s.partition))
                g.margin.labels(*labels).set(s.margin_s)
                g.time_to_loss.labels(*labels).set(s.time_to_loss_s)
                g.eta.labels(*labels).set(s.eta_s)
                g.unmirrored_bytes.labels(*labels).set(s.unmirrored_bytes)
                g.lost_offsets.labels(*labels).set(s.lost_records)
                for st in Status:
                    g.status.labels(*labels, st.value).set(1.0 if s.status is st else 0.0)


def set_retention_verdict(gauges: RetentionGauges, topic: str, partition: int, values: tuple) -> None:
    """One partition's verdict in ``gauges``: ``values`` = (margin s, time to loss s, catch-up ETA s, unmirrored
    bytes, lost offsets, status) — the daemon's retention watch updates only the partitions whose verdict changed."""
    margin, ttl, eta, unmirrored, lost, status = values
    labels = (topic, str(partition))
    with _lock:
        gauges.margin.labels(*labels).set(margin)
        gauges.time_to_loss.labels(*labels).set(ttl)
        gauges.eta.labels(*labels).set(eta)
        gauges.unmirrored_bytes.labels(*labels).set(unmirrored)
        gauges.lost_offsets.labels(*labels).set(lost)
        for st in Status:
            gauges.status.labels(*labels, st.value).set(1.0 if status is st else 0.0)


def remove_retention_verdict(gauges: RetentionGauges, topic: str, partition: int) -> None:
    """Remove one partition's series from ``gauges`` (it is no longer held here)."""
    labels = (topic, str(partition))
    with _lock:
        for metric in (gauges.margin, gauges.time_to_loss, gauges.eta, gauges.unmirrored_bytes, gauges.lost_offsets):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)
        for st in Status:
            with contextlib.suppress(KeyError):
                gauges.status.remove(*labels, st.value)


def unregister_retention_gauges(registry: CollectorRegistry, gauges: RetentionGauges) -> None:
    """Remove ``gauges`` from ``registry`` and stop updating them."""
    with _lock:
        if gauges in _registered:
            _registered.remove(gauges)
        for metric in (gauges.margin, gauges.time_to_loss, gauges.eta, gauges.unmirrored_bytes, gauges.lost_offsets,
                       gauges.status):
            registry.unregister(metric)
