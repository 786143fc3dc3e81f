"""The daemon's periodic topic-config sync, on a thread of its own (issue #18: the main thread's work must not grow
with what the daemon holds).

Every ``config_sync_interval_s`` the rescan finds the topics whose lanes are all there and hands them to this watch,
which describes them on both clusters and applies the rare changes (:func:`mirror_core.kafka.topic_config_sync.
sync_many_topic_configs`: retention, cleanup policy, compaction, size and timestamp bounds). On the main thread
that request held every fetch round — and with it every busy lane's latency — for its whole duration: 2.4 s of wall
time for 838 topics, once a minute. Here the main thread only hands a list over.

Invariants (the state lives here): at most one sync runs at a time and at most one list waits — a newer list
replaces a waiting one (it is the rescan's later view of the same topics); a topic's failure is logged and counted
naming the topic, a failure of the whole sync naming the clusters, and the next period tries again; copying never
waits for a sync (it may wait for one topic's apply, below).

A batch the target rejects for a size or timestamp bound still has its own topic synced at once, on the main thread
(``ShallowMirrorDaemon._repaired_by_config_sync``, inside :meth:`ConfigSyncWatch.repairing`). The two meet on one
topic safely: one apply at a time (the batch's per topic, or the whole repair); a topic repaired while a batch
runs is left alone by that batch, whose describes are older (applying its plan would undo the repair); and a
repair that finds nothing left to change on a topic the batch changed since a repair last looked retries the
refused batch once instead of halting (the batch may have fixed the bound just after the refusal).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from mirror_core.config.cluster import ClusterConfig
from mirror_core.daemon.events import event
from mirror_core.errors import MirrorError


class _Slot:
    """One topic's turn in a batched sync (``sync_many_topic_configs``' guard): may it apply, what it applied."""

    def __init__(self, current: bool):
        self.current, self.changes = current, []


class ConfigSyncWatch:
    """Runs the daemon's periodic config syncs on the thread ``shoal-config-sync`` (module docstring)."""

    def __init__(self, source: ClusterConfig, target: ClusterConfig, metrics, *, sync: Callable | None = None):
        self.source, self.target, self.metrics = source, target, metrics
        self._sync = sync  # sync_many_topic_configs unless given (tests)
        self._changed = threading.Condition()  # guards the three fields below
        self._waiting: list[tuple[str, str]] | None = None  # the next list to sync (the newest handed over)
        self._running = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.syncs = 0  # syncs finished (whether or not a topic failed)
        # one topic's apply by the batch, or a whole one-topic repair (main thread), at a time; the target topics
        # repaired since the running batch began: its plan for them (older describes) is not applied
        self._apply = threading.Lock()
        self._repaired: set[str] = set()
        # target topics the batch changed since a repair last looked at them: a batch the target refused just
        # before may find its repair with nothing left to change (see repairing)
        self._changed_here: set[str] = set()

    def submit(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Sync ``pairs`` ((source topic, target topic) each) on the watch's thread, after the sync running now if
        any; returns at once. A list still waiting is replaced."""
        with self._changed:
            if self._stopped:
                return
            self._waiting = list(pairs)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shoal-config-sync", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def stop(self) -> None:
        """Ask the thread to end after its current sync (not waited for: a sync stuck on a slow cluster must not
        eat a shutdown's grace). A list still waiting is dropped: the next start syncs again."""
        with self._changed:
            self._stopped, self._waiting = True, None
            self._changed.notify_all()

    def idle(self, timeout_s: float) -> bool:
        """Wait until no list waits and no sync runs; False if that did not happen within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: self._waiting is None and not self._running, timeout_s)

    @contextlib.contextmanager
    def repairing(self, target_topic: str) -> Iterator[bool]:
        """Held around a one-topic sync made elsewhere (the main thread's repair of a rejected batch): it waits for
        at most one topic's apply of the batch, and the running batch then leaves ``target_topic`` alone — its
        describes are older than the repair's, applying its plan would undo it. Yields whether the watch changed
        ``target_topic`` since a repair last asked (the batch may have repaired it after the target refused one)."""
        with self._apply:
            self._repaired.add(target_topic)
            changed = target_topic in self._changed_here
            self._changed_here.discard(target_topic)
            yield changed

    @contextlib.contextmanager
    def _applying(self, target_topic: str) -> Iterator[_Slot]:
        with self._apply:
            slot = _Slot(target_topic not in self._repaired)
            yield slot
            if slot.changes:
                self._changed_here.add(target_topic)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopped or self._waiting is not None)
                if self._stopped:
                    return
                pairs, self._waiting, self._running = self._waiting, None, True
            try:
                self.sync_now(pairs)
            finally:
                with self._changed:
                    self._running = False
                    self._changed.notify_all()

    def sync_now(self, pairs: Sequence[tuple[str, str]]) -> None:
        """One sync of ``pairs`` on the calling thread, every outcome logged and counted."""
        from mirror_core.kafka.topic_config_sync import sync_many_topic_configs

        with self._apply:
            self._repaired.clear()
        try:  # anything raised, by the clusters or the bookkeeping below, fails this sync only: the next runs
            if self._sync:  # tests
                results = self._sync(self.source, self.target, pairs)
            else:
                results = sync_many_topic_configs(self.source, self.target, pairs, guard=self._applying)
            for topic, target_topic in pairs:
                changes = results[topic]
                if isinstance(changes, MirrorError):
                    self.metrics.errors.labels("config_sync").inc()
                    event("config_sync_failed", logging.WARNING, topic=topic, target_topic=target_topic,
                          error=changes)
                    continue
                for change in changes:
                    self.metrics.config_changes.labels(target_topic).inc()
                    event("config_synced", topic=topic, target_topic=target_topic, change=f"'{change}'")
        except Exception as exc:  # noqa: BLE001 - a watch outlives transient cluster trouble; the next period retries
            self.metrics.errors.labels("config_sync").inc()
            event("config_sync_failed", logging.WARNING, source=self.source.name, target=self.target.name,
                  topics=len(pairs), error=f"{type(exc).__name__}: {exc}")
        self.syncs += 1
