"""The daemon's standing fetch round (mirror_core.daemon.standing_round) on the real sandbox brokers, on both request
routes.

What a user notices: after the first round, a round hands back only the partitions with news — the busy one — and
its request names only the partition whose position moved; idle partitions cost nothing, on the wire or in the
round's answer. A lost session (closed or evicted: FETCH_SESSION_ID_NOT_FOUND; its epoch taken:
INVALID_FETCH_SESSION_EPOCH) costs one full request naming every member, and the copy stays exact (the target read
back and compared with the source, record by record).
"""

from __future__ import annotations

import pytest

from mirror_core.daemon.standing_round import StandingRound
from mirror_core.engine.concurrent_copy import plain_share_writer
from mirror_core.engine.copier import CopyOptions, FetchedOnce
from mirror_core.kafka.broker_fetch import RoundSessions, RoundStats
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.model.ranges import PartitionRange
from tests.integration.kafka.test_fetch_sessions import (  # noqa: F401 - clients and route are fixtures
    _by_partition,
    _meddle,
    _produce,
    clients,
    route,
)

pytestmark = pytest.mark.integration

IDLE = 30


class _StandingCopy:
    """Open-ended copy of every partition of ``topic`` through a standing round: each round's news written with the
    partition's own writer (mode ``none``), as the daemon's lanes do."""

    def __init__(self, source, target, topic: str, target_topic: str, partitions: int):
        self.rounds = StandingRound(source, max_bytes=8 << 20, max_wait_ms=50, sessions=RoundSessions())
        self.fetchers = {f"{topic}-{p}": RawBatchFetcher(source, topic, p, 0, None, max_bytes=1 << 20,
                                                         max_wait_ms=50) for p in range(partitions)}
        self.writers = {f"{topic}-{p}": plain_share_writer(source, target, CopyOptions(),
                                                           PartitionRange(topic, p, 0, 2**62, target_topic, p))
                        for p in range(partitions)}

    def round(self) -> tuple[set[str], RoundStats]:
        """One round; returns the lanes it handed out and its counters. No lane may come back with an error."""
        stats = RoundStats()
        self.rounds.sync(list(self.fetchers.items()))
        news = self.rounds.send(stats=stats).collect()
        for lane, fetcher, start, outcome in news:
            assert outcome.error is None, f"{lane}: {outcome.error!r}"
            assert outcome.result.next_offset == fetcher.position
            if fetcher.position > start:
                self.writers[lane].copy_share(start, fetcher.position, FetchedOnce(outcome.result, start),
                                              start == 0)
        return {lane for lane, *_ in news}, stats


@pytest.mark.timeout(120)
def test_a_round_hands_out_only_the_busy_partition_and_names_only_what_moved(source_cluster, target_cluster,
                                                                             clients, route, unique_name):  # noqa: F811
    source, target = clients
    topic = unique_name(f"standing-{route}")
    target_topic = f"fs.{topic}"
    source_cluster.create_topic(topic, partitions=IDLE + 1)
    target_cluster.create_topic(target_topic, partitions=IDLE + 1)
    for p in range(IDLE + 1):
        _produce(source_cluster, topic, p, 3, "first")
    copy = _StandingCopy(source, target, topic, target_topic, IDLE + 1)
    news, first = copy.round()
    assert len(news) == IDLE + 1 and (first.incremental, first.named) == (0, IDLE + 1)
    news, second = copy.round()   # every position moved: all named once; nothing new
    assert news == set() and (second.incremental, second.named, second.answered) == (1, IDLE + 1, 0)
    for n in range(4):
        _produce(source_cluster, topic, 0, 4 + n, f"busy{n}")
        news, busy = copy.round()
        assert news == {f"{topic}-0"}, "only the busy partition is handed out"
        assert busy.partitions == IDLE + 1 and busy.named == (0 if n == 0 else 1)
    news, idle = copy.round()
    news, idle = copy.round()
    assert news == set() and (idle.named, idle.answered) == (0, 0)
    assert copy.rounds.audit() == [], "the books agree with the broker's session"
    source_records = _by_partition(source_cluster.read_all(topic))
    assert _by_partition(target_cluster.read_all(target_topic)) == source_records
    assert len(source_records[0]) == 3 + sum(4 + n for n in range(4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss", ["closed", "epoch_taken"])
def test_a_lost_session_is_asked_again_in_full_naming_every_member_and_stays_exact(
        source_cluster, target_cluster, clients, route, loss, unique_name):  # noqa: F811
    source, target = clients
    topic = unique_name(f"standing-{route}-{loss}")
    target_topic = f"fs.{topic}"
    source_cluster.create_topic(topic, partitions=4)
    target_cluster.create_topic(target_topic, partitions=4)
    copy = _StandingCopy(source, target, topic, target_topic, 4)
    for p in range(4):
        _produce(source_cluster, topic, p, 5, "before")
    copy.round()
    copy.round()
    leader = copy.fetchers[f"{topic}-0"].locate()[0]
    ours = copy.rounds.sessions.session(leader)
    assert ours.active
    _meddle(source, leader, ours.session_id, -1 if loss == "closed" else ours.epoch)
    for p in (1, 3):
        _produce(source_cluster, topic, p, 7, "during")
    news, lost = copy.round()
    assert (lost.sessions_lost, lost.requests) == (1, 2)
    assert lost.named == 4, "the full request after the loss names every member (the incremental one named none)"
    assert news == {f"{topic}-{p}" for p in range(4)} and ours.active, "a full answer names every partition"
    for p in range(4):
        _produce(source_cluster, topic, p, 2, "after")
    copy.round()
    copy.round()
    source_records = _by_partition(source_cluster.read_all(topic))
    assert _by_partition(target_cluster.read_all(target_topic)) == source_records
    assert [len(source_records[p]) for p in range(4)] == [7, 14, 7, 14]
