"""Fetch sessions (KIP-227) on the real sandbox brokers, on both request routes (hand-encoded and kafka-python).

What a user notices: once a round over many partitions has been sent in full, an idle round costs a few dozen
bytes instead of ~40 per partition each way, and only the partitions whose position moved travel in the request,
only the ones with news in the answer. What must not change: the copy is exact (an independent confluent-kafka
reader compares source and target), and losing the session on the broker — closed or evicted
(FETCH_SESSION_ID_NOT_FOUND), or its epoch taken by another request (INVALID_FETCH_SESSION_EPOCH) — costs one full
request and nothing else: no error reaches the caller, nothing is skipped or copied twice.
"""

from __future__ import annotations

import time

import pytest

from mirror_core.codec.batch_deep import decode_record_tail, read_records
from mirror_core.engine.concurrent_copy import plain_share_writer
from mirror_core.engine.copier import CopyOptions, FetchedOnce
from mirror_core.kafka.broker_fetch import RoundSessions, RoundStats, fetch_round, round_sessions
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.fetch_session import FETCH_SESSION_ID_NOT_FOUND, next_epoch
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from tests.kafka_helpers import private_broker

pytestmark = pytest.mark.integration

IDLE = 30            # idle partitions beside the busy one (partition 0)


@pytest.fixture(params=["fast", "kafka-python"])
def route(request):
    return request.param


@pytest.fixture
def clients(route, source_cluster, target_cluster):
    with WireClient.for_cluster(source_cluster.config, fast_path=route == "fast") as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        yield source, target


class _RoundCopy:
    """Open-ended copy of every partition of ``topic`` in fetch rounds, the daemon's way: one round, then each
    partition's share ``[start, fetcher.position)`` written with the lane's own writer (mode ``none``)."""

    def __init__(self, source, target, topic: str, target_topic: str, partitions: int, sessions: RoundSessions):
        self.source = source
        self.sessions = sessions
        self.fetchers = [RawBatchFetcher(source, topic, p, 0, None, max_bytes=1 << 20, max_wait_ms=50)
                         for p in range(partitions)]
        self.writers = [plain_share_writer(source, target, CopyOptions(),
                                           PartitionRange(topic, p, 0, 2**62, target_topic, p))
                        for p in range(partitions)]
        self.stats = RoundStats()

    def round(self) -> RoundStats:
        """One round; returns its own counters. Every partition must come back without an error."""
        before = RoundStats(**vars(self.stats))
        starts = [f.position for f in self.fetchers]
        outcomes = fetch_round(self.source, self.fetchers, max_bytes=8 << 20, max_wait_ms=50, stats=self.stats,
                               sessions=self.sessions)
        for fetcher, writer, start, outcome in zip(self.fetchers, self.writers, starts, outcomes, strict=True):
            assert outcome.error is None, f"{fetcher.topic}-{fetcher.partition}: {outcome.error!r}"
            assert outcome.result.next_offset == fetcher.position
            if fetcher.position > start:
                writer.copy_share(start, fetcher.position, FetchedOnce(outcome.result, start), start == 0)
        return RoundStats(**{k: v - getattr(before, k) for k, v in vars(self.stats).items()})

    def wire_bytes(self) -> int:
        conn = self.source.fast_connection(self.fetchers[0].locate()[0])
        return conn.bytes_sent + conn.bytes_received


def _by_partition(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.content())
    return out


def _produce(cluster, topic: str, partition: int, n: int, tag: str) -> None:
    cluster.produce(topic, [(b"k%d" % i, b"%s-%d-%d" % (tag.encode(), partition, i)) for i in range(n)],
                    partition=partition)


@pytest.mark.timeout(120)
def test_idle_partitions_stay_off_the_wire_after_the_first_round(source_cluster, target_cluster, clients, route,
                                                                 unique_name):
    source, target = clients
    topic = unique_name(route)
    target_topic = f"fs.{topic}"
    source_cluster.create_topic(topic, partitions=IDLE + 1)
    target_cluster.create_topic(target_topic, partitions=IDLE + 1)
    for p in range(IDLE + 1):
        _produce(source_cluster, topic, p, 3, "first")
    copy = _RoundCopy(source, target, topic, target_topic, IDLE + 1, RoundSessions())

    first = copy.round()
    assert (first.incremental, first.named, first.answered) == (0, IDLE + 1, IDLE + 1)
    second = copy.round()      # every position moved in the first round: all named again, none has news
    assert (second.incremental, second.named, second.answered) == (1, IDLE + 1, 0)
    for n in range(5):         # the busy partition gets records before each round; the others stay idle
        _produce(source_cluster, topic, 0, 4 + n, f"busy{n}")
        busy = copy.round()
        assert busy.partitions == IDLE + 1, "every partition is still fetched"
        assert (busy.incremental, busy.answered) == (1, 1), "only the busy partition is in the answer"
        assert busy.named == (0 if n == 0 else 1), "only the partition whose position moved is in the request"
    copy.round()               # the busy partition's last move is told to the broker
    if route == "fast":        # what an idle round costs on the wire, with the session and without
        before = copy.wire_bytes()
        idle = copy.round()
        with_session = copy.wire_bytes() - before
        assert (idle.named, idle.answered) == (0, 0)
        copy.sessions = RoundSessions(enabled=False)
        before = copy.wire_bytes()
        assert copy.round().named == IDLE + 1
        without = copy.wire_bytes() - before
        assert with_session * 10 < without, f"an idle round took {with_session} bytes with a session, " \
            f"{without} without"
    source_records = _by_partition(source_cluster.read_all(topic))
    assert _by_partition(target_cluster.read_all(target_topic)) == source_records
    assert len(source_records[0]) == 3 + sum(4 + n for n in range(5))


def _meddle(source, leader: int, session_id: int, epoch: int) -> None:
    """Another client sends a request naming our session: with epoch -1 it closes the session (as an eviction
    would), with the session's current epoch it uses up that epoch."""
    broker = source._manager.cluster.broker_metadata(leader)
    competitor = FastConnection(broker.host, broker.port, client_id="competitor")
    try:
        answer = competitor.fetch(min_version=13, max_version=18, max_wait_ms=0, min_bytes=1, max_bytes=1024,
                                  isolation_level=1, topics=[], session_id=session_id, session_epoch=epoch)
        assert answer.error_code == 0
    finally:
        competitor.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss", ["closed", "epoch_taken"])
def test_a_lost_session_costs_one_full_request_and_the_copy_stays_exact(source_cluster, target_cluster, clients,
                                                                        route, loss, unique_name):
    """``closed``: another client closes our session by its id (what eviction looks like to us: the next request
    gets FETCH_SESSION_ID_NOT_FOUND); ``epoch_taken``: another client sends a request in our session, so ours
    arrives with a stale epoch (INVALID_FETCH_SESSION_EPOCH)."""
    source, target = clients
    topic = unique_name(f"{route}-{loss}")
    target_topic = f"fs.{topic}"
    source_cluster.create_topic(topic, partitions=4)
    target_cluster.create_topic(target_topic, partitions=4)
    sessions = RoundSessions()
    copy = _RoundCopy(source, target, topic, target_topic, 4, sessions)
    for p in range(4):
        _produce(source_cluster, topic, p, 5, "before")
    copy.round()
    copy.round()
    leader = copy.fetchers[0].locate()[0]
    ours = sessions.session(leader)
    assert ours.active, "the broker gave the rounds a session"
    _meddle(source, leader, ours.session_id, -1 if loss == "closed" else ours.epoch)
    for p in (1, 3):
        _produce(source_cluster, topic, p, 7, "during")
    lost = copy.round()        # asked incrementally, refused, asked again in full: no error reaches the caller
    assert (lost.sessions_lost, lost.requests, lost.answered) == (1, 2, 4)
    assert ours.stats.sessions_lost == 1 and ours.active, "a new session replaced the lost one"
    for p in range(4):
        _produce(source_cluster, topic, p, 2, "after")
    copy.round()
    copy.round()
    assert copy.stats.sessions_lost == 1
    source_records = _by_partition(source_cluster.read_all(topic))
    assert _by_partition(target_cluster.read_all(target_topic)) == source_records
    assert [len(source_records[p]) for p in range(4)] == [7, 14, 7, 14]


@pytest.mark.timeout(60)
def test_a_single_partition_fetcher_with_a_session_reads_its_range_exactly_across_a_lost_session(
        source_cluster, clients, unique_name):
    source, _ = clients
    topic = unique_name()
    source_cluster.create_topic(topic)
    for n in range(4):           # four batches: a fetch of at most 256 bytes takes one at a time
        _produce(source_cluster, topic, 0, 10, f"x{n}")
    fetcher = RawBatchFetcher(source, topic, 0, 0, 60, max_bytes=256, max_wait_ms=50, fetch_session=True)
    got = []
    for _ in range(3):
        got += _values(fetcher.fetch())
    leader, session = fetcher._session
    assert session.active and session.stats.incremental_requests >= 1
    _meddle(source, leader, session.session_id, -1)
    _produce(source_cluster, topic, 0, 20, "y")
    deadline = time.monotonic() + 30
    while not fetcher.done and time.monotonic() < deadline:
        got += _values(fetcher.fetch())
    assert session.stats.sessions_lost == 1
    assert got == [r.value for r in source_cluster.read_all(topic)][:60] and len(got) == 60


def _values(result) -> list[bytes]:
    return [decode_record_tail(r.tail)[1] for view in result.batches for r in read_records(view)]


@pytest.fixture(scope="module")
def no_sessions_source(session_sandbox, tmp_path_factory):
    """A source broker with fetch sessions turned off: it answers every session request with session id 0."""
    session_sandbox.ensure("target")
    with private_broker("no-sessions", tmp_path_factory,
                        extra_properties="max.incremental.fetch.session.cache.slots=0\n") as cluster:
        yield cluster


@pytest.mark.timeout(240)
def test_a_broker_that_refuses_sessions_gets_full_requests_and_the_copy_is_exact(no_sessions_source,
                                                                                 target_cluster, route, unique_name):
    topic = unique_name(route)
    target_topic = f"fs.{topic}"
    no_sessions_source.create_topic(topic, partitions=3)
    target_cluster.create_topic(target_topic, partitions=3)
    with WireClient.for_cluster(no_sessions_source.config, fast_path=route == "fast") as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        copy = _RoundCopy(source, target, topic, target_topic, 3, RoundSessions())
        for n in range(3):
            for p in range(3):
                _produce(no_sessions_source, topic, p, 2 + n, f"r{n}")
            stats = copy.round()
            assert (stats.incremental, stats.named, stats.answered, stats.sessions_lost) == (0, 3, 3, 0)
        session = copy.sessions.session(copy.fetchers[0].locate()[0])
        assert not session.active and session.stats.full_requests == 3
    source_records = _by_partition(no_sessions_source.read_all(topic))
    assert _by_partition(target_cluster.read_all(target_topic)) == source_records
    assert [len(source_records[p]) for p in range(3)] == [9, 9, 9]


@pytest.mark.timeout(60)
def test_sessions_work_over_the_sasl_ssl_fast_path(secure_source_cluster, source_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic, partitions=4)
    for p in range(4):
        _produce(source_cluster, topic, p, 3, "tls")
    with WireClient.for_cluster(secure_source_cluster.config) as source:
        fetchers = [RawBatchFetcher(source, topic, p, 0, None, max_wait_ms=50) for p in range(4)]
        assert source.fast_connection(fetchers[0].locate()[0]).tls_version is not None
        stats = RoundStats()
        sessions = RoundSessions()
        got = []
        for _ in range(4):
            outcomes = fetch_round(source, fetchers, max_bytes=1 << 20, max_wait_ms=50, stats=stats,
                                   sessions=sessions)
            assert all(o.error is None for o in outcomes)
            got += [v for o in outcomes for v in _values(o.result)]
    assert (stats.requests, stats.incremental, stats.answered) == (4, 3, 4)
    assert sorted(got) == sorted(r.value for r in source_cluster.read_all(topic))


@pytest.mark.timeout(60)
def test_a_broker_dealt_over_several_connections_keeps_one_session_per_connection(source_cluster, unique_name):
    from mirror_core.kafka.broker_fetch import send_round

    topic = unique_name()
    source_cluster.create_topic(topic, partitions=4)
    for p in range(4):
        _produce(source_cluster, topic, p, 3, "slots")
    with WireClient.for_cluster(source_cluster.config) as source:
        fetchers = [RawBatchFetcher(source, topic, p, 0, None, max_wait_ms=50) for p in range(4)]
        sessions, stats = RoundSessions(), RoundStats()
        got = []
        for _ in range(4):
            outcomes = send_round(source, fetchers, max_bytes=1 << 20, max_wait_ms=50, stats=stats,
                                  connections=2, sessions=sessions).collect()
            assert all(o.error is None for o in outcomes)
            got += [v for o in outcomes for v in _values(o.result)]
        leader = fetchers[0].locate()[0]
        assert source.fast_connection(leader, 1) is not source.fast_connection(leader)
    assert sorted(sessions.by_broker) == [(leader, 0), (leader, 1)]
    assert all(s.active and s.stats.sessions_lost == 0 for s in sessions.by_broker.values())
    assert (stats.requests, stats.incremental, stats.answered) == (8, 6, 4)
    assert sorted(got) == sorted(r.value for r in source_cluster.read_all(topic))


def _incremental_probe(address: tuple[str, int], session_id: int, epoch: int) -> int:
    """The error code a broker gives an incremental request (no partitions) in session ``session_id`` at
    ``epoch``, sent by an outsider: 0 while the session lives (and its epoch matches), 70 once it is gone."""
    probe = FastConnection(*address, client_id="probe")
    try:
        return probe.fetch(min_version=7, max_version=18, max_wait_ms=0, min_bytes=1, max_bytes=1024,
                           isolation_level=1, topics=[], session_id=session_id, session_epoch=epoch).error_code
    finally:
        probe.close()


@pytest.mark.timeout(60)
def test_closing_a_client_closes_its_fetch_sessions_on_the_broker(source_cluster, route, unique_name):
    """KIP-227: a client that goes away closes its sessions (their id at FINAL_EPOCH, no partitions), so they stop
    holding slots of the broker's session cache. After ``WireClient.close`` the broker answers the old session id
    and epoch with FETCH_SESSION_ID_NOT_FOUND; a session of a client still open keeps answering."""
    topic = unique_name(route)
    source_cluster.create_topic(topic, partitions=3)
    for p in range(3):
        _produce(source_cluster, topic, p, 4, "bye")

    def client_with_a_session():
        client = WireClient.for_cluster(source_cluster.config, fast_path=route == "fast")
        fetchers = [RawBatchFetcher(client, topic, p, 0, None, max_wait_ms=50) for p in range(3)]
        for _ in range(2):      # the client's own sessions (round_sessions), as the daemon and shoal copy use them
            assert all(o.error is None for o in fetch_round(client, fetchers, max_bytes=1 << 20, max_wait_ms=50))
        leader = fetchers[0].locate()[0]
        session = round_sessions(client).session(leader)
        assert session.active, "the rounds run in a session"
        broker = client._manager.cluster.broker_metadata(leader)
        return client, (broker.host, broker.port), session.session_id, session.epoch

    closing, address, closed_id, closed_epoch = client_with_a_session()
    staying, kept_address, kept_id, kept_epoch = client_with_a_session()
    try:
        closing.close()
        assert _incremental_probe(address, closed_id, closed_epoch) == FETCH_SESSION_ID_NOT_FOUND
        assert _incremental_probe(kept_address, kept_id, kept_epoch) == 0, "the other client's session is untouched"
    finally:
        staying.close()
    assert _incremental_probe(kept_address, kept_id, next_epoch(kept_epoch)) == FETCH_SESSION_ID_NOT_FOUND, \
        "closed with its client"


@pytest.mark.timeout(60)
def test_a_session_with_a_long_poll_still_unanswered_is_closed_too(source_cluster, unique_name):
    """What a stopping daemon leaves: the round it sent ahead, a long poll nobody will read, still on the session's
    connection. The goodbye must not queue behind it (the broker answers a connection's requests in order, and the
    poll here lasts 20 s against a goodbye of at most a second): it goes out on a fresh connection."""
    from mirror_core.kafka.broker_fetch import send_round

    topic = unique_name()
    source_cluster.create_topic(topic, partitions=2)
    for p in range(2):
        _produce(source_cluster, topic, p, 3, "poll")
    client = WireClient.for_cluster(source_cluster.config)
    try:
        fetchers = [RawBatchFetcher(client, topic, p, 0, None, max_wait_ms=50) for p in range(2)]
        for _ in range(2):
            assert all(o.error is None for o in fetch_round(client, fetchers, max_bytes=1 << 20, max_wait_ms=50))
        leader = fetchers[0].locate()[0]
        session = round_sessions(client).session(leader)
        session_id, epoch = session.session_id, session.epoch
        send_round(client, fetchers, max_bytes=1 << 20, max_wait_ms=20_000)   # at the end: the broker waits
        assert client.fast_connection(leader).in_flight == 1
        broker = client._manager.cluster.broker_metadata(leader)
    finally:
        client.close()
    # the unanswered request may have taken the epoch or not: either way the session must be gone
    for probe_epoch in (epoch, next_epoch(epoch)):
        assert _incremental_probe((broker.host, broker.port), session_id, probe_epoch) == FETCH_SESSION_ID_NOT_FOUND
