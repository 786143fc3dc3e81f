"""The daemon's standing fetch round (mirror_core.daemon.standing_round): a round hands back only the news — partitions
the broker's answer named, lanes whose own state changed, failures — and an incremental request names only what changed;
a lost session is asked again in full; no partition's data is ever left unfetched.

Played against the model broker of test_fetch_session (Kafka's FetchSession.scala, reduced), one per leader, with
scripted fetchers (position, leader, entry): pure, no I/O.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.future import Future

from mirror_core.codec.fetch_messages import FetchPartitionSpec
from mirror_core.daemon.standing_round import StandingRound
from mirror_core.kafka.broker_fetch import RoundStats
from mirror_core.kafka.fetch_session import PartitionKey
from mirror_core.kafka.fetcher import FetchResult
from tests.unit.kafka.test_fetch_session import ModelBroker, _Log

pytestmark = pytest.mark.timeout(60)

IDS = {f"t{i}": uuid.UUID(int=100 + i) for i in range(4)}


class _Broker(ModelBroker):
    """The model broker, answering with each topic's own id."""

    def __init__(self, logs, *, slots: int = 1, fail: bool = False):
        super().__init__(logs, slots=slots)
        self.requests: list = []
        self.fail = fail

    def _response(self, session_id, parts, error=0):
        topics: dict = {}
        for key, data in parts:
            topics.setdefault((key.topic, key.topic_id), []).append(data)
        return SimpleNamespace(error_code=error, session_id=session_id, throttle_time_ms=0, responses=[
            SimpleNamespace(topic=name, topic_id=tid, partitions=ps) for (name, tid), ps in topics.items()])


class _Conn:
    def __init__(self, broker: _Broker):
        self.broker = broker

    def fetch_async(self, *, topics, session_id, session_epoch, forgotten, **_):
        request = SimpleNamespace(topics=topics, forgotten=forgotten, epoch=session_epoch, session_id=session_id)
        self.broker.requests.append(request)
        if self.broker.fail:
            return Future().failure(Errors.KafkaConnectionError("connection reset"))
        return Future().success(self.broker.handle(request))


class _Client:
    def __init__(self, brokers: dict[int, _Broker]):
        self.brokers = brokers
        self.request_timeout_ms = 1000

    def fast_connection(self, leader, slot=0, **_):
        return _Conn(self.brokers[leader])


class _Fetcher:
    """A scripted fetcher: its position moves over the (start, end) the model broker serves."""

    def __init__(self, key: PartitionKey, leader: int, position: int = 0):
        self.topic, self.topic_id, self.partition = key.topic, key.topic_id, key.partition
        self.key, self.leader_node, self.position, self.last_epoch = key, leader, position, -1
        self._leader = None
        self.specs = 0     # request entries built: what an idle round must not pay for

    def locate(self):
        if self._leader is None:
            self._leader = (self.leader_node, 0)
        return self._leader

    @property
    def leader_known(self):
        return self._leader is not None

    def forget_leader(self):
        self._leader = None

    def spec(self, epoch):
        self.specs += 1
        return FetchPartitionSpec(self.partition, epoch, self.position, 1 << 20)

    def handle(self, data):
        if data.error_code:
            raise Errors.for_code(data.error_code)()
        if data.records is not None:
            assert data.records[0] == self.position, "the broker fetched where the fetcher stands"
            self.position = data.records[1]
        return FetchResult([], self.position, data.high_watermark, data.last_stable_offset, data.log_start_offset)

    def unchanged(self, ends):
        return FetchResult([], self.position, ends.high_watermark, ends.last_stable_offset, ends.log_start_offset)


def _keys(n: int) -> list[PartitionKey]:
    return [PartitionKey(f"t{i % 4}", IDS[f"t{i % 4}"], i // 4) for i in range(n)]


def _setup(n: int, *, leaders=(1, 2), hw: int = 0):
    keys = _keys(n)
    logs = {key: _Log(high_watermark=hw) for key in keys}
    brokers = {leader: _Broker(logs) for leader in leaders}
    fetchers = {f"{k.topic}-{k.partition}": _Fetcher(k, leaders[i % len(leaders)]) for i, k in enumerate(keys)}
    rounds = StandingRound(_Client(brokers), max_bytes=1 << 24, max_wait_ms=0, sessions=_sessions())
    return keys, logs, brokers, fetchers, rounds


def _sessions():
    from mirror_core.kafka.broker_fetch import RoundSessions
    return RoundSessions()


def _round(rounds: StandingRound, fetchers: dict, stats: RoundStats | None = None):
    rounds.sync(list(fetchers.items()))
    return {lane: (start, outcome) for lane, _f, start, outcome in rounds.send(stats=stats).collect()}


def _named(broker: _Broker) -> int:
    return sum(len(t.partitions) for t in broker.requests[-1].topics)


def test_an_idle_round_hands_out_nothing_and_names_nothing():
    keys, logs, brokers, fetchers, rounds = _setup(400, hw=2)
    first = _round(rounds, fetchers)
    assert len(first) == 400 and all(o.result.next_offset == 2 for _s, o in first.values())
    second = _round(rounds, fetchers)   # every position moved: every partition named once, all caught up
    assert sum(_named(b) for b in brokers.values()) == 400 and second == {}
    built = sum(f.specs for f in fetchers.values())
    for _ in range(3):
        assert _round(rounds, fetchers) == {}, "an idle round has no news"
        assert all(_named(b) == 0 and not brokers[1].requests[-1].forgotten for b in brokers.values())
    assert sum(f.specs for f in fetchers.values()) == built, "an idle round builds no request entry"


def test_only_the_partitions_the_answer_named_are_handed_out_and_only_moved_ones_named_next():
    keys, logs, brokers, fetchers, rounds = _setup(200, hw=0)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    busy = [keys[3], keys[50], keys[121]]
    for key in busy:
        logs[key].high_watermark = 2
    logs[keys[77]].log_start = 0   # unchanged: no news
    news = _round(rounds, fetchers)
    assert set(news) == {f"{k.topic}-{k.partition}" for k in busy}
    for start, outcome in news.values():
        assert start == 0 and outcome.error is None and outcome.result.next_offset == 2
    stats = RoundStats()
    assert _round(rounds, fetchers, stats) == {}
    assert (stats.partitions, stats.named, stats.incremental) == (200, 3, 2), "only the moved positions travel"
    logs[keys[9]].high_watermark = 5   # a high watermark moved with no data at our position? it has data: named
    news = _round(rounds, fetchers)
    assert list(news) == [f"{keys[9].topic}-{keys[9].partition}"] and news[list(news)[0]][1].result.next_offset == 3


@pytest.mark.parametrize("how", ["evicted", "epoch_bumped"])
def test_a_lost_session_is_asked_again_at_once_naming_every_member(how):
    keys, logs, brokers, fetchers, rounds = _setup(100, hw=1)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    logs[keys[4]].high_watermark = 3
    if how == "evicted":
        brokers[1].sessions.clear()
    else:
        for s in brokers[1].sessions.values():
            s.epoch += 7
    stats = RoundStats()
    news = _round(rounds, fetchers, stats)
    assert stats.sessions_lost == 1
    full = brokers[1].requests[-1]
    assert full.epoch == 0 and _named(brokers[1]) == 50, "the full request names every member of the broker"
    assert news[f"{keys[4].topic}-{keys[4].partition}"][1].result.next_offset == 3
    assert all(o.error is None for _s, o in news.values())
    assert _round(rounds, fetchers) == {}


def test_a_lane_reset_between_rounds_is_named_at_its_new_position_and_reported():
    keys, logs, brokers, fetchers, rounds = _setup(8, leaders=(1,), hw=4)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    lane = f"{keys[2].topic}-{keys[2].partition}"
    fetchers[lane] = _Fetcher(keys[2], 1, position=1)   # reopened at its checkpoint, behind where the old one was
    news = _round(rounds, fetchers)
    assert list(news) == [lane] and news[lane][0] == 1 and news[lane][1].result.next_offset == 4
    twin = f"{keys[5].topic}-{keys[5].partition}"
    fetchers[twin] = _Fetcher(keys[5], 1, position=fetchers[twin].position)   # reopened at the same position
    news = _round(rounds, fetchers)
    assert list(news) == [twin], "a reopened lane is news even when the broker has nothing new for it"
    assert news[twin][1].result.high_watermark == 4 and news[twin][1].error is None


def test_a_lane_newly_held_joins_the_session_and_one_let_go_leaves_it():
    keys, logs, brokers, fetchers, rounds = _setup(9, leaders=(1,), hw=0)
    newcomer = fetchers.pop(f"{keys[8].topic}-{keys[8].partition}")
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    fetchers[f"{keys[8].topic}-{keys[8].partition}"] = newcomer
    news = _round(rounds, fetchers)
    request = brokers[1].requests[-1]
    assert request.epoch > 0 and _named(brokers[1]) == 1, "the newcomer joins the open session"
    assert list(news) == [f"{keys[8].topic}-{keys[8].partition}"]
    gone = fetchers.pop(f"{keys[0].topic}-{keys[0].partition}")
    assert _round(rounds, fetchers) == {}
    request = brokers[1].requests[-1]
    assert [(t.topic, list(t.partitions)) for t in request.forgotten] == [(gone.topic, [gone.partition])]
    assert gone.key not in brokers[1].sessions[100].params


def test_a_moved_leader_leaves_the_old_brokers_session_and_joins_the_new_ones():
    keys, logs, brokers, fetchers, rounds = _setup(20, hw=0)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    moved = fetchers[f"{keys[0].topic}-{keys[0].partition}"]   # on broker 1
    old = moved.key
    # broker 1 answers NOT_LEADER for it: the fetcher forgets its leader, which is broker 2 now
    real = brokers[1]._data
    brokers[1]._data = lambda key, spec: SimpleNamespace(**{**vars(real(key, spec)), "error_code": 6}) \
        if key == old else real(key, spec)
    logs[old].high_watermark = 1
    news = _round(rounds, fetchers)
    lane = f"{old.topic}-{old.partition}"
    assert isinstance(news[lane][1].error, Errors.NotLeaderForPartitionError) and not moved.leader_known
    moved.leader_node = 2
    news = _round(rounds, fetchers)
    assert news[lane][1].result.next_offset == 1
    assert [list(t.partitions) for t in brokers[1].requests[-1].forgotten] == [[old.partition]]
    assert old in brokers[2].sessions[100].params


def test_a_broker_that_cannot_be_reached_fails_its_members_and_is_asked_in_full_after():
    keys, logs, brokers, fetchers, rounds = _setup(10, hw=0)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    brokers[2].fail = True
    news = _round(rounds, fetchers)
    assert len(news) == 5 and all(isinstance(o.error, Errors.KafkaConnectionError) for _s, o in news.values())
    brokers[2].fail = False
    news = _round(rounds, fetchers)   # placed again (their leader was forgotten), in a new session: news again
    assert len(news) == 5 and all(o.error is None for _s, o in news.values())
    assert brokers[2].requests[-1].epoch == 0 and _named(brokers[2]) == 5


def test_the_audit_finds_a_lane_its_session_does_not_hold_and_names_it_again():
    keys, logs, brokers, fetchers, rounds = _setup(12, leaders=(1,), hw=0)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    assert rounds.audit() == []
    session = rounds.sessions.session(1)
    lost = keys[7]
    del session._sent[lost]   # the books and the session disagree (a bug would look like this)
    logs[lost].high_watermark = 2
    brokers[1].sessions[100].params.pop(lost)   # ... and the broker does not fetch it: a silent stall
    brokers[1].sessions[100].cached.pop(lost)
    assert _round(rounds, fetchers) == {}, "without the audit the lane's data is never fetched"
    found = rounds.audit()
    assert len(found) == 1 and f"{lost.topic}-{lost.partition}" in found[0]
    news = _round(rounds, fetchers)
    assert news[f"{lost.topic}-{lost.partition}"][1].result.next_offset == 2
    assert rounds.audit() == []


_ops = st.lists(st.one_of(
    st.tuples(st.just("round")), st.tuples(st.just("round")), st.tuples(st.just("round")),
    st.tuples(st.just("append"), st.integers(0, 11), st.integers(1, 5)),
    st.tuples(st.just("evict"), st.sampled_from([1, 2])),
    st.tuples(st.just("leave"), st.integers(0, 11)),
    st.tuples(st.just("join"), st.integers(0, 11)),
    st.tuples(st.just("reset"), st.integers(0, 11)),
    st.tuples(st.just("dropped_unread")),
), min_size=3, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_no_partition_with_data_at_its_position_is_ever_left_out(ops):
    keys, logs, brokers, fetchers, rounds = _setup(12, hw=0)
    held = dict(fetchers)
    committed = {lane: 0 for lane in held}
    for op in ops:
        if op[0] == "append":
            logs[keys[op[1]]].high_watermark += op[2]
        elif op[0] == "evict":
            brokers[op[1]].sessions.clear()
        elif op[0] == "leave":
            held.pop(f"{keys[op[1]].topic}-{keys[op[1]].partition}", None)
        elif op[0] in ("join", "reset"):
            lane = f"{keys[op[1]].topic}-{keys[op[1]].partition}"
            if op[0] == "join" and lane in held:
                continue
            held[lane] = _Fetcher(keys[op[1]], 1 + op[1] % 2, position=committed[lane])
        elif op[0] == "dropped_unread":
            rounds.sync(list(held.items()))
            rounds.send().discard()
        else:
            truth = {lane: logs[f.key].high_watermark for lane, f in held.items()}
            before = {lane: f.position for lane, f in held.items()}
            news = _round(rounds, held)
            for lane, fetcher in held.items():
                if lane in news:
                    start, outcome = news[lane]
                    assert outcome.error is None and start == before[lane]
                    assert outcome.result.high_watermark == truth[lane]
                else:
                    assert before[lane] >= truth[lane] and fetcher.position == before[lane], \
                        f"{lane} had data at {before[lane]} (end {truth[lane]}) and was left out"
                committed[lane] = fetcher.position
            assert rounds.audit() == []


class _CountingLanes(list):
    """A round's lane list that counts the walks over it."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_syncing_the_same_lane_list_again_walks_nothing_and_a_new_list_is_still_followed():
    keys, logs, brokers, fetchers, rounds = _setup(40, hw=1)
    lanes = _CountingLanes(fetchers.items())
    rounds.sync(lanes)
    rounds.send().collect()
    walked = _CountingLanes.walks
    for _ in range(5):   # an idle daemon's rounds: the very list it synced, unchanged
        rounds.sync(lanes)
        assert rounds.send().collect() == []
    assert _CountingLanes.walks == walked, "the same list: not walked again"
    lane = f"{keys[7].topic}-{keys[7].partition}"
    fetchers[lane] = _Fetcher(keys[7], fetchers[lane].leader_node, position=0)   # reopened: a new list
    rounds.sync(_CountingLanes(fetchers.items()))
    news = rounds.send().collect()
    assert [n[0] for n in news] == [lane] and news[0][3].result.next_offset == 1


def test_the_audit_repairs_a_placed_lane_whose_request_entry_is_missing_instead_of_failing():
    """A member placed at its broker (in ``lanes``) with no entry in the broker's request entries (``members``): the
    books disagree the way a bug would leave them. The audit used to index the entries and fail with KeyError, so
    the one check meant to catch a silent stall stopped the round instead; now it restores the entry and the lane
    is fetched again."""
    keys, logs, brokers, fetchers, rounds = _setup(12, leaders=(1,), hw=0)
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    lost = keys[5]
    del rounds._brokers[1].members[lost]
    logs[lost].high_watermark = 3
    found = rounds.audit()
    assert len(found) == 1 and f"{lost.topic}-{lost.partition}" in found[0] and "request entry" in found[0]
    news = _round(rounds, fetchers)
    assert news[f"{lost.topic}-{lost.partition}"][1].result.next_offset == 3
    assert rounds.audit() == []
