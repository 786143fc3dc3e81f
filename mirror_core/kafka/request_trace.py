"""Per-request timings of the fast connections: a measurement switch, off by default (``ACTIVE is None``).

``bench/request_timing.py`` turns it on to see where a one-partition copy of one-record batches waits: for every
request a :class:`~mirror_core.kafka.fast_connection.FastConnection` sends, when it was sent (or deferred to the next
socket write) and how many requests were then in flight on that connection; for every answer, when the caller began
waiting for it, whether its bytes were already in the socket (``ready``: the process was behind the broker) or the
caller had to block, and when it was read; and every write to the socket (several deferred requests leave in one). Off,
the cost is one module attribute test per request, per answer and per socket write.

Only the benchmark tool switches it on (:func:`start` / :func:`stop`); the trace lives in this process's memory
and holds no request contents, only times, api keys, sizes and counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ACTIVE: RequestTrace | None = None


@dataclass
class RequestTrace:
    """Raw events, appended in order (``perf_counter`` seconds)."""

    # (time sent or deferred, connection id, api key, correlation id, request bytes, requests in flight after it)
    sends: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)
    # (time the wait began, time the answer was read, connection id, correlation id, answer already in the socket)
    answers: list[tuple[float, float, int, int, bool]] = field(default_factory=list)
    # (time, connection id, 1 for a request sent on its own or -1 for a flush of deferred requests): the channel
    # writes (one sendmsg each on a plain socket)
    writes: list[tuple[float, int, int]] = field(default_factory=list)
    clock = staticmethod(time.perf_counter)


def start() -> RequestTrace:
    global ACTIVE
    ACTIVE = RequestTrace()
    return ACTIVE


def stop() -> RequestTrace | None:
    global ACTIVE
    trace, ACTIVE = ACTIVE, None
    return trace
