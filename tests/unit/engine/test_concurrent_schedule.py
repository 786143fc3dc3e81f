"""The concurrent copy's pure scheduling: which lanes a round fetches for, and how large a round's request is."""

from __future__ import annotations

from mirror_core.engine.concurrent_copy import _Lane, plan_round, request_max_bytes
from mirror_core.engine.copier import CopyResult
from mirror_core.model.ranges import PartitionRange


class _Position:
    """Stands in for a fetcher: only ``done`` is read by the scheduler."""

    def __init__(self, done: bool):
        self.done = done


def _lane(partition: int, *, done: bool = False, retry_at: float = 0.0) -> _Lane:
    rng = PartitionRange("t", partition, 0, 10, "t", partition)
    return _Lane(rng, writer=None, fetcher=_Position(done), result=CopyResult(rng, 0, 0), retry_at=retry_at)


def test_a_round_carries_every_unfinished_lane_not_sitting_out_a_retry():
    lanes = [_lane(0), _lane(1, done=True), _lane(2, retry_at=105.0), _lane(3, retry_at=99.0)]
    assert [lane.range.partition for lane in plan_round(lanes, now=100.0)] == [0, 3]
    assert [lane.range.partition for lane in plan_round(lanes, now=105.0)] == [0, 2, 3]


def test_nothing_to_fetch_once_every_lane_is_done():
    assert plan_round([_lane(0, done=True), _lane(1, done=True)], now=0.0) == []


def test_every_partition_of_a_round_can_bring_a_full_fetch():
    assert request_max_bytes(4 << 20, 4) == 16 << 20
    assert request_max_bytes(4 << 20, 0) == 4 << 20


def test_a_round_of_many_partitions_asks_for_no_more_than_the_round_cap():
    # 1,000 partitions of 4 MiB each would be 4 GiB; the cap keeps the whole round at 64 MiB
    assert request_max_bytes(4 << 20, 1000, leaders=1, round_max_bytes=64 << 20) == 64 << 20
    # the cap is shared by the round's requests (one per source leader)
    assert request_max_bytes(4 << 20, 500, leaders=2, round_max_bytes=64 << 20) == 32 << 20
    assert request_max_bytes(4 << 20, 500, leaders=3, round_max_bytes=64 << 20) * 3 <= 64 << 20


def test_a_round_under_the_cap_still_asks_every_partition_for_a_full_fetch():
    assert request_max_bytes(4 << 20, 4, leaders=1, round_max_bytes=64 << 20) == 16 << 20
    assert request_max_bytes(4 << 20, 2, leaders=3, round_max_bytes=64 << 20) == 8 << 20


def test_a_tiny_cap_still_asks_for_something():
    assert request_max_bytes(4 << 20, 10, leaders=100, round_max_bytes=10) == 1


def test_connections_for_link_spread_a_small_send_buffer_over_several_connections():
    from mirror_core.engine.concurrent_copy import connections_for_link

    # 100 kB send buffer at 200 ms: 0.5 MB/s per connection; a 1.5 MB/s link needs 3
    assert connections_for_link(window_bytes=100_000, rtt_s=0.2, link_bytes_per_s=1.5e6, partitions=8) == 3
    assert connections_for_link(window_bytes=100_000, rtt_s=0.2, link_bytes_per_s=20e6, partitions=8) == 4  # most
    assert connections_for_link(window_bytes=100_000, rtt_s=0.2, link_bytes_per_s=20e6, partitions=2) == 2
    assert connections_for_link(window_bytes=100_000, rtt_s=0.001, link_bytes_per_s=20e6, partitions=8) == 1
    assert connections_for_link(window_bytes=-1, rtt_s=0.2, link_bytes_per_s=20e6, partitions=8) == 1  # autotuned
    assert connections_for_link(window_bytes=None, rtt_s=None, link_bytes_per_s=20e6, partitions=8) == 1


def test_every_failed_lanes_error_is_logged_and_a_data_loss_is_raised_before_a_retriable_error(caplog):
    """Before the fix the round raised the first failed lane's error and dropped the others unlogged: a data loss
    on lane 1 hid behind lane 0's retriable error (and a rerun would only meet it by luck)."""
    import logging

    import pytest

    from mirror_core.engine.concurrent_copy import ConcurrentCopy
    from mirror_core.errors import DataLossError, PartitionUnavailableError
    from mirror_core.kafka.shared_produce import SharedProduce

    copy = ConcurrentCopy.__new__(ConcurrentCopy)
    copy.shared = SharedProduce()
    errors = {0: PartitionUnavailableError("src", "t", 0, "NotLeaderForPartitionError", offset=5),
              1: DataLossError("src", "t", 1, 7, 20), 2: None}

    def write_share(lane, start, outcome):
        if errors[lane.range.partition] is not None:
            raise errors[lane.range.partition]

    copy._write_share = write_share
    shares = [((_lane(p), 0), None) for p in range(3)]
    progressed = []
    with caplog.at_level(logging.ERROR, logger="mirror_core.engine.concurrent_copy"), \
            pytest.raises(DataLossError):
        copy._write_round(shares, lambda rng, result: progressed.append(rng.partition))
    copy.shared.close()
    logged = caplog.text
    assert "t-0" in logged and "PartitionUnavailableError" in logged
    assert "t-1" in logged and "DataLossError" in logged
    assert progressed == [2]


def test_most_severe_puts_an_interrupt_first_then_what_no_retry_cures():
    from mirror_core.engine.concurrent_copy import most_severe
    from mirror_core.errors import DataLossError, PartitionUnavailableError

    retriable = PartitionUnavailableError("src", "t", 0, "x")
    loss = DataLossError("src", "t", 1, 7, 20)
    interrupt = KeyboardInterrupt()
    assert most_severe([retriable, loss]) is loss
    assert most_severe([retriable, loss, interrupt]) is interrupt
    assert most_severe([retriable, PartitionUnavailableError("src", "t", 2, "y")]) is retriable


class _LedFetcher:
    """Stands in for a fetcher in send_round: partition p is led by broker 1 + p % brokers (round-robin leaders)."""

    def __init__(self, partition: int, brokers: int = 2):
        self.topic, self.topic_id, self.partition, self.brokers = "t", None, partition, brokers

    def locate(self):
        return 1 + self.partition % self.brokers, 0

    def spec(self, epoch):
        from mirror_core.codec.fetch_messages import FetchPartitionSpec
        return FetchPartitionSpec(self.partition, epoch, 0, 1)


def _sent_requests(monkeypatch, fetchers, connections, rotation):
    import mirror_core.kafka.broker_fetch as broker_fetch
    from mirror_core.kafka.broker_fetch import RoundSessions

    sent = []
    def send_fetch(client, leader, topics, **kw):
        sent.append((leader, kw.get("slot", 0), sorted(p.partition for t in topics for p in t.partitions),
                     kw["max_bytes"]))
        return object()

    monkeypatch.setattr(broker_fetch, "send_fetch", send_fetch)
    broker_fetch.send_round(None, fetchers, max_bytes=1, max_wait_ms=1, rotation=rotation, connections=connections,
                            sessions=RoundSessions(enabled=False))
    return sent


def test_round_robin_leaders_fill_every_connection_and_keep_each_partition_on_its_connection(monkeypatch):
    """2 brokers with round-robin leaders, 2 connections each: before the fix every partition of a broker (all even,
    or all odd) went to one connection (partition % 2) and the other stayed idle."""
    fetchers = [_LedFetcher(p) for p in range(8)]
    first = _sent_requests(monkeypatch, fetchers, connections=2, rotation=1)
    assert sorted((leader, slot, parts) for leader, slot, parts, _ in first) == [
        (1, 0, [0, 4]), (1, 1, [2, 6]), (2, 0, [1, 5]), (2, 1, [3, 7])]
    for rotation in (2, 3, 7):  # later rounds: same connection per partition (its fetch session stays)
        again = _sent_requests(monkeypatch, list(reversed(fetchers)), connections=2, rotation=rotation)
        assert sorted((leader, slot, parts) for leader, slot, parts, _ in again) == \
            sorted((leader, slot, parts) for leader, slot, parts, _ in first)


def test_a_rounds_request_size_comes_from_the_shares_send_round_builds(monkeypatch):
    """Before the fix the concurrent copy sized each request for ceil(partitions / connections) while send_round
    put all of a broker's partitions on one connection: each request asked for half of what its partitions need."""
    from mirror_core.engine.concurrent_copy import round_shape
    from mirror_core.kafka.broker_fetch import deal_to_connections

    fetchers = [_LedFetcher(p, brokers=3) for p in range(11)]
    by_leader: dict[int, list] = {}
    for f in fetchers:
        by_leader.setdefault(f.locate()[0], []).append((f.topic, f.partition))
    for connections in (1, 2, 3, 4):
        sent = _sent_requests(monkeypatch, fetchers, connections=connections, rotation=5)
        requests, busiest = round_shape(by_leader, connections)
        assert requests == len(sent)
        assert busiest == max(len(parts) for _, _, parts, _ in sent)
    assert deal_to_connections([], 2) == []
    assert deal_to_connections([("t", 9), ("t", 1), ("s", 5)], 5) == [[2], [1], [0]]
