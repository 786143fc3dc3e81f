"""Retrying Kafka requests: which errors are worth retrying (:func:`is_retriable`), a capped exponential backoff with
an overall deadline (:class:`Backoff`), and the retry loop of a request about one partition to its leader
(:func:`partition_request_with_retries`).

Invariants: a retry loop never runs past its give-up deadline (the last sleep is cut to it); a non-retriable error
is raised at once; between retries of a partition request the topic's cached metadata is dropped, so the next try
asks for the current leader.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import kafka.errors as Errors

from mirror_core.errors import FetchError, PartitionUnavailableError

if TYPE_CHECKING:
    from mirror_core.kafka.wire_client import WireClient


def is_retriable(error_type: type) -> bool:
    """Whether kafka-python classifies a broker error as worth retrying (leader moves, timeouts, ...)."""
    return bool(getattr(error_type, "retriable", False))



class Backoff:
    """Capped exponential backoff with jitter and an overall give-up deadline (all times in seconds)."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0, give_up_after: float = 120.0):
        self.initial = initial
        self.cap = cap
        self.give_up_after = give_up_after
        self.reset()

    def reset(self) -> None:
        self._failures = 0
        self._started = None

    def wait(self) -> bool:
        """Sleep before the next attempt; False (without sleeping) once the deadline has passed."""
        now = time.monotonic()
        if self._started is None:
            self._started = now
        if now - self._started >= self.give_up_after:
            return False
        delay = min(self.cap, self.initial * 2 ** self._failures) * random.uniform(0.8, 1.2)
        self._failures += 1
        time.sleep(min(delay, max(0.0, self.give_up_after - (now - self._started))))
        return True

    @property
    def elapsed(self) -> float:
        """Seconds since the first :meth:`wait` (0 before it)."""
        return 0.0 if self._started is None else time.monotonic() - self._started



def partition_request_with_retries(client: WireClient, topic: str, partition: int, what: str, attempt, *,
                                   retry_timeout_s: float = 60.0):
    """``attempt()`` (one request about ``topic-partition`` to its leader), retried after leader moves and
    transient errors (metadata refreshed between tries) until ``retry_timeout_s``: then
    :class:`PartitionUnavailableError`; a non-retriable error at once as :class:`FetchError`. ``what`` names the
    request in those errors, e.g. ``"ListOffsets(earliest)"``."""
    backoff = Backoff(give_up_after=retry_timeout_s)
    while True:
        try:
            return attempt()
        except Errors.KafkaError as exc:
            if not is_retriable(type(exc)):
                raise FetchError(client.cluster_name, topic, partition, None,
                                 f"{what}: {type(exc).__name__}") from None
            client.invalidate(topic)
            if not backoff.wait():
                raise PartitionUnavailableError(client.cluster_name, topic, partition,
                                                f"{what}: {type(exc).__name__}") from None
