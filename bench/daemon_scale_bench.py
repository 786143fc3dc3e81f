"""Daemon at scale (issue #18): one daemon process holding N partitions, mostly idle, two of them busy.

For each ``--partitions`` N (e.g. ``200 2000``), on two **private** single-node brokers (source and target, started
like the sandbox's — :class:`~mirror_core.dev.sandbox.broker.SandboxBroker` on free ports, own directories, a modest
heap — so thousands of partitions never land on the shared sandbox):

1. N source partitions as ``N / --per-topic`` topics, ``--seed-records`` records in each; one daemon process
   started as operators start it (:class:`bench.daemon_bench.Daemon`: ``python -m mirror_core.daemon``, group
   membership, exactly-once, the daemon's own defaults unless pinned below).
2. **Start-up, cold** (no checkpoint yet): process start → every lane opened (``lane_opened`` for each of the N
   lanes in its log) → the first fetch round after that (``shoal_fetch_rounds_total`` moved). Then **caught up**:
   every seeded record committed (``shoal_records_copied_total``).
3. **Idle window** (``--idle-s``, nothing produced): the daemon's CPU seconds per minute (``/proc/<pid>/stat``, all
   its threads), RSS (median of 1 s samples) and, from the kernel's per-socket counters (``ss -ti``: bytes of the
   daemon's connections alive at the window's end), the bytes it sent to / received from the source per fetch round
   and the bytes it exchanged with the target per second; the brokers' CPU too.
4. **Busy window** (``--busy-s``): ``--busy-rate`` records/s produced to two partitions (the first partition of the
   first two topics); a read_committed consumer on the target notes ``receive time − CreateTime`` for each record
   after ``--warmup-s``: p50 / p99 / max. The same CPU, RSS and wire figures. Then the target's copies of the busy
   topics are read back and must hold exactly the source's records.
5. **Start-up, warm**: the daemon is stopped (SIGTERM) and started again on the same pipeline, with N checkpoints
   (and offset maps) in the checkpoint topic: the same start-up measure. Peak RSS (``VmHWM``) of both processes.

Results: JSON lines while running, ``bench/results/daemon-scale-<tag>.json`` and Markdown tables at the end.
``--profile-s S`` adds, per N, a third start under cProfile for S seconds of idle running (start-up included) and
prints the functions with the most own time — to find what grows with idle lanes.

    .venv/bin/python -m bench.daemon_scale_bench --partitions 200 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.daemon_bench import PYTHON, RESULTS, ROOT, Daemon, _free_port, _value, _wait

CLK_TCK = os.sysconf("SC_CLK_TCK")
# broker settings of the private pair beyond the sandbox's: Kafka's own retention-check period (the sandbox's 1 s,
# a test timer, would have the brokers walk thousands of logs every second and load the machine being measured)
BROKER_EXTRA = (("log.retention.check.interval.ms", "300000"),)


class PrivatePair:
    """Source and target: two private single-node brokers (the sandbox's launcher and settings, free ports)."""

    def __init__(self, home: Path, cache_dir: Path, heap: str):
        from mirror_core.dev.sandbox.broker import SandboxBroker
        from mirror_core.dev.sandbox.spec import DEFAULT_KAFKA_VERSION, ClusterSpec

        self.brokers = {name: SandboxBroker(ClusterSpec(f"scale-{name}", DEFAULT_KAFKA_VERSION, _free_port(),
                                                        _free_port(), heap=heap, extra=BROKER_EXTRA),
                                            home, cache_dir)
                        for name in ("source", "target")}

    def start(self) -> PrivatePair:
        for broker in self.brokers.values():
            broker.start(timeout=180)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()

    def client_config(self, name: str) -> dict:
        return {"bootstrap.servers": self.brokers[name].spec.bootstrap}

    def port(self, name: str) -> int:
        return self.brokers[name].spec.port

    def pid(self, name: str) -> int | None:
        return self.brokers[name].pid()

    def open_files(self) -> dict[str, int | None]:
        return {name: broker.status().open_files for name, broker in self.brokers.items()}


# ---- process and socket counters (Linux /proc and ss) -------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid``'s threads by kind: ``main`` (the daemon's loop), ``librdkafka`` (threads named
    ``rdk:*``: the group membership's consumer, admin clients, the lease producer) and ``other`` (the lane
    workers, watches, the metrics server: Python does not name its threads for the OS)."""
    out = {"main": 0.0, "librdkafka": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = "main" if task.name == str(pid) else "librdkafka" if name.startswith("rdk:") else "other"
        out[kind] += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS now, peak RSS) of ``pid`` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def socket_bytes(pid: int, port: int) -> dict[str, tuple[int, int]]:
    """``pid``'s established connections to ``127.0.0.1:port``: local address → (bytes sent, bytes received)."""
    out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                         text=True, check=False).stdout.splitlines()
    found, local = {}, None
    for line in out:
        if not line.startswith(("\t", " ")):  # a connection's line; its counters follow on the next
            local = line.split()[2] if f"pid={pid}," in line else None
        elif local is not None:
            sent = re.search(r"bytes_sent:(\d+)", line)
            received = re.search(r"bytes_received:(\d+)", line)
            found[local] = (int(sent.group(1)) if sent else 0, int(received.group(1)) if received else 0)
            local = None
    return found


def bytes_between(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[tuple[int, int]]:
    """(sent, received) of each connection over a window, busiest first: the connections alive at its end (new
    ones counted from 0; one closed during the window is not counted)."""
    return sorted(((s - before.get(k, (0, 0))[0], r - before.get(k, (0, 0))[1]) for k, (s, r) in after.items()),
                  key=lambda pair: -sum(pair))


def metric(daemon: Daemon, name: str) -> float:
    """A metric's sum from the daemon's /metrics (rendering thousands of lanes' series takes a while on a loaded
    machine: a generous timeout, a few tries)."""
    import urllib.request

    for _ in range(5):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=20) as resp:
                body = resp.read().decode()
            return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M))
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"daemon /metrics did not answer; log {daemon.log}")


class Window:
    """One measuring window on the daemon (and the brokers): CPU, RSS samples, wire bytes, fetch rounds."""

    def __init__(self, daemon: Daemon, pair: PrivatePair):
        self.daemon, self.pair = daemon, pair
        self.pid = daemon.proc.pid
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.rss.append(memory_mib(self.pid)[0])

    def __enter__(self) -> Window:
        # the /metrics scrapes stay outside the CPU window: rendering 2,000 lanes' series costs the daemon ~0.6 CPU-s
        # on a short-lived request thread, which the window would otherwise count as the daemon's own
        self.rounds0 = metric(self.daemon, "shoal_fetch_rounds_total")
        self.began = time.monotonic()
        self.cpu0 = cpu_s(self.pid)
        self.threads0 = thread_cpu_s(self.pid)
        self.brokers0 = {name: cpu_s(self.pair.pid(name)) for name in ("source", "target")}
        self.wire0 = {name: socket_bytes(self.pid, self.pair.port(name)) for name in ("source", "target")}
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sampler.join()
        seconds = time.monotonic() - self.began
        cpu, threads = cpu_s(self.pid), thread_cpu_s(self.pid)
        brokers = {name: cpu_s(self.pair.pid(name)) for name in ("source", "target")}
        wire = {name: bytes_between(self.wire0[name], socket_bytes(self.pid, self.pair.port(name)))
                for name in ("source", "target")}
        rounds = metric(self.daemon, "shoal_fetch_rounds_total") - self.rounds0
        seconds_rounds = time.monotonic() - self.began
        per_min = 60 / seconds
        totals = {name: (sum(s for s, _ in conns), sum(r for _, r in conns)) for name, conns in wire.items()}
        self.result = {
            "seconds": round(seconds, 1),
            "cpu_s_per_min": round((cpu - self.cpu0) * per_min, 2),
            "cpu_s_per_min_by_thread": {kind: round((spent - self.threads0[kind]) * per_min, 2)
                                        for kind, spent in threads.items()},
            "rss_mib": round(statistics.median(self.rss), 1) if self.rss else None,
            "fetch_rounds_per_s": round(rounds / seconds_rounds, 2),
            "source_sent_per_round": round(totals["source"][0] / max(rounds, 1)),
            "source_received_per_round": round(totals["source"][1] / max(rounds, 1)),
            "target_sent_per_s": round(totals["target"][0] / seconds),
            "target_received_per_s": round(totals["target"][1] / seconds),
            # each connection's (sent, received) bytes per second, busiest first: which client the bytes are
            "source_connections_per_s": [(round(s / seconds), round(r / seconds)) for s, r in wire["source"]],
            "target_connections_per_s": [(round(s / seconds), round(r / seconds)) for s, r in wire["target"]],
            "broker_cpu_s_per_min": {name: round((brokers[name] - self.brokers0[name]) * per_min, 2)
                                     for name in ("source", "target")},
            # unrounded, for per-round figures (the rounded ones above move by 4 % per clock tick at idle)
            "rounds": rounds,
            "cpu_ms_per_round": round((cpu - self.cpu0) * 1000 / max(rounds, 1), 3),
            "cpu_ms_per_round_by_thread": {kind: round((spent - self.threads0[kind]) * 1000 / max(rounds, 1), 3)
                                           for kind, spent in threads.items()},
        }


# ---- start-up -----------------------------------------------------------------------------------------------------
def start_daemon(daemon: Daemon, lanes: int, timeout_s: float) -> dict:
    """Start the daemon; wait until every lane is opened and a fetch round followed. Seconds since the process
    start, from its log (ms; /metrics is not scraped meanwhile: rendering thousands of lanes costs the daemon):
    ``held_s`` (the last ``lane_acquired``), ``opened_s`` (the last ``lane_opened``), ``ready_s`` (the first fetch
    round after that, 0.5 s resolution)."""
    from datetime import datetime

    offset = daemon.log.stat().st_size if daemon.log.exists() else 0  # a restart appends to the same log
    began_wall = time.time()
    began = time.monotonic()
    daemon.start()
    opened: set[str] = set()
    held: set[str] = set()
    last_opened = last_held = rounds_at = None
    while True:
        if time.monotonic() - began > timeout_s:
            raise RuntimeError(f"{lanes} lanes not opened within {timeout_s:.0f}s ({len(opened)} were); "
                               f"log {daemon.log}")
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"daemon exited {daemon.proc.returncode} during start-up; log {daemon.log}")
        time.sleep(0.5)
        with open(daemon.log, "rb") as log:
            log.seek(offset)
            chunk = log.read()
        end = chunk.rfind(b"\n") + 1
        offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            found = re.search(r"event=lane_(opened|acquired) .*lane=(\S+)", line)
            if found:
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if found.group(1) == "opened":
                    opened.add(found.group(2))
                    last_opened = at
                else:
                    held.add(found.group(2))
                    last_held = at
        if len(opened) < lanes:
            continue
        rounds = metric(daemon, "shoal_fetch_rounds_total")
        if rounds_at is None:
            rounds_at = rounds
        elif rounds > rounds_at:
            return {"held_s": round(last_held - began_wall, 1) if last_held is not None else None,
                    "opened_s": round(last_opened - began_wall, 1),
                    "ready_s": round(time.monotonic() - began, 1)}


# ---- load ---------------------------------------------------------------------------------------------------------
def measure_latency(pair: PrivatePair, daemon: Daemon, window_pair, busy: list[tuple[str, int]], *, rate: int,
                    seconds: float, warmup_s: float, record_bytes: int) -> dict:
    """Produce ``rate`` records/s over the ``busy`` partitions for ``seconds``; latency on the target (see module)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from mirror_core.config.cluster import ClusterConfig

    src = ClusterConfig("source", pair.client_config("source"))
    tgt = ClusterConfig("target", pair.client_config("target"))
    consumer = Consumer(tgt.confluent(**{"group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                                         "isolation.level": "read_committed", "fetch.wait.max.ms": 100,
                                         "auto.offset.reset": "latest"}))
    consumer.assign([TopicPartition(f"dr.{topic}", p, -1) for topic, p in busy])  # -1: the end, now
    latencies: list[tuple[float, float]] = []  # (record timestamp ms, latency ms)
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            for msg in consumer.consume(1000, 0.1):
                if msg.error() is None:
                    latencies.append((msg.timestamp()[1], time.time() * 1000 - msg.timestamp()[1]))

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(2.0)  # the reader has its partitions and positions before the first record
    producer = Producer(src.confluent(**{"enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4"}))
    rng = random.Random(rate)
    values = [_value(rng, record_bytes) for _ in range(256)]
    produced = 0
    with window_pair as window:
        started = time.time()
        while time.time() - started < seconds:
            due = int((time.time() - started) * rate)
            while produced < due:
                topic, partition = busy[produced % len(busy)]
                producer.produce(topic, partition=partition, key=b"k%d" % (produced % 1000),
                                 value=values[produced % 256])
                produced += 1
            producer.poll(0)
            time.sleep(0.002)
        producer.flush(30)
    try:
        _wait(lambda: len(latencies) >= produced, 120, "every busy record on the target")
    finally:
        stop.set()
        reader.join(10)
        consumer.close()
    measured = sorted(lat for ts, lat in latencies if ts >= (started + warmup_s) * 1000)

    def pct(q: float) -> float:
        return round(measured[min(len(measured) - 1, int(q * len(measured)))], 1)

    return {**window.result, "records": produced, "rate_produced": round(produced / seconds),
            "measured_records": len(measured), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": round(measured[-1], 1)}


def check_exact(pair: PrivatePair, topics: list[str]) -> int:
    """The target copies of ``topics`` hold exactly the source's records (key, value, timestamp, partition order);
    returns how many were compared."""
    from mirror_core.config.cluster import ClusterConfig
    from tests.kafka_helpers import KafkaTestCluster

    src = KafkaTestCluster(ClusterConfig("source", pair.client_config("source")))
    tgt = KafkaTestCluster(ClusterConfig("target", pair.client_config("target")))
    compared = 0
    for topic in topics:
        want = [(r.partition, r.content()) for r in src.read_all(topic, timeout_s=120)]
        got = [(r.partition, r.content()) for r in tgt.read_all(f"dr.{topic}", timeout_s=120)]
        if got != want:
            raise AssertionError(f"target dr.{topic} differs from the source: {len(got)} records, {len(want)} on "
                                 "the source")
        compared += len(want)
    return compared


def seed(pair: PrivatePair, topics: list[str], partitions: int, records: int) -> None:
    """``records`` records in every partition, each acknowledged (a delivery error — a topic the producer does not
    know yet, say — is an error here, not a silently idle partition)."""
    from confluent_kafka import Producer

    from mirror_core.config.cluster import ClusterConfig

    failed: list[str] = []
    acked = [0]

    def delivered(err, _msg):
        if err is None:
            acked[0] += 1
        else:
            failed.append(err.str())

    producer = Producer(ClusterConfig("source", pair.client_config("source")).confluent(
        **{"enable.idempotence": True, "linger.ms": 20}))
    for topic in topics:
        for p in range(partitions):
            for i in range(records):
                producer.produce(topic, partition=p, key=b"seed%d" % i, value=b"seed record %d of %s-%d" % (i,
                                 topic.encode(), p), on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(120)
    wanted = len(topics) * partitions * records
    if left or failed or acked[0] != wanted:
        raise RuntimeError(f"seed records: {acked[0]} of {wanted} acknowledged, {left} unflushed, errors "
                           f"{sorted(set(failed))[:3]}")


def profile_top(path: Path, count: int = 25) -> list[str]:
    import pstats

    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:count]  # own time
    return [f"{tt:8.2f}s own {ct:8.2f}s cum {nc:>9} calls  {Path(fn).name}:{line} {name}"
            for (fn, line, name), (_cc, nc, tt, ct, _callers) in rows]


class _SkipWarm(Exception):
    """--no-warm: the warm start is not measured."""


# ---- one N --------------------------------------------------------------------------------------------------------
def run_scale(pair: PrivatePair, workdir: Path, partitions: int, args, root: Path | None = None) -> dict:
    """One N on fresh topics and a fresh pipeline; the daemon runs from ``root`` (default: this tree)."""
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.topics import TopicAdmin

    tag = uuid.uuid4().hex[:6]
    per_topic = min(args.per_topic, partitions)
    topics = [f"scale.{tag}.t{i:03d}" for i in range(math.ceil(partitions / per_topic))]
    if len(topics) * per_topic != partitions:
        raise SystemExit(f"--partitions {partitions} is not a multiple of --per-topic {per_topic}")
    src_admin = TopicAdmin(ClusterConfig("source", pair.client_config("source")))
    created = time.monotonic()
    for topic in topics:
        src_admin.create(topic, per_topic, None)
    _wait(lambda: all(src_admin.list_topics().get(topic) == per_topic for topic in topics), 60, "the topics")
    seed(pair, topics, per_topic, args.seed_records)
    busy = [(topics[0], 0), (topics[1], 0)] if len(topics) > 1 else [(topics[0], 0), (topics[0], 1)]
    pinned = {"commit_interval_ms": args.commit_interval_ms, "poll_interval_ms": args.poll_interval_ms,
              "rescan_interval_s": args.rescan_interval_s}
    if args.lease_compat is not None:  # else the daemon's default
        pinned["lease_compat"] = {"true": True, "false": False}.get(args.lease_compat, args.lease_compat)
    out = {"kind": "scale", "tree": str(root or ROOT), "partitions": partitions, "topics": len(topics),
           "per_topic": per_topic,
           "busy_partitions": len(busy), "seed_records": args.seed_records, "daemon": pinned,
           "setup_s": round(time.monotonic() - created, 1)}
    pipeline = f"scale-{partitions}-{tag}"

    def daemon(**extra) -> Daemon:
        merged = {k: v for k, v in pinned.items() if k != "commit_interval_ms"}
        return Daemon(workdir, pair, pipeline, rf"scale\.{tag}\..*", args.commit_interval_ms,
                      target=pair.client_config("target"), root=root, **merged, **extra)

    first = daemon()
    try:
        out["start_cold"] = start_daemon(first, partitions, args.startup_timeout_s)
        began = time.monotonic()
        while metric(first, "shoal_records_copied_total") < partitions * args.seed_records:  # 1 s: each scrape
            if time.monotonic() - began > args.startup_timeout_s:                            # renders every lane
                raise RuntimeError(f"the seeded records were not all copied; log {first.log}")
            time.sleep(1.0)
        out["start_cold"]["caught_up_s"] = round(out["start_cold"]["ready_s"] + time.monotonic() - began, 1)
        print(json.dumps({"partitions": partitions, "start_cold": out["start_cold"]}), flush=True)
        time.sleep(args.settle_s)
        with Window(first, pair) as idle:
            time.sleep(args.idle_s)
        out["idle"] = idle.result
        print(json.dumps({"partitions": partitions, "idle": out["idle"]}), flush=True)
        out["busy"] = measure_latency(pair, first, Window(first, pair), busy, rate=args.busy_rate,
                                      seconds=args.busy_s, warmup_s=args.warmup_s, record_bytes=args.record_bytes)
        print(json.dumps({"partitions": partitions, "busy": out["busy"]}), flush=True)
        out["peak_rss_mib_first"] = round(memory_mib(first.proc.pid)[1], 1)
    finally:
        stopping = time.monotonic()
        rc = first.stop()
        out["stop_s"] = round(time.monotonic() - stopping, 1)
        if rc != 0:
            print(f"daemon exited {rc}; log {first.log}", file=sys.stderr)
    out["exact_records_compared"] = check_exact(pair, sorted({topic for topic, _ in busy}))
    second = daemon() if not args.no_warm else None
    try:
        if second is None:
            raise _SkipWarm
        out["start_warm"] = start_daemon(second, partitions, args.startup_timeout_s)
        time.sleep(args.settle_s)
        out["start_warm"]["rss_mib"] = round(memory_mib(second.proc.pid)[0], 1)
        out["peak_rss_mib_second"] = round(memory_mib(second.proc.pid)[1], 1)
        print(json.dumps({"partitions": partitions, "start_warm": out["start_warm"]}), flush=True)
    except _SkipWarm:
        pass
    finally:
        if second is not None:
            second.stop()
    if args.profile_s and partitions == max(args.partitions):
        stats = workdir / f"{pipeline}.pstats"
        profiled = daemon(python_args=("-m", "cProfile", "-o", str(stats)))
        try:
            start_daemon(profiled, partitions, args.startup_timeout_s)
            time.sleep(args.profile_s)
        finally:
            profiled.stop()
        out["profile_top"] = profile_top(stats)
        RESULTS.mkdir(exist_ok=True)
        kept = RESULTS / f"daemon-scale-{args.tag}-{partitions}.pstats"
        kept.write_bytes(stats.read_bytes())
        out["profile_file"] = str(kept)
        print(f"\nprofile, {partitions} partitions (warm start + {args.profile_s:g}s idle, main thread, own time):")
        print("\n".join(out["profile_top"]), flush=True)
    tgt_admin = TopicAdmin(ClusterConfig("target", pair.client_config("target")))
    for topic in topics:  # the next N runs without these partitions on the brokers
        src_admin.delete(topic)
        tgt_admin.delete(f"dr.{topic}")
    return out


def print_tables(results: list[dict]) -> None:
    def who(r: dict) -> str:
        return f"{r['partitions']:,} ({Path(r.get('tree', str(ROOT))).name})"

    print("\n| partitions (tree) | start cold: held s | all lanes open s | first round s | caught up s | start warm: "
          "held s | all open s | first round s | stop s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        c, w = r["start_cold"], r.get("start_warm") or {}
        print(f"| {who(r)} | {c['held_s']} | {c['opened_s']} | {c['ready_s']} | {c['caught_up_s']} | "
              f"{w.get('held_s', '-')} | {w.get('opened_s', '-')} | {w.get('ready_s', '-')} | {r['stop_s']} |")
    print("\n| partitions (tree) | window | daemon CPU s/min | CPU ms per round | RSS MiB | fetch rounds/s | "
          "source B/round out | in | target B/s out | in | broker CPU s/min (source, target) | p50 ms | p99 ms | "
          "max ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in results:
        for name in ("idle", "busy"):
            w = r[name]
            lat = (f"{w['p50_ms']} | {w['p99_ms']} | {w['max_ms']}" if name == "busy" else "- | - | -")
            per_round = w["cpu_ms_per_round"]
            print(f"| {who(r)} | {name} | {w['cpu_s_per_min']} | {per_round:.2f} | {w['rss_mib']} | "
                  f"{w['fetch_rounds_per_s']} | {w['source_sent_per_round']:,} | {w['source_received_per_round']:,} | "
                  f"{w['target_sent_per_s']:,} | {w['target_received_per_s']:,} | "
                  f"{w['broker_cpu_s_per_min']['source']}, {w['broker_cpu_s_per_min']['target']} | {lat} |")
    print("\n| partitions (tree) | window | CPU s/min: main thread | librdkafka threads | other threads | "
          "CPU ms per round: main thread | librdkafka | other |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        for name in ("idle", "busy"):
            t, m = r[name]["cpu_s_per_min_by_thread"], r[name]["cpu_ms_per_round_by_thread"]
            print(f"| {who(r)} | {name} | {t['main']} | {t['librdkafka']} | {t['other']} | "
                  f"{m['main']:.3f} | {m['librdkafka']:.3f} | {m['other']:.3f} |")
    print("\n| partitions (tree) | peak RSS MiB (first run, second start) | RSS after warm start MiB |")
    print("|---|---:|---:|")
    for r in results:
        print(f"| {who(r)} | {r['peak_rss_mib_first']}, {r.get('peak_rss_mib_second', '-')} | "
              f"{(r.get('start_warm') or {}).get('rss_mib', '-')} |")
    here = [r for r in results if r.get("tree", str(ROOT)) == str(ROOT)]
    if len(here) >= 2:
        lo, hi = here[0], here[-1]
        extra = hi["partitions"] - lo["partitions"]
        print(f"\nper extra lane ({lo['partitions']:,} → {hi['partitions']:,}): idle RSS "
              f"{(hi['idle']['rss_mib'] - lo['idle']['rss_mib']) * 1024 / extra:.1f} KiB, idle CPU "
              f"{(hi['idle']['cpu_s_per_min'] - lo['idle']['cpu_s_per_min']) * 1000 / extra:.2f} ms/min")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon_scale_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--per-topic", type=int, default=50, help="partitions per topic")
    parser.add_argument("--seed-records", type=int, default=1, help="records in every partition before the start")
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--busy-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after start-up before measuring")
    parser.add_argument("--busy-rate", type=int, default=200, help="records/s over the two busy partitions")
    parser.add_argument("--record-bytes", type=int, default=512)
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--poll-interval-ms", type=int, default=200)
    parser.add_argument("--rescan-interval-s", type=float, default=10.0)
    parser.add_argument("--lease-compat", help="the pipeline's lease_compat (true/false, or a mode name); default: "
                                               "the daemon's default")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--broker-heap", default="-Xms256m -Xmx1g")
    parser.add_argument("--profile-s", type=float, default=0.0,
                        help="for the largest N, a third start under cProfile, running this long after start-up")
    parser.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--before-root", type=Path,
                        help="also run every N with the daemon from this source tree (e.g. a worktree of the branch "
                             "point), just before this tree's run: before/after under the same load")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm start (second process)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from mirror_core.dev.sandbox import sandbox_from_environ

    cache_dir = sandbox_from_environ(os.environ).cache_dir
    results = []
    began = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="shoal-scale-bench-") as tmp:
        workdir = Path(tmp)
        pair = PrivatePair(workdir / "brokers", cache_dir, args.broker_heap)
        try:
            pair.start()
            print(json.dumps({"brokers_open_files": pair.open_files()}), flush=True)
            for n in args.partitions:
                if args.before_root is not None:
                    results.append(run_scale(pair, workdir, n, args, root=args.before_root.resolve()))
                results.append(run_scale(pair, workdir, n, args))
        finally:
            pair.stop()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"daemon-scale-{args.tag}.json"
    out.write_text(json.dumps({"host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                        "platform": platform.platform(), "load_before": load_before,
                                        "load_after": os.getloadavg(),
                                        "run_s": round(time.monotonic() - began)},
                               "interpreter": PYTHON,
                               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                               "results": results}, indent=2))
    print(f"\nresults: {out} (load average before {load_before}, after {os.getloadavg()})")
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
