"""Fetch sessions (KIP-227, mirror_core.kafka.fetch_session): the pure state machine against a model broker.

The model broker below follows Kafka's FetchSession.scala (full / incremental contexts, the "must respond" rule of
CachedPartition, session errors 70/71, eviction); random sequences of position changes, partitions joining and
leaving, appends, evictions, competing epoch bumps, lost answers and dropped rounds are played through a
:class:`FetchSession` and checked against what a sessionless fetch would have said: no partition's news is ever
lost (a partition with data at its position is always answered), an omitted partition carries the true high
watermark and log start, and positions move only through data served. Plus the wire encoding of the session
fields and ForgottenTopicsData, byte-identical to kafka-python's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from mirror_core.codec.fetch_messages import FetchPartitionSpec, FetchTopicSpec, ForgottenTopic, encode_fetch_request
from mirror_core.kafka.fetch_requests import kafka_python_fetch_request
from mirror_core.kafka.fetch_session import (
    FETCH_SESSION_ID_NOT_FOUND,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    FetchSession,
    PartitionEnds,
    PartitionKey,
    next_epoch,
)

TOPIC_ID = uuid.UUID(int=7)


# -- a model broker (Kafka's FetchSession.scala, reduced to what a consumer sees) -----------------------------

@dataclass
class _Log:
    high_watermark: int = 0
    log_start: int = 0


@dataclass
class _BrokerSession:
    epoch: int
    params: dict = field(default_factory=dict)     # key → FetchPartitionSpec as last named
    cached: dict = field(default_factory=dict)     # key → (high watermark, log start) as last sent, -1: none


class ModelBroker:
    BATCH = 3          # records per fetch: a partition further behind needs several rounds

    def __init__(self, logs: dict[PartitionKey, _Log], *, slots: int = 1):
        self.logs = logs
        self.sessions: dict[int, _BrokerSession] = {}
        self.slots = slots
        self.next_id = 100

    def _data(self, key: PartitionKey, spec: FetchPartitionSpec):
        log = self.logs[key]
        end = min(log.high_watermark, spec.fetch_offset + self.BATCH)
        records = (spec.fetch_offset, end) if end > spec.fetch_offset else None
        return SimpleNamespace(partition_index=key.partition, error_code=0, high_watermark=log.high_watermark,
                               last_stable_offset=log.high_watermark, log_start_offset=log.log_start,
                               records=records)

    def _response(self, session_id: int, parts: list[tuple[PartitionKey, object]], error: int = 0):
        topics: dict = {}
        for key, data in parts:
            topics.setdefault(key.topic, []).append(data)
        return SimpleNamespace(error_code=error, session_id=session_id, throttle_time_ms=0, responses=[
            SimpleNamespace(topic=name, topic_id=TOPIC_ID, partitions=ps) for name, ps in topics.items()])

    def handle(self, request):
        named = {PartitionKey(t.topic, t.topic_id, p.partition): p for t in request.topics for p in t.partitions}
        if request.epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self.sessions.pop(request.session_id, None)
            session_id = 0
            if request.epoch == INITIAL_EPOCH and len(self.sessions) < self.slots:
                session_id, self.next_id = self.next_id, self.next_id + 1
                self.sessions[session_id] = _BrokerSession(1, dict(named), {
                    key: (self.logs[key].high_watermark, self.logs[key].log_start) for key in named})
            return self._response(session_id, [(key, self._data(key, spec)) for key, spec in named.items()])
        session = self.sessions.get(request.session_id)
        if session is None:
            return self._response(0, [], FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != request.epoch:
            return self._response(0, [], INVALID_FETCH_SESSION_EPOCH)
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
            data = self._data(key, spec)
            ends = (data.high_watermark, data.log_start_offset)
            if data.records is not None or ends != session.cached[key]:
                session.cached[key] = ends
                out.append((key, data))
        return self._response(request.session_id, out)


def _specs(positions: dict[PartitionKey, int], wanted) -> list[FetchTopicSpec]:
    topics: dict = {}
    for key in wanted:
        topics.setdefault(key.topic, []).append(FetchPartitionSpec(key.partition, 0, positions[key], 1 << 20))
    return [FetchTopicSpec(name, TOPIC_ID, parts) for name, parts in topics.items()]


KEYS = [PartitionKey(f"t{i % 2}", TOPIC_ID, i) for i in range(6)]

_round_op = st.tuples(st.just("round"), st.sets(st.sampled_from(KEYS), min_size=1))
_append_op = st.tuples(st.just("append"), st.sampled_from(KEYS), st.integers(1, 8))
_op = st.one_of(  # rounds and appends weighted up: the interesting runs are long stretches of a live session
    _round_op, _round_op, _round_op, _round_op, _round_op, _append_op, _append_op, _append_op,
    st.tuples(st.just("delete_records"), st.sampled_from(KEYS)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("competitor_bumps_epoch")),
    st.tuples(st.just("answer_lost"), st.sets(st.sampled_from(KEYS), min_size=1), st.booleans()),
    st.tuples(st.just("round_dropped_unread"), st.sets(st.sampled_from(KEYS), min_size=1)),
    st.tuples(st.just("close"), st.booleans()),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(_op, min_size=5, max_size=60), enabled=st.sampled_from([True, True, True, False]),
       slots=st.sampled_from([1, 1, 1, 0]))
def test_a_session_never_loses_a_partitions_news(ops, enabled, slots):
    logs = {key: _Log() for key in KEYS}
    broker = ModelBroker(logs, slots=slots)
    session = FetchSession(enabled=enabled)
    positions = {key: 0 for key in KEYS}
    for op in ops:
        kind = op[0]
        if kind == "append":
            logs[op[1]].high_watermark += op[2]
        elif kind == "delete_records":
            log = logs[op[1]]
            log.log_start = min(log.high_watermark, log.log_start + 1)
        elif kind == "evict":
            broker.sessions.clear()
        elif kind == "competitor_bumps_epoch":
            for s in broker.sessions.values():
                s.epoch = next_epoch(s.epoch)
        elif kind == "answer_lost":          # the broker took the request or not; the client never hears back
            request = session.build(_specs(positions, sorted(op[1])))
            if op[2]:
                broker.handle(request)
            session.failed(request)
        elif kind == "round_dropped_unread":  # sent and answered, but the caller never reads the answer
            broker.handle(session.build(_specs(positions, sorted(op[1]))))
        elif kind == "close":                # the client closes the session; the goodbye arrives or is lost
            request = session.close()
            if request is not None and op[1]:
                broker.handle(request)
        else:
            _round(session, broker, positions, sorted(op[1]))


def _round(session: FetchSession, broker: ModelBroker, positions: dict, wanted: list[PartitionKey]) -> None:
    """One round as a caller runs it (a lost session is asked again at once as a full request), checked."""
    truth = {key: (broker.logs[key].high_watermark, broker.logs[key].log_start) for key in wanted}
    request = session.build(_specs(positions, wanted))
    answer = session.answer(request, broker.handle(request))
    if answer.resend_full:
        request = session.build(_specs(positions, wanted))
        assert request.full, "after a lost session the next request names every partition"
        answer = session.answer(request, broker.handle(request))
    assert not answer.resend_full and not answer.error_code and not answer.missing
    assert set(answer.parts) | set(answer.unchanged) == set(wanted)
    assert not set(answer.parts) & set(answer.unchanged)
    for key, data in answer.parts.items():
        assert (data.high_watermark, data.log_start_offset) == truth[key]
        if data.records is not None:
            start, end = data.records
            assert start == positions[key], "the broker fetched where the fetcher stands"
            positions[key] = end                          # the data was accepted: the position moves
        else:
            assert positions[key] >= truth[key][0]
    for key, ends in answer.unchanged.items():
        assert positions[key] >= truth[key][0], f"{key} had data at {positions[key]} but was left out"
        assert ends == PartitionEnds(truth[key][0], truth[key][0], truth[key][1]), "an omitted partition keeps " \
            "the broker's current high watermark and log start"


# -- the protocol, step by step ------------------------------------------------------------------------------

def _one_round(session, broker, positions, wanted):
    request = session.build(_specs(positions, wanted))
    return request, session.answer(request, broker.handle(request))


def test_after_the_full_request_only_changes_travel_and_idle_partitions_are_left_out():
    logs = {key: _Log(high_watermark=2) for key in KEYS}
    broker = ModelBroker(logs)
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    first, answer = _one_round(session, broker, positions, KEYS)
    assert (first.session_id, first.epoch, first.partition_count) == (0, INITIAL_EPOCH, len(KEYS))
    for key, data in answer.parts.items():
        positions[key] = data.records[1]
    second, answer = _one_round(session, broker, positions, KEYS)
    assert (second.session_id, second.epoch) == (100, 1)
    assert second.partition_count == len(KEYS), "every position moved: every partition is named"
    assert not answer.parts and set(answer.unchanged) == set(KEYS)
    assert answer.unchanged[KEYS[0]] == PartitionEnds(2, 2, 0)
    logs[KEYS[3]].high_watermark = 5
    third, answer = _one_round(session, broker, positions, KEYS[:5])
    assert (third.epoch, third.partition_count) == (2, 0), "nothing changed: an empty incremental request"
    assert [(t.topic, list(t.partitions)) for t in third.forgotten] == [(KEYS[5].topic, [KEYS[5].partition])]
    assert list(answer.parts) == [KEYS[3]] and answer.parts[KEYS[3]].records == (2, 5)


def test_a_lost_session_is_asked_again_in_full_and_an_evicted_one_from_scratch():
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS)
    broker.sessions[100].epoch += 5                               # someone else used our session
    request, answer = _one_round(session, broker, positions, KEYS)
    assert not request.full and answer.resend_full and not answer.parts and not answer.unchanged
    again = session.build(_specs(positions, KEYS))
    assert (again.session_id, again.epoch) == (100, INITIAL_EPOCH), "the full request closes the old session"
    session.answer(again, broker.handle(again))
    broker.sessions.clear()                                       # evicted
    request, answer = _one_round(session, broker, positions, KEYS)
    assert answer.resend_full and session.stats.sessions_lost == 2
    assert session.build(_specs(positions, KEYS))[:2] == (0, INITIAL_EPOCH)


def test_a_broker_that_makes_no_session_gets_full_requests_and_opting_out_is_sessionless():
    broker = ModelBroker({key: _Log(1) for key in KEYS}, slots=0)
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    for _ in range(3):
        request, answer = _one_round(session, broker, positions, KEYS)
        assert (request.session_id, request.epoch, request.partition_count) == (0, INITIAL_EPOCH, len(KEYS))
        assert set(answer.parts) == set(KEYS)
    off = FetchSession(enabled=False)
    for _ in range(2):
        request, _ = _one_round(off, ModelBroker({key: _Log(1) for key in KEYS}), positions, KEYS)
        assert (request.session_id, request.epoch, request.partition_count) == (0, FINAL_EPOCH, len(KEYS))


def test_a_request_built_while_the_last_is_unanswered_starts_afresh():
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS)
    dropped = session.build(_specs(positions, KEYS))
    broker.handle(dropped)                                        # answered, never read
    request = session.build(_specs(positions, KEYS))
    assert (request.session_id, request.epoch, request.partition_count) == (100, INITIAL_EPOCH, len(KEYS))


def test_switching_between_topic_names_and_ids_starts_a_new_session():
    session = FetchSession()
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS)
    by_name = [FetchTopicSpec("t0", None, [FetchPartitionSpec(0, 0, 0, 1 << 20)])]
    request = session.build(by_name)
    assert request.full and not request.by_id


def test_an_incremental_answer_naming_a_partition_we_never_asked_for_drops_the_session():
    session = FetchSession()
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS[:2])
    request = session.build(_specs(positions, KEYS[:2]))
    stranger = broker._data(KEYS[4], FetchPartitionSpec(KEYS[4].partition, 0, 0, 1))
    answer = session.answer(request, broker._response(100, [(KEYS[4], stranger)]))
    assert not answer.parts and set(answer.unchanged) == set(KEYS[:2])
    assert session.build(_specs(positions, KEYS[:2])).full


def test_a_partition_whose_leader_moves_leaves_the_old_brokers_session_and_joins_the_new_ones():
    from mirror_core.kafka.broker_fetch import RoundSessions

    logs = {key: _Log(high_watermark=4) for key in KEYS}
    brokers = {1: ModelBroker(logs), 2: ModelBroker(logs)}
    sessions = RoundSessions()
    positions = {key: 0 for key in KEYS}
    leaders = {key: 1 if i < 4 else 2 for i, key in enumerate(KEYS)}

    def round_() -> dict:
        answers = {}
        for node in (1, 2):
            wanted = [key for key in KEYS if leaders[key] == node]
            request, answer = _one_round(sessions.session(node), brokers[node], positions, wanted)
            answers[node] = (request, answer)
            for key, data in answer.parts.items():
                if data.records is not None:
                    positions[key] = data.records[1]
        return answers

    for _ in range(3):          # everyone read to the end, and the broker told where they stand
        round_()
    moved = KEYS[0]
    leaders[moved] = 2
    logs[moved].high_watermark = 9
    answers = round_()
    old, new = answers[1][0], answers[2][0]
    assert [(t.topic, list(t.partitions)) for t in old.forgotten] == [(moved.topic, [moved.partition])]
    assert moved not in brokers[1].sessions[100].params, "the old leader's session no longer fetches it"
    assert [p.partition for t in new.topics for p in t.partitions] == [moved.partition]
    assert answers[2][1].parts[moved].records == (4, 7), "the new leader fetches it where the fetcher stands"
    assert not answers[2][1].parts.keys() - {moved}


# -- on the wire ----------------------------------------------------------------------------------------------

_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(version=st.integers(7, 18), session_id=st.integers(0, 2**31 - 1), epoch=st.integers(-1, 2**31 - 1),
       named=st.lists(st.tuples(_names, st.uuids(), st.lists(st.integers(0, 2**31 - 1), max_size=3, unique=True)),
                      max_size=3, unique_by=lambda t: t[0]),
       forgotten=st.lists(st.tuples(_names, st.uuids(), st.lists(st.integers(0, 2**31 - 1), min_size=1,
                                                                 max_size=4)), max_size=3))
def test_session_fields_and_forgotten_topics_are_byte_identical_to_kafka_pythons(version, session_id, epoch,
                                                                                 named, forgotten):
    by_id = version >= 13
    topics = [FetchTopicSpec(name, tid if by_id else None, [FetchPartitionSpec(p, 3, 10 * p, 1 << 20, 2)
                                                           for p in parts]) for name, tid, parts in named]
    gone = [ForgottenTopic(name, tid if by_id else None, parts) for name, tid, parts in forgotten]
    request = SimpleNamespace(session_id=session_id, epoch=epoch, topics=topics, forgotten=gone, by_id=by_id)
    theirs = kafka_python_fetch_request(topics, max_wait_ms=500, max_bytes=1 << 20, isolation=1, session=request)
    theirs.API_VERSION = version
    theirs.with_header(correlation_id=9, client_id="shoal")
    ours = encode_fetch_request(version, 9, "shoal", max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                                isolation_level=1, topics=topics, session_id=session_id, session_epoch=epoch,
                                forgotten=gone)
    assert ours == bytes(theirs.encode(framed=True, header=True))


def test_data_in_an_answer_that_does_not_fit_the_session_is_not_handed_out():
    """Review finding: an incremental answer that names a partition we never asked for means the broker's view of
    the session differs from ours; the data it carries for our partitions may come from an offset the broker keeps,
    not from the fetcher's position. None of it is taken (the partitions are asked again, by a full request)."""
    session = FetchSession()
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS[:2])
    request = session.build(_specs(positions, KEYS[:2]))
    assert not request.full
    ours = broker._data(KEYS[0], FetchPartitionSpec(KEYS[0].partition, 0, 0, 1 << 20))
    stranger = broker._data(KEYS[4], FetchPartitionSpec(KEYS[4].partition, 0, 0, 1))
    answer = session.answer(request, broker._response(100, [(KEYS[0], ours), (KEYS[4], stranger)]))
    assert not answer.parts and KEYS[0] in answer.missing
    assert session.build(_specs(positions, KEYS[:2])).full


# -- closing a session ---------------------------------------------------------------------------------------

def test_closing_sends_the_sessions_id_at_the_final_epoch_and_the_broker_forgets_it():
    logs = {key: _Log(high_watermark=5) for key in KEYS}
    broker = ModelBroker(logs)
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS[:3])
    _one_round(session, broker, positions, KEYS[:3])
    old_id, old_epoch = session.session_id, session.epoch
    assert session.active and old_id in broker.sessions

    goodbye = session.close()
    assert (goodbye.session_id, goodbye.epoch) == (old_id, FINAL_EPOCH)
    assert goodbye.full and goodbye.topics == [] and goodbye.forgotten == [] and goodbye.wanted == ()
    answer = broker.handle(goodbye)
    assert answer.error_code == 0 and answer.session_id == 0 and answer.responses == []
    assert old_id not in broker.sessions, "the broker's cache slot is free again"
    stale = SimpleNamespace(session_id=old_id, epoch=old_epoch, topics=[], forgotten=[])
    assert broker.handle(stale).error_code == FETCH_SESSION_ID_NOT_FOUND

    assert not session.active and session.stats.sessions_closed == 1
    again = session.build(_specs(positions, KEYS[:3]))
    assert again.full and again.session_id == 0 and again.epoch == INITIAL_EPOCH, \
        "after a close the next request opens a new session and names no old one"


def test_closing_without_a_session_on_the_broker_sends_nothing():
    assert FetchSession().close() is None                       # never sent a request
    assert FetchSession(enabled=False).close() is None          # sessions off
    refusing = ModelBroker({key: _Log(1) for key in KEYS}, slots=0)
    session = FetchSession()
    _one_round(session, refusing, {key: 0 for key in KEYS}, KEYS[:2])
    assert session.close() is None, "a broker that made no session has nothing to close"
    session = FetchSession()
    broker = ModelBroker({key: _Log(1) for key in KEYS})
    _one_round(session, broker, {key: 0 for key in KEYS}, KEYS[:2])
    assert session.close() is not None and session.close() is None, "closed once"


def test_a_session_dropped_by_the_client_but_still_on_the_broker_is_closed_too():
    """A transport failure drops the session here (the next request would be full) but the broker may still hold
    it: close names its id all the same."""
    broker = ModelBroker({key: _Log(4) for key in KEYS})
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS[:2])
    held = session.session_id
    session.failed(session.build(_specs(positions, KEYS[:2])))
    assert not session.active and held in broker.sessions
    goodbye = session.close()
    assert goodbye.session_id == held and goodbye.epoch == FINAL_EPOCH
    broker.handle(goodbye)
    assert held not in broker.sessions


def test_an_answer_to_a_request_sent_before_the_close_is_never_taken():
    broker = ModelBroker({key: _Log(6) for key in KEYS})
    session = FetchSession()
    positions = {key: 0 for key in KEYS}
    _one_round(session, broker, positions, KEYS[:2])
    request = session.build(_specs(positions, KEYS[:2]))
    response = broker.handle(request)
    session.close()
    answer = session.answer(request, response)
    assert not answer.parts and set(answer.missing) <= set(KEYS[:2]), "no data of the closed session moves a fetcher"


def test_closing_a_clients_sessions_never_raises_when_the_broker_cannot_be_reached():
    """RoundSessions.close runs inside WireClient.close: a broker that is gone (the daemon stopping during a source
    outage) costs the goodbye, never the close."""
    import kafka.errors as Errors

    from mirror_core.kafka.broker_fetch import RoundSessions

    class _Unreachable:
        request_timeout_ms = 1000

        def fast_connection(self, node_id, slot=0, *, timeout_s=None):
            raise Errors.KafkaConnectionError(f"connecting to broker {node_id}: connection refused")

    sessions = RoundSessions()
    broker = ModelBroker({key: _Log(2) for key in KEYS})
    _one_round(sessions.session(1), broker, {key: 0 for key in KEYS}, KEYS[:2])
    assert sessions.session(1).active
    assert sessions.close(_Unreachable(), timeout_s=0.5) == 0
    assert not sessions.by_broker, "forgotten all the same: a later round starts a new session"
