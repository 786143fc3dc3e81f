"""The timestamp of the first record at or after each start offset, read through a wire client the caller already
holds: one Fetch per partition, all in flight together (preflight's "oldest data" fact for ``shoal copy``).

Preflight reads it through a new librdkafka consumer when it has no client (:func:`~mirror_core.services.preflight.
observe_data`); over a 200 ms link that consumer's bootstrap, its second connection and its fetch took 1.0 s
(PLAINTEXT) and 2.7 s (SASL_SSL, where each connection pays its TLS and SASL set-up) before the first byte, while
the copy's own client is connected already. Both read the same way: uncommitted (an open or aborted transaction's
first record counts, as it did), the timestamp a consumer sees (a LogAppendTime batch's records: its max timestamp),
markers skipped, a start below the log start (retention moved since it was chosen) read from the log start. One
difference: a start past the end of a source log truncated since it was chosen fails (the fetch's FetchError) where
the consumer reset to the log start; preflight then stops instead of judging records the copy would not read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from kafka.protocol.consumer import IsolationLevel

from mirror_core.codec.batch_deep import read_records
from mirror_core.errors import ClusterUnavailableError, CorruptBatchError, DataLossError
from mirror_core.kafka.broker_fetch import RoundSessions, send_round
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient

FIRST_FETCH_BYTES = 1   # per partition: exactly the first batch, which comes whole whatever its size (KIP-74)
RETRY_PAUSE_S = 0.1


def first_record_timestamps(client: WireClient, topic: str, starts: Mapping[int, int], *,
                            ends: Mapping[int, int] | None = None, timeout_s: float = 30.0) -> dict[int, int | None]:
    """Partition → the timestamp of the first record at or after its start offset (None: no record from there up to
    its end — nothing, or only transaction markers). ``ends``: each partition's high watermark as the caller read
    it; a leader answering with a lower one (a new leader whose high watermark still lags) is asked again rather
    than believed to have nothing (default: the high watermark of each answer). A retriable error (a leader
    moving) is asked again until ``timeout_s``, then a :class:`ClusterUnavailableError` naming the cluster, topic
    and partitions; any other error is raised as the fetch raised it (naming the partition)."""
    def reader(p: int, start: int) -> RawBatchFetcher:
        return RawBatchFetcher(client, topic, p, start, None, max_bytes=FIRST_FETCH_BYTES, max_wait_ms=0,
                               isolation=IsolationLevel.READ_UNCOMMITTED, retry_timeout_s=timeout_s)

    fetchers = {p: reader(p, start) for p, start in starts.items()}
    wanted = dict(starts)   # partition → the offset its first record must be at or after
    found: dict[int, int | None] = {}
    sessions = RoundSessions(enabled=False)   # one-off requests: no fetch session left open on the brokers
    deadline = time.monotonic() + timeout_s
    while fetchers:
        pending = list(fetchers.values())
        # a request per partition, all in flight together: a Fetch returns the first batch whole only for the first
        # partition of its answer (KIP-74), so one request for all would bring one partition's first batch per
        # round trip when batches are larger than a partition's share; alone, each brings exactly one batch
        rounds = [send_round(client, [fetcher], max_bytes=FIRST_FETCH_BYTES, max_wait_ms=0,
                             isolation=IsolationLevel.READ_UNCOMMITTED, sessions=sessions) for fetcher in pending]
        outcomes = [pending_round.collect()[0] for pending_round in rounds]
        waiting = False
        for fetcher, outcome in zip(pending, outcomes, strict=True):
            p = fetcher.partition
            if outcome.error is not None:
                if isinstance(outcome.error, DataLossError):   # deleted since the start was chosen: read on from there
                    log_start = outcome.error.log_start_offset
                    wanted[p] = log_start
                    fetchers[p] = reader(p, log_start)
                    continue
                if not outcome.retriable:
                    raise outcome.error
                waiting = True
                continue
            result = outcome.result
            try:
                first = _first_at_or_after(result.batches, wanted[p])
            except CorruptBatchError as exc:
                raise exc.located(client.cluster_name, topic, p) from None
            if first is not None:
                found[p] = first
                del fetchers[p]
            elif fetcher.position >= max(result.high_watermark, (ends or {}).get(p, 0)):
                found[p] = None
                del fetchers[p]
            elif fetcher.position >= result.high_watermark:
                waiting = True   # the answering leader's high watermark lags the end the caller read
        if fetchers and time.monotonic() > deadline:
            raise ClusterUnavailableError(client.cluster_name, client.bootstrap_servers,
                                          f"no first record from {topic!r} partitions {sorted(fetchers)} within "
                                          f"{timeout_s:.0f} s")
        if waiting:
            time.sleep(RETRY_PAUSE_S)
    return found


def _first_at_or_after(batches, offset: int) -> int | None:
    """The visible timestamp of the first record at or after ``offset`` in ``batches`` (None: none there)."""
    for batch in batches:
        if batch.next_offset <= offset:
            continue
        for record in read_records(batch):
            if record.offset >= offset:
                return record.timestamp
    return None
