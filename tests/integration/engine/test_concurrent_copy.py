"""``shoal copy`` copies its partitions concurrently: one multi-partition Fetch per source broker per round, one
writer per lane, the next round in flight while this one is written. An independent reader (confluent-kafka,
read_committed) compares source and target record by record per partition."""

from __future__ import annotations

import random
import time

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.concurrent_copy import ConcurrentCopy, lane_share_writer, plain_share_writer
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore
from tests.copy_helpers import shoal

PARTITIONS = 4


def _fill(cluster, topic: str) -> None:
    """Plain batches on every partition plus committed and aborted source transactions in between."""
    from confluent_kafka import Producer

    cluster.create_topic(topic, partitions=PARTITIONS)
    noise = random.Random(3)
    now = int(time.time() * 1000)
    cluster.produce(topic, [(b"k%d" % i, b"%d:" % i + noise.randbytes(200), [("i", b"%d" % i)], now)
                            for i in range(4000)], **{"compression.type": "none", "linger.ms": 5, "batch.size": 8192})
    producer = Producer(cluster.config.confluent(**{"transactional.id": f"{topic}.txn"}))
    producer.init_transactions(10)
    for n, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        for i in range(200):
            producer.produce(topic, key=b"t", value=b"%s-%d-%d" % (b"ok" if commit else b"ABORTED", n, i),
                             partition=i % PARTITIONS)
        producer.flush()
        producer.commit_transaction(10) if commit else producer.abort_transaction(10)
    cluster.produce(topic, [(b"tail%d" % i, b"tail") for i in range(400)], **{"compression.type": "lz4"})


def _by_partition(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.content())
    return out


@pytest.mark.timeout(180)
def test_shoal_copy_of_four_partitions_is_exact(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"cc.{topic}"
    _fill(source_cluster, topic)
    done = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                 target_topic, "--pipeline", f"cc.{target_topic}", "--commit-bytes", "65536",
                 "--fetch-max-bytes", "32768", "--max-inflight-bytes", "32768", timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    source = _by_partition(source_cluster.read_all(topic))
    target = _by_partition(target_cluster.read_all(target_topic))
    assert sorted(source) == list(range(PARTITIONS))
    assert target == source
    assert not any(b"ABORTED" in (value or b"") for part in target.values() for _, value, _, _ in part)
    again = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                  target_topic, "--pipeline", f"cc.{target_topic}", timeout=150)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _by_partition(target_cluster.read_all(target_topic)) == source, "a rerun of finished work copied again"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["exactly-once", "none"])
def test_partitions_share_fetch_requests_and_progress_together(source_cluster, target_cluster, unique_name, mode):
    """The library path: every round is one request to the (single) source broker carrying every unfinished
    partition, so the partitions advance together instead of one after another."""
    topic = unique_name(mode)
    target_topic = f"cc.{topic}"
    _fill(source_cluster, topic)
    options = CopyOptions(fetch_max_bytes=16_384, max_inflight_bytes=16_384)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        ranges = [PartitionRange(topic, p, 0, list_offsets(source, topic, p, "last_stable"), target_topic, p)
                  for p in range(PARTITIONS)]
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic,
                      start_offsets={p: 0 for p in range(PARTITIONS)}).raise_if_refused()
        if mode == "none":
            writers = [plain_share_writer(source, target, options, r) for r in ranges]
        else:
            store = CheckpointStore(target_cluster.config, target)
            store.ensure_topic()
            copier = CheckpointedCopier(source, target, store, pipeline=f"cc-{topic.rsplit('.', 1)[-1]}",
                                        mode=DeliveryMode.EXACTLY_ONCE, options=options,
                                        policy=CommitPolicy(commit_bytes=32_768))
            writers = [lane_share_writer(copier.open_lane(topic, p, target_topic, p), r)
                       for p, r in enumerate(ranges)]
        seen: list[int] = []
        copy = ConcurrentCopy(source, options, writers, ranges)
        results = copy.run(progress=lambda rng, _: seen.append(rng.partition))
    stats = copy.stats
    assert stats.requests == stats.rounds  # one broker: one request per round
    assert stats.partitions >= 3 * stats.rounds // 2, f"{stats}: rounds did not carry several partitions"
    first_round = seen[:PARTITIONS]
    assert sorted(first_round) == list(range(PARTITIONS)), f"the first round wrote {first_round}, not every partition"
    assert [r.source_end for r in results] == [r.end for r in ranges]
    assert _by_partition(target_cluster.read_all(target_topic)) == _by_partition(source_cluster.read_all(topic))


@pytest.mark.timeout(120)
def test_a_round_of_many_partitions_stays_under_the_round_cap(source_cluster, target_cluster, unique_name):
    """Memory does not grow with the partition count: 24 partitions that could each bring a 16 kB fetch (384 kB per
    round) are fetched in rounds of at most 48 kB, and the copy is still exact."""
    partitions, cap = 24, 48_000
    topic = unique_name()
    target_topic = f"cc.{topic}"
    source_cluster.create_topic(topic, partitions=partitions)
    target_cluster.create_topic(target_topic, partitions=partitions)
    noise = random.Random(5)
    source_cluster.produce(topic, [(b"k%d" % i, noise.randbytes(300)) for i in range(2400)],
                           **{"compression.type": "none", "linger.ms": 5, "batch.size": 4096})
    options = CopyOptions(fetch_max_bytes=16_000, max_inflight_bytes=16_000, round_max_bytes=cap)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        ranges = [PartitionRange(topic, p, 0, list_offsets(source, topic, p, "last_stable"), target_topic, p)
                  for p in range(partitions)]
        largest = max(view.size for r in ranges for view in _views(source, r))
        copy = ConcurrentCopy(source, options, [plain_share_writer(source, target, options, r) for r in ranges],
                              ranges)
        results = copy.run()
    assert copy.round_asked_bytes <= cap
    assert 0 < copy.max_round_bytes <= cap + largest, f"a round brought {copy.max_round_bytes} bytes"
    assert sum(r.bytes for r in results) > 3 * cap, "too little data to need several rounds"
    assert [r.source_end for r in results] == [r.end for r in ranges]
    assert _by_partition(target_cluster.read_all(target_topic)) == _by_partition(source_cluster.read_all(topic))


def _views(client, rng: PartitionRange):
    from mirror_core.kafka.fetcher import RawBatchFetcher

    return list(RawBatchFetcher(client, rng.topic, rng.partition, rng.start, rng.end))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["at-least-once", "none"])
def test_lanes_of_one_record_batches_share_produce_requests(source_cluster, target_cluster, unique_name, mode):
    """Outside transactions the lanes' writes of a round go out together: 4 partitions of one-record batches take
    about a quarter of the Produce requests they would take lane by lane, and the copy is exact."""
    topic = unique_name(mode.replace("-", ""))
    target_topic = f"cc.{topic}"
    source_cluster.create_topic(topic, partitions=PARTITIONS)
    target_cluster.create_topic(target_topic, partitions=PARTITIONS)
    for p in range(PARTITIONS):
        source_cluster.produce(topic, [(b"k%d" % i, b"p%d-%d" % (p, i)) for i in range(150)], partition=p,
                               **{"batch.num.messages": 1, "linger.ms": 0})
    options = CopyOptions(fetch_max_bytes=1 << 20, max_inflight_bytes=1 << 20)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        ranges = [PartitionRange(topic, p, 0, list_offsets(source, topic, p, "last_stable"), target_topic, p)
                  for p in range(PARTITIONS)]
        if mode == "none":
            writers = [plain_share_writer(source, target, options, r) for r in ranges]
        else:
            store = CheckpointStore(target_cluster.config, target)
            store.ensure_topic()
            copier = CheckpointedCopier(source, target, store, pipeline=f"cc-{topic.rsplit('.', 1)[-1]}",
                                        mode=DeliveryMode.AT_LEAST_ONCE, options=options,
                                        policy=CommitPolicy(commit_bytes=1 << 20))
            writers = [lane_share_writer(copier.open_lane(topic, p, target_topic, p), r)
                       for p, r in enumerate(ranges)]
        copy = ConcurrentCopy(source, options, writers, ranges)
        results = copy.run()
    assert [r.batches for r in results] == [150] * PARTITIONS
    shared = copy.shared.stats
    assert shared.batches >= 600
    assert shared.requests <= shared.batches / 3, f"{shared}: the lanes did not share Produce requests"
    assert [r.source_end for r in results] == [r.end for r in ranges]
    assert _by_partition(target_cluster.read_all(target_topic)) == _by_partition(source_cluster.read_all(topic))


@pytest.mark.timeout(120)
def test_two_fetch_connections_to_one_broker_carry_different_partitions(source_cluster, target_cluster, unique_name):
    """Where one connection's window caps the link, a round deals a broker's partitions over several connections:
    two sockets to the one source broker, each fetching its own partitions, and the copy is exact."""
    topic = unique_name()
    target_topic = f"cc.{topic}"
    _fill(source_cluster, topic)
    target_cluster.create_topic(target_topic, partitions=PARTITIONS)
    options = CopyOptions(fetch_max_bytes=16_384, max_inflight_bytes=16_384, fetch_connections=2)
    carried: dict[int, set] = {}  # id of the connection -> partitions its fetches asked for
    sockets = {}
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        real = source.fast_connection

        def spying(node, slot=0):
            conn = real(node, slot)
            key = id(conn)
            if key not in sockets:
                sockets[key] = conn._sock.getsockname()
                fetch = conn.fetch_async

                def recorded(*, topics, _fetch=fetch, _key=key, **fields):
                    carried.setdefault(_key, set()).update(p.partition for t in topics for p in t.partitions)
                    return _fetch(topics=topics, **fields)
                conn.fetch_async = recorded
            return conn

        source.fast_connection = spying
        ranges = [PartitionRange(topic, p, 0, list_offsets(source, topic, p, "last_stable"), target_topic, p)
                  for p in range(PARTITIONS)]
        copy = ConcurrentCopy(source, options, [plain_share_writer(source, target, options, r) for r in ranges],
                              ranges)
        results = copy.run()
    fetching = [parts for parts in carried.values() if parts]
    assert len(fetching) == 2, f"fetches went over {len(fetching)} connection(s)"
    assert len({sockets[key] for key in carried}) == 2, "the two connections share one socket"
    assert fetching[0].isdisjoint(fetching[1]) and fetching[0] | fetching[1] == set(range(PARTITIONS))
    assert copy.stats.requests == 2 * copy.stats.rounds
    assert [r.source_end for r in results] == [r.end for r in ranges]
    assert _by_partition(target_cluster.read_all(target_topic)) == _by_partition(source_cluster.read_all(topic))
