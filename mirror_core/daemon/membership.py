"""Which daemon process holds which lane: membership and assignment through a Kafka consumer group on the source.

The daemons of one pipeline join one consumer group on the SOURCE cluster (``shoal.<pipeline>.daemons``), subscribed
to the explicit topic names Shoal's own selection computed (never a broker-side regex: one regex dialect, Shoal's).
Kafka does what the group protocol is for — membership, failure detection, balanced incremental assignment — with
the ``consumer`` protocol (KIP-848: the broker computes the assignment) on Kafka 4 brokers and the classic protocol
with the ``cooperative-sticky`` assignor on older ones (the protocol, the consumer's settings and the group's timeouts:
:mod:`mirror_core.daemon.group_settings`). The group is used for membership only:

- assigned partitions are ``incremental_assign``-ed and paused in the same callback, so the consumer never fetches
  (the daemon's own fetch rounds read the source); no offset is ever committed through the group (so lag tools show
  the group with members and no committed offsets: see docs/daemon-membership.md);
- ``poll()`` runs on its own thread every :data:`POLL_S`, whatever the daemon loop is doing (a long target outage
  stalls copying, never membership): membership lives as long as the process;
- an assigned source partition is a lane this process may hold; the daemon loop reads :meth:`GroupMembership.assigned`.

Revocation hand-shake (the rule this module owns): the revocation callback runs on the poll thread. It marks the
partitions *revoking* (:meth:`GroupMembership.revoking`), and blocks until the daemon loop has closed those lanes —
their open transaction finished or aborted, the lane dropped — and said so with :meth:`GroupMembership.released`,
or until ``revoke_timeout_s`` passes. Only then does it ``incremental_unassign`` and return, so the partition goes
to its next holder after our last commit. The loop answers revocations once per pass of its main loop (a counter
read when nothing changed, no I/O) and from the lane pool's progress tick only once the lanes' work of that pass has
returned, so the wait is about one copy round: the slowest lane's fetch and commit of that round (seconds under a
backlog or a slow target), not milliseconds.

If the timeout passes (the loop is stuck in one lane's write retries, say), the callback gives the partitions up
anyway and logs ``event=revoke_timeout``: it must return well within the group's rebalance timeout
(``max.poll.interval.ms``) or the broker would expel this member and take all its lanes. Safety never depends on
the callback: the next holder opens the lane with the lane's transactional.id, which fences this process's writer
(its open transaction is aborted, its next write fails as fenced and the loop drops the lane), and it resumes from
the checkpoint committed with the data, read only after that fencing. A lost assignment (this member's session
expired: the group already gave the partitions to others) is dropped without waiting, for the same reason.

A group that never forms (a broker without the requested protocol, a missing group ACL, an unreachable
coordinator) is no error librdkafka reports: the member simply never gets an assignment. :meth:`GroupMembership.
unjoined_for_s` tells how long it has been subscribed without one; the daemon turns that into an event, a metric and
a failing ``/readyz``.

Invariants: ``_assigned`` is exactly what was ``incremental_assign``-ed and not yet unassigned; ``_revoking`` ⊆
``_assigned``; ``_released`` holds partitions the loop closed while they were revoking (cleared at unassign), and
only for the revocation the loop saw: :meth:`GroupMembership.released` ignores a partition whose revocation began
after the generation the loop read (``_revoke_started``). Every consumer call happens on the poll thread (subscribe
requests are handed to it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import daemon_group_id as group_id
from mirror_core.daemon.group_settings import MAX_POLL_INTERVAL_MS, consumer_settings
from mirror_core.errors import ConfigError

log = logging.getLogger("shoal.daemon.membership")

POLL_S = 0.5                    # the poll thread's cadence (the group's liveness is librdkafka's, this only serves
                                # callbacks)
ERROR_LOG_EVERY_S = 30.0        # a repeated librdkafka error (the source unreachable) is logged this often

Partition = tuple[str, int]


@dataclass(frozen=True)
class MembershipView:
    """What the loop and ``/readyz``-style reporting need to know of this member."""

    protocol: str
    group: str
    joined: bool            # at least one assignment (possibly empty) received since the last subscribe
    assigned: frozenset[Partition]
    revoking: frozenset[Partition]
    last_poll_age_s: float


def lost_note(reachability) -> str:
    """Why an assignment was lost, as far as this process can tell. With the source unreachable (``reachability``
    says so) the coordinator is down too: nobody was given the partitions — the classic protocol's client-side
    session timer (librdkafka SESSTMOUT) dropped them because no coordinator answered."""
    if reachability is not None and reachability.failing:
        return ("our session timed out while the group coordinator on the source was unreachable (the client drops "
                "its assignment itself; nobody was given the partitions): the lanes are dropped and taken again "
                "when the group answers; their checkpoints keep the positions")
    return ("our session expired (the coordinator did not hear from us within the session timeout): the group may "
            "have given them to others, whose transactional.id fences any write of ours still in flight")


class GroupMembership:
    """One daemon process's membership of its pipeline's group (see the module docstring for the hand-shake)."""

    def __init__(self, source: ClusterConfig, pipeline: str, worker_id: str, *, protocol: str,
                 revoke_timeout_s: float = 30.0, classic_session_timeout_ms: int | None = None,
                 metadata_refresh_ms: int | None = None, on_change=None, reachability=None):
        if revoke_timeout_s * 1000 >= MAX_POLL_INTERVAL_MS / 2:
            raise ConfigError(f"revoke_timeout_s {revoke_timeout_s:g} must stay well below the group's rebalance "
                              f"timeout ({MAX_POLL_INTERVAL_MS / 1000:g}s)")
        self.pipeline, self.worker_id, self.protocol = pipeline, worker_id, protocol
        self.group = group_id(pipeline)
        self.revoke_timeout_s = revoke_timeout_s
        self._settings = consumer_settings(source, pipeline, worker_id, protocol,
                                           classic_session_timeout_ms=classic_session_timeout_ms,
                                           metadata_refresh_ms=metadata_refresh_ms)
        self._on_change = on_change  # called (no arguments, on the poll thread) when assigned/revoking changed
        # a SourceReachability (mirror_core.kafka.source_reachability), told when every source broker is down for the
        # group's consumer (librdkafka's _ALL_BROKERS_DOWN) and when an assignment arrives (the coordinator answered)
        self._reachability = reachability
        self._errors_logged: dict[str, tuple[float, int]] = {}  # error code → (last logged, repeats since)
        self._lock = threading.Condition()
        self._assigned: set[Partition] = set()
        self._revoking: set[Partition] = set()
        self._released: set[Partition] = set()
        self._revoke_started: dict[Partition, int] = {}  # revoking partition → the generation its revocation began
        self._leaving = False       # shutdown: the loop holds no lane any more, revocations need no wait
        self._joined = False
        self._generation = 0        # bumped on every change of _assigned or _revoking (a cheap "anything new?")
        self._subscription: list[str] | None = None   # wanted (set by the loop)
        self._subscribed: list[str] | None = None     # applied (by the poll thread)
        self._unjoined_since: float | None = None     # monotonic time of a non-empty subscribe with no assignment yet
        self._stop = threading.Event()
        self._last_poll = time.monotonic()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # the last consumer error (shown in logs and status)

    # ---- the daemon loop's side --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"shoal-membership-{self.worker_id}", daemon=True)
        self._thread.start()

    def subscribe(self, topics: Iterable[str]) -> None:
        """Subscribe to exactly these topic names (the poll thread applies it; an unchanged list is a no-op)."""
        with self._lock:
            self._subscription = sorted(set(topics))

    @property
    def alive(self) -> bool:
        """False once the poll thread ended without :meth:`close` (an unexpected error: see ``error``)."""
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    @property
    def generation(self) -> int:
        """Changes whenever the assignment or the revocations change: the loop skips its checks while it does not."""
        return self._generation

    def assigned(self) -> frozenset[Partition]:
        """Partitions this process may hold as lanes now: assigned and not being revoked."""
        with self._lock:
            return frozenset(self._assigned - self._revoking)

    def revoking(self) -> frozenset[Partition]:
        """Partitions the group is taking back: the loop closes their lanes, then calls :meth:`released`."""
        with self._lock:
            return frozenset(self._revoking - self._released)

    def released(self, partitions: Iterable[Partition], *, as_of: int | None = None) -> None:
        """The loop closed these lanes (no open transaction, dropped): a waiting revocation may complete.
        ``as_of``: the :attr:`generation` the loop read before it read :meth:`revoking` — a revocation of the same
        partition that began after that (the earlier one completed, the partition came back and is being revoked
        again, its new lane perhaps mid-transaction) is not satisfied by this call."""
        with self._lock:
            parts = set(partitions) & self._revoking
            if as_of is not None:
                parts = {p for p in parts if self._revoke_started.get(p, 0) <= as_of}
            self._released |= parts
            self._lock.notify_all()

    @property
    def joined(self) -> bool:
        """At least one assignment (possibly empty) received: the group formed for this member."""
        return self._joined

    def unjoined_for_s(self) -> float:
        """How long this member has been subscribed to a non-empty topic list without ever receiving an
        assignment (0 once joined, or while nothing is subscribed)."""
        with self._lock:
            since = self._unjoined_since
        return 0.0 if since is None else time.monotonic() - since

    def view(self) -> MembershipView:
        with self._lock:
            return MembershipView(self.protocol, self.group, self._joined, frozenset(self._assigned),
                                  frozenset(self._revoking), time.monotonic() - self._last_poll)

    def close(self, timeout_s: float = 10.0) -> None:
        """Leave the group: call only when the loop holds no lane (a revocation then needs no wait)."""
        with self._lock:
            self._leaving = True
            self._lock.notify_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ---- the poll thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({**self._settings, "error_cb": self._on_error})
        try:
            while not self._stop.is_set():
                self._apply_subscription(consumer)
                msg = consumer.poll(POLL_S)
                self._last_poll = time.monotonic()
                if msg is not None and msg.error() is not None:
                    self._on_error(msg.error())
        except Exception as exc:  # noqa: BLE001 - logged; the loop sees no assignment any more
            log.error("event=membership_failed group=%s error=%s", self.group, f"{type(exc).__name__}: {exc}",
                      exc_info=True)
            self.error = str(exc)
        finally:
            try:
                consumer.close()  # leaves the group; its revocation callback finds _leaving set and does not wait
            except Exception as exc:  # noqa: BLE001 - the broker expires the member after its session timeout
                log.warning("event=membership_leave_failed group=%s error=%s", self.group, exc)
            with self._lock:
                self._assigned.clear()
                self._revoking.clear()
                self._released.clear()
                self._revoke_started.clear()
                self._generation += 1
            self._changed()

    def _apply_subscription(self, consumer) -> None:
        with self._lock:
            wanted = self._subscription
        if wanted is None or wanted == self._subscribed:
            return
        if wanted:
            consumer.subscribe(wanted, on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_lost)
        else:
            consumer.unsubscribe()
        self._subscribed = wanted
        with self._lock:
            if not wanted:
                self._unjoined_since = None
            elif not self._joined and self._unjoined_since is None:
                self._unjoined_since = time.monotonic()
        log.info("event=group_subscribed group=%s protocol=%s topics=%d", self.group, self.protocol, len(wanted))

    def _on_assign(self, consumer, partitions) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        # an explicit logical offset skips the committed-offset look-up (nothing is ever committed here); the
        # pause right after keeps the consumer from fetching at all
        tps = [TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in partitions]
        if tps:
            consumer.incremental_assign(tps)
            consumer.pause(tps)
        if self._reachability is not None:
            self._reachability.answered(time.monotonic())
        with self._lock:
            self._assigned |= {(tp.topic, tp.partition) for tp in partitions}
            self._joined = True
            self._unjoined_since = None
            self._generation += 1
        if partitions:
            log.info("event=group_assigned group=%s worker=%s partitions=%s", self.group, self.worker_id,
                     _names(partitions))
        self._changed()

    def _on_revoke(self, consumer, partitions) -> None:
        self._give_up(consumer, partitions, wait=True)

    def _on_lost(self, consumer, partitions) -> None:
        log.warning("event=group_assignment_lost group=%s worker=%s partitions=%s note=%s", self.group,
                    self.worker_id, _names(partitions), lost_note(self._reachability))
        self._give_up(consumer, partitions, wait=False)

    def _give_up(self, consumer, partitions, *, wait: bool) -> None:
        parts = {(tp.topic, tp.partition) for tp in partitions}
        with self._lock:
            self._generation += 1
            for part in parts & self._assigned - self._revoking:
                self._revoke_started[part] = self._generation
            self._revoking |= parts & self._assigned
        self._changed()
        deadline = time.monotonic() + self.revoke_timeout_s
        with self._lock:
            while wait and not self._leaving and not (parts & self._revoking) <= self._released:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("event=revoke_timeout group=%s worker=%s partitions=%s waited_s=%g note=%s",
                                self.group, self.worker_id, _names(partitions), self.revoke_timeout_s,
                                "given up without the loop's release; the next holder's transactional.id fences "
                                "this process's writer of those lanes")
                    break
                self._lock.wait(min(left, 1.0))
        if partitions:
            consumer.incremental_unassign(list(partitions))
        with self._lock:
            self._assigned -= parts
            self._revoking -= parts
            self._released -= parts
            for part in parts:
                self._revoke_started.pop(part, None)
            self._generation += 1
        if partitions:
            log.info("event=group_revoked group=%s worker=%s partitions=%s", self.group, self.worker_id,
                     _names(partitions))
        self._changed()

    def _on_error(self, error) -> None:
        """librdkafka's error callback (the poll thread). An unreachable source repeats the same connection error
        many times a second: each error code is logged once per :data:`ERROR_LOG_EVERY_S` (the latest text), with
        how often it repeated meanwhile."""
        from confluent_kafka import KafkaError

        self.error = str(error)
        code = error.code() if hasattr(error, "code") else None
        if self._reachability is not None and code == KafkaError._ALL_BROKERS_DOWN:
            self._reachability.unanswered(time.monotonic(), f"every broker of the group's consumer is down ({error})")
        now = time.monotonic()
        kind = str(code) if code is not None else self.error   # the texts vary (timings, addresses): by code
        last, repeats = self._errors_logged.get(kind, (None, 0))
        if last is not None and now - last < ERROR_LOG_EVERY_S:
            self._errors_logged[kind] = (last, repeats + 1)
            return
        if len(self._errors_logged) > 100:   # codes are few; texts of code-less errors could be many
            self._errors_logged.clear()
        self._errors_logged[kind] = (now, 0)
        log.warning("event=membership_error group=%s error=%s repeated=%d", self.group, error, repeats)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def _names(partitions) -> str:
    return ",".join(f"{tp.topic}-{tp.partition}" for tp in partitions) or "-"
