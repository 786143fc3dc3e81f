"""The daemon's prune watch: how far each held lane's offset map may be pruned.

Gathering a floor (:mod:`mirror_core.kafka.prune_inputs`) lists every consumer group on the source and asks each for
its committed offsets: on a source with thousands of groups, or one that answers slowly, that takes seconds. It
therefore runs in a thread of its own with its own client, never on the copy loop: the loop publishes the
partitions it holds (cheap) and, between rounds, hands each lane the newest floors (:meth:`PruneWatch.floors`).

Invariants: a floor is only ever a value gathered for that partition (a partition whose log start could not be
read gets none that time, the others still do); a failed group listing yields no floors at all (a partial list
could prune what a missing group still holds); a gathering is retried at the next interval, or as soon as the
loop starts holding a partition it has no floor for.
"""

from __future__ import annotations

import logging
import threading

from mirror_core.config.cluster import ClusterConfig

log = logging.getLogger("shoal.daemon")


class PruneWatch:
    def __init__(self, source: ClusterConfig, metrics, *, interval_s: float):
        self.source, self.metrics, self.interval_s = source, metrics, interval_s
        self._held: frozenset[tuple[str, int]] = frozenset()
        self._floors: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.gatherings = 0  # successful ones
        self.version = 0  # bumped whenever the floors change: the copy loop applies them only then

    def publish(self, held: set[tuple[str, int]]) -> None:
        """The copy loop's held (source topic, partition)s; a partition new to the watch wakes it."""
        held = frozenset(held)
        with self._lock:
            new = bool(held - self._held - self._floors.keys())
            self._held = held
        if new:
            self._wake.set()

    def floors(self) -> dict[tuple[str, int], int]:
        """The newest gathered floors, (topic, partition) → offset below which nothing can be asked for."""
        with self._lock:
            return dict(self._floors)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shoal-prune", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its current gathering (not waited for: it is a daemon thread)."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.gather_once()
            except Exception as exc:  # noqa: BLE001 - a watch outlives transient cluster trouble
                self.metrics.errors.labels("prune").inc()
                log.warning("event=prune_failed error=%s", f"{type(exc).__name__}: {exc}")

    def gather_once(self) -> dict[tuple[str, int], int]:
        """Gather floors for the published partitions now; returns them (also kept for :meth:`floors`)."""
        from mirror_core.kafka.prune_inputs import gather_prune_floors
        from mirror_core.kafka.wire_client import WireClient

        with self._lock:
            held = sorted(self._held)
        if not held:
            return {}
        with WireClient.for_cluster(self.source) as client:
            gathered = gather_prune_floors(self.source, client, held)
        with self._lock:
            floors = {tp: floor for tp, floor in gathered.items() if tp in self._held}
            if floors != self._floors:
                self._floors = floors
                self.version += 1
            floors = dict(self._floors)
        self.gatherings += 1
        return floors
