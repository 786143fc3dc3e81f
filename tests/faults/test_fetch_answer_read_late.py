"""Hole (review of the prefetch overlap): a Fetch sent ahead while the caller writes was failed with
RequestTimedOutError when the write phase outlasted its timeout, although the broker had not been silent: the fast
connection started a request's timeout clock when it was *sent*, and the answer is only read after the write. Two
partitions' prefetches on one connection show it deterministically: the broker answers a connection's requests one
at a time, so the second long poll starts only when the first is answered, and its answer arrives after its
send-time deadline even though the broker was never silent for the timeout once we were listening. Now the clock
starts when we start waiting for the answer (``FastConnection._read_one``): both prefetches are taken, nothing is
fetched twice or skipped.
"""

from __future__ import annotations

import time

import pytest

from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient

LONG_POLL_MS = 2000      # the broker holds each (empty) fetch this long
REQUEST_TIMEOUT_MS = 500  # a fetch's timeout is this plus the long poll: 2.5 s
WRITE_PHASE_S = 3.0       # longer than that: the first answer is waiting, the second is still to come (at ~4 s)


@pytest.mark.timeout(60)
def test_prefetched_fetches_read_after_a_long_write_are_not_timed_out(source_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic, partitions=2)
    with WireClient.for_cluster(source_cluster.config) as source:
        for p in range(2):   # a new topic's leaders may not know their epoch yet: wait until both answer
            RawBatchFetcher(source, topic, p, 0, None, max_wait_ms=10, retry_timeout_s=30).fetch()
        source.request_timeout_ms = REQUEST_TIMEOUT_MS
        fetchers = [RawBatchFetcher(source, topic, p, 0, None, max_wait_ms=LONG_POLL_MS, retry_timeout_s=0)
                    for p in range(2)]
        assert all(fetcher.prefetch() for fetcher in fetchers)
        conn = source.fast_connection(source.leader_for(topic, 0)[0])
        assert conn is not None and conn is source.fast_connection(source.leader_for(topic, 1)[0]), \
            "both prefetches travel on one connection (the sandbox source is one broker)"
        time.sleep(WRITE_PHASE_S)            # the caller writes the previous share meanwhile
        results = [fetcher.fetch() for fetcher in fetchers]   # each takes its own prefetch's answer
        assert not conn.closed, "a prefetched answer read late closed the connection as timed out"
        assert all(not result.batches and result.next_offset == 0 for result in results)
        for p in range(2):
            source_cluster.produce(topic, [(b"k", b"after-%d" % p)], partition=p)
        # the next fetches read what was produced since: nothing skipped, nothing twice
        got = {fetcher.partition: [v for v in _values(fetcher)] for fetcher in fetchers}
    expected = {r.partition: [r.value] for r in source_cluster.read_all(topic)}
    assert got == {p: expected.get(p, []) for p in range(2)}


def _values(fetcher: RawBatchFetcher) -> list[bytes]:
    from mirror_core.codec.batch_deep import decode_record_tail, read_records

    fetcher.max_wait_ms = 100
    out = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        result = fetcher.fetch()
        out += [decode_record_tail(r.tail)[1] for view in result.batches for r in read_records(view)]
        if result.next_offset >= result.high_watermark and result.high_watermark > 0:
            return out
    return out
