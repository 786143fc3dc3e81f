"""Whether the source cluster answers this daemon at all: one daemon-level statement while it does not.

When the source cluster is down (or cut off from this daemon), every held lane fails its fetches and retries with
backoff, and the group's consumer loses its coordinator (the group lives on the source). Each lane saying
"retrying" tells an operator little; what they need is one sentence: *the source cluster is unreachable, since when,
the last error, nothing is copied and no lane state is lost meanwhile*. This module decides when to say it and when
to take it back; the daemon reports (an event, ``/readyz`` 503 with the sentence under ``"source"``, the
``shoal_source_reachable`` gauge).

Observations (any thread: the group's error callback runs on the membership's poll thread):

- :meth:`SourceReachability.answered` — the source answered something: a fetch round with at least one partition
  served, a rescan's metadata, a group assignment;
- :meth:`SourceReachability.unanswered` — a failure that means "no broker of the source answers": every partition
  of a fetch round failed at the transport level (:func:`is_transport_failure`), a rescan that could not reach the
  cluster, librdkafka's ``_ALL_BROKERS_DOWN`` on the group's consumer. One broker of several being down is not
  this: its partitions' lanes retry on their own, the other lanes' answers keep the source reachable.

Decision (pure; the caller passes ``now``): the source is declared unreachable once failures have been observed for
:data:`UNREACHABLE_AFTER_S` with no answer since the first of them (a single refused connection during a leader
move does not count), and reachable again at the first answer. :meth:`SourceReachability.check` returns the
transition to report, at most once per change.

Invariants: ``_failing_since`` is the time of the first failure after the last answer (None when the last
observation was an answer or there was none; an answer to a request that began before it does not clear it);
``_reported`` is what was last reported (True: unreachable), changed only by :meth:`check`. Observations are
stamped with when the request began (a failing request may have waited seconds for its answer), so the statement
does not lag by that wait.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import kafka.errors as Errors

from mirror_core.errors import ClusterUnavailableError

UNREACHABLE_AFTER_S = 5.0

# no broker answered (a partition without a leader on a cluster that answers is not this)
_TRANSPORT_ERRORS = (Errors.KafkaConnectionError, Errors.NodeNotReadyError, Errors.KafkaTimeoutError,
                     Errors.RequestTimedOutError, ClusterUnavailableError)


def is_transport_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` means the broker could not be reached (as opposed to a broker's answer refusing something)."""
    return isinstance(exc, _TRANSPORT_ERRORS)


@dataclass(frozen=True)
class ReachabilityChange:
    """A transition to report: ``unreachable`` True when the source stopped answering, False when it is back."""

    unreachable: bool
    cluster: str
    since_s: float          # how long it has been failing (down) or had been unreachable (up)
    error: str | None       # the last failure seen

    @property
    def problem(self) -> str | None:
        """The sentence for ``/readyz`` while unreachable, None once back."""
        if not self.unreachable:
            return None
        return (f"source cluster {self.cluster!r} unreachable for {self.since_s:.0f}s (last error: {self.error}): "
                "nothing is copied; lanes keep their checkpoints and retry with backoff, and the daemon resumes by "
                "itself when the source answers again")


class SourceReachability:
    """Tracks whether the source answers (see the module docstring)."""

    def __init__(self, cluster: str, *, after_s: float = UNREACHABLE_AFTER_S):
        self.cluster = cluster
        self.after_s = after_s
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._last_error: str | None = None
        self._reported = False
        self._reported_at = 0.0

    @property
    def unreachable(self) -> bool:
        """What was last reported."""
        return self._reported

    @property
    def failing(self) -> bool:
        """Whether the source's last answers failed (at once: not only after ``after_s``)."""
        return self._failing_since is not None

    def answered(self, now: float) -> None:
        """An answer to a request that began at ``now``. One that began before the first failure since the last
        answer says nothing about the source after that failure (the round in flight when the broker went down
        is answered, then nothing is): it leaves the failure standing."""
        with self._lock:
            if self._failing_since is not None and now < self._failing_since:
                return
            self._failing_since = None

    def unanswered(self, now: float, error: object) -> None:
        with self._lock:
            if self._failing_since is None:
                self._failing_since = now
            self._last_error = _one_line(error)

    def observe_round(self, now: float, errors: list[BaseException | None]) -> None:
        """One fetch round's outcomes (one error or None per partition): any partition served is an answer; every
        partition failing at the transport level is a failure; anything else (a broker's refusal) says nothing."""
        if not errors:
            return
        if any(error is None for error in errors):
            self.answered(now)
        elif all(is_transport_failure(error) for error in errors):
            self.unanswered(now, errors[0])

    def check(self, now: float) -> ReachabilityChange | None:
        """The transition to report now, if any."""
        with self._lock:
            failing_since, error = self._failing_since, self._last_error
            down = failing_since is not None and now - failing_since >= self.after_s
            if down == self._reported:
                return None
            self._reported = down
            if down:
                self._reported_at = failing_since
                return ReachabilityChange(True, self.cluster, now - failing_since, error)
            return ReachabilityChange(False, self.cluster, now - self._reported_at, error)

    def problem(self, now: float) -> str | None:
        """The current ``/readyz`` sentence (its duration kept fresh), None while reachable. Decided here from the
        observations, not from what :meth:`check` last reported: ``/readyz`` is served on its own thread and must
        say so even while the daemon loop waits on the unreachable source."""
        with self._lock:
            failing_since = self._failing_since
            if failing_since is None or now - failing_since < self.after_s:
                return None
            return ReachabilityChange(True, self.cluster, now - failing_since, self._last_error).problem


def _one_line(error: object) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return " ".join(text.split())[:300]
