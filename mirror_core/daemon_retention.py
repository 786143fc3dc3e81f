"""The daemon's retention watch: how long until the source deletes what the daemon has not copied yet.

Every ``retention_interval_s`` the positions of the lanes this daemon holds (published by the copy loop after each
fetch round) are assessed against the source's retention (:mod:`mirror_core.retention`, the same model as
``shoal deadlines``) and the ``shoal_retention_*`` gauges are replaced (:mod:`mirror_core.metrics`): margin, time to
loss, catch-up ETA, unmirrored bytes, lost offsets, status. It runs in a thread of its own with its own clients,
so the copy path never waits for it; a failed assessment is logged and counted, and the gauges keep their last
values until the next one succeeds.

Copy capacity is estimated the way ``shoal deadlines`` does without ``--throughput`` (round trips to both clusters,
the partition fetch size, a 100 MB/s link), so a margin is comparable between the two.
"""

from __future__ import annotations

import logging
import threading

from mirror_core.cluster import ClusterConfig

log = logging.getLogger("shoal.daemon")

AT_RISK_BELOW_S = 3600.0  # as `shoal deadlines --at-risk-below 1h`
LINK_BYTES_PER_S = 100e6  # as `shoal deadlines --bandwidth 100`


class RetentionWatch:
    """Keeps one daemon's retention gauges current. Invariant: the gauges describe only partitions published by the
    copy loop at the last assessment (a lane that moved to another daemon disappears here)."""

    def __init__(self, source: ClusterConfig, target: ClusterConfig, metrics, *, interval_s: float,
                 fetch_bytes: int):
        from mirror_core.metrics import register_retention_gauges

        self.source, self.target, self.metrics = source, target, metrics
        self.interval_s, self.fetch_bytes = interval_s, fetch_bytes
        self.gauges = register_retention_gauges(metrics.registry)
        self._positions: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.assessments = 0

    def publish(self, positions: dict[tuple[str, int], int]) -> None:
        """The copy loop's latest positions (source topic, partition) → next offset to copy."""
        with self._lock:
            self._positions = dict(positions)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shoal-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its current assessment (not waited for: it is a daemon thread)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.assess_once()
            except Exception as exc:  # noqa: BLE001 - a watch outlives transient cluster trouble
                self.metrics.errors.labels("retention").inc()
                log.warning("event=retention_failed error=%s", f"{type(exc).__name__}: {exc}")

    def assess_once(self) -> list:
        """One assessment of the published positions; returns the statuses (most urgent first)."""
        from mirror_core.kafka_wire import WireClient
        from mirror_core.metrics import update_retention_gauges
        from mirror_core.retention import CopyCapacity, Status, assess_partitions
        from mirror_core.retention_inputs import gather_inputs, measure_rtt

        with self._lock:
            positions = dict(self._positions)
        if not positions:
            update_retention_gauges([], self.gauges)
            return []
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(positions):
            topics.setdefault(topic, []).append(partition)
        with WireClient.for_cluster(self.source) as source, WireClient.for_cluster(self.target) as target:
            rtt = measure_rtt(source) + measure_rtt(target)
        copy = CopyCapacity.estimate(bandwidth_bytes_per_s=LINK_BYTES_PER_S, rtt_s=rtt, fetch_bytes=self.fetch_bytes)
        inputs = gather_inputs(self.source, topics, positions)
        statuses = assess_partitions(inputs.snapshots, inputs.topics, copy, at_risk_below_s=AT_RISK_BELOW_S,
                                     check_interval_ms=inputs.check_interval_ms)
        update_retention_gauges(statuses, self.gauges)
        self.assessments += 1
        for s in statuses:
            if s.status is not Status.SAFE:
                log.warning("event=retention_%s topic=%s partition=%s position=%s margin_s=%.0f "
                            "time_to_loss_s=%.0f", s.status.value.lower(), s.topic, s.partition,
                            positions.get((s.topic, s.partition)), s.margin_s, s.time_to_loss_s)
        return statuses
