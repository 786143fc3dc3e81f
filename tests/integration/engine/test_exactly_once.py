"""Exactly-once and at-least-once copies under SIGKILL, fencing of a second writer, and the checkpoint store."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import ProducerFencedError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore

ROOT = Path(__file__).resolve().parents[3]
RECORD_BYTES = 400


def _fill(cluster, topic: str, partitions: int = 2, records: int = 20_000) -> None:
    """Plain batches plus committed and aborted source transactions, so markers and aborted data are in the way."""
    from confluent_kafka import Producer

    cluster.create_topic(topic, partitions=partitions)
    now = int(time.time() * 1000)
    noise = random.Random(records)  # incompressible values: the throttle counts wire bytes
    cluster.produce(topic, [(b"k%d" % i, b"%d:" % i + noise.randbytes(RECORD_BYTES), [("i", b"%d" % i)], now)
                            for i in range(records)],
                    **{"compression.type": "lz4", "linger.ms": 5, "batch.size": 16384})
    producer = Producer(cluster.config.confluent(**{"transactional.id": f"{topic}.txn"}))
    producer.init_transactions(10)
    for n, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        for i in range(300):
            producer.produce(topic, key=b"t", value=b"%s-%d-%d" % (b"ok" if commit else b"ABORTED", n, i),
                             partition=i % partitions)
        producer.flush()
        producer.commit_transaction(10) if commit else producer.abort_transaction(10)
    cluster.produce(topic, [(b"tail%d" % i, b"tail") for i in range(200)])


def _copy_cmd(topic: str, target_topic: str, mode: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mirror_core.cli", "copy", "--source", "source", "--target", "target",
            "--topic", topic, "--target-topic", target_topic, "--mode", mode, "--pipeline", f"p.{target_topic}",
            "--commit-interval-ms", "1500", "--commit-bytes", "262144", "--fetch-max-bytes", "32768",
            "--max-inflight-bytes", "32768",
            "--throttle-mbps", "0.3", *extra]


def _open_transaction(target_cluster, topic: str, partitions: int) -> bool:
    """True when a target partition's last stable offset lags its high watermark: a transaction is open."""
    with WireClient.for_cluster(target_cluster.config) as client:
        return any(list_offsets(client, topic, p, "last_stable") < list_offsets(client, topic, p, "latest")
                   for p in range(partitions) if _exists(client, topic))


def _exists(client: WireClient, topic: str) -> bool:
    try:
        client.topic_metadata(topic, refresh=True)
        return True
    except Exception:  # noqa: BLE001
        return False


def _target_end(target_cluster, topic: str, partitions: int) -> int:
    """The target topic's high watermarks summed (0 while it does not exist): grows with every write, committed
    or not."""
    with WireClient.for_cluster(target_cluster.config) as client:
        if not _exists(client, topic):
            return 0
        return sum(list_offsets(client, topic, p, "latest") for p in range(partitions))


def _kill_and_rerun(cmd: list[str], *, kills: int, seed: int, on_kill=None, writing=None) -> int:
    """Start the copy, SIGKILL it at seeded random points ``kills`` times, then let it finish; returns kills done.

    ``writing()`` (a number that grows while the copy writes): each kill point is then counted from the moment
    this run's first write landed, not from process start — the interpreter's start-up, preflight and lane
    opening take seconds on a loaded machine, and a kill before the first write proves nothing."""
    rng = random.Random(seed)
    env = {**os.environ, "COLUMNS": "200"}
    done = 0
    while done < kills:
        before = writing() if writing is not None else None
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if writing is not None:
            deadline = time.monotonic() + 60
            while proc.poll() is None and writing() == before and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            proc.wait(timeout=rng.uniform(0.2, 1.4) if writing is not None else rng.uniform(2.0, 3.2))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            done += 1
            if on_kill is not None:
                on_kill()
            continue
        out, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        break  # finished before the next kill
    final = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    return done


def _contents(cluster, topic: str) -> list[tuple]:
    return [(r.partition, r.content()) for r in cluster.read_all(topic, timeout_s=60)]


def test_sigkill_ten_times_exactly_once(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"{topic}.eos"
    _fill(source_cluster, topic)
    open_at_kill = []
    kills = _kill_and_rerun(_copy_cmd(topic, target_topic, "exactly-once"), kills=10, seed=20261123,
                            on_kill=lambda: open_at_kill.append(_open_transaction(target_cluster, target_topic, 2)),
                            writing=lambda: _target_end(target_cluster, target_topic, 2))
    assert kills == 10, "the copy finished before ten kills; make it slower"
    assert sum(open_at_kill) >= 3, f"only {sum(open_at_kill)} kills hit an open transaction"
    source, target = _contents(source_cluster, topic), _contents(target_cluster, target_topic)
    assert target == source, "every source record exactly once, in order"
    assert not any(b"ABORTED" in (value or b"") for _p, (_k, value, _h, _t) in target)
    with WireClient.for_cluster(target_cluster.config) as client:
        for p in range(2):
            assert list_offsets(client, target_topic, p, "last_stable") == \
                list_offsets(client, target_topic, p, "latest"), "no hanging transaction on the target"


def test_sigkill_at_least_once_loses_nothing_and_bounds_duplicates(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"{topic}.alo"
    _fill(source_cluster, topic, records=6_000)
    kills = _kill_and_rerun(_copy_cmd(topic, target_topic, "at-least-once"), kills=5, seed=7)
    assert kills >= 3
    source, target = _contents(source_cluster, topic), _contents(target_cluster, target_topic)
    assert set(target) == set(source), "no loss"
    duplicates = sum(n - 1 for n in Counter(target).values())
    # at most one commit window (256 KiB of data plus the flush that crossed it) re-copied per kill
    per_window = (262144 + 65536) // RECORD_BYTES
    assert duplicates <= kills * per_window, f"{duplicates} duplicates for {kills} kills"
    for p in range(2):  # order kept: the target is the source with re-copied stretches
        src = [c for q, c in source if q == p]
        first_seen = list(dict.fromkeys(c for q, c in target if q == p))
        assert first_seen == src


def test_second_writer_fences_the_first(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    target_topic = f"{topic}.fenced"
    _fill(source_cluster, topic, partitions=1, records=4_000)
    slow = subprocess.Popen(_copy_cmd(topic, target_topic, "exactly-once"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    # the second writer starts once the first has written (its open transaction on the target), not after a fixed
    # sleep: under a loaded machine the first process's start-up and preflight alone can take longer than a sleep,
    # and a second writer that finishes first leaves nothing for the first to be fenced on
    deadline = time.monotonic() + 60
    while not _open_transaction(target_cluster, target_topic, 1):
        assert slow.poll() is None, f"the first writer ended before writing: {slow.communicate()[1].decode()[-2000:]}"
        assert time.monotonic() < deadline, "the first writer never opened a transaction on the target"
        time.sleep(0.2)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        second = CheckpointedCopier(source, target, store, pipeline=f"p.{target_topic}",
                                    mode=DeliveryMode.EXACTLY_ONCE, policy=CommitPolicy(65536, 300))
        end = list_offsets(source, topic, 0, "last_stable")
        second.copy(PartitionRange(topic, 0, 0, end, target_topic, 0))
    _out, err = slow.communicate(timeout=120)
    assert slow.returncode == 1
    assert "fenced" in err.decode() and "Traceback" not in err.decode()
    assert _contents(target_cluster, target_topic) == _contents(source_cluster, topic)


def test_fenced_writer_raises_producer_fenced(target_cluster, unique_name):
    from mirror_core.codec.batch_codec import Codec
    from mirror_core.codec.batch_deep import SourceRecord, encode_batch, encode_record_tail
    from mirror_core.kafka.writer import BatchWriter, OutgoingBatch

    topic = target_cluster.create_topic(unique_name())

    def batch() -> OutgoingBatch:
        return OutgoingBatch(topic, 0, encode_batch([SourceRecord(0, 1, 0, encode_record_tail(b"k", b"v"))],
                                                    Codec.NONE), source_offset=0)

    with WireClient.for_cluster(target_cluster.config) as target:
        first = BatchWriter(target, transactional_id=unique_name("lane"))
        first.begin_transaction()
        first.write([batch()])
        second = BatchWriter(target, transactional_id=first.transactional_id)
        second.init_producer_id()  # takes the lane over: aborts the first writer's transaction
        with pytest.raises(ProducerFencedError, match="fenced"):
            first.write([batch()])
            first.commit_transaction()
    assert target_cluster.read_all(topic) == [], "the fenced writer's transaction was aborted"


def test_checkpoints_are_readable_and_export_to_parquet(source_cluster, target_cluster, unique_name, tmp_path):
    import pyarrow.parquet as pq

    topic = unique_name()
    _fill(source_cluster, topic, partitions=2, records=1_000)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=f"{topic}.cp")
        copier = CheckpointedCopier(source, target, store, pipeline=f"p.{topic}", options=CopyOptions())
        ends = {p: list_offsets(source, topic, p, "last_stable") for p in range(2)}
        results = [copier.copy(PartitionRange(topic, p, 0, ends[p], f"{topic}.cp", p)) for p in range(2)]
        checkpoints = store.read_all(f"p.{topic}")
        rows = store.export_parquet(tmp_path / "cp.parquet", f"p.{topic}")
    assert {k[2]: cp.position for k, cp in checkpoints.items()} == ends
    for r in results:
        cp = checkpoints[(f"p.{topic}", topic, r.range.partition)]
        assert cp.target_next == r.next_target_offset and cp.offset_map.as_tuples() == r.offset_runs.as_tuples()
        assert cp.offset_map.position == cp.position
    table = pq.read_table(tmp_path / "cp.parquet")
    assert rows == 2 and sorted(table.column("position").to_pylist()) == sorted(ends.values())


def test_recreated_source_topic_halts_instead_of_resuming(source_cluster, target_cluster, unique_name):
    from mirror_core.errors import TopicRecreatedError

    topic = unique_name()
    _fill(source_cluster, topic, partitions=1, records=500)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=f"{topic}.dr")
        copier = CheckpointedCopier(source, target, store, pipeline=f"p.{topic}")
        end = list_offsets(source, topic, 0, "last_stable")
        copier.copy(PartitionRange(topic, 0, 0, end, f"{topic}.dr", 0))
        source_cluster.admin.recreate(topic, 1)
        source_cluster.produce(topic, [(b"k", b"new data") for _ in range(10)])
        with pytest.raises(TopicRecreatedError, match="recreated"):
            copier.copy(PartitionRange(topic, 0, 0, 10, f"{topic}.dr", 0))


def test_a_rerun_whose_checkpoint_is_past_the_range_end_is_skipped_not_an_error(source_cluster, target_cluster,
                                                                                 unique_name):
    """A whole-batch copy ends past the requested end; rerunning the same range reports it done."""
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(10)])  # one batch
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=f"{topic}.dr")
        copier = CheckpointedCopier(source, target, store, pipeline=f"p.{topic}")
        first = copier.copy(PartitionRange(topic, 0, 0, 5, f"{topic}.dr", 0))
        assert first.source_end == 10
        again = copier.copy(PartitionRange(topic, 0, 0, 5, f"{topic}.dr", 0))
        assert (again.source_start, again.source_end, again.records, again.commits) == (10, 10, 0, 0)
    assert len(target_cluster.read_all(f"{topic}.dr")) == 10


def test_checkpoint_stays_small_after_ten_thousand_source_transactions(source_cluster, target_cluster, unique_name):
    """Every source transaction leaves a commit marker, so 10,000 of them cut the offset map into 10,000 runs;
    the stored checkpoint must still stay under 100 KiB per lane."""
    import threading

    from confluent_kafka import Producer

    topic = source_cluster.create_topic(unique_name())

    def transactions(worker: int, count: int) -> None:
        producer = Producer(source_cluster.config.confluent(**{"transactional.id": f"{topic}.w{worker}",
                                                               "linger.ms": 0}))
        producer.init_transactions(30)
        for i in range(count):
            producer.begin_transaction()
            producer.produce(topic, key=b"w%d" % worker, value=b"%d" % i, partition=0)
            producer.commit_transaction(30)

    workers = [threading.Thread(target=transactions, args=(w, 2_500)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        end = list_offsets(source, topic, 0, "last_stable")
        assert end == 20_000, "10,000 records and 10,000 commit markers"
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=f"{topic}.dr")
        result = CheckpointedCopier(source, target, store, pipeline=f"p.{topic}").copy(
            PartitionRange(topic, 0, 0, end, f"{topic}.dr", 0))
        checkpoint = store.read(f"p.{topic}", topic, 0)
    assert result.records == 10_000 and checkpoint.position == end
    assert len(checkpoint.offset_map) > 1_000, "the markers really cut the map into many runs"
    size = len(checkpoint.to_value())
    assert size < 100 * 1024, f"the stored checkpoint is {size} bytes"
