"""The daemon's retention watch: how long until the source deletes what the daemon has not copied yet.

Every ``retention_interval_s`` the positions of the lanes this daemon holds (published by the copy loop after each
fetch round) are assessed against the source's retention (:mod:`mirror_core.retention`, the same model as
``shoal deadlines``) and the ``shoal_retention_*`` gauges are replaced (:mod:`mirror_core.metrics`): margin, time to
loss, catch-up ETA, unmirrored bytes, lost offsets, status. It runs in a thread of its own with its own clients,
so the copy path never waits for it; a failed assessment is logged and counted, and the gauges keep their last
values until the next one succeeds.

The verdict is the shared one (:func:`mirror_core.retention_inputs.assess_positions` with the pipeline file's
``retention:`` policy): ``shoal deadlines``, the Airflow checks and the Shoal page reach the same status and margin.
"""

from __future__ import annotations

import logging
import threading

from mirror_core.cluster import ClusterConfig

log = logging.getLogger("shoal.daemon")



class RetentionWatch:
    """Keeps one daemon's retention gauges current. Invariant: the gauges describe only partitions published by the
    copy loop at the last assessment (a lane that moved to another daemon disappears here)."""

    def __init__(self, source: ClusterConfig, target: ClusterConfig, metrics, *, interval_s: float,
                 fetch_bytes: int, policy=None):
        from mirror_core.metrics import register_retention_gauges
        from mirror_core.retention_inputs import OldestTimestamps
        from mirror_core.retention_policy import RetentionPolicy

        self.source, self.target, self.metrics = source, target, metrics
        self.interval_s, self.fetch_bytes = interval_s, fetch_bytes
        self.policy = policy or RetentionPolicy(fetch_bytes=fetch_bytes)
        self.gauges = register_retention_gauges(metrics.registry)
        self._positions: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.assessments = 0
        self._oldest = OldestTimestamps()  # the log-start probes, kept between assessments (only on this thread)

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
        from mirror_core.metrics import update_retention_gauges
        from mirror_core.retention import Status
        from mirror_core.retention_inputs import assess_positions

        with self._lock:
            positions = dict(self._positions)
        if not positions:
            update_retention_gauges([], self.gauges)
            return []
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(positions):
            topics.setdefault(topic, []).append(partition)
        statuses = assess_positions(self.source, topics, positions, self.policy, target=self.target,
                                    oldest=self._oldest).statuses
        update_retention_gauges(statuses, self.gauges)
        self.assessments += 1
        for s in statuses:
            if s.status is not Status.SAFE:
                log.warning("event=retention_%s topic=%s partition=%s position=%s margin_s=%.0f "
                            "time_to_loss_s=%.0f", s.status.value.lower(), s.topic, s.partition,
                            positions.get((s.topic, s.partition)), s.margin_s, s.time_to_loss_s)
        return statuses
