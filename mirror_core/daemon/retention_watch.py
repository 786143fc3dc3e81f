"""The daemon's retention watch: how long until the source deletes what the daemon has not copied yet.

Every ``retention_interval_s`` the positions of the lanes this daemon holds (published by the copy loop after each
fetch round) are assessed against the source's retention (:mod:`mirror_core.model.retention`, the same model as
``shoal deadlines``) and the ``shoal_retention_*`` gauges are replaced (:mod:`mirror_core.services.retention_metrics`):
margin, time to loss, catch-up ETA, unmirrored bytes, lost offsets, status. It runs in a thread of its own with its own
clients, so the copy path never waits for it; a failed assessment is logged and counted, and the gauges keep their last
values until the next one succeeds.

The verdict is the shared one (:func:`mirror_core.services.deadlines.assess_positions` with the pipeline file's
``retention:`` policy): ``shoal deadlines``, the Airflow checks and the Shoal page reach the same status and margin.

Only lanes with something unmirrored are assessed (issue #18: an idle daemon's cost must not grow with idle lanes).
The copy loop keeps the positions by events (:class:`~mirror_core.model.held_positions.HeldPositions`): a lane whose
committed position reached the high watermark its last fetch answer reported, with no answer naming it since, is
*caught up*. Skipping it is safe: the standing fetch round is named every partition whose high watermark or log start
moved, so the source holds nothing past that position, and retention deletes only below the high watermark — there is
nothing unmirrored it could delete, which is exactly the verdict an assessment would reach (SAFE: no deadline,
catch-up ETA 0, nothing unmirrored, nothing lost; set once, no request sent). A lane that falls behind (new data, a
failed fetch or copy, a reset, a lane just opened) is marked behind by the event that says so and is assessed by the
next assessment — its warning comes no later than one ``retention_interval_s``, as before. The gauges are updated per
partition whose verdict changed, not cleared and rebuilt.
"""

from __future__ import annotations

import logging
import threading

from mirror_core.config.cluster import ClusterConfig
from mirror_core.model.held_positions import HeldPositions
from mirror_core.model.retention import INF, Status

log = logging.getLogger("shoal.daemon")
# the verdict an assessment reaches for a caught-up partition (nothing unmirrored: no deadline, nothing to catch up,
# nothing lost): (margin s, time to loss s, catch-up ETA s, unmirrored bytes, lost offsets, status)
CAUGHT_UP = (INF, INF, 0.0, 0, 0, Status.SAFE)


def _shown_position(position: int | None) -> int | str:
    """A position for the log: None is a lane assessed from the log start (never opened here, no checkpoint)."""
    return "log_start" if position is None else position


class RetentionWatch:
    """Keeps one daemon's retention gauges current. Invariants: the gauges describe only partitions in ``positions``
    at the last assessment (a lane that moved to another daemon disappears here); ``_shown`` holds the values set
    for each partition shown, ``_shown_caught`` the partitions shown with the caught-up verdict (their values are
    ``CAUGHT_UP``), so an assessment touches only the series whose verdict changed."""

    def __init__(self, source: ClusterConfig, target: ClusterConfig, metrics, *, interval_s: float,
                 fetch_bytes: int, policy=None):
        from mirror_core.kafka.retention_inputs import OldestTimestamps
        from mirror_core.model.retention_policy import RetentionPolicy
        from mirror_core.services.retention_metrics import register_retention_gauges

        self.source, self.target, self.metrics = source, target, metrics
        self.interval_s, self.fetch_bytes = interval_s, fetch_bytes
        self.policy = policy or RetentionPolicy(fetch_bytes=fetch_bytes)
        self.gauges = register_retention_gauges(metrics.registry)
        self.positions = HeldPositions()  # kept by the copy loop (events), read here at each assessment
        self._shown: dict[tuple[str, int], tuple] = {}
        self._shown_caught: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.assessments = 0
        self._oldest = OldestTimestamps()  # the log-start probes, kept between assessments (only on this thread)

    def publish(self, positions: dict[tuple[str, int], int]) -> None:
        """Replace every position: (source topic, partition) → next offset to copy, none known to be caught up (the
        daemon keeps ``positions`` by events instead)."""
        self.positions.replace(positions)

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
        """One assessment of the lanes behind (the caught-up ones get the caught-up verdict without a request);
        returns the assessed statuses (most urgent first)."""
        from mirror_core.services.deadlines import assess_positions

        behind, caught = self.positions.snapshot()
        statuses = []
        if behind:
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(behind):
                topics.setdefault(topic, []).append(partition)
            # a topic or partition no longer on the source (deleted: the daemon halts or retires its lanes once the
            # deletion is confirmed), or one whose probe failed (a corrupt batch at its position, its leader
            # unavailable), is left out and named, the others are still assessed
            skipped: list = []
            statuses = assess_positions(self.source, topics, behind, self.policy, target=self.target,
                                        oldest=self._oldest, skipped=skipped).statuses
            for s in skipped:
                if s.error is None:
                    log.warning("event=retention_skipped topic=%s partition=%s reason=%s", s.topic,
                                "all" if s.partition is None else s.partition, s.reason)
                else:   # its verdict cannot be reached: said each assessment, counted as a retention error
                    self.metrics.errors.labels("retention").inc()
                    log.error("event=retention_skipped topic=%s partition=%s reason=%s error=%s", s.topic,
                              s.partition, s.reason, s.error)
        self._show(caught, statuses)
        self.assessments += 1
        for s in statuses:
            if s.status is not Status.SAFE:
                log.warning("event=retention_%s topic=%s partition=%s position=%s margin_s=%.0f "
                            "time_to_loss_s=%.0f", s.status.value.lower(), s.topic, s.partition,
                            _shown_position(behind.get((s.topic, s.partition))), s.margin_s, s.time_to_loss_s)
        return statuses

    def _show(self, caught: dict, statuses: list) -> None:
        """Set the gauges of the partitions whose verdict changed: the assessed ones (their new values), the newly
        caught-up ones (``CAUGHT_UP``); remove the series of partitions no longer held or not assessed."""
        from mirror_core.services.retention_metrics import remove_retention_verdict, set_retention_verdict

        assessed = {}
        for s in statuses:
            assessed[(s.topic, s.partition)] = (s.margin_s, s.time_to_loss_s, s.eta_s, s.unmirrored_bytes,
                                                s.lost_records, s.status)
        shown, gauges = self._shown, self.gauges
        gone = shown.keys() - assessed.keys() - caught.keys()  # set operations: no walk of the caught-up in Python
        for tp in gone:
            remove_retention_verdict(gauges, *tp)
            del shown[tp]
        for tp, values in assessed.items():
            if shown.get(tp) != values:
                set_retention_verdict(gauges, *tp, values)
                shown[tp] = values
        caught_now = caught.keys() - assessed.keys()
        for tp in caught_now - self._shown_caught:
            if shown.get(tp) != CAUGHT_UP:
                set_retention_verdict(gauges, *tp, CAUGHT_UP)
                shown[tp] = CAUGHT_UP
        self._shown_caught = set(caught_now)
