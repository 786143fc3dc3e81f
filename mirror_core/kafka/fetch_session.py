"""Fetch sessions (KIP-227, incremental fetch): what one client's requests to one broker leave out, and why.

Without a session every FetchRequest names every partition with its position, and every response names every
partition with its high watermark, even when nothing changed: a daemon holding 2,000 idle partitions sends and
receives ~100 bytes per partition per round for nothing. With a session the broker remembers, per session, each
partition's fetch parameters (fetch offset, leader epoch, last fetched epoch, max bytes) and what it last told us
(high watermark, log start offset). Then:

- a **full** request (session epoch 0) names every partition; the response names every partition and carries the
  new session's id (0: the broker made none — sessions disabled with ``max.incremental.fetch.session.cache.slots=0``,
  the cache full, or a broker older than Fetch v7 — and we keep sending full requests);
- an **incremental** request (the session's id, epoch 1, 2, …) names only the partitions whose parameters changed
  or that join the session, and lists the ones that leave it in ``ForgottenTopicsData``;
- an incremental response names only the partitions with something to say: records, an error, a changed high
  watermark or log start offset, a diverging epoch. **A partition left out of an incremental response has nothing
  new**: its fetcher keeps its position, and its high watermark, last stable offset and log start offset are the
  ones the broker last sent (:class:`PartitionEnds`, kept here). It is never "the end was reached", "stalled" or
  "done" by itself; callers treat it exactly like a response that carried the partition with no records. (The
  broker does not name a partition for a changed last stable offset alone, so the kept one may be older than the
  broker's: harmless, since it is only left out while the broker has no records at our position — any record below
  the real LSO would make the broker name it.)

Standing members (:meth:`FetchSession.build_changes`, the daemon's rounds, :mod:`mirror_core.daemon.standing_round`):
the caller keeps the set of partitions the session should hold and says which of them changed or left since the last
request; an incremental request is then built from the changes alone and its answer read from the partitions the broker
named alone (:attr:`SessionRequest.sparse`: ``unchanged`` stays empty, a partition not named is simply not news) — a
round over 2,000 idle partitions costs nothing per partition here. A full request still names every member and its
answer is checked against every member.

This module is pure (no I/O): :meth:`FetchSession.build` turns the partitions a round wants into the request's
session fields, partitions and forgotten partitions; :meth:`FetchSession.answer` reads the response (any object
with kafka-python's FetchResponse field names: ``error_code``, ``session_id``, ``responses[].topic`` /
``.topic_id`` / ``.partitions[]``) into per-partition data or "unchanged"; :meth:`FetchSession.failed` takes a
transport failure. The caller (:mod:`mirror_core.kafka.broker_fetch`, :mod:`mirror_core.kafka.fetcher`) does the I/O.

Session loss: FETCH_SESSION_ID_NOT_FOUND (70; also what eviction from the broker's cache looks like),
INVALID_FETCH_SESSION_EPOCH (71) and FETCH_SESSION_TOPIC_ID_ERROR (106) carry no partition data. The session is
dropped and :attr:`SessionAnswer.resend_full` tells the caller to send the same partitions again at once as a full
request (opening a new session), so callers never see a session error: no position moved, nothing is skipped or
repeated. A transport failure, an answer that does not fit the session (a partition we did not ask for, a
partition left out we know nothing about), or a request built while the previous one is still unanswered (a round
dropped unread) also drop the session; the next request is full and closes the old session (its id with epoch 0).

Closing (:meth:`FetchSession.close`): a session holds one slot of the broker's session cache (and the state of every
partition in it) until it is closed or evicted, and a live session is evicted only for a busier one — so a client
that goes away closes its sessions, as the Java consumer does on close. The rule (Kafka's FetchManager.newContext):
a full request (epoch 0 or FINAL_EPOCH) that names a session id removes that session, whatever its epoch; at
FINAL_EPOCH (-1) no new session is made. So the closing request is the session's id, epoch -1, no partitions, no
forgotten partitions; the broker answers it with session id 0 and nothing else, and a later incremental request
with the old id gets FETCH_SESSION_ID_NOT_FOUND.

Invariants (where the state lives: :class:`FetchSession`):

- ``_sent`` is exactly the broker's view of the session: every partition in it was named by a request the broker
  answered without a session error, with the parameters we last sent; an incremental request names a partition
  whenever our parameters differ from ``_sent`` (so the broker always fetches at the fetcher's position), and
  forgets every partition of ``_sent`` the round does not want.
- At most one request per session is unanswered; its epoch is the session's epoch; the epoch advances only when
  that request is answered without a session error.
- ``_ends`` holds, for each partition in the session, the high watermark, last stable offset and log start offset
  of the last response that named it; a partition is reported "unchanged" only from there.
- ``enabled=False`` (or a broker that refuses sessions) gives exactly the sessionless request of Kafka < 1.1
  clients: session id 0, epoch -1, every partition named.
- After :meth:`FetchSession.close` nothing of the old session is kept (id, epoch, ``_sent``, ``_ends``, the
  unanswered request): whether or not the broker got the closing request, a later :meth:`build` is full and opens a
  new session, and an answer to a request of the old session is never taken.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from mirror_core.codec.fetch_messages import FetchPartitionSpec, FetchTopicSpec, ForgottenTopic

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0       # a full request that opens a session (closing the one named by its id, if any)
FINAL_EPOCH = -1        # a full request without a session (closing the one named by its id, if any)

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FETCH_SESSION_TOPIC_ID_ERROR = 106
SESSION_ERRORS = frozenset((FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR))


def next_epoch(epoch: int) -> int:
    """Kafka's JFetchMetadata.nextEpoch: 1, 2, …, 2**31-1, then 1 again (0 and -1 are reserved)."""
    return 1 if epoch >= 2**31 - 1 or epoch < 0 else epoch + 1


class PartitionKey(NamedTuple):
    topic: str
    topic_id: uuid.UUID | None
    partition: int


class PartitionEnds(NamedTuple):
    """What the broker last said about a partition's log: the values an omitted partition keeps."""

    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class SessionRequest(NamedTuple):
    """The session part of one FetchRequest, and what its answer is matched against."""

    session_id: int
    epoch: int
    topics: list[FetchTopicSpec]        # the partitions named in the request
    forgotten: list[ForgottenTopic]     # partitions leaving the session
    wanted: Mapping[PartitionKey, FetchPartitionSpec] | tuple[PartitionKey, ...]  # every partition the round
    #                                   expects an answer for (named or not): build's tuple, build_changes' mapping
    token: int                          # which request of the session this is
    by_id: bool                         # topics named by id (Fetch v13+), for the session's whole life
    sparse: bool = False                # build_changes: the answer names only what the broker named (news)

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    @property
    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics)


@dataclass
class SessionAnswer:
    """A response read against its request: each wanted partition is in exactly one of ``parts`` (the response's
    data for it), ``unchanged`` (left out of an incremental response: nothing new, the last known ends) or
    ``missing`` (the broker said nothing about it where it had to: retried by the caller); or, when the session
    was lost, nothing at all and ``resend_full``."""

    parts: dict[PartitionKey, object] = field(default_factory=dict)
    unchanged: dict[PartitionKey, PartitionEnds] = field(default_factory=dict)
    missing: list[PartitionKey] = field(default_factory=list)
    resend_full: bool = False
    error_code: int = 0                 # the response's top-level error (not a session error: those resend)


@dataclass
class SessionStats:
    full_requests: int = 0
    incremental_requests: int = 0
    sessions_lost: int = 0              # session errors, transport failures, answers that did not fit
    sessions_closed: int = 0            # closing requests built (close)


class FetchSession:
    """One client's fetch session with one broker (see the module docstring for the protocol and invariants)."""

    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._sent: dict[PartitionKey, FetchPartitionSpec] = {}
        self._ends: dict[PartitionKey, PartitionEnds] = {}
        self._by_id: bool | None = None          # whether the session names topics by id (v13+): never mixed
        self._outstanding: SessionRequest | None = None
        self._tokens = 0
        # topic name ↔ id of every topic named in this session's requests (per topic, not per partition): how a
        # sparse answer's partitions are keyed without walking the members (build_changes)
        self._topic_ids: dict[str, uuid.UUID | None] = {}
        self._topic_names: dict[uuid.UUID, str] = {}
        self.stats = SessionStats()

    @property
    def active(self) -> bool:
        """Whether the next request can be incremental."""
        return self.session_id != INVALID_SESSION_ID and self.epoch not in (INITIAL_EPOCH, FINAL_EPOCH)

    def build(self, topics: Sequence[FetchTopicSpec]) -> SessionRequest:
        """The request for ``topics`` (every partition the round wants, at its current parameters)."""
        wanted: dict[PartitionKey, FetchPartitionSpec] = {}
        for spec in topics:
            for part in spec.partitions:
                wanted[PartitionKey(spec.topic, spec.topic_id, part.partition)] = part
        by_id = all(spec.topic_id is not None for spec in topics)
        if self._outstanding is not None:        # the last request's answer was never read: state unknown
            self._lose()
        if self._by_id is not None and by_id != self._by_id:
            self._lose()                         # a session keeps to names or to ids (else error 106)
        self._tokens += 1
        if not self.enabled:
            request = SessionRequest(INVALID_SESSION_ID, FINAL_EPOCH, list(topics), [], tuple(wanted), self._tokens,
                                     by_id)
        elif not self.active:
            request = SessionRequest(self.session_id, INITIAL_EPOCH, list(topics), [], tuple(wanted), self._tokens,
                                     by_id)
        else:
            named = [key for key, part in wanted.items() if self._sent.get(key) != part]
            gone = [key for key in self._sent if key not in wanted]
            request = SessionRequest(self.session_id, self.epoch, _topics(named, wanted), _forgotten(gone),
                                     tuple(wanted), self._tokens, by_id)
        if request.full:
            self.stats.full_requests += 1
        else:
            self.stats.incremental_requests += 1
        self._by_id = by_id
        self._outstanding = request if self.enabled else None
        return request

    def build_changes(self, members: Mapping[PartitionKey, FetchPartitionSpec], changed: Iterable[PartitionKey],
                      left: Iterable[PartitionKey], *, by_id: bool, rotation: int = 0) -> SessionRequest:
        """The request for the standing set ``members`` (every partition the session should hold, at its current
        parameters; the caller's own mapping, not copied: it must not change until this request is answered or
        failed). While the session is active the request is incremental and costs what changed: it names the
        ``changed`` members whose parameters differ from what the broker holds and forgets the ``left`` partitions
        it holds — KIP-227's rule, the same request :meth:`build` would make, without walking every member. The
        caller guarantees that a member not in ``changed`` has the parameters it had at the last request and that
        every partition gone from ``members`` since then is in ``left`` (:class:`mirror_core.daemon.standing_round.
        StandingRound`, whose :meth:`~mirror_core.daemon.standing_round.StandingRound.audit` checks it against
        :meth:`holds`). Otherwise (the first request, after a lost session) the request is full: every member,
        ``rotation`` shifting their order (fairness under the request's max_bytes). ``by_id``: every member's topic
        has an id. The answer (:meth:`answer`) is sparse: only the partitions the broker named."""
        if self._outstanding is not None:        # the last request's answer was never read: state unknown
            self._lose()
        if self._by_id is not None and by_id != self._by_id:
            self._lose()                         # a session keeps to names or to ids (else error 106)
        self._tokens += 1
        if not self.enabled or not self.active:
            keys = list(members)
            if rotation and len(keys) > 1:
                shift = rotation % len(keys)
                keys = keys[shift:] + keys[:shift]
            session_id, epoch = (INVALID_SESSION_ID, FINAL_EPOCH) if not self.enabled else \
                (self.session_id, INITIAL_EPOCH)
            request = SessionRequest(session_id, epoch, _topics(keys, members), [], members, self._tokens, by_id,
                                     sparse=True)
            self.stats.full_requests += 1
        else:
            sent = self._sent
            named = [key for key in set(changed) if key in members and sent.get(key) != members[key]]
            gone = [key for key in set(left) if key in sent and key not in members]
            request = SessionRequest(self.session_id, self.epoch, _topics(named, members), _forgotten(gone),
                                     members, self._tokens, by_id, sparse=True)
            self.stats.incremental_requests += 1
        for spec in request.topics:
            self._topic_ids[spec.topic] = spec.topic_id
            if spec.topic_id is not None:
                self._topic_names[spec.topic_id] = spec.topic
        self._by_id = by_id
        self._outstanding = request if self.enabled else None
        return request

    def holds(self) -> Mapping[PartitionKey, FetchPartitionSpec]:
        """The broker's view of the session as far as we know it (read only): each partition it holds, with the
        parameters we last named it with. Empty while no session is active."""
        return MappingProxyType(self._sent)

    def ends(self, key: PartitionKey) -> PartitionEnds | None:
        """What the broker last said about ``key``'s log (None: nothing kept, e.g. after an error)."""
        return self._ends.get(key)

    def failed(self, request: SessionRequest) -> None:
        """The request got no answer (transport failure, timeout): the broker may or may not have taken it."""
        if self._outstanding is not None and request.token == self._outstanding.token:
            self._outstanding = None
            self._lose()

    def answer(self, request: SessionRequest, response) -> SessionAnswer:
        """Read ``response`` (the answer to ``request``) into per-partition outcomes, updating the session."""
        current = self._outstanding is not None and request.token == self._outstanding.token
        if current:
            self._outstanding = None
        error = getattr(response, "error_code", 0) or 0
        if error:
            if current:
                self._lose(fresh=error == FETCH_SESSION_ID_NOT_FOUND)
            if error in SESSION_ERRORS:
                return SessionAnswer(resend_full=True)
            return SessionAnswer(error_code=error)
        got = _response_parts(response)
        if request.sparse:
            result, fits = self._read_sparse(request, got)
        else:
            result, fits = self._read(request, got)
        if not self.enabled:
            return result
        if not current or not fits:
            # An answer that is not to our latest request, or names what we did not ask for: our view of the
            # session and the broker's differ, so a partition's data may come from an offset the broker keeps, not
            # from its fetcher's position — taking it could skip. Nothing of it is handed out (the Java client
            # drops such a response too): those partitions are asked again, by a full request. A partition left out
            # stays where it is (no data taken: nothing to skip).
            if current:
                self._lose()
            if not request.full or not current:
                result.missing.extend(result.parts)
                result.parts = {}
            return result
        self._commit(request, response, result)
        return result

    def _read(self, request: SessionRequest, got: dict[tuple, object]) -> tuple[SessionAnswer, bool]:
        """Every wanted partition of a :meth:`build` request: its data, unchanged or missing; and whether the
        answer fits the request."""
        result = SessionAnswer()
        fits = True
        for key in request.wanted:
            data = got.pop((key.topic_id, key.partition), None) if key.topic_id is not None else None
            if data is None:
                data = got.pop((key.topic, key.partition), None)
            if data is not None:
                result.parts[key] = data
            elif not request.full and key in self._ends:
                result.unchanged[key] = self._ends[key]
            else:
                result.missing.append(key)
                fits = fits and request.full     # a full response may leave partitions out (KIP-219 throttling)
        if got:
            fits = False                         # partitions we did not ask for
        return result, fits

    def _read_sparse(self, request: SessionRequest, got: dict[tuple, object]) -> tuple[SessionAnswer, bool]:
        """A :meth:`build_changes` request's answer, from what the broker named: each named partition's data; a
        partition the request named that the answer left out while nothing is known of it (new to the session)
        is missing; a full answer is checked against every member (the broker may leave some out: missing, as in
        :meth:`_read`). ``unchanged`` stays empty: a member left out of an incremental answer is no news."""
        result = SessionAnswer()
        fits = True
        wanted, ids, names = request.wanted, self._topic_ids, self._topic_names
        for (topic, partition), data in got.items():
            key = PartitionKey(topic, ids.get(topic), partition) if isinstance(topic, str) else \
                PartitionKey(names.get(topic), topic, partition)
            if key in wanted:
                result.parts[key] = data
            else:
                fits = False                     # a partition we did not ask for
        parts, ends = result.parts, self._ends
        if request.full:
            result.missing = [key for key in wanted if key not in parts]
        else:
            for spec in request.topics:
                for part in spec.partitions:
                    key = PartitionKey(spec.topic, spec.topic_id, part.partition)
                    if key not in parts and key not in ends:
                        result.missing.append(key)
                        fits = False
        return result, fits

    def close(self) -> SessionRequest | None:
        """The request that closes this session on the broker (its id, FINAL_EPOCH, no partitions; see the module
        docstring), or None when the broker holds no session of ours (none made, sessions off, or already closed
        by the broker). Forgets the session here at once, whether or not the request is ever sent or answered: a
        closing request that never arrives leaves the session to the broker's eviction, nothing worse."""
        if not self.enabled or self.session_id == INVALID_SESSION_ID:
            request = None
        else:
            self._tokens += 1
            request = SessionRequest(self.session_id, FINAL_EPOCH, [], [], (), self._tokens,
                                     True if self._by_id is None else self._by_id)
            self.stats.sessions_closed += 1
        self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH
        self._sent, self._ends = {}, {}
        self._by_id = None
        self._outstanding = None
        self._topic_ids, self._topic_names = {}, {}
        return request

    # -- state -----------------------------------------------------------------------------------------------

    def _commit(self, request: SessionRequest, response, result: SessionAnswer) -> None:
        """The broker took ``request``: its view of the session is now ours, plus what the response said."""
        session_id = getattr(response, "session_id", INVALID_SESSION_ID) or INVALID_SESSION_ID
        if request.full:
            self._sent = {}
            self._ends = {}
        for spec in request.topics:
            for part in spec.partitions:
                key = PartitionKey(spec.topic, spec.topic_id, part.partition)
                if not request.full or key in result.parts:  # a new session holds what its first answer named
                    self._sent[key] = part
        for topic in request.forgotten:
            for index in topic.partitions:
                key = PartitionKey(topic.topic, topic.topic_id, index)
                self._sent.pop(key, None)
                self._ends.pop(key, None)
        for key, data in result.parts.items():
            if data.error_code:
                self._ends.pop(key, None)        # the broker names it again once the error is gone
            else:
                self._ends[key] = PartitionEnds(data.high_watermark, data.last_stable_offset,
                                                data.log_start_offset)
        if session_id == INVALID_SESSION_ID:     # none made (full), or closed by the broker (incremental)
            self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH
            self._sent, self._ends = {}, {}
        elif request.full:
            self.session_id, self.epoch = session_id, next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)

    def _lose(self, *, fresh: bool = False) -> None:
        """Drop the session: the next request is full; it closes the old session unless the broker has none."""
        if self.session_id != INVALID_SESSION_ID or self._sent:
            self.stats.sessions_lost += 1
        if fresh:
            self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._sent, self._ends = {}, {}
        self._outstanding = None


def _topics(keys: Iterable[PartitionKey], wanted: dict[PartitionKey, FetchPartitionSpec]) -> list[FetchTopicSpec]:
    grouped: dict[tuple[str, uuid.UUID | None], list[FetchPartitionSpec]] = {}
    for key in keys:
        grouped.setdefault((key.topic, key.topic_id), []).append(wanted[key])
    return [FetchTopicSpec(topic, topic_id, parts) for (topic, topic_id), parts in grouped.items()]


def _forgotten(keys: Iterable[PartitionKey]) -> list[ForgottenTopic]:
    grouped: dict[tuple[str, uuid.UUID | None], list[int]] = {}
    for key in keys:
        grouped.setdefault((key.topic, key.topic_id), []).append(key.partition)
    return [ForgottenTopic(topic, topic_id, parts) for (topic, topic_id), parts in grouped.items()]


def _response_parts(response) -> dict[tuple, object]:
    """The response's partitions by (topic id, partition) from v13, by (name, partition) before."""
    parts: dict[tuple, object] = {}
    for topic in getattr(response, "responses", None) or ():
        name, topic_id = getattr(topic, "topic", None), getattr(topic, "topic_id", None)
        if topic_id is not None and topic_id == uuid.UUID(int=0):
            topic_id = None
        for data in topic.partitions:
            parts[(topic_id, data.partition_index) if topic_id is not None else (name, data.partition_index)] = data
    return parts
