"""A short read cache with a deadline, for status pages that read clusters: a slow cluster shows its last reading
(with its age) or "still reading", never a hung page.

``ReadCache.get_many(items)`` returns, per key, a fresh-enough value (younger than ``ttl_s``) at once; otherwise it
starts one reading per key (never two at a time for one key, however many callers ask) in a small thread pool and
waits at most ``deadline_s``; a reading that finishes later fills the cache for the next caller.

Invariant: ``_inflight`` holds at most one future per key, removed when its reading ends (successfully or not);
``_values`` holds the last completed reading per key and when it completed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reading:
    """What :meth:`ReadCache.get_many` returns per key: the value (None: never read yet), its age in seconds, and
    whether a newer reading is still under way because the deadline passed."""

    value: Any
    age_s: float | None
    still_reading: bool


class ReadCache:
    def __init__(self, *, ttl_s: float, deadline_s: float, workers: int = 4,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.deadline_s, self.clock = ttl_s, deadline_s, clock
        self._values: dict[Hashable, tuple[float, Any]] = {}
        self._inflight: dict[Hashable, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shoal-read")

    def get_many(self, items: Sequence[tuple[Hashable, Callable[[], Any]]]) -> list[Reading]:
        """``items``: (key, read function). The read function's exceptions are the caller's to turn into values."""
        pending: dict[Hashable, Future] = {}
        with self._lock:
            for key, read in items:
                hit = self._values.get(key)
                if hit is not None and self.clock() - hit[0] < self.ttl_s:
                    continue
                if key not in self._inflight:
                    self._inflight[key] = self._pool.submit(self._read, key, read)
                pending[key] = self._inflight[key]
        if pending:
            wait(list(pending.values()), timeout=self.deadline_s)
        out = []
        with self._lock:
            for key, _read in items:
                hit = self._values.get(key)
                running = key in pending and not pending[key].done()
                out.append(Reading(None if hit is None else hit[1],
                                   None if hit is None else self.clock() - hit[0], running))
        return out

    def _read(self, key: Hashable, read: Callable[[], Any]) -> None:
        try:
            value = read()
            with self._lock:
                self._values[key] = (self.clock(), value)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
