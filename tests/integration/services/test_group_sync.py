"""`shoal groups sync` on real brokers: groups moved to the target resume at exactly the next record.

The source topic holds plain batches, committed and aborted transactions (so commit/abort markers and aborted data
sit between records), and is copied exactly-once with the CLI (default pipeline ``copy.<topic>.<target topic>``).
Source groups commit offsets part-way through a batch, at the end (caught up) and on a commit marker; after the
sync, a stock consumer on the target with that group id (``auto.offset.reset=error``, so a missing commit fails
loudly) must read first exactly the record a consumer of the source would read next.
"""

from __future__ import annotations

import argparse
import io
import re
import time
import uuid

import pytest

from mirror_core.cli.groups_command import EXIT_INCOMPLETE, add_parser, run
from mirror_core.cli.main import main as shoal_main
from tests.kafka_helpers import Record

PARTITIONS = 2


def _build_source(cluster, topic: str) -> None:
    """Per partition: 60 plain records (lz4, several per batch) · a committed transaction of 10 · an aborted one of
    10 · 20 plain · a committed transaction of 5; then 10 plain on partition 1 only. Partition 0 ends on a commit
    marker, partition 1 on plain records."""
    from confluent_kafka import Producer

    cluster.create_topic(topic, partitions=PARTITIONS)
    t0 = int(time.time() * 1000) - 60_000
    plain = {"compression.type": "lz4", "linger.ms": 50, "batch.size": 2048}

    def produce_plain(p: int, tag: str, n: int) -> None:
        cluster.produce(topic, [(b"%s-%d-%d" % (tag.encode(), p, i), b"v" * (i % 7) + b"%d" % i,
                                 [("p", b"%d" % p), ("i", b"%d" % i)], t0 + i) for i in range(n)],
                        partition=p, **plain)

    txn = Producer(cluster.config.confluent(**{"transactional.id": f"{topic}.txn"}))
    txn.init_transactions(10)

    def transaction(tag: bytes, n: int, commit: bool) -> None:
        txn.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(n):
                txn.produce(topic, key=b"%s-%d-%d" % (tag, p, i), value=b"%s" % tag, partition=p,
                            headers=[("txn", tag)])
        txn.flush()
        txn.commit_transaction(10) if commit else txn.abort_transaction(10)

    for p in range(PARTITIONS):
        produce_plain(p, "a", 60)
    transaction(b"committed-1", 10, True)
    transaction(b"ABORTED", 10, False)
    for p in range(PARTITIONS):
        produce_plain(p, "b", 20)
    transaction(b"committed-2", 5, True)
    produce_plain(1, "tail", 10)


def _copy(topic: str, target_topic: str) -> None:
    """The CLI's exactly-once copy, earliest to the last stable offset (default pipeline name)."""
    assert shoal_main(["copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                       target_topic, "--mode", "exactly-once"]) == 0


def _commit_markers(cluster, topic: str, partition: int) -> list[int]:
    """Offsets of the commit markers: no compaction here, so every offset below the high watermark that no
    READ_UNCOMMITTED reader sees is a marker; a commit marker follows a committed transactional record."""
    everything = {r.offset: r for r in cluster.read_all(topic, isolation="read_uncommitted")
                  if r.partition == partition}
    committed = {r.offset for r in cluster.read_all(topic) if r.partition == partition}
    markers = [o for o in range(max(everything) + 2) if o not in everything]
    return [m for m in markers if m - 1 in committed and dict(everything[m - 1].headers).get("txn")]


def _ends(cluster, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(cluster.config.confluent(**{"group.id": f"ends-{uuid.uuid4().hex[:6]}",
                                                    "isolation.level": "read_committed"}))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _commit_source(cluster, group: str, topic: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(cluster.config.confluent(**{"group.id": group, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _committed(cluster, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(cluster.config.confluent())
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic and tp.offset >= 0}


class GroupReader:
    """A stock consumer of one topic with a group id, starting from the group's committed offsets only."""

    def __init__(self, cluster, group: str, topic: str, *, subscribe: bool):
        from confluent_kafka import Consumer, TopicPartition

        self.topic = topic
        self.consumer = Consumer(cluster.config.confluent(**{
            "group.id": group, "enable.auto.commit": False, "isolation.level": "read_committed",
            "auto.offset.reset": "error", "session.timeout.ms": 10_000}))
        if subscribe:
            self.consumer.subscribe([topic])
        else:
            self.consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])  # OFFSET_STORED

    def first_records(self, partitions, timeout_s: float = 30.0) -> dict[int, Record]:
        """The first record read on each of ``partitions``."""
        found: dict[int, Record] = {}
        deadline = time.monotonic() + timeout_s
        while set(partitions) - set(found):
            assert time.monotonic() < deadline, f"no record on {set(partitions) - set(found)} of {self.topic}"
            for p, rec in self.poll(1.0).items():
                found.setdefault(p, rec)
        return found

    def poll(self, timeout_s: float) -> dict[int, Record]:
        msg = self.consumer.poll(timeout_s)
        if msg is None:
            return {}
        assert not msg.error(), f"consumer of {self.topic}: {msg.error()}"
        return {msg.partition(): Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                        tuple(msg.headers() or ()), msg.timestamp()[1])}

    def read_nothing_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = self.poll(0.5)
            assert not got, f"a caught-up group read {got}"

    def positions(self) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        return {tp.partition: tp.offset for tp in self.consumer.position(
            [TopicPartition(self.topic, p) for p in range(PARTITIONS)])}

    def close(self) -> None:
        self.consumer.close()


def _sync(sandbox, pipeline: str, groups: str, *extra: str) -> tuple[int, str]:
    from rich.console import Console

    parser = argparse.ArgumentParser(prog="shoal")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["groups", "sync", "--source", "source", "--target", "target", "--pipeline", pipeline,
                              "--groups", groups, *extra])
    out = io.StringIO()
    code = run(args, sandbox, Console(file=out, width=300))
    return code, out.getvalue()


@pytest.fixture
def mirrored(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"{topic}.dr"
    _build_source(source_cluster, topic)
    _copy(topic, target_topic)
    return topic, target_topic, f"copy.{topic}.{target_topic}"


def test_synced_groups_resume_at_exactly_the_next_record(mirrored, source_cluster, target_cluster, sandbox):
    topic, target_topic, pipeline = mirrored
    prefix = f"g.{uuid.uuid4().hex[:8]}"
    ends = _ends(source_cluster, topic)
    commit_markers = {p: _commit_markers(source_cluster, topic, p) for p in range(PARTITIONS)}
    assert all(len(m) == 2 for m in commit_markers.values()), commit_markers
    assert commit_markers[0][-1] == ends[0] - 1, "partition 0 ends on a commit marker"
    groups = {
        f"{prefix}.partway": {0: 25, 1: 63},  # inside an lz4 batch; inside the first committed transaction
        f"{prefix}.caughtup": dict(ends),  # the last stable offset (partition 0: just past a commit marker)
        f"{prefix}.marker": {0: commit_markers[0][0], 1: commit_markers[1][-1]},
    }
    for group, offsets in groups.items():
        _commit_source(source_cluster, group, topic, offsets)

    code, table = _sync(sandbox, pipeline, re.escape(prefix) + r"\..*")
    assert code == 0, table
    assert table.count("committed") >= 6 and "not translatable" not in table, table

    for kind in ("partway", "marker"):
        group = f"{prefix}.{kind}"
        source_reader = GroupReader(source_cluster, group, topic, subscribe=False)
        try:
            expected = source_reader.first_records(range(PARTITIONS))
        finally:
            source_reader.close()
        source_all = source_cluster.read_all(topic)
        for p in range(PARTITIONS):  # the reference, cross-checked against the log itself
            nxt = next(r for r in source_all if r.partition == p and r.offset >= groups[group][p])
            assert expected[p] == nxt
        target_reader = GroupReader(target_cluster, group, target_topic, subscribe=True)
        try:
            got = target_reader.first_records(range(PARTITIONS))
        finally:
            target_reader.close()
        for p in range(PARTITIONS):
            assert got[p].content() == expected[p].content(), (kind, p, groups[group][p], got[p], expected[p])

    # caught up: the target consumer reads nothing, until a new record is copied; then exactly that record
    group = f"{prefix}.caughtup"
    target_reader = GroupReader(target_cluster, group, target_topic, subscribe=True)
    try:
        target_reader.read_nothing_for(6.0)
        committed = _committed(target_cluster, group, target_topic)
        assert set(committed) == set(range(PARTITIONS)), "the caught-up group was committed on the target"
        last = {p: max(r.offset for r in target_cluster.read_all(target_topic) if r.partition == p)
                for p in range(PARTITIONS)}
        assert committed == {p: last[p] + 1 for p in range(PARTITIONS)}, "right after the last copied record"
        assert all(pos >= committed[p] for p, pos in target_reader.positions().items()), \
            "the consumer started there (and stepped over the mirror's own transaction marker)"

        # the group is active on the target now: a second sync leaves it alone
        code, table = _sync(sandbox, pipeline, re.escape(group))
        assert code == 0 and "skipped: group active on the target (state STABLE, 1 member)" in table, table

        new = {p: (b"new-%d" % p, b"after the sync", [("new", b"1")], int(time.time() * 1000))
               for p in range(PARTITIONS)}
        for p, rec in new.items():
            source_cluster.produce(topic, [rec], partition=p)
        _copy(topic, target_topic)
        got = target_reader.first_records(range(PARTITIONS))
        for p in range(PARTITIONS):
            key, value, headers, ts = new[p]
            assert got[p].content() == (key, value, tuple(headers), ts), (p, got[p])
    finally:
        target_reader.close()


def test_dry_run_commits_nothing_and_untranslatable_offsets_are_never_committed(mirrored, source_cluster,
                                                                                target_cluster, sandbox):
    topic, target_topic, pipeline = mirrored
    prefix = f"g.{uuid.uuid4().hex[:8]}"
    ends = _ends(source_cluster, topic)
    _commit_source(source_cluster, f"{prefix}.dry", topic, {0: 10, 1: 20})

    code, table = _sync(sandbox, pipeline, re.escape(prefix) + r"\..*", "--dry-run")
    assert code == 0 and "would commit (dry run)" in table and "dry run: nothing committed" in table, table
    assert _committed(target_cluster, f"{prefix}.dry", target_topic) == {}

    # records the mirror has not copied yet: a group that read them cannot be placed on the target
    source_cluster.produce(topic, [(b"late", b"not copied")], partition=1)
    _commit_source(source_cluster, f"{prefix}.ahead", topic, {0: 30, 1: ends[1] + 1})
    code, table = _sync(sandbox, pipeline, re.escape(f"{prefix}.ahead"), "--strict")
    assert code == EXIT_INCOMPLETE, table
    assert f"not translatable (not copied yet: the copy is at {ends[1]})" in table, table
    assert _committed(target_cluster, f"{prefix}.ahead", target_topic) == {0: 30}, \
        "the translatable partition is committed, the other is not"

    # a group already synced is in sync, and an unknown pipeline is one line naming it and the cluster
    code, table = _sync(sandbox, pipeline, re.escape(f"{prefix}.ahead"))
    assert code == 0 and "the target group is already at 30" in table, table
    from mirror_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pipeline 'no-such-pipeline' has no checkpoints on cluster 'target'"):
        _sync(sandbox, "no-such-pipeline", ".*")
