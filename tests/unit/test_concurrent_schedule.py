"""The concurrent copy's pure scheduling: which lanes a round fetches for, and how large a round's request is."""

from __future__ import annotations

from mirror_core.concurrent_copy import _Lane, plan_round, request_max_bytes
from mirror_core.copier import CopyResult, PartitionRange


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
    from mirror_core.concurrent_copy import connections_for_link

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

    from mirror_core.concurrent_copy import ConcurrentCopy
    from mirror_core.errors import DataLossError, PartitionUnavailableError
    from mirror_core.shared_produce import SharedProduce

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
    with caplog.at_level(logging.ERROR, logger="mirror_core.concurrent_copy"), \
            pytest.raises(DataLossError):
        copy._write_round(shares, lambda rng, result: progressed.append(rng.partition))
    copy.shared.close()
    logged = caplog.text
    assert "t-0" in logged and "PartitionUnavailableError" in logged
    assert "t-1" in logged and "DataLossError" in logged
    assert progressed == [2]


def test_most_severe_puts_an_interrupt_first_then_what_no_retry_cures():
    from mirror_core.concurrent_copy import most_severe
    from mirror_core.errors import DataLossError, PartitionUnavailableError

    retriable = PartitionUnavailableError("src", "t", 0, "x")
    loss = DataLossError("src", "t", 1, 7, 20)
    interrupt = KeyboardInterrupt()
    assert most_severe([retriable, loss]) is loss
    assert most_severe([retriable, loss, interrupt]) is interrupt
    assert most_severe([retriable, PartitionUnavailableError("src", "t", 2, "y")]) is retriable
