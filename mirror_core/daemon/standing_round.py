"""The daemon's fetch rounds over a standing set of partitions: a round costs what changed, not what is held.

:func:`mirror_core.kafka.broker_fetch.send_round` is given every partition a round wants and hands back an outcome for
each: right for a copy's few partitions, but a daemon holding 2,000 mostly idle lanes paid for every one of them
every round (a spec built and diffed against the session, a key and an "unchanged" result per partition the
broker's answer left out) though the wire of an idle round is 45 bytes. :class:`StandingRound` keeps the round's
members from one round to the next instead:

- **membership** (:meth:`StandingRound.sync`): the lanes that fetch this round, each with its fetcher. A lane whose
  fetcher is new (opened, reopened after a reset) joins; one no longer given leaves (its partition is forgotten by
  its broker's session at the next request). The comparison is one identity check per lane — the only walk over
  every member left, and in C-speed dictionary operations.
- **placement**: a joining member is placed at its leader (:meth:`~mirror_core.kafka.fetcher.RawBatchFetcher.locate`),
  and placed again after its leader was forgotten (a retriable error); placing makes its
  :class:`~mirror_core.kafka.fetch_session.PartitionKey` and its request entry, once.
- **requests** (:meth:`StandingRound.send`): one per broker with members, in that broker's fetch session
  (:meth:`~mirror_core.kafka.fetch_session.FetchSession.build_changes`). An incremental request names only the members
  whose entry changed since the last request — a position moved by an answer, a new leader epoch, a join — and
  forgets the ones that left (KIP-227's own rule); a full request (the first, after a session error or eviction —
  FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR — or a transport failure)
  names every member of its broker.
- **answers** (:meth:`StandingPending.collect <mirror_core.daemon.standing_pending.StandingPending.collect>`,
  in :mod:`~mirror_core.daemon.standing_pending`): only the news, as (lane, fetcher, start, outcome): every partition
  an answer named (data, an error, a moved high watermark or log start offset), every member whose own state
  changed since the last request (joined or placed again: reported even when the broker left it out, with the
  session's kept ends; a moved position is news already), and every member that failed (no leader, its broker's
  request failed, the answer left out a partition it had to name). A member left out of an incremental answer has
  nothing new and costs nothing.

Invariants (the state lives here): every member is either placed — in exactly one broker's ``lanes`` and
``members``, with the entry its fetcher's position and leader epoch give — or waiting in ``_unplaced``; a
member's position moves only when its part of an answer is accepted (:meth:`~mirror_core.kafka.fetcher.RawBatchFetcher.
handle`), and every member handed out as news is re-entered before the next request, so the broker always fetches
at the fetcher's position; a broker's ``members`` is what its session must hold, ``changed`` and ``left`` what
differs from the last request. :meth:`StandingRound.audit` (run by the daemon every ``AUDIT_MAX_S``) checks this
against each session's own view (:meth:`~mirror_core.kafka.fetch_session.FetchSession.holds`) and repairs a discrepancy
—
a lane that would otherwise never be named, never fetched — naming it, so a bug here is a log line, not a silent
stall.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.fetch_messages import FetchPartitionSpec
from mirror_core.daemon.standing_pending import SentRequest, StandingPending
from mirror_core.kafka.broker_fetch import _UNREACHABLE, RoundSessions, RoundStats, round_sessions
from mirror_core.kafka.fetch_session import FetchSession, PartitionKey
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient


class _Member:
    """One lane of the standing round: its fetcher and, once placed, its leader, epoch and partition key."""

    __slots__ = ("lane", "fetcher", "leader", "epoch", "key")

    def __init__(self, lane: str, fetcher: RawBatchFetcher):
        self.lane, self.fetcher = lane, fetcher
        self.leader: int | None = None
        self.epoch = -1
        self.key: PartitionKey | None = None


class _Broker:
    """One source broker's part of the standing round (invariants: see the module docstring)."""

    __slots__ = ("leader", "session", "members", "lanes", "changed", "left", "joined", "without_id")

    def __init__(self, leader: int, session: FetchSession):
        self.leader, self.session = leader, session
        self.members: dict[PartitionKey, FetchPartitionSpec] = {}   # what its session must hold, at what entry
        self.lanes: dict[PartitionKey, _Member] = {}
        self.changed: set[PartitionKey] = set()    # entries new or changed since the last request
        self.left: set[PartitionKey] = set()       # partitions gone since the last request
        self.joined: set[PartitionKey] = set()     # members placed since the last request (reported in its answer)
        self.without_id = 0                        # members whose topic has no id (the session names topics)


class StandingRound:
    """A standing set of lanes fetched round after round, one request per source broker (module docstring)."""

    def __init__(self, client: WireClient, *, max_bytes: int, max_wait_ms: int,
                 isolation: IsolationLevel = IsolationLevel.READ_COMMITTED, sessions: RoundSessions | None = None):
        self.client, self.max_bytes, self.max_wait_ms, self.isolation = client, max_bytes, max_wait_ms, isolation
        self.sessions = round_sessions(client) if sessions is None else sessions
        self._members: dict[str, _Member] = {}
        self._unplaced: dict[str, _Member] = {}
        self._brokers: dict[int, _Broker] = {}
        self._pending: StandingPending | None = None
        self._synced: Sequence | None = None  # the sequence last given to sync (see there)

    def __len__(self) -> int:
        return len(self._members)

    def sync(self, lanes: Sequence[tuple[str, RawBatchFetcher]]) -> None:
        """This round's lanes (each once): a lane with a new fetcher joins, a lane not given any more leaves.

        The very sequence object synced last time (an idle daemon's rounds reuse their list while no lane changed):
        nothing to compare — membership changes only here. A caller must not change a sequence it passed."""
        self._no_round_outstanding()
        if lanes is self._synced:
            return
        self._synced = lanes
        members = self._members
        for lane, fetcher in lanes:
            member = members.get(lane)
            if member is not None and member.fetcher is fetcher:
                continue
            if member is not None:
                self._unplace(member)
            members[lane] = self._unplaced[lane] = _Member(lane, fetcher)
        if len(members) > len(lanes):   # some lanes left: only now is a set of this round's lanes worth making
            keep = {lane for lane, _fetcher in lanes}
            for lane in [lane for lane in members if lane not in keep]:
                self._unplace(members.pop(lane))
                self._unplaced.pop(lane, None)

    def send(self, *, rotation: int = 0, stats: RoundStats | None = None) -> StandingPending:
        """Send this round's requests (one per broker with members) without waiting; the answers are taken by
        :meth:`StandingPending.collect`."""
        self._no_round_outstanding()
        sent_at = time.monotonic()
        failed = self._place_waiting()
        pending = StandingPending(self, failed, stats, sent_at)
        for broker in self._brokers.values():
            if broker.members:
                sent = SentRequest(broker, list(broker.joined))
                broker.joined.clear()
                if pending._send(sent, rotation):
                    pending._in_flight.append(sent)
        if stats is not None:
            stats.rounds += 1
        self._pending = pending
        return pending

    def audit(self) -> list[str]:
        """Check the books against the sessions (see the module docstring) and repair what differs: a member
        neither placed nor waiting is placed again; an entry that is not its fetcher's is renewed; a placed member
        its broker's session does not hold at its entry and that the next request would not name is named; a
        partition a session holds that is no member's any more is forgotten. Returns one sentence per repair.
        Call between rounds (no round outstanding).

        One walk of each broker's placed members (its session's view read once per broker, not per member);
        the members placed nowhere are looked for only when that walk counted fewer than the members not
        waiting (members not in ``_unplaced``) — each member has one key and one leader, so it is counted at most
        once."""
        self._no_round_outstanding()
        found = []
        members, unplaced = self._members, self._unplaced
        placed = 0
        for broker in self._brokers.values():
            held, active = broker.session.holds(), broker.session.active
            entries, changed, leader = broker.members, broker.changed, broker.leader
            for key, member in broker.lanes.items():
                lane = member.lane
                if member.key != key or member.leader != leader or members.get(lane) is not member \
                        or lane in unplaced:
                    continue  # not a member placed here: a member missing from its books is found below
                placed += 1
                entry = member.fetcher.spec(member.epoch)
                if entries.get(key) != entry:   # a missing entry is a disagreement too, never a KeyError
                    found.append(f"{lane}: its request entry was not its fetcher's (offset {member.fetcher.position})")
                    entries[key] = entry
                    changed.add(key)
                if active and held.get(key) != entry and key not in changed:
                    found.append(f"{lane}: not held by broker {leader}'s fetch session at offset "
                                 f"{member.fetcher.position}; named again")
                    changed.add(key)
        # the members not waiting: _unplaced may hold a lane that is no member (a bug's stale entry, e.g. a left
        # lane's member put there by _place), which must not offset a member placed nowhere
        if placed != len(members) - len(members.keys() & unplaced.keys()):
            for lane, member in members.items():
                if lane in unplaced:
                    continue
                broker = self._brokers.get(member.leader)
                if broker is None or member.key is None or broker.lanes.get(member.key) is not member:
                    found.append(f"{lane}: not placed at any broker; placed again")
                    unplaced[lane] = member
        for broker in self._brokers.values():
            for key in broker.session.holds().keys() - broker.members.keys() - broker.left:
                found.append(f"{key.topic}-{key.partition}: held by broker {broker.leader}'s fetch session "
                             "for no lane; forgotten")
                broker.left.add(key)
        return found

    # -- books -----------------------------------------------------------------------------------------------

    def _no_round_outstanding(self) -> None:
        if self._pending is not None and not self._pending.collected:
            raise RuntimeError("a standing round's previous round is neither collected nor discarded")

    def _place_waiting(self) -> list[tuple[_Member, BaseException]]:
        """Place every waiting member at its leader; the ones whose leader cannot be found fail this round (and
        wait for the next). With the source unreachable, one look-up per round, not one per member."""
        failed: list[tuple[_Member, BaseException]] = []
        unreachable: BaseException | None = None
        for lane, member in list(self._unplaced.items()):
            fetcher = member.fetcher
            if unreachable is not None and not fetcher.leader_known:
                failed.append((member, unreachable))
                continue
            try:
                leader, epoch = fetcher.locate()
            except Exception as exc:  # noqa: BLE001 - one partition's trouble stays with it
                if isinstance(exc, _UNREACHABLE):
                    unreachable = exc
                failed.append((member, exc))
                continue
            del self._unplaced[lane]
            self._place(member, leader, epoch)
        return failed

    def _place(self, member: _Member, leader: int, epoch: int) -> None:
        fetcher = member.fetcher
        broker = self._brokers.get(leader)
        if broker is None:
            broker = self._brokers[leader] = _Broker(leader, self.sessions.session(leader))
        key = PartitionKey(fetcher.topic, fetcher.topic_id, fetcher.partition)
        other = broker.lanes.get(key)
        if other is not None and other is not member:   # the same partition under another lane name: one entry
            self._unplace(other)
            self._unplaced[other.lane] = other
        member.leader, member.epoch, member.key = leader, epoch, key
        broker.members[key] = fetcher.spec(epoch)
        broker.lanes[key] = member
        broker.changed.add(key)
        broker.joined.add(key)
        broker.left.discard(key)   # named and forgotten in one request would leave it out of the session
        broker.without_id += key.topic_id is None

    def _unplace(self, member: _Member) -> None:
        """Take ``member`` off its broker (its partition is forgotten by the session at the next request)."""
        broker = self._brokers.get(member.leader) if member.key is not None else None
        if broker is not None and broker.lanes.get(member.key) is member:
            del broker.lanes[member.key]
            del broker.members[member.key]
            broker.changed.discard(member.key)
            broker.joined.discard(member.key)
            broker.left.add(member.key)
            broker.without_id -= member.key.topic_id is None
        member.leader, member.key = None, None

    def _renew(self, member: _Member) -> None:
        """After news of ``member``: its leader forgotten → placed again next round; else its entry renewed
        (named in the next request when it differs from what the broker holds)."""
        if self._members.get(member.lane) is not member or member.lane in self._unplaced:
            return
        if not member.fetcher.leader_known:
            self._unplace(member)
            self._unplaced[member.lane] = member
            return
        broker = self._brokers[member.leader]
        entry = member.fetcher.spec(member.epoch)
        if broker.members.get(member.key) != entry:
            broker.members[member.key] = entry
            broker.changed.add(member.key)
