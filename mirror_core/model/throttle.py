"""A byte-rate limit for copies, so a back-fill does not swamp a busy source cluster.

Token bucket that starts empty and holds at most one second of burst: ``consume(n)`` returns once the caller may
use ``n`` more bytes. Starting empty matters: a full bucket at the start would let every lane of a run burst a
second's worth at once. The clock
and the sleep are injectable so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """Allows at most ``bytes_per_second`` on average, with bursts of at most one second's worth."""

    def __init__(self, bytes_per_second: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if bytes_per_second <= 0:
            raise ValueError("a throttle needs a positive rate")
        self.rate = float(bytes_per_second)
        self._clock = clock
        self._sleep = sleep
        self._tokens = 0.0
        self._last = clock()

    def consume(self, n: int) -> float:
        """Take ``n`` bytes' worth of tokens, sleeping until they are there; returns the seconds slept."""
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        self._sleep(wait)
        self._last = self._clock()
        self._tokens = 0.0
        return wait
