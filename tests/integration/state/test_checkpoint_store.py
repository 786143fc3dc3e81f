"""The checkpoint store reads incrementally (real brokers).

Every test uses its own checkpoint topic, and checks the store against two references: a fresh store (which
reads the topic from the log start) and, where it matters, an independent confluent-kafka READ_COMMITTED reader
folded into "last value per key". ``records_read`` shows how much a read fetched.
"""

from __future__ import annotations

import re
import time

import pytest

from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore, checkpoint_partition
from mirror_core.state.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG
from mirror_core.state.lane_health_records import LaneHealthWriter, read_health_records
from mirror_core.state.leases import MEMBER_PREFIX, Lease, LeaseStore, lease_key

PARTITIONS = 3


def _cp(pipeline: str, partition: int, position: int, topic: str = "t") -> Checkpoint:
    return Checkpoint(pipeline=pipeline, topic=topic, partition=partition, position=position,
                      target_topic=f"dr.{topic}", target_partition=partition, target_next=None, owner="copy",
                      owner_epoch=1, updated_ms=1_700_000_000_000 + position)


def _put(cluster, store: CheckpointStore, items: list[tuple[bytes, bytes | None]]) -> None:
    """Plain (non-transactional, idempotent) writes, each to its key's partition; returns once acknowledged."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer(cluster.config.confluent(**{"enable.idempotence": True, "linger.ms": 0}))
    for key, value in items:
        producer.produce(store.topic, key=key, value=value, partition=checkpoint_partition(key, store.partitions),
                         on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not errors, errors


def _put_cps(cluster, store: CheckpointStore, cps: list[Checkpoint]) -> None:
    _put(cluster, store, [(cp.key, cp.to_value()) for cp in cps])


def _fresh(cluster, client: WireClient, store: CheckpointStore) -> CheckpointStore:
    return CheckpointStore(cluster.config, client, topic=store.topic, partitions=store.partitions)


def _independent_fold(cluster, topic: str) -> dict[bytes, bytes]:
    """Last committed value per key as a stock READ_COMMITTED consumer sees the topic (tombstones remove keys)."""
    out: dict[bytes, bytes] = {}
    for record in cluster.read_all(topic):
        if record.value is None:
            out.pop(record.key, None)
        else:
            out[record.key] = record.value
    return out


def _keys_in(partition: int, count: int, pipeline: str = "p") -> list[Checkpoint]:
    """``count`` checkpoints whose keys all land in checkpoint partition ``partition``."""
    out, n = [], 0
    while len(out) < count:
        cp = _cp(pipeline, n, 0)
        if checkpoint_partition(cp.key, PARTITIONS) == partition:
            out.append(cp)
        n += 1
    return out


@pytest.fixture
def wire(target_cluster):
    with WireClient.for_cluster(target_cluster.config) as client:
        yield client


@pytest.fixture
def store(target_cluster, wire, unique_name):
    store = CheckpointStore(target_cluster.config, wire, topic=unique_name("checkpoints"), partitions=PARTITIONS)
    store.ensure_topic()
    yield store
    target_cluster.admin.delete(store.topic)


def test_second_read_reads_only_what_was_appended(target_cluster, wire, store):
    _put_cps(target_cluster, store, [_cp("p1", i, 100 + i) for i in range(30)] + [_cp("p2", i, 1) for i in range(5)])
    first = store.read_all("p1")
    assert {k[2]: cp.position for k, cp in first.items()} == {i: 100 + i for i in range(30)}
    assert store.records_read == 35, "the first read reads every record"

    _put_cps(target_cluster, store, [*(_cp("p1", i, 200 + i) for i in range(5)), _cp("p1", 30, 7), _cp("p1", 31, 7)])
    second = store.read_all("p1")
    assert store.records_read == 35 + 7, "the second read reads only the 7 records appended since"
    assert {k[2]: cp.position for k, cp in second.items()} == \
        {**{i: 100 + i for i in range(30)}, **{i: 200 + i for i in range(5)}, 30: 7, 31: 7}

    fresh = _fresh(target_cluster, wire, store)
    assert fresh.read_all("p1") == second and fresh.read_all() == store.read_all()
    assert fresh.records_read == 42
    assert store.records_read == 42, "nothing new: a read fetches nothing"
    assert dict(store.latest_items()) == _independent_fold(target_cluster, store.topic)


def test_read_refreshes_only_its_own_partition(target_cluster, wire, store):
    a, b = _keys_in(0, 2), _keys_in(1, 2)
    _put_cps(target_cluster, store, [*a, *b])
    assert store.read("p", a[0].topic, a[0].partition) == a[0]
    assert store.records_read == 2, "only partition 0 was read"
    _put_cps(target_cluster, store, [_cp("p", b[0].partition, 9)])  # partition 1
    assert store.read("p", a[1].topic, a[1].partition) == a[1]
    assert store.records_read == 2, "partition 1 changed, partition 0 did not: nothing fetched"
    assert store.read("p", "t", b[0].partition).position == 9
    assert store.records_read == 2 + 3, "partition 1 read from its start once (two old records and the new one)"
    assert [k for k, _v in store.records(1)] == [b[1].key, b[0].key], \
        "records(): live keys in order of their last write"


def test_open_transaction_is_invisible_until_commit_and_aborted_never_shows(target_cluster, wire, unique_name):
    from confluent_kafka import Producer

    store = CheckpointStore(target_cluster.config, wire, topic=unique_name("checkpoints"), partitions=PARTITIONS,
                            settle_timeout_s=0.5)
    store.ensure_topic()
    try:
        k, k2, k3, k4 = _keys_in(2, 4)
        _put_cps(target_cluster, store, [_cp("p", k.partition, 1)])
        assert store.read("p", "t", k.partition).position == 1

        producer = Producer(target_cluster.config.confluent(**{"transactional.id": f"{store.topic}.txn"}))
        producer.init_transactions(30)
        producer.begin_transaction()
        for cp in (_cp("p", k.partition, 2), _cp("p", k2.partition, 2)):
            producer.produce(store.topic, key=cp.key, value=cp.to_value(), partition=2)
        assert producer.flush(30) == 0
        _put_cps(target_cluster, store, [_cp("p", k3.partition, 3)])  # plain write behind the open transaction

        started = time.monotonic()
        during = store.read_all("p")
        assert time.monotonic() - started < 10, "an open transaction costs a bounded wait, not a hang"
        assert {key[2]: cp.position for key, cp in during.items()} == {k.partition: 1}, \
            "neither the open transaction nor the write behind it is visible"
        assert store.read("p", "t", k2.partition) is None

        producer.commit_transaction(30)
        after = store.read_all("p")  # right after the commit was acknowledged: no polling
        assert {key[2]: cp.position for key, cp in after.items()} == {k.partition: 2, k2.partition: 2, k3.partition: 3}

        producer.begin_transaction()
        aborted = _cp("p", k.partition, 666)
        producer.produce(store.topic, key=aborted.key, value=aborted.to_value(), partition=2)
        assert producer.flush(30) == 0
        producer.abort_transaction(30)
        before = store.records_read
        _put_cps(target_cluster, store, [_cp("p", k4.partition, 4)])  # moves the stable offset past the abort
        final = store.read_all("p")
        assert {key[2]: cp.position for key, cp in final.items()} == \
            {k.partition: 2, k2.partition: 2, k3.partition: 3, k4.partition: 4}
        assert store.records_read == before + 1, "the aborted record is never even decoded"
        assert _fresh(target_cluster, wire, store).read_all("p") == final
        assert {cp.key: cp.to_value() for cp in final.values()} == _independent_fold(target_cluster, store.topic)
    finally:
        target_cluster.admin.delete(store.topic)


def test_a_commit_acknowledged_by_the_writer_is_seen_by_the_next_read(wire, store):
    """The broker acknowledges EndTxn before it writes the commit markers; the store's read waits for them."""
    writer = BatchWriter(wire, transactional_id=f"{store.topic}.lane")
    writer.init_producer_id()
    reader = CheckpointStore(store.cluster, wire, topic=store.topic, partitions=store.partitions)
    for position in range(1, 31):
        writer.begin_transaction()
        writer.write([store.checkpoint_batch(_cp("p", 0, position))])
        writer.commit_transaction()
        seen = reader.read("p", "t", 0)
        assert seen is not None and seen.position == position, f"commit {position} not visible right after its ack"
    assert reader.records_read == 30


def test_tombstones_remove_keys(target_cluster, wire, store):
    a, b = _cp("p", 0, 5), _cp("p", 1, 6)
    _put_cps(target_cluster, store, [a, b])
    assert set(store.read_all("p")) == {("p", "t", 0), ("p", "t", 1)}
    _put(target_cluster, store, [(a.key, None)])
    assert set(store.read_all("p")) == {("p", "t", 1)}
    assert store.read("p", "t", 0) is None and store.records_read == 3
    assert _fresh(target_cluster, wire, store).read_all("p") == store.read_all("p")
    _put_cps(target_cluster, store, [_cp("p", 0, 7)])
    assert store.read("p", "t", 0).position == 7


def test_ensure_topic_creates_the_topic_with_explicit_settings(target_cluster, store):
    configs = target_cluster.admin.configs(store.topic)
    for name in ("cleanup.policy", "max.message.bytes", "min.insync.replicas"):
        assert configs[name] == CHECKPOINT_TOPIC_CONFIG[name]


@pytest.mark.parametrize(("config", "named"), [
    ({"cleanup.policy": "compact,delete"}, "cleanup.policy=compact,delete"),
    ({"cleanup.policy": "delete"}, "cleanup.policy=delete"),
    ({"cleanup.policy": "compact", "max.message.bytes": "4096"}, "max.message.bytes=4096"),
])
def test_ensure_topic_refuses_settings_that_would_break_the_checkpoints(target_cluster, wire, unique_name, config,
                                                                         named):
    topic = target_cluster.create_topic(unique_name("checkpoints"), PARTITIONS, config)
    try:
        with pytest.raises(ConfigError, match=re.escape(named)):
            CheckpointStore(target_cluster.config, wire, topic=topic, partitions=PARTITIONS).ensure_topic()
    finally:
        target_cluster.admin.delete(topic)


def test_delete_records_prunes_or_forces_a_reread(target_cluster, wire, unique_name):
    """A compacted-only topic refuses delete_records (POLICY_VIOLATION), so this checkpoint topic also has the
    delete policy, the way an operator could have configured it (retention moves the log start the same way)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = target_cluster.create_topic(unique_name("checkpoints"), 1, {
        "cleanup.policy": "compact,delete", "min.compaction.lag.ms": "0", "segment.ms": "3600000"})
    admin = AdminClient(target_cluster.config.confluent())

    def delete_before(offset: int) -> None:
        done = admin.delete_records([TopicPartition(topic, 0, offset)])
        assert next(iter(done.values())).result(30).low_watermark == offset

    try:
        store = CheckpointStore(target_cluster.config, wire, topic=topic, partitions=1)
        # no ensure_topic(): it refuses the delete policy (test_ensure_topic_refuses_...); the cache must still cope
        _put_cps(target_cluster, store, [_cp("p", i, i) for i in range(10)])   # offsets 0..9
        _put_cps(target_cluster, store, [_cp("p", 0, 100)])                    # offset 10
        assert len(store.read_all("p")) == 10 and store.records_read == 11

        delete_before(5)  # below what the store has read: the keys last written below 5 disappear
        pruned = store.read_all("p")
        assert {k[2]: cp.position for k, cp in pruned.items()} == {0: 100, **{i: i for i in range(5, 10)}}
        assert store.records_read == 11 and store.cache_resets == 0, "pruned in place, nothing re-read"
        assert _fresh(target_cluster, wire, store).read_all("p") == pruned

        _put_cps(target_cluster, store, [_cp("p", 20 + i, i) for i in range(5)])  # offsets 11..15, not read yet
        delete_before(13)  # past what the store has read: it must start over at the new log start
        reread = store.read_all("p")
        assert {k[2]: cp.position for k, cp in reread.items()} == {22: 2, 23: 3, 24: 4}
        assert store.cache_resets == 1 and store.records_read == 11 + 3, "re-read from the log start (13..15)"
        assert _fresh(target_cluster, wire, store).read_all("p") == reread
        assert {cp.key: cp.to_value() for cp in reread.values()} == _independent_fold(target_cluster, topic)
    finally:
        target_cluster.admin.delete(topic)


def test_recreated_checkpoint_topic_is_read_anew(target_cluster, wire, store):
    _put_cps(target_cluster, store, [_cp("old", i, 1) for i in range(4)])
    assert len(store.read_all()) == 4
    target_cluster.admin.recreate(store.topic, PARTITIONS, {"cleanup.policy": "compact"})
    # more records than before, so every partition's new stable offset is past what the store had read: only the
    # topic id tells that these offsets belong to another log
    _put_cps(target_cluster, store, [_cp("new", i, 2) for i in range(20)])
    after = store.read_all()
    assert {k[0] for k in after} == {"new"} and len(after) == 20
    assert store.cache_resets >= 1
    assert _fresh(target_cluster, wire, store).read_all() == after


def test_leases_and_health_records_read_through_the_same_cache(target_cluster, wire, store):
    """Lease records and membership heartbeats (as a lease-based daemon of the previous release writes them) and
    lane health records share the checkpoint topic: each reader picks its own records out of one incremental cache,
    and neither mistakes the other's."""
    leases = LeaseStore(store, target_cluster.config.confluent())
    health = LaneHealthWriter(leases.producer)
    far = int(time.time() * 1000) + 600_000
    for lane in ("a", "b", "c"):
        leases.write(Lease("p", lane, "w1", far))
    leases.write(Lease("p", MEMBER_PREFIX + "w1", "w1", far))  # the old daemon's membership heartbeats
    leases.write(Lease("p", MEMBER_PREFIX + "w2", "w2", far))
    leases.write(Lease("other", "a", "w9", far))
    retrying = {"state": "retrying", "reason": "unavailable", "message": "down", "attempts": 2, "since_ms": 5}
    health.write("p", "w1", {"a": retrying}, [], far - 600_000)
    _put_cps(target_cluster, store, [_cp("p", 0, 1)])
    lanes, members = leases.read_with_members("p")
    assert {lane: lease.holder for lane, lease in lanes.items()} == {"a": "w1", "b": "w1", "c": "w1"}
    assert set(members) == {"w1", "w2"}
    assert {lane: (r.holder, r.state, r.attempts) for lane, r in read_health_records(store, "p").items()} == \
        {"a": ("w1", "retrying", 2)}
    assert store.records_read == 8

    for n in range(10):
        leases.write(Lease("p", "a", "w1", far + n))
    leases.producer.produce([(lease_key("p", MEMBER_PREFIX + "w2"), None, "w2")], what="membership")  # old leave
    leases.release("p", "b", "w1")
    health.write("p", "w1", {}, ["a"], far - 600_000)  # the lane copies again: cleared
    lanes, members = leases.read_with_members("p")
    assert store.records_read == 8 + 13, "only the renewals, the leave, the release and the clear are read"
    assert lanes["a"].expires_ms == far + 9 and lanes["b"].expires_ms == 0 and set(members) == {"w1"}
    assert MEMBER_PREFIX + "w2" not in lanes and read_health_records(store, "p") == {}
    fresh = LeaseStore(_fresh(target_cluster, wire, store), {})
    assert fresh.read_with_members("p") == (lanes, members)
    assert {k[2] for k in store.read_all("p")} == {0} and store.records_read == 21, \
        "checkpoints come from the same cache: no re-read"


def _lane_commits(store: CheckpointStore, rounds: int, *, floor_at: int | None = None):
    """A lane's commits of a growing map (sealed every 8 runs), as (checkpoint, batches) per round; the whole map
    (one list of runs) is returned alongside, as the oracle."""
    from mirror_core.model.map_segments import LaneMap
    from mirror_core.model.offset_map import OffsetMap
    from mirror_core.model.offset_runs import OffsetRun

    lane_map, whole = LaneMap(tail_start=0, segment_runs=8), OffsetMap(0, 0)
    out = []
    for r in range(rounds):
        for _ in range(5):
            run = OffsetRun(whole.position + 1, whole.position + 2, whole.target_next)  # a record after a marker
            whole.extend([run], position=run.source_end)
            lane_map.tail_runs.append(run)
        commit = lane_map.commit(position=whole.position, target_next=whole.target_next,
                                 floor=floor_at if r == rounds - 1 else None)
        cp = Checkpoint(pipeline="p", topic="t", partition=0, position=whole.position, target_topic="dr.t",
                        target_partition=0, target_next=whole.target_next, owner="daemon", owner_epoch=1,
                        offset_map=commit.tail, map_segments=commit.chain,
                        map_pruned_below=commit.start if commit.dropped else None)
        out.append((cp, store.checkpoint_batches(cp, commit)))
        lane_map.apply(commit)
    return out, whole


def test_a_lane_reads_its_own_segmented_map_past_a_foreign_open_transaction(target_cluster, wire, store):
    """Segments are committed in the lane's transaction with its checkpoint: a READ_COMMITTED read that stops at
    a foreign open transaction's LSO sees neither; the lane's own read (past the LSO) assembles the whole map."""
    from confluent_kafka import Producer

    commits, whole = _lane_commits(store, 6)
    part = checkpoint_partition(commits[0][0].key, PARTITIONS)
    foreign = Producer(target_cluster.config.confluent(**{"transactional.id": f"{store.topic}.foreign"}))
    foreign.init_transactions(30)
    foreign.begin_transaction()
    foreign.produce(store.topic, key=b'"other"', value=b"{}", partition=part)
    foreign.flush(30)
    try:
        writer = BatchWriter(wire, transactional_id=f"{store.topic}.lane")
        writer.init_producer_id()
        for _, batches in commits:
            writer.begin_transaction()
            writer.write(batches)
            writer.commit_transaction()
        assert commits[-1][0].map_segments.count >= 3
        assert _fresh(target_cluster, wire, store).read("p", "t", 0) is None  # hidden behind the open one
        own = _fresh(target_cluster, wire, store).read_own("p", "t", 0)
        assert own.offset_map == whole and own.map_segments.starts
    finally:
        foreign.abort_transaction(30)
    assert _fresh(target_cluster, wire, store).read("p", "t", 0).offset_map == whole


def test_pruned_segments_are_tombstoned_and_the_rest_still_assembles(target_cluster, wire, store):
    commits, whole = _lane_commits(store, 8, floor_at=20)
    writer = BatchWriter(wire, transactional_id=f"{store.topic}.lane")
    writer.init_producer_id()
    for _, batches in commits:
        writer.begin_transaction()
        writer.write(batches)
        writer.commit_transaction()
    cp = _fresh(target_cluster, wire, store).read("p", "t", 0)
    assert 0 < cp.offset_map.start <= 20 and cp.map_pruned_below == cp.offset_map.start
    assert all(cp.offset_map.translate(s) == whole.translate(s) for s in range(cp.offset_map.start, whole.position))
    assert cp.offset_map.translate(cp.offset_map.start - 1) is None
    live = [k for k in _independent_fold(target_cluster, store.topic) if k.startswith(b'{"map_segment"')]
    assert len(live) == cp.map_segments.count


def test_checkpoints_of_a_pipeline_in_another_checkpoint_topic_are_counted(target_cluster, wire, store):
    """A daemon whose pipeline file names its own checkpoint topic asks the default one for its pipeline's
    checkpoints (written there by a backfill or copy) and refuses to start when there are any."""
    other = CheckpointStore(target_cluster.config, wire, topic=f"{store.topic}.custom", partitions=store.partitions)
    assert other.pipeline_checkpoints_in(f"{store.topic}.absent", "p") == 0  # no such topic: nothing there
    _put_cps(target_cluster, store, [_cp("p", 0, 10), _cp("p", 1, 20), _cp("q", 0, 5)])
    assert other.pipeline_checkpoints_in(store.topic, "p") == 2
    assert other.pipeline_checkpoints_in(store.topic, "r") == 0
    assert store.pipeline_checkpoints_in(store.topic, "p") == 0  # its own topic is not "another"


@pytest.mark.timeout(90)
def test_a_daemon_with_its_own_checkpoint_topic_refuses_checkpoints_left_in_the_default(target_cluster, source_cluster,
                                                                                      wire, unique_name):
    import threading

    from mirror_core.config.names import CHECKPOINT_TOPIC
    from mirror_core.config.pipeline_file import pipeline_config_from_mapping
    from mirror_core.daemon.loop import ShallowMirrorDaemon
    from mirror_core.errors import ConfigError

    name = unique_name("cp-elsewhere")
    pipeline = name
    default = CheckpointStore(target_cluster.config, wire)
    default.ensure_topic()
    _put_cps(target_cluster, default, [_cp(pipeline, 0, 42, topic=f"orders-{name}")])
    config = pipeline_config_from_mapping({
        "pipeline": pipeline, "source": dict(source_cluster.config.settings),
        "target": dict(target_cluster.config.settings),
        "include": [f"orders-{name}"], "checkpoint_topic": f"{name}.checkpoints"})
    daemon = ShallowMirrorDaemon(config, worker_id="w")
    stop = threading.Event()
    threading.Timer(20, stop.set).start()  # without the check the daemon would run (and start lane 0 afresh)
    with pytest.raises(ConfigError, match=rf"1 checkpoint\(s\) of this pipeline are in '{CHECKPOINT_TOPIC}'"):
        daemon.run(stop)
    stop.set()


@pytest.mark.timeout(120)
def test_one_pass_read_of_many_lanes_equals_each_lanes_own_read(target_cluster, wire, store):
    """A daemon opening many lanes reads their checkpoints in one pass (read_own_many) after their InitProducerIds:
    the same checkpoints per-lane read_own calls give — past a foreign open transaction on every partition, with
    lanes that committed above the LSO, one that aborted its newest checkpoint, a segmented map, and lanes with
    no checkpoint at all."""
    from confluent_kafka import Producer

    commits, whole = _lane_commits(store, 4)  # lane t-0: a map sealed in segments
    _put_cps(target_cluster, store, [_cp("p", n, 10 + n) for n in range(1, 13)])  # below the LSO
    foreign = Producer(target_cluster.config.confluent(**{"transactional.id": f"{store.topic}.foreign"}))
    foreign.init_transactions(30)
    foreign.begin_transaction()
    for part in range(PARTITIONS):  # every partition's LSO stops here from now on
        foreign.produce(store.topic, key=b'"other"', value=b"{}", partition=part)
    foreign.flush(30)
    try:
        writer = BatchWriter(wire, transactional_id=f"{store.topic}.lane-0")
        writer.init_producer_id()
        for _, batches in commits:
            writer.begin_transaction()
            writer.write(batches)
            writer.commit_transaction()
        for n in range(1, 6):  # lanes that committed newer checkpoints behind the foreign transaction
            writer = BatchWriter(wire, transactional_id=f"{store.topic}.lane-{n}")
            writer.init_producer_id()
            writer.begin_transaction()
            writer.write([store.checkpoint_batch(_cp("p", n, 100 + n))])
            writer.commit_transaction()
            if n == 5:  # ... and one whose next checkpoint was aborted
                writer.begin_transaction()
                writer.write([store.checkpoint_batch(_cp("p", n, 666))])
                writer.abort_transaction()
        lanes = [("t", n) for n in range(15)]

        many = _fresh(target_cluster, wire, store).read_own_many("p", lanes)
        each = {lane: _fresh(target_cluster, wire, store).read_own("p", *lane) for lane in lanes}

        assert many == each
        assert many[("t", 0)].offset_map == whole
        assert {n: many[("t", n)].position for n in range(1, 13)} == \
            {n: 100 + n if n <= 5 else 10 + n for n in range(1, 13)}
        assert many[("t", 13)] is None and many[("t", 14)] is None
    finally:
        foreign.abort_transaction(30)


@pytest.mark.timeout(120)
def test_one_unreadable_checkpoint_fails_only_its_own_lane_in_a_daemons_batched_read(target_cluster, wire, store):
    """Review of i18-startup: a checkpoint this Shoal cannot decode (a newer Shoal's format) makes the one-pass
    read_own_many raise for the whole batch; the daemon's batched open (``_read_checkpoints``) must still give every
    other lane its checkpoint and only that lane the error, as per-lane reads did. Read from the real brokers:
    checkpoints in every partition of the checkpoint topic, the poisoned one among them."""
    import json
    from types import SimpleNamespace

    from mirror_core.daemon.loop import ShallowMirrorDaemon

    cps = [_cp("p", n, 10 + n) for n in range(8)]
    poisoned = json.loads(cps[5].to_value())
    poisoned["v"] = 99
    _put(target_cluster, store, [(cp.key, cp.to_value()) for cp in cps if cp.partition != 5]
         + [(cps[5].key, json.dumps(poisoned).encode())])
    lanes = [("t", n) for n in range(9)]  # ("t", 8): no checkpoint
    with pytest.raises(MirrorError, match="format 99"):
        _fresh(target_cluster, wire, store).read_own_many("p", lanes)

    daemon = SimpleNamespace(config=SimpleNamespace(pipeline="p"), store=_fresh(target_cluster, wire, store))
    read = ShallowMirrorDaemon._read_checkpoints(daemon, lanes)

    assert isinstance(read.pop(("t", 5)), MirrorError)
    assert {lane: None if cp is None else cp.position for lane, cp in read.items()} == \
        {**{("t", n): 10 + n for n in range(8) if n != 5}, ("t", 8): None}
