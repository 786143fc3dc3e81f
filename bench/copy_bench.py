"""Copy benchmark: Shoal's shallow copy against a deep consume → produce baseline and a null copy, same data.

For each case the same generated data on the sandbox's source cluster is mirrored to fresh topics on the target
cluster by three mirrors, each in its own process (so CPU time and peak RSS are per mirror):

- ``shallow``: Shoal's :class:`~mirror_core.engine.copier.RangeCopier` (raw Fetch → header rewrite → raw Produce).
- ``deep``: a MirrorMaker-1-style loop on confluent-kafka: Consumer (read_committed) → Producer (idempotent,
  acks=all) with the compression.type / batch.size / linger.ms / batch.num.messages the source was written with,
  flushed at the end. Every record is decompressed and re-compressed. The consumer keeps librdkafka's fetch and
  queue defaults (64 MiB pre-fetch queue): tighter queues (``--deep-consumer-conf``) made it latency-bound
  (``fetch.queue.backoff.ms``), which would flatter Shoal.
- ``null``: the ceiling for producing raw batches: every batch is fetched and prepared into memory first, then only
  producing them back with :class:`~mirror_core.kafka.writer.BatchWriter` is timed.
- ``shallow-sasl`` (not in the default set): ``shallow`` over SASL_SSL with SCRAM-SHA-512, fetch and produce both on
  the fast path's own TLS connections: the source through its secure listener, the target through its own secure
  listener when the sandbox target has one, else through the source broker's (recorded as ``secure_target``; the
  mirror's CPU is what is compared, and both brokers share core 0 either way).
- ``shallow-sasl-kp`` (not in the default set): the same over kafka-python's connections (``fast_path=False``),
  which is what a secure cluster got before the fast path spoke TLS and SASL.
- ``shallow-before`` (not in the default set): ``shallow`` run from another checkout (``--before-root``, e.g. a
  worktree of main at a branch point), so a change and its baseline are measured in one run on the same data;
  ``concurrent-alo-before`` likewise runs that checkout's ``concurrent-alo``.
- ``concurrent-alo`` / ``concurrent-eos`` / ``concurrent-none`` (not in the default set): ``shoal copy``'s engine
  (:class:`~mirror_core.engine.concurrent_copy.ConcurrentCopy`, one lane per partition, every partition of the case) in
  at-least-once (checkpoints, the lanes' writes sharing Produce requests), exactly-once (a transaction per lane
  and commit: lanes never share a request) and ``none`` mode; ``concurrent-alo-alone`` is at-least-once with
  every lane writing alone (``combine_lanes=False``, how lanes wrote before); ``concurrent-alo-coalesce`` /
  ``concurrent-eos-coalesce`` are at-least-once / exactly-once with ``--coalesce-small-batches`` (64 KiB: the
  ``coalesced`` deep case, off by default). The single-partition mirrors above
  skip the multi-partition case ``lz4-1-record-batches-4p``.

Measured per mirror: wall seconds and CPU seconds (user + system, all threads) of the copy phase (clients
connected, imports done), MB/s and CPU-s per GB over the source's on-disk batch bytes, the whole process's CPU
(``RUSAGE_CHILDREN`` in the parent, interpreter start-up included) and peak RSS (``VmHWM``) next to the RSS at
the start of the copy phase (the interpreter + library baseline).

Pinning: the mirror process runs on core 1 (``os.sched_setaffinity``) and, unless ``--no-pin``, every thread of the
source and target broker JVMs (``.sandbox/{source,target}/broker.pid``) on core 0 with ``taskset -a``; their
original masks are restored afterwards, also on failure. Data is generated before pinning.

Run ``.venv/bin/python -m bench.copy_bench --help``; results go to ``bench/results/*.json`` and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
MIRROR_CORE, BROKER_CORE = 1, 0
MIRRORS = ("shallow", "deep", "null", "shallow-sasl", "shallow-sasl-kp", "shallow-before", "concurrent-alo",
           "concurrent-alo-alone", "concurrent-eos", "concurrent-none", "concurrent-alo-before",
           "concurrent-alo-coalesce", "concurrent-eos-coalesce")
# mirrors run from the --before-root checkout, as the mirror it names there
BEFORE_MIRRORS = {"shallow-before": "shallow-before", "concurrent-alo-before": "concurrent-alo"}
DEFAULT_MIRRORS = ("shallow", "deep", "null")
# these copy partition 0 only
SINGLE_PARTITION_MIRRORS = {"shallow", "null", "shallow-sasl", "shallow-sasl-kp", "shallow-before"}
# concurrent mirrors: `shoal copy`'s engine (ConcurrentCopy) in a delivery mode; "-alone": lanes never share
# Produce requests (CopyOptions.combine_lanes=False, how every lane wrote before)
# mirror -> (mode, lanes share Produce requests, coalesce_bytes: 0 = off, else --coalesce-small-batches' default)
CONCURRENT_MIRRORS = {"concurrent-alo": ("at-least-once", True, 0), "concurrent-alo-alone": ("at-least-once", False, 0),
                      "concurrent-eos": ("exactly-once", True, 0), "concurrent-none": ("none", True, 0),
                      "concurrent-alo-coalesce": ("at-least-once", True, 64 * 1024),
                      "concurrent-eos-coalesce": ("exactly-once", True, 64 * 1024)}
SECURE_MIRRORS = {"shallow-sasl": True, "shallow-sasl-kp": False}   # mirror -> fast path on
MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    """One data shape: how the source topic is written (and the deep baseline re-writes it)."""

    name: str
    codec: str                # compression.type
    records: int
    record_bytes: int = 1024  # value size; keys are 12 bytes
    batch_size: int = 64 * 1024   # producer batch.size (bytes before compression)
    batch_records: int = 10_000   # producer batch.num.messages (1: one record per batch)
    linger_ms: int = 20
    partitions: int = 1           # records go round-robin over the partitions
    values: str = "text"      # "text": :func:`_values`; "orders": the link benchmark's JSON order events


def default_cases(scale: float) -> list[Case]:
    return [
        Case("zstd-1KiB", "zstd", int(250_000 * scale)),
        Case("lz4-1KiB", "lz4", int(250_000 * scale)),
        Case("lz4-1-record-batches", "lz4", int(20_000 * scale), batch_records=1, linger_ms=0),
        Case("lz4-1-record-batches-4p", "lz4", int(20_000 * scale), batch_records=1, linger_ms=0, partitions=4),
        Case("none-1-record-batches", "none", int(20_000 * scale), batch_records=1, linger_ms=0),
        uncompressed_orders_case(scale),
    ]


def uncompressed_orders_case(scale: float) -> Case:
    """The link benchmark's data on one partition (issue 14's "uncompressed records" target): uncompressed JSON
    order events of ~520 bytes with 16-byte keys (``ord-%012d``), ~553 bytes per record as stored, written with
    ``batch.size`` 256 KiB and ``linger.ms`` 20 (see :func:`bench.link_bench.generate`)."""
    return Case("none-json-orders", "none", int(250_000 * scale), record_bytes=0, batch_size=256 * 1024,
                linger_ms=20, values="orders")


# -- data ---------------------------------------------------------------------------------------------------

def _values(record_bytes: int, count: int = 2048, seed: int = 7) -> list[bytes]:
    """Text-like 1 KiB values (log lines of words and numbers): compress about like real JSON/log payloads."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
             for _ in range(400)]
    out = []
    for _ in range(count):
        parts = []
        while sum(len(p) + 1 for p in parts) < record_bytes:
            parts.append(rng.choice(words) if rng.random() < 0.7 else str(rng.randint(0, 10**9)))
        out.append(" ".join(parts).encode()[:record_bytes])
    return out


def generate(case: Case, source_conf: dict, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({**source_conf, "log_level": 0, "enable.idempotence": True, "acks": "all",
                         "compression.type": case.codec, "batch.size": case.batch_size,
                         "batch.num.messages": case.batch_records, "linger.ms": case.linger_ms})
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err.str())

    if case.values == "orders":
        from bench.link_bench import order_event

        def value(i: int) -> bytes:
            return order_event(i)

        key_format = b"ord-%012d"
    else:
        values = _values(case.record_bytes)

        def value(i: int) -> bytes:
            return values[i % len(values)]

        key_format = b"key-%08d"
    for i in range(case.records):
        while True:
            try:
                producer.produce(topic, key=key_format % i, value=value(i), partition=i % case.partitions,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) or errors:
        raise RuntimeError(f"generating {topic}: {errors[:3]}")


def describe_source(source_conf: dict, topic: str, partitions: int = 1) -> dict:
    """Offsets and on-disk batch statistics of every partition, read with Shoal's raw fetcher (``start``/``end``:
    partition 0's, for the single-partition mirrors)."""
    from mirror_core.kafka.fetcher import RawBatchFetcher
    from mirror_core.kafka.list_offsets import list_offsets
    from mirror_core.kafka.wire_client import WireClient

    starts, ends, sizes, records = [], [], [], 0
    with WireClient("source", source_conf) as client:
        for p in range(partitions):
            starts.append(list_offsets(client, topic, p, "earliest"))
            ends.append(list_offsets(client, topic, p, "last_stable"))
            for view in RawBatchFetcher(client, topic, p, starts[-1], ends[-1]):
                sizes.append(view.size)
                records += view.records_count
    return {"start": starts[0], "end": ends[0], "starts": starts, "ends": ends, "records": records,
            "batches": len(sizes), "bytes": sum(sizes), "batch_bytes_min": min(sizes),
            "batch_bytes_avg": round(sum(sizes) / len(sizes)), "batch_bytes_max": max(sizes)}


# -- pinning ------------------------------------------------------------------------------------------------

def _broker_pids() -> list[int]:
    pids = []
    for name in ("source", "target"):
        path = ROOT / ".sandbox" / name / "broker.pid"
        if path.exists():
            pids.append(int(path.read_text().split()[0]))
    return pids


@contextmanager
def pinned_brokers(enabled: bool):
    """Pin every thread of the source and target JVMs to BROKER_CORE; restore their masks afterwards."""
    saved: dict[int, str] = {}
    note = "not pinned (--no-pin)"
    if enabled and (os.cpu_count() or 1) >= 2:
        try:
            for pid in _broker_pids():
                out = subprocess.run(["taskset", "-p", str(pid)], check=True, capture_output=True, text=True)
                saved[pid] = out.stdout.strip().rsplit(":", 1)[1].strip()
                subprocess.run(["taskset", "-a", "-p", f"{1 << BROKER_CORE:x}", str(pid)], check=True,
                               capture_output=True)
            note = f"brokers {sorted(saved)} on core {BROKER_CORE}, mirror on core {MIRROR_CORE}"
        except (OSError, subprocess.CalledProcessError) as exc:
            note = f"broker pinning failed ({exc}); mirror on core {MIRROR_CORE}"
    elif enabled:
        note = "one core only: nothing pinned"
    try:
        yield note
    finally:
        for pid, mask in saved.items():
            subprocess.run(["taskset", "-a", "-p", mask, str(pid)], check=False, capture_output=True)


# -- the mirrors (each runs in a child process) ----------------------------------------------------------------

def _status_kib(field: str) -> int:
    """A /proc/self/status memory figure. VmHWM (peak RSS) starts afresh at exec, unlike ``ru_maxrss``, which
    Linux carries over from the forking parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Phase:
    """Wall and CPU time of the copy phase, and the RSS when it started."""

    def __enter__(self):
        self.rss_start_kib = _status_kib("VmRSS")
        self.wall, self.cpu = time.monotonic(), _cpu()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.monotonic() - self.wall, _cpu() - self.cpu

    def report(self, **extra) -> dict:
        return {"seconds": self.wall, "cpu_seconds": self.cpu, "rss_start_kib": self.rss_start_kib,
                "peak_rss_kib": _status_kib("VmHWM"), **extra}


def child_shallow(spec: dict) -> dict:
    from mirror_core.engine.copier import CopyOptions, RangeCopier
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.kafka.writer import BatchWriter
    from mirror_core.model.ranges import PartitionRange

    fast = spec.get("fast_path", True)
    with WireClient("source", spec["source"], fast_path=fast) as source, \
            WireClient("target", spec["target"], fast_path=fast) as target:
        writer = BatchWriter(target)
        writer.init_producer_id()
        copier = RangeCopier(source, target, writer, CopyOptions(fetch_max_bytes=spec["fetch_max_bytes"],
                                                                 max_inflight_bytes=spec["max_inflight_bytes"]))
        rng = PartitionRange(spec["src_topic"], 0, spec["start"], spec["end"], spec["dst_topic"], 0)
        with _Phase() as phase:
            result = copier.copy(rng)
    return phase.report(records=result.records, batches=result.batches, bytes=result.bytes)


def child_deep(spec: dict) -> dict:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    case = spec["case"]
    consumer = Consumer({**spec["source"], "log_level": 0, "group.id": f"shoal-bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, **spec.get("deep_consumer_conf", {})})
    producer = Producer({**spec["target"], "log_level": 0, "enable.idempotence": True, "acks": "all",
                         "compression.type": case["codec"], "batch.size": case["batch_size"],
                         "batch.num.messages": case["batch_records"], "linger.ms": case["linger_ms"]})
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err.str())

    dst, records = spec["dst_topic"], 0
    ends = dict(enumerate(spec["ends"]))
    positions = dict(enumerate(spec["starts"]))
    consumer.assign([TopicPartition(spec["src_topic"], p, at) for p, at in positions.items()])
    with _Phase() as phase:
        while any(positions[p] < ends[p] for p in ends):
            for msg in consumer.consume(1000, 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consume: {err}")
                while True:
                    try:
                        producer.produce(dst, value=msg.value(), key=msg.key(), headers=msg.headers(),
                                         timestamp=msg.timestamp()[1], partition=msg.partition(),
                                         on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.01)
                records += 1
                positions[msg.partition()] = msg.offset() + 1
            producer.poll(0)
        left = producer.flush(120)
    consumer.close()
    if left or errors:
        raise RuntimeError(f"deep produce: {left} unflushed, errors {errors[:3]}")
    return phase.report(records=records)


def child_null(spec: dict) -> dict:
    from mirror_core.codec.batch_prepare import prepare_for_target
    from mirror_core.kafka.fetcher import RawBatchFetcher
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.kafka.writer import BatchWriter, OutgoingBatch

    with WireClient("source", spec["source"]) as source, WireClient("target", spec["target"]) as target:
        batches = []
        fetcher = RawBatchFetcher(source, spec["src_topic"], 0, spec["start"], spec["end"],
                                  max_bytes=spec["fetch_max_bytes"])
        for view in fetcher:
            prepared = prepare_for_target(view)
            if prepared is not None:
                batches.append(OutgoingBatch(spec["dst_topic"], 0, prepared.data, prepared.source_first_offset))
        writer = BatchWriter(target)
        writer.init_producer_id()
        records = sum(b.records_count for b in batches)
        total = sum(len(b.data) for b in batches)
        with _Phase() as phase:
            chunk, size = [], 0
            for batch in batches:
                chunk.append(batch)
                size += len(batch.data)
                if size >= spec["max_inflight_bytes"]:
                    writer.write(chunk)
                    chunk, size = [], 0
            if chunk:
                writer.write(chunk)
    return phase.report(records=records, batches=len(batches), bytes=total)


def child_concurrent(spec: dict) -> dict:
    """``shoal copy``'s engine over every partition: ConcurrentCopy with one lane per partition in the mirror's
    delivery mode (checkpoints in the target's ``__shoal_checkpoints``, a pipeline of its own per run)."""
    from dataclasses import replace

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.config.commit_policy import CommitPolicy
    from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
    from mirror_core.engine.concurrent_copy import ConcurrentCopy, lane_share_writer, plain_share_writer
    from mirror_core.engine.copier import CopyOptions
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.model.ranges import PartitionRange
    from mirror_core.state.checkpoint import CheckpointStore

    mode, combine, coalesce_bytes = CONCURRENT_MIRRORS[spec["mirror"]]
    options = CopyOptions(fetch_max_bytes=spec["fetch_max_bytes"], max_inflight_bytes=spec["max_inflight_bytes"],
                          combine_lanes=combine, coalesce_bytes=coalesce_bytes)
    src, dst = spec["src_topic"], spec["dst_topic"]
    with WireClient("source", spec["source"]) as source, WireClient("target", spec["target"]) as target:
        ranges = [PartitionRange(src, p, lo, hi, dst, p)
                  for p, (lo, hi) in enumerate(zip(spec["starts"], spec["ends"], strict=True))]
        if mode == "none":
            writers = [plain_share_writer(source, target, options, r) for r in ranges]
        else:  # as `shoal copy` does (copy_command._share_writers), with its default commit policy
            commit_bytes = 4 * MIB
            store = CheckpointStore(ClusterConfig("target", spec["target"]), target)
            store.ensure_topic()
            copier = CheckpointedCopier(source, target, store, pipeline=f"bench.{dst}", mode=DeliveryMode(mode),
                                        options=replace(options, max_inflight_bytes=min(
                                            options.max_inflight_bytes, commit_bytes)),
                                        policy=CommitPolicy(commit_bytes=commit_bytes))
            writers = [lane_share_writer(s, r) for s, r in zip(copier.open_lanes(ranges), ranges, strict=True)]
        copy = ConcurrentCopy(source, options, writers, ranges)
        with _Phase() as phase:
            results = copy.run()
    shared = copy.shared.stats if copy.shared is not None else None
    return phase.report(records=sum(r.records for r in results), batches=sum(r.batches for r in results),
                        bytes=sum(r.bytes for r in results), rounds=copy.rounds,
                        max_round_bytes=copy.max_round_bytes,
                        shared_requests=shared.requests if shared else None,
                        shared_batches=shared.batches if shared else None)


CHILDREN = {"shallow": child_shallow, "deep": child_deep, "null": child_null, "shallow-sasl": child_shallow,
            "shallow-sasl-kp": child_shallow, "shallow-before": child_shallow,
            **dict.fromkeys(CONCURRENT_MIRRORS, child_concurrent)}


def run_child(mirror: str, spec: dict, root: Path = ROOT) -> dict:
    """Run one mirror in its own process pinned to MIRROR_CORE, from the checkout ``root`` (its ``bench`` and
    ``mirror_core``); returns its report plus whole-process CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "bench.copy_bench", "--child", mirror],
                          input=json.dumps(spec), capture_output=True, text=True, cwd=root, env=env, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{mirror} mirror failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["process_cpu_seconds"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    report["process_seconds"] = time.monotonic() - started
    return report


def child_main(mirror: str) -> None:
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {MIRROR_CORE})
    spec = json.loads(sys.stdin.read())
    profile_to = os.environ.get("SHOAL_BENCH_PROFILE")   # a measurement aid: cProfile (CPU clock) into this file
    if profile_to:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        report = profiler.runcall(CHILDREN[mirror], spec)
        profiler.dump_stats(f"{profile_to}.{mirror}.prof")
    else:
        report = CHILDREN[mirror](spec)
    report["affinity"] = sorted(os.sched_getaffinity(0))
    print(json.dumps(report))


# -- the run ------------------------------------------------------------------------------------------------

def target_records(target_conf: dict, topic: str, partitions: int) -> int:
    """Records on the target topic, read back (an exactly-once copy's transaction markers take offsets too)."""
    from mirror_core.kafka.fetcher import RawBatchFetcher
    from mirror_core.kafka.list_offsets import list_offsets
    from mirror_core.kafka.wire_client import WireClient

    records = 0
    with WireClient("target", target_conf) as client:
        for p in range(partitions):
            start, end = list_offsets(client, topic, p, "earliest"), list_offsets(client, topic, p, "last_stable")
            records += sum(view.records_count for view in RawBatchFetcher(client, topic, p, start, end))
    return records


def run(args) -> dict:
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.kafka.topics import TopicAdmin

    sandbox = sandbox_from_environ(os.environ)
    source_conf, target_conf = sandbox.client_config("source"), sandbox.client_config("target")
    source_admin = TopicAdmin(ClusterConfig("source", source_conf))
    target_admin = TopicAdmin(ClusterConfig("target", target_conf))
    secure = _secure_endpoints(sandbox, source_conf, target_conf, source_admin, target_admin) \
        if any(m in SECURE_MIRRORS for m in args.mirrors) else None
    cases = [c for c in default_cases(args.scale) if not args.cases or c.name in args.cases]
    run_id = time.strftime("%Y%m%d-%H%M%S")
    out = {"run_id": run_id, "machine": _machine(), "fetch_max_bytes": args.fetch_max_bytes,
           "deep_consumer_conf": dict(args.deep_consumer_conf),
           "max_inflight_bytes": args.max_inflight_bytes, "cases": [], "commit": _commit(ROOT),
           "before_root": str(args.before_root) if args.before_root else None,
           "before_commit": _commit(args.before_root) if args.before_root else None,
           "secure_target": secure["target_name"] if secure else None}
    created: list[tuple[TopicAdmin, str]] = []
    try:
        for case in cases:
            src = f"bench-{case.name}-{run_id}"
            source_admin.create(src, case.partitions)
            created.append((source_admin, src))
            t0 = time.monotonic()
            generate(case, source_conf, src)
            data = describe_source(source_conf, src, case.partitions)
            data["generate_seconds"] = time.monotonic() - t0
            entry = {"case": asdict(case), "source": data, "runs": []}
            out["cases"].append(entry)
            print(f"{case.name}: {data['records']} records, {data['bytes'] / MIB:.1f} MiB in {data['batches']} "
                  f"batches (avg {data['batch_bytes_avg']} B)", flush=True)
            with pinned_brokers(not args.no_pin) as note:
                out["pinning"] = note
                for rep in range(args.repeat):
                    for mirror in rotated(args.mirrors, rep):
                        if case.partitions > 1 and mirror in SINGLE_PARTITION_MIRRORS:
                            continue
                        dst = f"{src}-{mirror}-{rep}"
                        src_conf, dst_conf, dst_admin, dst_plain = source_conf, target_conf, target_admin, target_conf
                        if mirror in SECURE_MIRRORS:
                            src_conf, dst_conf = secure["source"], secure["target"]
                            dst_admin, dst_plain = secure["admin"], secure["target_plain"]
                        dst_admin.create(dst, case.partitions)
                        created.append((dst_admin, dst))
                        spec = {"source": src_conf, "target": dst_conf, "src_topic": src, "dst_topic": dst,
                                "fast_path": SECURE_MIRRORS.get(mirror, True),
                                "start": data["start"], "end": data["end"], "starts": data["starts"],
                                "ends": data["ends"], "case": asdict(case),
                                "mirror": BEFORE_MIRRORS.get(mirror, mirror),
                                "fetch_max_bytes": args.fetch_max_bytes,
                                "max_inflight_bytes": args.max_inflight_bytes,
                                "deep_consumer_conf": dict(args.deep_consumer_conf)}
                        root = args.before_root if mirror in BEFORE_MIRRORS else ROOT
                        report = run_child(BEFORE_MIRRORS.get(mirror, mirror), spec, root)
                        landed = target_records(dst_plain, dst, case.partitions)
                        if landed != data["records"]:
                            raise RuntimeError(f"{mirror} on {case.name}: target holds {landed} records, "
                                               f"expected {data['records']}")
                        report.update(_derived(report, data), mirror=mirror, repeat=rep)
                        entry["runs"].append(report)
                        print("  " + _row(case.name, report), flush=True)
    finally:
        if not args.keep_topics:
            for admin, topic in created:
                admin.delete(topic)
    return out


def rotated(mirrors: list[str], repeat: int) -> list[str]:
    """The mirrors in the order repeat ``repeat`` runs them: rotated by one per repeat, so that with as many
    repeats as mirrors each one runs first once. The first copy after a case's data was generated ran slower
    whichever mirror it was (the deep loop at 0.5-0.7x its later repeats when it went first, 2026-12-03), so a
    fixed order charged that to one mirror."""
    shift = repeat % len(mirrors) if mirrors else 0
    return list(mirrors[shift:]) + list(mirrors[:shift])


def _secure_endpoints(sandbox, source_conf: dict, target_conf: dict, source_admin, target_admin) -> dict:
    """SASL_SSL/SCRAM client configs for the secure mirrors: the source's secure listener, and the target's when the
    running target has one (else the source broker's, see the module docstring)."""
    source = sandbox.client_config("source", secure=True)
    if "secure" in sandbox.broker("target").info():
        return {"source": source, "target": sandbox.client_config("target", secure=True), "admin": target_admin,
                "target_plain": target_conf, "target_name": "target (SASL_SSL listener)"}
    return {"source": source, "target": source, "admin": source_admin, "target_plain": source_conf,
            "target_name": "source broker's SASL_SSL listener (the target runs without one)"}


def _derived(report: dict, data: dict) -> dict:
    gb = data["bytes"] / 1e9
    return {"mb_per_s": data["bytes"] / 1e6 / report["seconds"],
            "records_per_s": data["records"] / report["seconds"],
            "cpu_s_per_gb": report["cpu_seconds"] / gb,
            "process_cpu_s_per_gb": report["process_cpu_seconds"] / gb,
            "rss_growth_mib": (report["peak_rss_kib"] - report["rss_start_kib"]) / 1024}


def _machine() -> dict:
    import confluent_kafka
    import kafka

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(), "confluent_kafka": confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0], "kafka_python": kafka.__version__}


def _commit(root: Path) -> str | None:
    """The checkout's HEAD commit, with ``+dirty`` when it has uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "mirror_core"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


HEADER = (f"{'case':<22} {'mirror':<20} {'MB/s':>7} {'rec/s':>8} {'wall s':>7} {'CPU s':>6} {'CPU s/GB':>9} "
          f"{'proc CPU s/GB':>13} {'peak RSS MiB':>12} {'start RSS':>9} {'growth':>7}")


def _row(case: str, r: dict) -> str:
    return (f"{case:<22} {r['mirror']:<20} {r['mb_per_s']:>7.1f} {r['records_per_s']:>8.0f} {r['seconds']:>7.2f} "
            f"{r['cpu_seconds']:>6.2f} {r['cpu_s_per_gb']:>9.1f} {r['process_cpu_s_per_gb']:>13.1f} "
            f"{r['peak_rss_kib'] / 1024:>12.1f} {r['rss_start_kib'] / 1024:>9.1f} {r['rss_growth_mib']:>7.1f}")


def print_table(out: dict) -> None:
    print(f"\npinning: {out.get('pinning')}; MB = 10^6 bytes of source batches (compressed, as stored)")
    if out.get("secure_target"):
        print(f"secure mirrors: source through its SASL_SSL listener (SCRAM-SHA-512), target: {out['secure_target']}")
    print(HEADER)
    for entry in out["cases"]:
        for r in entry["runs"]:
            print(_row(entry["case"]["name"], r))


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.copy_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", help="case names (default: all of " +
                        ", ".join(c.name for c in default_cases(1)) + ")")
    parser.add_argument("--mirrors", nargs="*", default=list(DEFAULT_MIRRORS), choices=MIRRORS,
                        help="default: " + " ".join(DEFAULT_MIRRORS) + "; the SASL_SSL pair: shallow-sasl, "
                        "shallow-sasl-kp (compare with shallow in the same run)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every case's record count")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each mirror per case")
    parser.add_argument("--fetch-max-bytes", type=int, default=4 * MIB)
    parser.add_argument("--max-inflight-bytes", type=int, default=8 * MIB)
    parser.add_argument("--deep-consumer-conf", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer setting for the deep baseline (repeatable)")
    parser.add_argument("--before-root", type=Path,
                        help="checkout the *-before mirrors run from (its bench/copy_bench.py must take --child)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the broker JVMs to core 0")
    parser.add_argument("--keep-topics", action="store_true", help="leave the bench topics on both clusters")
    parser.add_argument("--out", type=Path, help="result JSON (default: bench/results/copy-<time>.json)")
    parser.add_argument("--child", choices=MIRRORS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if set(BEFORE_MIRRORS) & set(args.mirrors) and not args.child and args.before_root is None:
        parser.error("the *-before mirrors need --before-root")
    if args.child:
        child_main(args.child)
        return
    out = run(args)
    path = args.out or RESULTS / f"copy-{out['run_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print_table(out)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
