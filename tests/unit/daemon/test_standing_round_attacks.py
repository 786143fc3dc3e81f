"""Review attacks on the standing fetch round (mirror_core.daemon.standing_round, issue #18 follow-up): leader moves and
moves back, epoch fencing, transient partition errors that clear without the lane's entry changing, a broker whose
session is never told a partition left, the audit on corrupted books. Played against the model broker of
test_standing_round extended with what a real Kafka broker does that the model leaves out (FetchSession.scala,
ReplicaManager): only the leader serves a partition (NOT_LEADER_OR_FOLLOWER elsewhere), the request's
current_leader_epoch is checked (FENCED_LEADER_EPOCH below the leader's, UNKNOWN_LEADER_EPOCH above), a partition
with an error is always named and its cached high watermark set to -1 (so it is named again once the error
clears). Pure, no I/O.

The liveness check: after any sequence of faults, once the cluster is quiet and metadata is current, a few rounds
bring every held lane to its log end; the safety check is the scripted fetcher's own assertion that the broker
fetched where the fetcher stands (never from an offset the broker kept for an old entry).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirror_core.daemon.standing_round import StandingRound
from mirror_core.kafka.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, PartitionKey, next_epoch
from tests.unit.daemon.test_standing_round import _Broker, _Client, _Fetcher, _keys, _sessions
from tests.unit.kafka.test_fetch_session import _BrokerSession, _Log

pytestmark = pytest.mark.timeout(60)

NOT_LEADER, FENCED, UNKNOWN_EPOCH, FETCH_SESSION_ID_NOT_FOUND, INVALID_EPOCH = 6, 74, 76, 70, 71


class _Cluster:
    """Who leads each partition at which epoch (the truth), and what metadata says (may lag)."""

    def __init__(self, keys, nodes):
        self.leader = {key: nodes[i % len(nodes)] for i, key in enumerate(keys)}
        self.epoch = {key: 0 for key in keys}
        self.meta = {key: (self.leader[key], 0) for key in keys}

    def move(self, key, node, *, meta_lags=False):
        self.leader[key] = node
        self.epoch[key] += 1
        if not meta_lags:
            self.refresh(key)

    def refresh(self, key=None):
        for k in ([key] if key is not None else list(self.leader)):
            self.meta[k] = (self.leader[k], self.epoch[k])


class _KafkaBroker(_Broker):
    """The model broker plus leadership, leader-epoch checks and Kafka's error rule for cached partitions."""

    def __init__(self, node, logs, cluster: _Cluster, *, slots: int = 1):
        super().__init__(logs, slots=slots)
        self.node, self.cluster = node, cluster
        self.errors: dict[PartitionKey, int] = {}   # transient partition errors this broker answers

    def _error(self, key, spec) -> int:
        if key in self.errors:
            return self.errors[key]
        if self.cluster.leader[key] != self.node:
            return NOT_LEADER
        if spec.current_leader_epoch >= 0:
            if spec.current_leader_epoch < self.cluster.epoch[key]:
                return FENCED
            if spec.current_leader_epoch > self.cluster.epoch[key]:
                return UNKNOWN_EPOCH
        return 0

    def _part(self, key, spec):
        error = self._error(key, spec)
        if error:
            return SimpleNamespace(partition_index=key.partition, error_code=error, high_watermark=-1,
                                   last_stable_offset=-1, log_start_offset=-1, records=None)
        return self._data(key, spec)

    def handle(self, request):
        named = {PartitionKey(t.topic, t.topic_id, p.partition): p for t in request.topics for p in t.partitions}
        if request.epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self.sessions.pop(request.session_id, None)
            session_id = 0
            parts = [(key, self._part(key, spec)) for key, spec in named.items()]
            if request.epoch == INITIAL_EPOCH and len(self.sessions) < self.slots:
                session_id, self.next_id = self.next_id, self.next_id + 1
                self.sessions[session_id] = _BrokerSession(1, dict(named), {
                    key: (-1, -1) if data.error_code else (data.high_watermark, data.log_start_offset)
                    for key, data in parts})
            return self._response(session_id, parts)
        session = self.sessions.get(request.session_id)
        if session is None:
            return self._response(0, [], FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != request.epoch:
            return self._response(0, [], INVALID_EPOCH)
        for key, spec in named.items():
            session.params[key] = spec
            session.cached.setdefault(key, (-1, -1))
        for gone in request.forgotten:
            for index in gone.partitions:
                key = PartitionKey(gone.topic, gone.topic_id, index)
                session.params.pop(key, None)
                session.cached.pop(key, None)
        if not session.params:
            del self.sessions[request.session_id]
            return self._response(0, [])
        session.epoch = next_epoch(session.epoch)
        out = []
        for key, spec in session.params.items():
            data = self._part(key, spec)
            if data.error_code:      # always named; cached high watermark -1: named again once the error clears
                session.cached[key] = (-1, -1)
                out.append((key, data))
                continue
            ends = (data.high_watermark, data.log_start_offset)
            if data.records is not None or ends != session.cached[key]:
                session.cached[key] = ends
                out.append((key, data))
        return self._response(request.session_id, out)


class _EpochFetcher(_Fetcher):
    """A scripted fetcher whose leader and epoch come from (possibly stale) metadata."""

    def __init__(self, key, cluster: _Cluster, position: int = 0):
        super().__init__(key, cluster.meta[key][0], position)
        self.cluster = cluster

    def locate(self):
        if self._leader is None:
            self._leader = self.cluster.meta[self.key]
        return self._leader


def _lane(key) -> str:
    return f"{key.topic}-{key.partition}"


def _world(n: int, nodes=(1, 2, 3), hw: int = 0):
    keys = _keys(n)
    logs = {key: _Log(high_watermark=hw) for key in keys}
    cluster = _Cluster(keys, nodes)
    brokers = {node: _KafkaBroker(node, logs, cluster) for node in nodes}
    fetchers = {_lane(key): _EpochFetcher(key, cluster) for key in keys}
    rounds = StandingRound(_Client(brokers), max_bytes=1 << 24, max_wait_ms=0, sessions=_sessions())
    return keys, logs, cluster, brokers, fetchers, rounds


def _round(rounds, fetchers):
    rounds.sync(list(fetchers.items()))
    return {lane: (start, outcome) for lane, _f, start, outcome in rounds.send().collect()}


def _settle(rounds, fetchers, logs, *, limit: int = 12):
    """Quiet cluster, current metadata: rounds until every lane stands at its log end (or ``limit`` rounds)."""
    for _ in range(limit):
        _round(rounds, fetchers)
        if all(f.position == logs[f.key].high_watermark for f in fetchers.values()):
            return
    behind = {lane: (f.position, logs[f.key].high_watermark) for lane, f in fetchers.items()
              if f.position != logs[f.key].high_watermark}
    raise AssertionError(f"lanes stalled (position, log end) after {limit} quiet rounds: {behind}")


def test_a_leader_that_moves_away_and_back_fetches_from_the_lanes_new_position():
    """B leads the lane alone (its session is never told the lane left: no request goes to a broker with no
    members), the lane moves to C and copies there, then leadership comes back to B: B must be told the new offset
    (KIP-227: the broker keeps the last offset it was told)."""
    keys, logs, cluster, brokers, fetchers, rounds = _world(1, nodes=(1,), hw=0)
    brokers[2] = _KafkaBroker(2, logs, cluster)
    key = keys[0]
    fetcher = fetchers[_lane(key)]
    _round(rounds, fetchers)
    logs[key].high_watermark = 2
    _settle(rounds, fetchers, logs)
    cluster.move(key, 2)
    news = _round(rounds, fetchers)   # broker 1 answers NOT_LEADER
    assert news[_lane(key)][1].error is not None
    logs[key].high_watermark = 5
    _settle(rounds, fetchers, logs)   # copied 2..5 on broker 2
    assert fetcher.position == 5
    cluster.move(key, 1)
    logs[key].high_watermark = 7
    _settle(rounds, fetchers, logs)   # the fetcher asserts broker 1 fetched at 5, not at its kept 2
    assert fetcher.position == 7


@pytest.mark.parametrize("code", [UNKNOWN_EPOCH, NOT_LEADER, 56])   # 56: KAFKA_STORAGE_ERROR
def test_a_transient_partition_error_that_clears_with_the_lanes_entry_unchanged_does_not_stall_it(code):
    """The broker answers a retriable error for one partition; the lane is placed again at the same broker with
    the same entry (same offset, same epoch: nothing to name); when the error clears the lane must still get its
    data — an incremental request that does not name it relies on the broker naming it again."""
    keys, logs, cluster, brokers, fetchers, rounds = _world(6, nodes=(1, 2), hw=1)
    _settle(rounds, fetchers, logs)
    key = keys[2]
    node = cluster.leader[key]
    brokers[node].errors[key] = code
    for _ in range(3):
        news = _round(rounds, fetchers)
        assert _lane(key) in news and news[_lane(key)][1].error is not None, "the error is told every round"
    del brokers[node].errors[key]
    logs[key].high_watermark = 4
    _settle(rounds, fetchers, logs)


def test_epoch_fencing_after_a_leader_election_on_the_same_broker_is_told_and_recovers():
    """A new leader epoch on the same broker, metadata lagging (FENCED_LEADER_EPOCH each round, told each round),
    then metadata catches up: the lane is named with the new epoch and fetched."""
    keys, logs, cluster, brokers, fetchers, rounds = _world(4, nodes=(1, 2), hw=1)
    _settle(rounds, fetchers, logs)
    key = keys[1]
    cluster.move(key, cluster.leader[key], meta_lags=True)   # epoch 1 at the broker, metadata still says 0
    logs[key].high_watermark = 3
    news = _round(rounds, fetchers)
    assert news[_lane(key)][1].error is not None
    news = _round(rounds, fetchers)                           # still stale metadata: fenced again, told again
    assert news[_lane(key)][1].error is not None
    cluster.refresh()
    _settle(rounds, fetchers, logs)
    assert fetchers[_lane(key)].position == 3


def test_the_audit_forgets_a_partition_held_in_the_session_of_a_broker_that_no_longer_has_the_lane():
    keys, logs, cluster, brokers, fetchers, rounds = _world(4, nodes=(1, 2), hw=1)
    _settle(rounds, fetchers, logs)
    assert rounds.audit() == []
    key = keys[0]                                       # on broker 1
    other = rounds.sessions.session(2)
    other._sent[key] = fetchers[_lane(key)].spec(0)     # broker 2's books say its session holds the lane too
    found = rounds.audit()
    assert len(found) == 1 and f"{key.topic}-{key.partition}" in found[0] and "broker 2" in found[0]


def test_the_audit_places_again_a_lane_missing_from_its_brokers_books():
    keys, logs, cluster, brokers, fetchers, rounds = _world(4, nodes=(1, 2), hw=1)
    _settle(rounds, fetchers, logs)
    key = keys[0]
    broker = rounds._brokers[cluster.leader[key]]
    del broker.lanes[key]                               # the books lost the lane (a bug would look like this)
    logs[key].high_watermark = 3
    found = rounds.audit()
    assert len(found) == 1 and _lane(key) in found[0]
    _settle(rounds, fetchers, logs)


_ops = st.lists(st.one_of(
    st.tuples(st.just("round")), st.tuples(st.just("round")), st.tuples(st.just("round")),
    st.tuples(st.just("append"), st.integers(0, 7), st.integers(1, 5)),
    st.tuples(st.just("move"), st.integers(0, 7), st.sampled_from([1, 2, 3]), st.booleans()),
    st.tuples(st.just("refresh")),
    st.tuples(st.just("error"), st.integers(0, 7), st.sampled_from([NOT_LEADER, UNKNOWN_EPOCH, 56])),
    st.tuples(st.just("clear"), st.integers(0, 7)),
    st.tuples(st.just("evict"), st.sampled_from([1, 2, 3])),
    st.tuples(st.just("reset"), st.integers(0, 7)),
    st.tuples(st.just("leave"), st.integers(0, 7)),
    st.tuples(st.just("join"), st.integers(0, 7)),
    st.tuples(st.just("dropped_unread")),
), min_size=3, max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_after_any_leader_moves_errors_and_resets_a_quiet_cluster_brings_every_lane_to_its_end(ops):
    keys, logs, cluster, brokers, fetchers, rounds = _world(8, nodes=(1, 2, 3), hw=0)
    held = dict(fetchers)
    committed = {lane: 0 for lane in held}
    for op in ops:
        if op[0] == "append":
            logs[keys[op[1]]].high_watermark += op[2]
        elif op[0] == "move":
            cluster.move(keys[op[1]], op[2], meta_lags=op[3])
        elif op[0] == "refresh":
            cluster.refresh()
        elif op[0] == "error":
            key = keys[op[1]]
            brokers[cluster.leader[key]].errors[key] = op[2]
        elif op[0] == "clear":
            for broker in brokers.values():
                broker.errors.pop(keys[op[1]], None)
        elif op[0] == "evict":
            brokers[op[1]].sessions.clear()
        elif op[0] == "leave":
            held.pop(_lane(keys[op[1]]), None)
        elif op[0] in ("join", "reset"):
            lane = _lane(keys[op[1]])
            if op[0] == "join" and lane in held:
                continue
            held[lane] = _EpochFetcher(keys[op[1]], cluster, position=committed[lane])
        elif op[0] == "dropped_unread":
            rounds.sync(list(held.items()))
            rounds.send().discard()
        else:
            _round(rounds, held)
            for lane, fetcher in held.items():
                committed[lane] = fetcher.position
    for broker in brokers.values():
        broker.errors.clear()
    cluster.refresh()
    _settle(rounds, held, logs, limit=15)
    assert rounds.audit() == []
