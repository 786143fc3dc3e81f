"""A fetch round the daemon gives up (no lane left to copy it into) must not stay queued on the source connection:
the broker answers a connection's requests in order, so the next round would wait behind the dropped round's long
poll and read its stale answer first. :meth:`PendingRound.discard` (what the daemon calls) leaves nothing of it."""

from __future__ import annotations

import time

import pytest

from mirror_core.kafka.broker_fetch import send_round
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient

LONG_POLL_MS = 6000


@pytest.mark.timeout(60)
def test_the_round_after_a_discarded_one_reads_its_own_answer_without_waiting_behind_it(source_cluster,
                                                                                       unique_name):
    idle, busy = unique_name("idle"), unique_name("busy")
    source_cluster.create_topic(idle)
    source_cluster.create_topic(busy)
    source_cluster.produce(busy, [(b"k", b"v%d" % i) for i in range(10)])
    with WireClient.for_cluster(source_cluster.config, fast_path=True) as client:
        parked = RawBatchFetcher(client, idle, 0, 0, None, max_wait_ms=LONG_POLL_MS)
        dropped = send_round(client, [parked], max_bytes=1 << 20, max_wait_ms=LONG_POLL_MS)  # a long poll, parked
        time.sleep(0.2)  # the broker holds it now
        dropped.discard()
        fetcher = RawBatchFetcher(client, busy, 0, 0, None, max_wait_ms=100)
        started = time.monotonic()
        [outcome] = send_round(client, [fetcher], max_bytes=1 << 20, max_wait_ms=100).collect()
        waited = time.monotonic() - started
    assert outcome.error is None, outcome.error
    assert fetcher.position == 10 and parked.position == 0, "each round moved only its own fetcher"
    # before discard() the daemon just forgot the round: this answer came after the parked long poll's (~6 s)
    assert waited < LONG_POLL_MS / 1000 / 2, f"the next round waited {waited:.1f}s behind the dropped round"
