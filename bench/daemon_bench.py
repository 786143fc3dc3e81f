"""Daemon benchmark: end-to-end replication latency and throughput of the continuous shallow mirror daemon.

Two measurements, each against a fresh pipeline and fresh topics on the sandbox (source → target), with the daemon
running as operators run it (``python -m mirror_core.daemon --config <yaml>``, its own process):

- ``latency``: a producer writes to the source at a fixed rate (records carry CreateTime = the moment the producer
  client accepted them); a read_committed consumer on the target (``fetch.wait.max.ms`` 100) notes, for every record,
  ``receive time − record timestamp``: produce → on the source → fetched by the daemon → produced in the daemon's
  transaction → committed → visible to a read_committed consumer. The first ``--warmup-s`` seconds are left out.
  Reported: p50 / p90 / p99 / max and the rates produced and received. Run for each ``--rates`` ×
  ``--commit-intervals`` combination.
- ``lanes`` (``--lanes-partitions``): many lanes busy at once — a backlog spread over that many partitions, fetched in
  small per-partition slices (``--lanes-fetch-bytes``) so every fetch round carries a share for every lane and the
  round's commits dominate; run once per ``--commit-workers`` value (1: the lanes commit in turn, as before the
  lane workers). Reported: fetch rounds/s (``shoal_fetch_rounds_total``), records/s and MB/s over the copy window.
  ``--target-rtt-ms`` > 0 puts the target at that round trip: a private single-node broker (the sandbox's Kafka
  jars) that advertises the address of a pipelined delay proxy (:mod:`bench.delay_proxy`, half the round trip each
  way) in front of it, so every target request of the daemon pays it; the source stays the sandbox's.
- ``catchup``: a backlog of ``--backlog-records`` is written first; then the daemon starts and the time from its
  first copied record (``shoal_records_copied_total`` > 0 on ``/metrics``, polled every 0.2 s) until every record is
  committed on the target is the copy time: records/s and MB/s (raw batch bytes, ``shoal_bytes_copied_total``).
  The copy time runs from the daemon's first ``lane_acquired`` log line to the ``copied`` line that completed the
  backlog (log timestamps, ms), so session opens and every step are inside it; start-up (interpreter, imports,
  connecting, preflight) is reported apart.

Every run checks that the target holds exactly the source's committed record count. Results go to
``bench/results/daemon-<time>.json`` and a Markdown table is printed.

    .venv/bin/python -m bench.daemon_bench --help
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


def _sandbox():
    from mirror_core.dev.sandbox import sandbox_from_environ

    return sandbox_from_environ(os.environ)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, workdir: Path, sandbox, pipeline: str, include: str, commit_interval_ms: int, *,
                 target: dict | None = None, python_args: tuple[str, ...] = (), root: Path | None = None, **extra):
        import yaml

        self.python_args = python_args  # interpreter options before ``-m mirror_core.daemon`` (e.g. cProfile)
        self.root = root or ROOT  # the source tree the daemon runs from (e.g. a worktree of an older commit)
        self.port = _free_port()
        self.config = workdir / f"{pipeline}.yaml"
        self.log = workdir / f"{pipeline}.log"
        self.config.write_text(yaml.safe_dump({
            "pipeline": pipeline, "source": sandbox.client_config("source"),
            "target": target or sandbox.client_config("target"),
            "include": include, "naming": "prefix:dr.", "mode": "exactly-once",
            "commit_interval_ms": commit_interval_ms, "commit_bytes": 4 * 1024 * 1024, "poll_interval_ms": 50,
            "rescan_interval_s": 2, "lease_ttl_s": 15, "metrics_port": self.port, **extra}))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([PYTHON, *self.python_args, "-m", "mirror_core.daemon", "--config",
                                          str(self.config)], cwd=self.root, stdout=log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        return self.proc.wait(60)

    def metric_sum(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
                body = resp.read().decode()
        except OSError:
            return 0.0
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M))


class FarTarget:
    """A private single-node KRaft broker on loopback behind :mod:`bench.delay_proxy`: it advertises the proxy's
    port, so every client request (the daemon's transactions included) pays ``rtt_ms``. The proxy hides TCP window
    effects (it reads ahead), which do not matter for small transactional requests."""

    KAFKA_VERSION = "4.4.0"

    def __init__(self, home: Path, rtt_ms: float):
        from mirror_core.dev.sandbox import jars
        from mirror_core.dev.sandbox.broker import LOG_CONFIG
        from mirror_core.dev.sandbox.spec import FAST_TIMERS, SINGLE_NODE, ClusterSpec

        self.home, self.rtt_ms = home, rtt_ms
        self.port, self.proxy_port, self.controller = _free_port(), _free_port(), _free_port()
        self.lib = jars.resolve_classpath(ClusterSpec("far-target", self.KAFKA_VERSION, self.port, self.controller),
                                          Path.home() / ".cache" / "shoal")
        self.log_config = LOG_CONFIG["kafka4"]
        self.props = home / "server.properties"
        settings = {
            "process.roles": "broker,controller", "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller}", "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.proxy_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(home / "data"), **SINGLE_NODE, **FAST_TIMERS}
        home.mkdir(parents=True, exist_ok=True)
        self.props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.broker: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None

    def _java(self, main: str, *args: str) -> list[str]:
        import shutil

        return [shutil.which("java") or "java", "-Xms256m", "-Xmx512m", "-XX:+UseSerialGC",
                "-Djava.awt.headless=true", f"-Dkafka.logs.dir={self.home / 'logs'}",
                f"-Dlog4j2.configurationFile={self.log_config}", "-cp", f"{self.lib}/*", main, *args]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def start(self, timeout_s: float = 120.0) -> FarTarget:
        from mirror_core.dev.sandbox.broker import new_cluster_id

        cluster_id = new_cluster_id()  # never "-…", which the storage tool reads as an option
        subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.props)),
                       check=True, capture_output=True)
        console = open(self.home / "console.log", "wb")  # noqa: SIM115 - kept open for the JVM's lifetime
        self.broker = subprocess.Popen(self._java("kafka.Kafka", str(self.props)), stdout=console,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.proxy = subprocess.Popen([PYTHON, "-m", "bench.delay_proxy", "--listen", self.bootstrap, "--to",
                                       f"127.0.0.1:{self.port}", "--one-way-ms", f"{self.rtt_ms / 2:g}"], cwd=ROOT)
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.broker.poll() is not None:
                raise RuntimeError(f"far target broker exited: see {self.home / 'console.log'}")
            try:
                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(1)
        raise RuntimeError("far target broker did not come up")

    def measured_rtt_ms(self) -> float:
        """The median of 5 Metadata round trips through the proxy."""
        from mirror_core.kafka.wire_client import WireClient

        with WireClient("far-target", {"bootstrap.servers": self.bootstrap}) as client:
            client.metadata([])  # connected
            times = []
            for _ in range(5):
                started = time.monotonic()
                client.metadata([])
                times.append((time.monotonic() - started) * 1000)
        return round(sorted(times)[2], 1)

    def stop(self) -> None:
        for proc in (self.proxy, self.broker):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _lanes_owned(daemon: Daemon) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=2) as resp:
            m = re.search(r"^shoal_lanes_owned (\S+)$", resp.read().decode(), re.M)
            return float(m.group(1)) if m else 0.0
    except OSError:
        return 0.0


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _committed_count(cluster_config, topic: str) -> int:
    from tests.kafka_helpers import KafkaTestCluster

    return len(KafkaTestCluster(cluster_config).read_all(topic, timeout_s=120))


def _value(rng: random.Random, size: int) -> bytes:
    words = [b"order", b"payment", b"customer", b"sku", b"shipped", b"pending", b"EUR", b"USD"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" " + str(rng.randint(0, 10**6)).encode() + b" "
    return bytes(out[:size])


def run_latency(sandbox, workdir: Path, *, rate: int, seconds: float, warmup_s: float, partitions: int,
                record_bytes: int, commit_interval_ms: int) -> dict:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.topics import TopicAdmin

    src = ClusterConfig("source", sandbox.client_config("source"))
    tgt = ClusterConfig("target", sandbox.client_config("target"))
    tag = uuid.uuid4().hex[:8]
    topic = f"bench.daemon.latency.{tag}"
    TopicAdmin(src).create(topic, partitions, None)
    daemon = Daemon(workdir, sandbox, f"bench-lat-{tag}", re.escape(topic), commit_interval_ms).start()
    try:
        _wait(lambda: _lanes_owned(daemon) >= partitions, 60, "the daemon's lanes")
        consumer = Consumer(tgt.confluent(**{"group.id": f"bench-{tag}", "enable.auto.commit": False,
                                             "isolation.level": "read_committed", "fetch.wait.max.ms": 100,
                                             "auto.offset.reset": "earliest"}))
        _wait(lambda: f"dr.{topic}" in TopicAdmin(tgt).list_topics(), 30, "the target topic")
        consumer.assign([TopicPartition(f"dr.{topic}", p, 0) for p in range(partitions)])
        latencies: list[tuple[float, float]] = []  # (receive time, latency ms)
        stop = threading.Event()

        def consume():
            while not stop.is_set():
                for msg in consumer.consume(1000, 0.1):
                    if msg.error() is None:
                        now = time.time() * 1000
                        latencies.append((now, now - msg.timestamp()[1]))

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        producer = Producer(src.confluent(**{"enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4"}))
        rng = random.Random(rate)
        values = [_value(rng, record_bytes) for _ in range(256)]
        started = time.time()
        produced = 0
        while time.time() - started < seconds:
            due = int((time.time() - started) * rate)
            while produced < due:
                producer.produce(topic, key=b"k%d" % (produced % 1000), value=values[produced % 256])
                produced += 1
            producer.poll(0)
            time.sleep(0.002)
        producer.flush(30)
        produce_s = time.time() - started
        _wait(lambda: len(latencies) >= produced, 120, "every record on the target")
        stop.set()
        reader.join(10)
        consumer.close()
        measured = [lat for at, lat in latencies if at >= (started + warmup_s) * 1000]
        measured.sort()
        on_target = _committed_count(tgt, f"dr.{topic}")
        assert on_target == produced, f"{on_target} records on the target, {produced} produced"

        def pct(q: float) -> float:
            return measured[min(len(measured) - 1, int(q * len(measured)))]

        return {"kind": "latency", "rate_target": rate, "partitions": partitions, "record_bytes": record_bytes,
                "commit_interval_ms": commit_interval_ms, "seconds": round(produce_s, 1), "records": produced,
                "rate_produced": round(produced / produce_s), "measured_records": len(measured),
                "p50_ms": round(pct(0.50), 1), "p90_ms": round(pct(0.90), 1), "p99_ms": round(pct(0.99), 1),
                "max_ms": round(measured[-1], 1), "mean_ms": round(statistics.fmean(measured), 1)}
    finally:
        rc = daemon.stop()
        if rc != 0:
            print(f"daemon exited {rc}; log {daemon.log}", file=sys.stderr)


def run_catchup(sandbox, workdir: Path, *, records: int, partitions: int, record_bytes: int,
                commit_interval_ms: int) -> dict:
    from confluent_kafka import Producer

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.topics import TopicAdmin

    src = ClusterConfig("source", sandbox.client_config("source"))
    tgt = ClusterConfig("target", sandbox.client_config("target"))
    tag = uuid.uuid4().hex[:8]
    topic = f"bench.daemon.catchup.{tag}"
    TopicAdmin(src).create(topic, partitions, None)
    producer = Producer(src.confluent(**{"enable.idempotence": True, "linger.ms": 20, "compression.type": "lz4",
                                         "batch.size": 65536}))
    rng = random.Random(records)
    values = [_value(rng, record_bytes) for _ in range(256)]
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"k%d" % (i % 1000), value=values[i % 256])
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    daemon = Daemon(workdir, sandbox, f"bench-catchup-{tag}", re.escape(topic), commit_interval_ms)
    launched = time.monotonic()
    daemon.start()
    try:
        launched_wall = time.time()
        while daemon.metric_sum("shoal_records_copied_total") < records:
            if time.monotonic() - launched > 600:
                raise RuntimeError(f"catch-up did not finish; log {daemon.log}")
            time.sleep(0.2)
        copy_bytes = daemon.metric_sum("shoal_bytes_copied_total")
        first, done = _copy_window(daemon.log.read_text())
        on_target = _committed_count(tgt, f"dr.{topic}")
        assert on_target == records, f"{on_target} records on the target, {records} produced"
        seconds = done - first
        return {"kind": "catchup", "partitions": partitions, "record_bytes": record_bytes, "records": records,
                "commit_interval_ms": commit_interval_ms, "batch_bytes": int(copy_bytes),
                "seconds": round(seconds, 2), "startup_s": round(first - launched_wall, 2),
                "records_per_s": round(records / seconds), "mb_per_s": round(copy_bytes / seconds / 1e6, 1)}
    finally:
        rc = daemon.stop()
        if rc != 0:
            print(f"daemon exited {rc}; log {daemon.log}", file=sys.stderr)


def _produce_backlog(src, topic: str, records: int, record_bytes: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(src.confluent(**{"enable.idempotence": True, "linger.ms": 20, "compression.type": "lz4",
                                         "batch.size": 65536}))
    rng = random.Random(records)
    values = [_value(rng, record_bytes) for _ in range(256)]
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"k%d" % (i % 1000), value=values[i % 256])
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)


def run_lanes(sandbox, workdir: Path, *, records: int, partitions: int, record_bytes: int, commit_workers: int,
              partition_fetch_bytes: int, far_target: FarTarget | None = None) -> dict:
    """Many lanes busy at once (see the module docstring): one catch-up, every round a share per lane."""
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.topics import TopicAdmin

    src = ClusterConfig("source", sandbox.client_config("source"))
    target_settings = {"bootstrap.servers": far_target.bootstrap} if far_target else sandbox.client_config("target")
    tgt = ClusterConfig("target", target_settings)
    tag = uuid.uuid4().hex[:8]
    topic = f"bench.daemon.lanes.{tag}"
    TopicAdmin(src).create(topic, partitions, None)
    _produce_backlog(src, topic, records, record_bytes)
    extra = {"commit_workers": commit_workers} if commit_workers else {}  # 0: the key left out (a build before it)
    daemon = Daemon(workdir, sandbox, f"bench-lanes-{tag}", re.escape(topic), 1000, target=target_settings,
                    partition_fetch_max_bytes=partition_fetch_bytes, **extra)
    launched = time.monotonic()
    daemon.start()
    try:
        while daemon.metric_sum("shoal_records_copied_total") < records:
            if time.monotonic() - launched > 600:
                raise RuntimeError(f"catch-up did not finish; log {daemon.log}")
            time.sleep(0.2)
        copy_bytes = daemon.metric_sum("shoal_bytes_copied_total")
        first, done = _copy_window(daemon.log.read_text())
        log = daemon.log.read_text()
        rounds = sum(1 for line in log.splitlines() if "event=copied" in line)  # lane commits with data
        steady_first, _ = _copy_window(log, start="event=copied")  # from the first commit: lane opens left out
        fetch_rounds = daemon.metric_sum("shoal_fetch_rounds_total")
        on_target = _committed_count(tgt, f"dr.{topic}")
        assert on_target == records, f"{on_target} records on the target, {records} produced"
        seconds = done - first
        return {"kind": "lanes", "partitions": partitions, "commit_workers": commit_workers,
                "target_rtt_ms": far_target.measured_rtt_ms() if far_target else 0.0,
                "partition_fetch_bytes": partition_fetch_bytes, "record_bytes": record_bytes, "records": records,
                "batch_bytes": int(copy_bytes), "seconds": round(seconds, 2),
                "fetch_rounds_total": int(fetch_rounds), "lane_commits": rounds,
                "lane_commits_per_s": round(rounds / seconds, 1), "steady_s": round(done - steady_first, 2),
                "steady_lane_commits_per_s": round((rounds - 1) / max(done - steady_first, 1e-3), 1),
                "steady_mb_per_s": round(copy_bytes / max(done - steady_first, 1e-3) / 1e6, 1),
                "records_per_s": round(records / seconds), "mb_per_s": round(copy_bytes / seconds / 1e6, 1)}
    finally:
        rc = daemon.stop()
        if rc != 0:
            print(f"daemon exited {rc}; log {daemon.log}", file=sys.stderr)


def _copy_window(log: str, start: str = "event=lane_acquired") -> tuple[float, float]:
    """(first ``start`` line, last copied) as epoch seconds, from the daemon's log lines."""
    from datetime import datetime

    def stamp(line: str) -> float:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    lines = log.splitlines()
    first = min(stamp(line) for line in lines if start in line)
    last = max(stamp(line) for line in lines if "event=copied" in line)
    return first, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,5000", help="producer records/s for the latency runs")
    parser.add_argument("--commit-intervals", default="200,1000", help="daemon commit_interval_ms values")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each latency run")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--record-bytes", type=int, default=512)
    parser.add_argument("--backlog-records", type=int, default=200_000, help="0: no catch-up run")
    parser.add_argument("--lanes-partitions", type=int, default=0, help="0: no many-lanes run")
    parser.add_argument("--lanes-records", type=int, default=96_000)
    parser.add_argument("--lanes-fetch-bytes", type=int, default=65_536, help="partition_fetch_max_bytes there")
    parser.add_argument("--commit-workers", default="1,8",
                        help="daemon commit_workers values for the lanes runs (0: key left out)")
    parser.add_argument("--target-rtt-ms", type=float, default=0.0,
                        help="lanes runs: a private target broker behind a delay proxy at this round trip")
    parser.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sandbox = _sandbox()
    results = []
    with tempfile.TemporaryDirectory(prefix="shoal-daemon-bench-") as tmp:
        workdir = Path(tmp)
        if args.lanes_partitions:
            far = FarTarget(workdir / "far-target", args.target_rtt_ms).start() if args.target_rtt_ms else None
            try:
                for workers in [int(x) for x in args.commit_workers.split(",")]:
                    r = run_lanes(sandbox, workdir, records=args.lanes_records, partitions=args.lanes_partitions,
                                  record_bytes=args.record_bytes, commit_workers=workers,
                                  partition_fetch_bytes=args.lanes_fetch_bytes, far_target=far)
                    print(json.dumps(r), flush=True)
                    results.append(r)
            finally:
                if far is not None:
                    far.stop()
        for interval in [int(x) for x in args.commit_intervals.split(",")]:
            for rate in [int(x) for x in args.rates.split(",") if x.strip()]:
                r = run_latency(sandbox, workdir, rate=rate, seconds=args.seconds, warmup_s=args.warmup_s,
                                partitions=args.partitions, record_bytes=args.record_bytes,
                                commit_interval_ms=interval)
                print(json.dumps(r), flush=True)
                results.append(r)
            if args.backlog_records:
                r = run_catchup(sandbox, workdir, records=args.backlog_records, partitions=args.partitions,
                                record_bytes=args.record_bytes, commit_interval_ms=interval)
                print(json.dumps(r), flush=True)
                results.append(r)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"daemon-{args.tag}.json"
    out.write_text(json.dumps({"host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                        "platform": platform.platform()}, "args": vars(args), "results": results},
                              indent=2))
    print(f"\nresults: {out}\n")
    print("| commit_interval_ms | load rec/s (produced) | p50 ms | p90 ms | p99 ms | max ms | records measured |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if r["kind"] == "latency":
            print(f"| {r['commit_interval_ms']} | {r['rate_produced']:,} | {r['p50_ms']} | {r['p90_ms']} | "
                  f"{r['p99_ms']} | {r['max_ms']} | {r['measured_records']:,} |")
    print("\n| target RTT ms | lanes | commit_workers | records | batch MB | copy s (opens incl.) | MB/s | "
          "steady s (first commit on) | steady lane commits/s | steady MB/s | fetch rounds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if r["kind"] == "lanes":
            print(f"| {r['target_rtt_ms']} | {r['partitions']} | {r['commit_workers']} | {r['records']:,} | "
                  f"{r['batch_bytes'] / 1e6:.1f} | {r['seconds']} | {r['mb_per_s']} | {r['steady_s']} | "
                  f"{r['steady_lane_commits_per_s']} | {r['steady_mb_per_s']} | {r['fetch_rounds_total']} |")
    print("\n| commit_interval_ms | backlog records | batch MB | copy s | records/s | MB/s | start-up s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if r["kind"] == "catchup":
            print(f"| {r['commit_interval_ms']} | {r['records']:,} | {r['batch_bytes'] / 1e6:.1f} | {r['seconds']} | "
                  f"{r['records_per_s']:,} | {r['mb_per_s']} | {r['startup_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
