"""Review attacks on the daemon's standing fetch round (mirror_core.daemon.standing_round) on the real sandbox brokers,
both request routes: what a real broker's incremental fetch session does when the lane's own position moves while the
broker has nothing new to say, and when retention deletes past a lagging lane.

- records deleted (DeleteRecords, as retention would) past a lane that is behind, while its broker's session is
  incremental: the next round must say DataLossError for that lane — never hand out a share that starts past the
  deleted range (a silent skip);
- a lane reopened at its checkpoint below the offset its broker's session keeps, with no new data anywhere (the
  broker's high watermark does not move, so it has no reason of its own to name the partition): the round must
  fetch again from the checkpoint, every record of ``[checkpoint, old position)``.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.daemon.standing_round import StandingRound
from mirror_core.errors import DataLossError, TopicRecreatedError
from mirror_core.kafka.broker_fetch import RoundSessions, RoundStats
from mirror_core.kafka.fetcher import RawBatchFetcher
from tests.integration.kafka.test_fetch_sessions import clients, route  # noqa: F401 - fixtures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _produce_batches(cluster, topic: str, partition: int, n: int) -> None:
    for i in range(n):   # one batch per record: a fetch with a tiny partition budget takes one batch at a time
        cluster.produce(topic, [(b"k%d" % i, b"v%d" % i)], partition=partition, **{"linger.ms": 0})


def _round(rounds: StandingRound, fetchers: dict, stats: RoundStats | None = None) -> dict:
    rounds.sync(list(fetchers.items()))
    return {lane: (start, outcome) for lane, _f, start, outcome in rounds.send(stats=stats).collect()}


def test_records_deleted_past_a_lagging_lane_in_an_incremental_session_are_data_loss_never_a_skip(
        source_cluster, clients, unique_name):  # noqa: F811
    source, _target = clients
    topic = unique_name("standing-loss")
    source_cluster.create_topic(topic, partitions=2)
    _produce_batches(source_cluster, topic, 0, 10)
    _produce_batches(source_cluster, topic, 1, 1)
    # a partition budget of one byte: the broker still returns one whole batch (KIP-74), so lane 0 lags behind
    fetchers = {f"{topic}-{p}": RawBatchFetcher(source, topic, p, 0, None, max_bytes=1, max_wait_ms=50)
                for p in range(2)}
    lagging = fetchers[f"{topic}-0"]
    rounds = StandingRound(source, max_bytes=1 << 20, max_wait_ms=50, sessions=RoundSessions())
    _round(rounds, fetchers)
    stats = RoundStats()
    _round(rounds, fetchers, stats)
    assert stats.incremental == 1 and 0 < lagging.position < 8, "lane 0 lags inside an incremental session"
    behind = lagging.position
    admin = AdminClient(source_cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 0, 8)]).values():
        future.result(30)
    for _ in range(3):
        news = _round(rounds, fetchers)
        if f"{topic}-0" in news:
            break
    start, outcome = news[f"{topic}-0"]
    assert start == behind and isinstance(outcome.error, DataLossError), \
        f"records [{behind}, 8) deleted before they were copied must halt as data loss, got {outcome!r}"
    assert lagging.position == behind, "the position never moves past records that were not copied"


def test_a_lane_reopened_below_the_offset_its_session_keeps_fetches_again_from_its_checkpoint(
        source_cluster, clients, unique_name):  # noqa: F811
    source, _target = clients
    topic = unique_name("standing-reset")
    source_cluster.create_topic(topic, partitions=3)
    for p in range(3):
        _produce_batches(source_cluster, topic, p, 6)
    fetchers = {f"{topic}-{p}": RawBatchFetcher(source, topic, p, 0, None, max_bytes=1 << 20, max_wait_ms=50)
                for p in range(3)}
    rounds = StandingRound(source, max_bytes=1 << 20, max_wait_ms=50, sessions=RoundSessions())
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    assert _round(rounds, fetchers) == {} and all(f.position == 6 for f in fetchers.values())
    lane = f"{topic}-1"
    fetchers[lane] = RawBatchFetcher(source, topic, 1, 2, None, max_bytes=1 << 20, max_wait_ms=50)  # checkpoint 2
    got = []
    for _ in range(3):
        news = _round(rounds, fetchers)
        assert set(news) <= {lane}
        if lane in news:
            start, outcome = news[lane]
            assert outcome.error is None, repr(outcome.error)
            got += [b.base_offset for b in outcome.result.batches]
        if fetchers[lane].position == 6:
            break
    assert fetchers[lane].position == 6 and got == [2, 3, 4, 5], f"refetched {got} from the checkpoint"
    twin = f"{topic}-2"   # reopened at the very offset its session keeps: told, with the broker's ends, no error
    fetchers[twin] = RawBatchFetcher(source, topic, 2, 6, None, max_bytes=1 << 20, max_wait_ms=50)
    news = _round(rounds, fetchers)
    assert set(news) == {twin} and news[twin][1].error is None and news[twin][1].result.high_watermark == 6
    assert rounds.audit() == []


@pytest.mark.parametrize("how", ["deleted", "recreated"])
def test_a_deleted_or_recreated_topic_in_an_incremental_session_is_told_every_round_never_fetched_anew(
        source_cluster, clients, unique_name, how):  # noqa: F811
    """The broker answers UNKNOWN_TOPIC_ID for a session's partition of a deleted topic; a topic recreated under the
    same name has a new id and a new log from offset 0: a lane standing at 4 on the old log must be told (a
    recreated topic: TopicRecreatedError) round after round, and never be handed data of the new log."""
    source, _target = clients
    topic = unique_name(f"standing-{how}")
    other = unique_name(f"standing-{how}-other")
    source_cluster.create_topic(topic, partitions=1)
    source_cluster.create_topic(other, partitions=1)
    _produce_batches(source_cluster, topic, 0, 4)
    _produce_batches(source_cluster, other, 0, 1)
    fetchers = {name: RawBatchFetcher(source, name, 0, 0, None, max_bytes=1 << 20, max_wait_ms=50)
                for name in (topic, other)}
    rounds = StandingRound(source, max_bytes=1 << 20, max_wait_ms=50, sessions=RoundSessions())
    _round(rounds, fetchers)
    _round(rounds, fetchers)
    assert fetchers[topic].position == 4
    admin = AdminClient(source_cluster.config.confluent())
    admin.delete_topics([topic])[topic].result(30)
    if how == "recreated":
        for _ in range(60):
            try:
                source_cluster.create_topic(topic, partitions=1)
                break
            except Exception:  # noqa: BLE001 - the deletion is still being finished
                time.sleep(0.5)
        _produce_batches(source_cluster, topic, 0, 8)
    errors = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(errors) < 3:
        news = _round(rounds, fetchers)
        if topic in news:
            _start, outcome = news[topic]
            assert outcome.error is not None, f"the {how} topic handed out {outcome.result!r}"
            errors.append(outcome.error)
        time.sleep(0.2)
    assert len(errors) >= 3, f"the {how} topic was told {errors!r} in 30 s of rounds: a silent stall"
    assert fetchers[topic].position == 4
    if how == "recreated":
        assert any(isinstance(e, TopicRecreatedError) for e in errors), errors
    assert fetchers[other].position == 1
