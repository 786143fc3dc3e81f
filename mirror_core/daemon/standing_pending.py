"""A standing round's requests once sent (:class:`StandingPending`): the answers taken as news, or given up unread.

The round itself — its members, their placement at their leaders, the requests — is
:class:`~mirror_core.daemon.standing_round.StandingRound`; what it sends is handed here. **Answers**
(:meth:`StandingPending.collect`): only the news, as (lane, fetcher, start, outcome): every partition an answer named
(data, an error, a moved high watermark or log start offset), every member whose own state changed since the last
request (joined or placed again: reported even when the broker left it out, with the session's kept ends; a moved
position is news already), and every member that failed (no leader, its broker's request failed, the answer left out
a partition it had to name). A member left out of an incremental answer has nothing new and costs nothing.

Invariants: no fetcher moves before :meth:`~StandingPending.collect`, which hands each named partition's part to its
fetcher and re-enters every member it reports (``StandingRound._renew``) before the next request; a request that
fails loses its broker's session (the next one is full); a lost session is asked again at once, as a full request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import kafka.errors as Errors

from mirror_core.kafka.broker_fetch import (
    PartitionOutcome,
    RoundStats,
    _failed,
    _handle,
    give_up_requests,
)
from mirror_core.kafka.fetch_requests import send_fetch, wait_fetch
from mirror_core.kafka.fetch_session import PartitionKey, SessionRequest
from mirror_core.kafka.fetcher import RawBatchFetcher

if TYPE_CHECKING:
    from mirror_core.daemon.standing_round import StandingRound, _Broker, _Member

News = tuple[str, RawBatchFetcher, int, PartitionOutcome]   # lane, its fetcher, share start, what the round gave


class SentRequest:
    """One broker's request of a round: the request, its future, and the members it reports on (joined)."""

    __slots__ = ("broker", "request", "future", "reported")

    def __init__(self, broker: _Broker, reported: list[PartitionKey]):
        self.broker, self.reported = broker, reported
        self.request: SessionRequest | None = None
        self.future = None


class StandingPending:
    """A standing round's requests, sent; :meth:`collect` takes the answers (news only), :meth:`discard` drops
    them. In-flight state only: no fetcher has moved yet."""

    def __init__(self, owner: StandingRound, failed: list[tuple[_Member, BaseException]], stats: RoundStats | None,
                 sent_at: float):
        self._owner, self._stats = owner, stats
        # when the round was sent (monotonic): its answers say the source answered a request of that time, not of
        # when they are taken — the round in flight when the source went down is answered, then nothing is
        self.sent_at = sent_at
        self._failed = failed
        self._in_flight: list[SentRequest] = []
        self.collected = False
        self.answered = 0   # brokers whose answer was taken (a source that answers is reachable)

    def collect(self) -> list[News]:
        """Wait for every broker's answer; hand each named partition's part to its fetcher; return the news."""
        if self.collected:
            raise RuntimeError("a fetch round is collected once")
        self.collected = True
        news: list[tuple[_Member, int, PartitionOutcome]] = []
        failed, self._failed = self._failed, []
        for member, exc in failed:
            outcome = PartitionOutcome()
            _failed(member.fetcher, outcome, exc)
            news.append((member, member.fetcher.position, outcome))
        for sent in self._in_flight:
            self._collect_one(sent, news, resent=False)
        self._in_flight = []
        for member, _start, _outcome in news:
            self._owner._renew(member)
        return [(member.lane, member.fetcher, start, outcome) for member, start, outcome in news]

    def discard(self) -> None:
        """Give the round up unread (as :meth:`mirror_core.kafka.broker_fetch.PendingRound.discard`): no fetcher moves,
        each session starts afresh, a connection with an answer still coming is closed (or drained)."""
        if self.collected:
            return
        self.collected = True
        give_up_requests(self._owner.client, self._in_flight, lambda sent: sent.broker.session)
        self._in_flight = []

    def _send(self, sent: SentRequest, rotation: int = 0) -> bool:
        owner, broker, stats = self._owner, sent.broker, self._stats
        sent.request = broker.session.build_changes(broker.members, broker.changed, broker.left,
                                                    by_id=broker.without_id == 0, rotation=rotation)
        broker.changed.clear()   # any failure of this request loses the session: the next one is full
        broker.left.clear()
        try:
            sent.future = send_fetch(owner.client, broker.leader, sent.request.topics, max_wait_ms=owner.max_wait_ms,
                                     max_bytes=owner.max_bytes, isolation=owner.isolation, session=sent.request)
        except Exception as exc:  # noqa: BLE001 - e.g. authentication: every partition of this broker fails
            broker.session.failed(sent.request)
            self._failed.extend((member, exc) for member in broker.lanes.values())
            return False
        if stats is not None:
            stats.count_request(sent.request, len(broker.members))
        return True

    def _collect_one(self, sent: SentRequest, news: list, *, resent: bool) -> None:
        broker, future = sent.broker, sent.future
        try:
            wait_fetch(self._owner.client, future)
        except Exception as exc:  # noqa: BLE001 - e.g. authentication failing now: this broker's partitions fail
            broker.session.failed(sent.request)
            self._fail_all(sent, news, exc)
            return
        if future.failed():
            broker.session.failed(sent.request)
            self._fail_all(sent, news, future.exception)
            return
        answer = broker.session.answer(sent.request, future.value)
        if answer.resend_full and not resent:  # the session was lost: ask again at once, as a full request
            if self._stats is not None:
                self._stats.sessions_lost += 1
            if self._send(sent):
                self._collect_one(sent, news, resent=True)
            else:
                news.extend((m, m.fetcher.position, o) for m, o in self._take_failed(broker))
            return
        if answer.resend_full or answer.error_code:
            self._fail_all(sent, news, Errors.for_code(answer.error_code or future.value.error_code)())
            return
        self.answered += 1
        if self._stats is not None:
            self._stats.answered += len(answer.parts)
        lanes, told = broker.lanes, set()
        for key, data in answer.parts.items():
            member = lanes[key]
            start = member.fetcher.position
            outcome = PartitionOutcome()
            _handle(member.fetcher, outcome, data)
            news.append((member, start, outcome))
            told.add(key)
        for key in answer.missing:
            member = lanes[key]
            outcome = PartitionOutcome()
            _failed(member.fetcher, outcome, Errors.KafkaConnectionError(
                f"fetch response without {key.topic}-{key.partition}"))
            news.append((member, member.fetcher.position, outcome))
            told.add(key)
        for key in sent.reported:   # members joined or placed again: their news even when the broker had none
            member = lanes.get(key)
            if member is None or key in told:
                continue
            ends = broker.session.ends(key)
            outcome = PartitionOutcome()
            if ends is None:
                _failed(member.fetcher, outcome, Errors.KafkaConnectionError(
                    f"fetch response without {key.topic}-{key.partition}"))
            else:
                outcome.result = member.fetcher.unchanged(ends)
            news.append((member, member.fetcher.position, outcome))

    def _take_failed(self, broker: _Broker) -> list[tuple[_Member, PartitionOutcome]]:
        """The failures :meth:`_send` noted while collecting (a resend that could not be sent), as outcomes."""
        failed, self._failed = self._failed, []
        out = []
        for member, exc in failed:
            outcome = PartitionOutcome()
            _failed(member.fetcher, outcome, exc)
            out.append((member, outcome))
        return out

    def _fail_all(self, sent: SentRequest, news: list, exc: BaseException) -> None:
        for member in list(sent.broker.lanes.values()):
            outcome = PartitionOutcome()
            _failed(member.fetcher, outcome, exc)
            news.append((member, member.fetcher.position, outcome))
