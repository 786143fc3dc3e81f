"""One Fetch request per source broker for many partitions, the way the Java consumer fetches.

The daemon keeps one :class:`~mirror_core.kafka.fetcher.RawBatchFetcher` per lane (position, topic id, leader) and asks
:func:`fetch_round` for all of them at once: the partitions are grouped by leader, each leader gets one
FetchRequest carrying all of its partitions (sent to every leader before any answer is read, so the brokers'
long polls overlap), and each partition's part of the answer is handed back to its own fetcher
(:meth:`~mirror_core.kafka.fetcher.RawBatchFetcher.handle`), which applies the same rules as a single-partition fetch:
READ_COMMITTED filtering, OFFSET_OUT_OF_RANGE → :class:`~mirror_core.errors.DataLossError`, a changed topic id →
:class:`~mirror_core.errors.TopicRecreatedError`.

Fetch sessions (KIP-227, :mod:`mirror_core.kafka.fetch_session`): each client keeps one session per source broker for
its rounds (:class:`RoundSessions`, per client by default, ``enabled=False`` to opt out). After the first (full)
round a request names only the partitions whose position changed, joined or left, and the broker's answer only
the partitions with something new; a partition left out of the answer gets a result without batches at its
unchanged position, with the high watermark / last stable / log start offsets last known (never "done" or
"stalled" by itself). A lost session (FETCH_SESSION_ID_NOT_FOUND, e.g. evicted; INVALID_FETCH_SESSION_EPOCH) is
re-asked at once as a full request inside :meth:`PendingRound.collect`: callers never see it. In a session the
broker keeps the partition order itself and moves a partition that returned data to the end (Kafka's
IncrementalFetchContext), so the rotation below matters for full requests only.
Closing the client closes its sessions on their brokers (:meth:`RoundSessions.close`, best effort, at most
``CLOSE_TIMEOUT_S``): a session left open holds a slot of the broker's session cache until a busier one evicts it.

Invariants: a partition appears in at most one request per round; one partition's error never touches another's
result (each outcome is its own); a fetcher's position moves only when its part of a response was accepted; memory
per round is bounded by ``max_bytes`` per broker (plus, as Kafka allows, one batch larger than that limit); the
request's partition order rotates from round to round, so partitions later in the list are not starved when the
first ones fill ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.fetch_messages import FetchTopicSpec
from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka.fetch_requests import send_fetch, wait_fetch
from mirror_core.kafka.fetch_session import FetchSession, PartitionKey, SessionAnswer, SessionRequest
from mirror_core.kafka.fetcher import FetchResult, RawBatchFetcher
from mirror_core.kafka.retries import is_retriable
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)

# a leader look-up that reached no broker at all (not a broker's answer such as LEADER_NOT_AVAILABLE)
_UNREACHABLE = (Errors.KafkaConnectionError, Errors.NodeNotReadyError, Errors.KafkaTimeoutError,
                ClusterUnavailableError)

CLOSE_TIMEOUT_S = 1.0    # a client's goodbye to its fetch sessions, all brokers together (RoundSessions.close)


@dataclass
class PartitionOutcome:
    """What one round gave one fetcher: a result (possibly without batches) or the error of its partition."""

    result: FetchResult | None = None
    error: BaseException | None = None

    @property
    def retriable(self) -> bool:
        return self.error is not None and isinstance(self.error, Errors.KafkaError) and \
            is_retriable(type(self.error))


@dataclass
class RoundStats:
    """Counters a benchmark or a test reads: requests sent (one per broker per round, plus a full one again after a
    lost session), partitions asked, partitions named on the wire (all of them in a full request, the changed ones
    in an incremental one), and partitions the answers named (an incremental answer leaves the idle ones out)."""

    rounds: int = 0
    requests: int = 0
    partitions: int = 0
    named: int = 0
    answered: int = 0
    incremental: int = 0
    sessions_lost: int = 0

    def count_request(self, request, partitions: int) -> None:
        """One fetch request sent for ``partitions`` members (``request``: its session request)."""
        self.requests += 1
        self.partitions += partitions
        self.named += request.partition_count
        self.incremental += not request.full


def give_up_answer(client: WireClient, future) -> None:
    """An answer nobody will read (see :meth:`PendingRound.discard`): close the hand-encoded connection it is coming
    on, or, on kafka-python's route, wait for it and drop it, so no later read meets it first."""
    if future is None or future.is_done:
        return
    conn = getattr(future, "conn", None)
    if conn is not None:
        conn.close()
        return
    with contextlib.suppress(Exception):  # a failed answer is as good as a taken one: nothing is left
        wait_fetch(client, future)


def give_up_requests(client: WireClient, in_flight, session_of) -> None:
    """Give a sent round's requests up unread: each one's fetch session is told its request failed (its answer is
    never read: the session starts afresh) and its answer is given up (:func:`give_up_answer`)."""
    for sent in in_flight:
        if sent.request is not None:
            session_of(sent).failed(sent.request)
        give_up_answer(client, sent.future)


@dataclass
class RoundSessions:
    """One client's fetch sessions for its rounds, one per source broker and connection slot (a round that deals a
    broker's partitions over several connections sends one request per slot, each its own session;
    :mod:`mirror_core.kafka.fetch_session`). ``enabled=False``: every request is a sessionless full one (brokers that
    refuse sessions need nothing: they answer with session id 0 and the requests stay full)."""

    enabled: bool = True
    by_broker: dict[tuple[int, int], FetchSession] = field(default_factory=dict)

    def session(self, broker: int, slot: int = 0) -> FetchSession:
        found = self.by_broker.get((broker, slot))
        if found is None or found.enabled != self.enabled:
            found = self.by_broker[(broker, slot)] = FetchSession(enabled=self.enabled)
        return found

    def close(self, client: WireClient, *, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Close every session on its broker (:meth:`FetchSession.close`: its id at FINAL_EPOCH, no partitions),
        on the same connection slot, all sent before any answer is read; best effort within ``timeout_s`` overall,
        never raising (a session not closed is evicted by its broker in time). Returns how many the brokers
        confirmed. A connection with a request of an uncollected round still on it (the round a stopping daemon
        sent ahead) would answer that long poll first: it is closed and a fresh one, bounded by the time left,
        carries the goodbye. The sessions are forgotten here in any case: a later round starts new ones."""
        deadline = time.monotonic() + timeout_s
        sent = []
        for (broker, slot), session in sorted(self.by_broker.items()):
            request = session.close()
            left = deadline - time.monotonic()
            if request is None or left <= 0:
                continue
            try:
                sent.append(((broker, slot), _send_goodbye(client, broker, slot, request, left)))
            except Exception as exc:  # noqa: BLE001 - best effort: the broker evicts it in time
                log.debug("fetch session %d with broker %d not closed: %s", request.session_id, broker, exc)
        self.by_broker.clear()
        closed = 0
        for (broker, _slot), future in sent:
            try:
                wait_fetch(client, future, timeout_s=max(deadline - time.monotonic(), 0.0))
            except Exception as exc:  # noqa: BLE001 - e.g. authentication failing now
                log.debug("fetch session with broker %d not closed: %s", broker, exc)
                continue
            if future.is_done and future.succeeded() and not future.value.error_code:
                closed += 1
            else:
                log.debug("fetch session with broker %d not closed: %s", broker,
                          future.exception if future.is_done and future.failed() else "no answer in time")
        return closed


def _send_goodbye(client: WireClient, broker: int, slot: int, request: SessionRequest, timeout_s: float):
    """Send one session's closing request (see :meth:`RoundSessions.close`) and return its future."""
    if getattr(client, "fast_connection", None) is not None:
        conn = client.fast_connection(broker, slot, timeout_s=timeout_s)
        if conn is not None and conn.in_flight:   # behind an uncollected round's long poll: a fresh connection
            conn.close()
            client.fast_connection(broker, slot, timeout_s=timeout_s)
    return send_fetch(client, broker, [], max_wait_ms=0, max_bytes=1, isolation=IsolationLevel.READ_COMMITTED,
                      session=request, slot=slot, request_timeout_ms=max(1, int(timeout_s * 1000)))


_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def round_sessions(client: WireClient) -> RoundSessions:
    """The fetch sessions of ``client``'s rounds (made on first use; set ``enabled`` on it to opt out). One client
    is used by one thread (:class:`~mirror_core.kafka.wire_client.WireClient`), so its rounds never overlap in a session
    except by a round dropped unread, which the session notices (and then starts afresh). They are closed on their
    brokers when the client is closed (:meth:`RoundSessions.close`, run by ``WireClient.close``): whoever owns
    the client — the daemon at shutdown, ``shoal copy`` at its end — closes its sessions by closing it. Sessions
    passed to :func:`send_round` explicitly are their caller's to close."""
    found = _SESSIONS.get(client)
    if found is None:
        found = _SESSIONS[client] = RoundSessions()
        if hasattr(client, "on_close"):
            client.on_close(found.close)
    return found


def fetch_round(client: WireClient, fetchers: Sequence[RawBatchFetcher], *, max_bytes: int, max_wait_ms: int,
                rotation: int = 0, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
                stats: RoundStats | None = None, sessions: RoundSessions | None = None) -> list[PartitionOutcome]:
    """Fetch every fetcher's partition at its position: one request per leader, all in flight together.

    Returns one outcome per fetcher, in the given order. ``rotation`` shifts the partition order inside each
    request (pass a round counter) for fairness under ``max_bytes``. A fetcher whose leader cannot be found, or
    whose broker's request fails, gets a (usually retriable) error and has its leader forgotten, so the next round
    looks it up again.
    """
    return send_round(client, fetchers, max_bytes=max_bytes, max_wait_ms=max_wait_ms, rotation=rotation,
                      isolation=isolation, stats=stats, sessions=sessions).collect()


class _BrokerRequest:
    """One broker's request of a round (on one of the client's connections to it, ``slot``): its members (index
    into the fetchers, leader epoch), the session and the session request it went with, and its future."""

    __slots__ = ("leader", "slot", "members", "session", "request", "future")

    def __init__(self, leader: int, slot: int, members: list[tuple[int, int]], session: FetchSession):
        self.leader = leader
        self.slot = slot
        self.members = members
        self.session = session
        self.request: SessionRequest | None = None
        self.future = None


class PendingRound:
    """A fetch round whose requests are sent and whose answers are not taken yet (see :func:`send_round`).

    In-flight state only: no fetcher's position has moved; :meth:`collect` hands each partition's part to its
    fetcher. A round never collected (the caller failed meanwhile) moves nothing, so dropping it skips nothing (its
    brokers' sessions notice the unanswered request at their next use and start afresh)."""

    def __init__(self, client: WireClient, fetchers: Sequence[RawBatchFetcher], outcomes: list[PartitionOutcome],
                 in_flight: list[_BrokerRequest], send, stats: RoundStats | None):
        self._client = client
        self._fetchers = fetchers
        self._outcomes = outcomes
        self._in_flight = in_flight
        self._send = send
        self._stats = stats
        self.collected = False

    @property
    def fetchers(self) -> Sequence[RawBatchFetcher]:
        return self._fetchers

    def collect(self) -> list[PartitionOutcome]:
        """Wait for every broker's answer and hand each partition's part to its fetcher; one outcome per fetcher,
        in the order given to :func:`send_round`. Call once."""
        if self.collected:
            raise RuntimeError("a fetch round is collected once")
        self.collected = True
        for sent in self._in_flight:
            self._collect_one(sent, resent=False)
        self._in_flight = []
        return self._outcomes

    def _collect_one(self, sent: _BrokerRequest, *, resent: bool) -> None:
        client, fetchers, outcomes = self._client, self._fetchers, self._outcomes
        future = sent.future
        try:
            wait_fetch(client, future)
        except Exception as exc:  # noqa: BLE001 - e.g. authentication failing now: this broker's partitions fail
            sent.session.failed(sent.request)
            self._fail_all(sent, exc)
            return
        if future.failed():
            sent.session.failed(sent.request)
            self._fail_all(sent, future.exception)
            return
        answer = sent.session.answer(sent.request, future.value)
        if answer.resend_full and not resent:  # the session was lost: ask again at once, as a full request
            if self._stats is not None:
                self._stats.sessions_lost += 1
            if self._send(sent):
                self._collect_one(sent, resent=True)
            return
        if answer.resend_full or answer.error_code:
            self._fail_all(sent, Errors.for_code(answer.error_code or future.value.error_code)())
            return
        if self._stats is not None:
            self._stats.answered += len(answer.parts)
        _hand_out(answer, [(i, fetchers[i]) for i, _ in sent.members], outcomes)

    def _fail_all(self, sent: _BrokerRequest, exc: BaseException) -> None:
        for i, _ in sent.members:
            _failed(self._fetchers[i], self._outcomes[i], exc)

    def discard(self) -> None:
        """Give the round up without taking its answers; no fetcher moves. Call instead of :meth:`collect`.

        An answer left unread would wait on its connection ahead of the next round's: the next round would read it
        first, and should its deadline pass meanwhile (an idle daemon sleeps past it) the connection fails under
        the next round's own request. So every hand-encoded connection with a request of this round still
        unanswered is closed now (its future fails; a new connection is made on next use): a broker answers a
        connection's requests in order, so the next round would otherwise also wait behind this round's long poll.
        On kafka-python's route (no connection of our own to close) the answers are drained: waited for and
        dropped, so none is left for a later read."""
        if self.collected:
            return
        self.collected = True
        give_up_requests(self._client, self._in_flight, lambda sent: sent.session)
        self._in_flight = []


def send_round(client: WireClient, fetchers: Sequence[RawBatchFetcher], *, max_bytes: int, max_wait_ms: int,
               rotation: int = 0, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
               stats: RoundStats | None = None, connections: int = 1,
               sessions: RoundSessions | None = None) -> PendingRound:
    """Send :func:`fetch_round`'s requests (one per leader) without waiting; the answers are taken by
    :meth:`PendingRound.collect`. Lets a caller write the previous round while this one travels (overlap).
    ``connections`` > 1: a leader's partitions are dealt over that many connections to it
    (:func:`deal_to_connections`; one request each, each with ``max_bytes``, each in its own fetch session), for a
    link where one connection's window per round trip is below the link rate. ``sessions``: the fetch sessions to
    use (default: the client's own, :func:`round_sessions`)."""
    sessions = round_sessions(client) if sessions is None else sessions
    outcomes = [PartitionOutcome() for _ in fetchers]
    by_leader: dict[int, list[tuple[int, int]]] = {}  # leader → [(index into fetchers, leader epoch)]
    unreachable: BaseException | None = None  # a leader look-up of this round found no broker of the cluster
    for index, fetcher in enumerate(fetchers):
        if unreachable is not None and not fetcher.leader_known:
            # every look-up would wait the same way (a re-bootstrap of the whole cluster, seconds each): with the
            # source down, one per round, not one per partition (2,000 lanes would block the loop for hours)
            _failed(fetcher, outcomes[index], unreachable)
            continue
        try:
            leader, epoch = fetcher.locate()
        except Exception as exc:  # noqa: BLE001 - one partition's trouble stays with it (kafka or TopicRecreated)
            if isinstance(exc, _UNREACHABLE):
                unreachable = exc
            _failed(fetcher, outcomes[index], exc)
            continue
        by_leader.setdefault(leader, []).append((index, epoch))

    def send(sent: _BrokerRequest) -> bool:
        """Build the broker's session request from its members' current positions and send it."""
        topics = _request_topics([(fetchers[i], epoch) for i, epoch in sent.members])
        sent.request = sent.session.build(topics)
        try:
            sent.future = send_fetch(client, sent.leader, topics, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                     isolation=isolation, session=sent.request,
                                     **({"slot": sent.slot} if sent.slot else {}))
        except Exception as exc:  # noqa: BLE001 - e.g. authentication: every partition of this broker fails
            sent.session.failed(sent.request)
            for i, _ in sent.members:
                _failed(fetchers[i], outcomes[i], exc)
            return False
        if stats is not None:
            stats.count_request(sent.request, len(sent.members))
        return True

    in_flight = []
    for leader, members in by_leader.items():
        keys = [(fetchers[i].topic, fetchers[i].partition) for i, _ in members]
        for slot, dealt in enumerate(deal_to_connections(keys, connections)):
            share = [members[j] for j in dealt]
            if rotation and len(share) > 1:
                shift = rotation % len(share)
                share = share[shift:] + share[:shift]
            sent = _BrokerRequest(leader, slot, share, sessions.session(leader, slot))
            if send(sent):
                in_flight.append(sent)
    if stats is not None:
        stats.rounds += 1
    return PendingRound(client, fetchers, outcomes, in_flight, send, stats)


def deal_to_connections(keys: Sequence[tuple[str, int]], connections: int) -> list[list[int]]:
    """One broker's partitions of a round dealt over ``connections`` connections to it (pure): the indices into
    ``keys`` ((topic, partition) each) of every connection's request, none empty. Sorted by topic and partition and
    dealt by position, so the requests differ by one partition at most whatever the partition numbers (a leader of
    the even partitions only still fills every connection), and a partition keeps its connection, so its fetch
    session, from round to round while the broker's set of partitions stays the same."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    slots = max(1, min(connections, len(order)))
    return [order[slot::slots] for slot in range(slots)] if order else []


def _request_topics(members: list[tuple[RawBatchFetcher, int]]) -> list[FetchTopicSpec]:
    """Group partitions by topic, keeping the (rotated) order of first appearance."""
    topics: dict[str, tuple[object, list]] = {}
    for fetcher, epoch in members:
        topic_id, parts = topics.setdefault(fetcher.topic, (fetcher.topic_id, []))
        parts.append(fetcher.spec(epoch))
    return [FetchTopicSpec(name, topic_id, parts) for name, (topic_id, parts) in topics.items()]


def _hand_out(answer: SessionAnswer, members: list[tuple[int, RawBatchFetcher]],
              outcomes: list[PartitionOutcome]) -> None:
    """Each partition's part of a broker's answer to its fetcher: data is handled (the position may move), a
    partition left out of an incremental answer gets a result without batches at its position (nothing new), one
    missing where the broker had to name it is retried."""
    for i, fetcher in members:
        key = PartitionKey(fetcher.topic, fetcher.topic_id, fetcher.partition)
        if key in answer.parts:
            _handle(fetcher, outcomes[i], answer.parts[key])
        elif key in answer.unchanged:
            outcomes[i].result = fetcher.unchanged(answer.unchanged[key])
        else:
            _failed(fetcher, outcomes[i], Errors.KafkaConnectionError(
                f"fetch response without {fetcher.topic}-{fetcher.partition}"))


def _dispatch(response, members: list[tuple[int, RawBatchFetcher]], outcomes: list[PartitionOutcome]) -> None:
    """:func:`_hand_out` for a sessionless ``response`` to a request for ``members`` (all of them named)."""
    session = FetchSession(enabled=False)
    request = session.build(_request_topics([(fetcher, -1) for _, fetcher in members]))
    _hand_out(session.answer(request, response), members, outcomes)


def _handle(fetcher: RawBatchFetcher, outcome: PartitionOutcome, data) -> None:
    try:
        outcome.result = fetcher.handle(data)
    except Exception as exc:  # noqa: BLE001 - kept on this partition's outcome
        _failed(fetcher, outcome, exc)


def _failed(fetcher: RawBatchFetcher, outcome: PartitionOutcome, exc: BaseException) -> None:
    outcome.error = exc
    if isinstance(exc, Errors.KafkaError) and is_retriable(type(exc)):
        fetcher.forget_leader()
