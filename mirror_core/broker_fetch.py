"""One Fetch request per source broker for many partitions, the way the Java consumer fetches.

The daemon keeps one :class:`~mirror_core.fetcher.RawBatchFetcher` per lane (position, topic id, leader) and asks
:func:`fetch_round` for all of them at once: the partitions are grouped by leader, each leader gets one
FetchRequest carrying all of its partitions (sent to every leader before any answer is read, so the brokers'
long polls overlap), and each partition's part of the answer is handed back to its own fetcher
(:meth:`~mirror_core.fetcher.RawBatchFetcher.handle`), which applies the same rules as a single-partition fetch:
READ_COMMITTED filtering, OFFSET_OUT_OF_RANGE → :class:`~mirror_core.errors.DataLossError`, a changed topic id →
:class:`~mirror_core.errors.TopicRecreatedError`.

Invariants: a partition appears in at most one request per round; one partition's error never touches another's
result (each outcome is its own); a fetcher's position moves only when its part of a response was accepted; memory
per round is bounded by ``max_bytes`` per broker (plus, as Kafka allows, one batch larger than that limit); the
request's partition order rotates from round to round, so partitions later in the list are not starved when the
first ones fill ``max_bytes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.consumer import IsolationLevel

from mirror_core.fetcher import FetchResult, RawBatchFetcher, send_fetch, wait_fetch
from mirror_core.kafka_wire import WireClient, is_retriable
from mirror_core.wire_fastpath import FetchTopicSpec


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
    """Counters a benchmark or a test reads: requests sent (one per broker per round) and partitions asked."""

    rounds: int = 0
    requests: int = 0
    partitions: int = 0


def fetch_round(client: WireClient, fetchers: Sequence[RawBatchFetcher], *, max_bytes: int, max_wait_ms: int,
                rotation: int = 0, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
                stats: RoundStats | None = None) -> list[PartitionOutcome]:
    """Fetch every fetcher's partition at its position: one request per leader, all in flight together.

    Returns one outcome per fetcher, in the given order. ``rotation`` shifts the partition order inside each
    request (pass a round counter) for fairness under ``max_bytes``. A fetcher whose leader cannot be found, or
    whose broker's request fails, gets a (usually retriable) error and has its leader forgotten, so the next round
    looks it up again.
    """
    return send_round(client, fetchers, max_bytes=max_bytes, max_wait_ms=max_wait_ms, rotation=rotation,
                      isolation=isolation, stats=stats).collect()


class PendingRound:
    """A fetch round whose requests are sent and whose answers are not taken yet (see :func:`send_round`).

    In-flight state only: no fetcher's position has moved; :meth:`collect` hands each partition's part to its
    fetcher. A round never collected (the caller failed meanwhile) moves nothing, so dropping it skips nothing."""

    def __init__(self, client: WireClient, fetchers: Sequence[RawBatchFetcher], outcomes: list[PartitionOutcome],
                 in_flight: list):
        self._client = client
        self._fetchers = fetchers
        self._outcomes = outcomes
        self._in_flight = in_flight
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
        client, fetchers, outcomes = self._client, self._fetchers, self._outcomes
        for members, future in self._in_flight:
            try:
                wait_fetch(client, future)
            except Exception as exc:  # noqa: BLE001 - e.g. authentication failing now: this broker's partitions fail
                for i, _ in members:
                    _failed(fetchers[i], outcomes[i], exc)
                continue
            error = future.exception if future.failed() else None
            if error is None and future.value.error_code:
                error = Errors.for_code(future.value.error_code)()
            if error is not None:
                for i, _ in members:
                    _failed(fetchers[i], outcomes[i], error)
                continue
            _dispatch(future.value, [(i, fetchers[i]) for i, _ in members], outcomes)
        self._in_flight = []
        return outcomes

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
        for _members, future in self._in_flight:
            if future.is_done:
                continue
            conn = getattr(future, "conn", None)
            if conn is not None:
                conn.close()
                continue
            with contextlib.suppress(Exception):  # a failed answer is as good as a taken one: nothing is left
                wait_fetch(self._client, future)
        self._in_flight = []


def send_round(client: WireClient, fetchers: Sequence[RawBatchFetcher], *, max_bytes: int, max_wait_ms: int,
               rotation: int = 0, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
               stats: RoundStats | None = None, connections: int = 1) -> PendingRound:
    """Send :func:`fetch_round`'s requests (one per leader) without waiting; the answers are taken by
    :meth:`PendingRound.collect`. Lets a caller write the previous round while this one travels (overlap).
    ``connections`` > 1: a leader's partitions are dealt over that many connections to it (one request each, each
    with ``max_bytes``), for a link where one connection's window per round trip is below the link rate."""
    outcomes = [PartitionOutcome() for _ in fetchers]
    by_leader: dict[int, list[tuple[int, int]]] = {}  # leader → [(index into fetchers, leader epoch)]
    for index, fetcher in enumerate(fetchers):
        try:
            leader, epoch = fetcher.locate()
        except Exception as exc:  # noqa: BLE001 - one partition's trouble stays with it (kafka or TopicRecreated)
            _failed(fetcher, outcomes[index], exc)
            continue
        by_leader.setdefault(leader, []).append((index, epoch))
    in_flight = []
    for leader, members in by_leader.items():
        if rotation and len(members) > 1:
            shift = rotation % len(members)
            members = members[shift:] + members[:shift]
        slots = max(1, min(connections, len(members)))
        for slot in range(slots):  # a partition keeps its connection from round to round (partition mod slots)
            share = [m for m in members if fetchers[m[0]].partition % slots == slot] if slots > 1 else members
            if not share:
                continue
            topics = _request_topics([(fetchers[i], epoch) for i, epoch in share])
            try:
                future = send_fetch(client, leader, topics, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                    isolation=isolation, **({"slot": slot} if slot else {}))
            except Exception as exc:  # noqa: BLE001 - e.g. authentication: every partition of this broker fails
                for i, _ in share:
                    _failed(fetchers[i], outcomes[i], exc)
                continue
            in_flight.append((share, future))
            if stats is not None:
                stats.requests += 1
                stats.partitions += len(share)
    if stats is not None:
        stats.rounds += 1
    return PendingRound(client, fetchers, outcomes, in_flight)


def _request_topics(members: list[tuple[RawBatchFetcher, int]]) -> list[FetchTopicSpec]:
    """Group partitions by topic, keeping the (rotated) order of first appearance."""
    topics: dict[str, tuple[object, list]] = {}
    for fetcher, epoch in members:
        topic_id, parts = topics.setdefault(fetcher.topic, (fetcher.topic_id, []))
        parts.append(fetcher.spec(epoch))
    return [FetchTopicSpec(name, topic_id, parts) for name, (topic_id, parts) in topics.items()]


def _dispatch(response, members: list[tuple[int, RawBatchFetcher]], outcomes: list[PartitionOutcome]) -> None:
    """Hand each partition's part of ``response`` to its fetcher; a partition missing from it is retried."""
    parts = {}  # by (name, partition) up to v12, by (topic id, partition) from v13
    for topic in response.responses:
        name, topic_id = getattr(topic, "topic", None), getattr(topic, "topic_id", None)
        for data in topic.partitions:
            if name:
                parts[(name, data.partition_index)] = data
            if topic_id is not None:
                parts[(topic_id, data.partition_index)] = data
    for i, fetcher in members:
        data = parts.get((fetcher.topic_id, fetcher.partition)) if fetcher.topic_id is not None else None
        if data is None:
            data = parts.get((fetcher.topic, fetcher.partition))
        if data is None:
            _failed(fetcher, outcomes[i], Errors.KafkaConnectionError(
                f"fetch response without {fetcher.topic}-{fetcher.partition}"))
            continue
        try:
            outcomes[i].result = fetcher.handle(data)
        except Exception as exc:  # noqa: BLE001 - kept on this partition's outcome
            _failed(fetcher, outcomes[i], exc)


def _failed(fetcher: RawBatchFetcher, outcome: PartitionOutcome, exc: BaseException) -> None:
    outcome.error = exc
    if isinstance(exc, Errors.KafkaError) and is_retriable(type(exc)):
        fetcher.forget_leader()
