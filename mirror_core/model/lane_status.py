"""What state a daemon lane is in, as a user sees it, and the one place where a lane's error is classified.

States (every lane is in exactly one):

- ``copying``: the last attempt worked (or none failed yet);
- ``retrying``: a retriable error; the lane retries with backoff (``attempts`` so far, failing ``since_ms``);
- ``stalled``: still retrying, but failing for longer than the pipeline's ``stall_after_s``: it alerts (metrics,
  ``/readyz``), it does not give up; or, with nothing failing, held up by something outside Shoal for longer than
  its own bound (:meth:`LaneHealth.held_up`: a source transaction left open at the offset the lane has reached,
  ``open_transaction_alert_s``);
- ``halted``: the error needs an operator (data deleted before it was copied, a recreated topic, a batch the target
  refuses, …): the lane is not reopened until ``shoal lanes resume``; the reason and the offsets are kept and
  persisted with the checkpoint (:class:`PersistedLaneState`), so a restart does not reopen it;
- ``retired``: the source topic was deleted after the lane had copied everything: nothing is left to do.

Classification (:func:`classify_failure`) reads ``retriable`` and ``lane_reason`` from the error itself
(:mod:`mirror_core.errors`); errors Shoal does not know (bugs, library surprises) are retried and so end up
``stalled`` if they persist — never retried silently. ``reason`` is a small fixed vocabulary (:data:`REASONS`), so
it can label Prometheus series. Pure: no I/O, no clocks read here (callers pass ``now``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import kafka.errors as Errors

COPYING, RETRYING, STALLED, HALTED, RETIRED = "copying", "retrying", "stalled", "halted", "retired"
STATES = (COPYING, RETRYING, STALLED, HALTED, RETIRED)
NOT_READY = (STALLED, HALTED)  # what makes /readyz answer 503

REASONS = (
    "none", "data_loss", "topic_recreated", "source_truncated", "corrupt_batch", "foreign_write", "batch_rejected",
    "skip_refused", "fetch_refused", "source_deleted", "config", "unavailable", "ambiguous_write", "checkpoint",
    "kafka_retriable", "kafka_refused", "transaction_timeout", "source_transaction_open", "unknown",
)
SOURCE_TRANSACTION_OPEN = "source_transaction_open"  # held up: the source's last stable offset does not move


def classify_failure(exc: BaseException) -> tuple[bool, str]:
    """(retriable, reason) of a lane's error.

    - Shoal's named errors: their own ``retriable`` and ``lane_reason``;
    - a broker error code that escaped as is (kafka-python's error with an ``errno``): kafka-python's
      ``retriable``; a non-retriable code (not authorized, invalid request) halts as ``kafka_refused``;
    - anything unnamed (a plain :class:`MirrorError`, a client-side library error, a bug): retried as ``unknown``,
      so it turns ``stalled`` after the bound and alerts, rather than halt a lane on a guess.
    """
    from mirror_core.errors import MirrorError

    if isinstance(exc, MirrorError):
        reason = getattr(exc, "lane_reason", "unknown")
        if reason not in REASONS or reason == "unknown":
            return True, "unknown"
        return bool(exc.retriable), reason
    if isinstance(exc, Errors.KafkaError):
        if getattr(type(exc), "retriable", False):
            return True, "kafka_retriable"
        if getattr(type(exc), "errno", None) is not None:
            return False, "kafka_refused"
    return True, "unknown"


MAX_MESSAGE_CHARS = 1000  # a persisted halt message is cut here, so the checkpoint record stays small


@dataclass(frozen=True)
class PersistedLaneState:
    """A lane state stored in its checkpoint (``Checkpoint.lane_state``; None there means healthy).

    Only states that outlive the process are stored: ``halted`` and ``retired``. ``position`` is the committed
    source position at the halt; ``range_end`` the end of the range the reason names (the uncopied range of a
    deleted source topic, the log start of a data loss), None when the reason names no range; ``since_ms`` when
    the lane stopped (wall clock, ms)."""

    state: str
    reason: str
    message: str
    since_ms: int
    position: int | None = None
    range_end: int | None = None

    def __post_init__(self) -> None:
        if self.state not in (HALTED, RETIRED):
            raise ValueError(f"only halted or retired lane states are persisted, not {self.state!r}")
        if len(self.message) > MAX_MESSAGE_CHARS:  # the checkpoint record has a size limit; the log has it all
            object.__setattr__(self, "message", self.message[:MAX_MESSAGE_CHARS - 1] + "…")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: dict) -> PersistedLaneState:
        known = {"state", "reason", "message", "since_ms", "position", "range_end"}
        return cls(**{k: v for k, v in body.items() if k in known})


@dataclass
class LaneHealth:
    """The live state of one lane in one daemon process.

    Invariants: ``attempts`` and ``since_ms`` are 0/None while ``copying``; ``since_ms`` is when the current run
    of failures began (the first failure after the last success), so ``stalled`` means failing for longer than the
    bound without one success in between — or, with ``attempts`` 0, held up with no failure since ``since_ms``
    (:meth:`held_up`; a failure then keeps ``since_ms``: the lane has not moved since); a ``halted``/``retired`` lane
    stays so until :meth:`resumed`."""

    state: str = COPYING
    reason: str = "none"
    message: str | None = None
    attempts: int = 0
    since_ms: int | None = None
    position: int | None = None
    range_end: int | None = None
    stall_after_s: float = field(default=300.0, repr=False)

    @property
    def stopped(self) -> bool:
        return self.state in (HALTED, RETIRED)

    def succeeded(self) -> None:
        if not self.stopped:
            self.state, self.reason, self.message, self.attempts, self.since_ms = COPYING, "none", None, 0, None
            self.range_end = None

    def failed(self, reason: str, message: str, now_ms: int, *, position: int | None = None) -> None:
        """A retriable failure: ``retrying``, or ``stalled`` once failing for longer than ``stall_after_s``."""
        if self.stopped:
            return
        self.attempts += 1
        if self.since_ms is None:  # the first failure of a run (a lane held up keeps its since: it has not moved)
            self.since_ms = now_ms
        self.reason, self.message, self.position = reason, message, position
        self.state = RETRYING
        self.refresh(now_ms)

    def refresh(self, now_ms: int) -> None:
        """Re-evaluate ``retrying`` → ``stalled`` (time passes while a lane backs off). A lane held up
        (:meth:`held_up`: stalled with no failure, ``attempts`` 0) stays so: its bound is not ``stall_after_s``."""
        if self.state in (RETRYING, STALLED) and self.since_ms is not None and self.attempts:
            self.state = STALLED if now_ms - self.since_ms > self.stall_after_s * 1000 else RETRYING

    def held_up(self, reason: str, message: str, since_ms: int, *, position: int) -> None:
        """Nothing failed, but the lane has not been able to move past ``position`` since ``since_ms`` for a reason
        outside Shoal (a source transaction left open there): ``stalled``, alerting like a lane failing for longer
        than the bound, until :meth:`succeeded`. The caller judges that the bound has passed."""
        if self.stopped:
            return
        self.state, self.reason, self.message, self.attempts = STALLED, reason, message, 0
        self.since_ms, self.position, self.range_end = since_ms, position, None

    def stop(self, persisted: PersistedLaneState) -> None:
        self.state, self.reason, self.message = persisted.state, persisted.reason, persisted.message
        self.since_ms, self.position, self.range_end = persisted.since_ms, persisted.position, persisted.range_end
        self.attempts = 0

    def resumed(self) -> None:
        self.state, self.reason, self.message, self.attempts, self.since_ms = COPYING, "none", None, 0, None
        self.position = self.range_end = None

    def as_dict(self) -> dict:
        body = asdict(self)
        body.pop("stall_after_s")
        return body


def observed_state(persisted_state: str | None, *, lag: int, held: bool | None, owner: str | None,
                   updated_ms: int | None, now_ms: int, stall_after_s: float) -> tuple[str, str | None]:
    """A lane's state as seen from outside the daemon (the Shoal page reads checkpoints, the daemon group and
    records, not the daemon's memory): a persisted ``halted``/``retired`` wins; a lane with data to copy whose
    checkpoint has not moved for ``stall_after_s`` is ``stalled`` (with why: no daemon holds it, or no progress);
    else ``copying``. ``held``: a daemon holds the lane (its partition assigned in the daemon group, or a live lease
    of a lease-based daemon), None when that is unknown (the group could not be read). (``retrying`` lives in the
    daemon's memory: its ``/readyz`` and metrics show it, and the holder writes it into the lane's health record,
    where the page reads it: :mod:`mirror_core.state.lane_health_records`.)"""
    if persisted_state in (HALTED, RETIRED):
        return persisted_state, None
    if lag <= 0 or updated_ms is None:
        return COPYING, None
    idle_s = max(0.0, (now_ms - updated_ms) / 1000)
    if idle_s < stall_after_s:
        return COPYING, None
    if owner is not None and owner.startswith("backfill:"):
        return STALLED, f"owned by {owner}, no checkpoint for {idle_s:.0f}s while {lag} offsets behind"
    if held is False:
        return STALLED, f"no daemon holds the lane (no member of the daemon group has it, no live lease); {lag} " \
                        f"offsets behind, last checkpoint {idle_s:.0f}s ago"
    unknown = " (the daemon group could not be read)" if held is None else ""
    return STALLED, f"no checkpoint for {idle_s:.0f}s while {lag} offsets behind{unknown}"
