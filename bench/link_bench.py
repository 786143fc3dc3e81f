"""Link benchmark: copy the same data over a modelled long link with Shoal and its peers, at several round trips.

The source is far and the target near (Shoal runs beside the target). Model (root only, opt-in: never part of the
test suite): a network namespace ``shoal-link`` joined to the host by a veth pair (host 10.77.0.1, namespace
10.77.0.2); a private single-node Kafka broker (the benchmark's own source, from the sandbox's jar cache) runs inside
the namespace; the link's rate is a ``tbf`` qdisc on the namespace's veth end (the data direction, far → near: real
TCP on that leg). The round trip is added by a pipelined delay proxy on the host (:mod:`bench.delay_proxy`, half
each way; the broker advertises the proxy's address), because this machine's kernel has no ``sch_netem``: TCP
windows and socket buffers therefore see the short veth round trip, not the modelled one — a small broker send
buffer does not cap throughput here as it would on a real long link (the preflight rule
``check_link_buffers`` covers that case). The target is the sandbox's target broker on loopback.

Mirrors, each its own process, copying the whole topic (4 partitions of ~650-byte uncompressed JSON records):

- ``shoal-copy``: ``shoal copy --mode exactly-once --link-mbps 20`` (all partitions concurrently; fetches sized
  for the measured round trip);
- ``shoal-copy-sasl``: the same over SASL_SSL with SCRAM-SHA-512 on both sides (the far broker's secure listener
  through the same proxy and link, the sandbox target's secure listener), TLS on Shoal's fast path;
- ``shoal-copy-1p``: the same, of a topic of its own with ONE partition (``--one-partition-records``, by default
  300,000 records, ~166 MB: about ten link-sized fetches at 200 ms, so the first fetch's transfer, which lands before
  the steady window opens, does not inflate the rate as a 41 MB partition did); its rate is judged against the link
  too, over the middle 60 % (``middle_60pct_MBps``) as well;
- ``shoal-copy-sasl-before``: ``shoal-copy-sasl`` from ``--before-tree`` (same arguments, ``--link-mbps`` kept);
- ``backfill``: ``shoal backfill plan`` + ``shoal backfill run`` (PySpark ``local[2]``, the real job; CPU is the
  whole process tree: the spark-submit JVM and its Python workers);
- ``backfill-units``: the code a backfill task runs per unit (:class:`CheckpointedCopier`), units one after
  another in one process (no Spark: a Spark task runs its units the same way);
- ``daemon``: ``python -m mirror_core.daemon`` catching up the backlog from the earliest offset, stopped (SIGTERM)
  once every lane's checkpoint reached the source end;
- ``deep``: a confluent-kafka consume → produce loop (read_committed consumer at librdkafka defaults, idempotent
  acks=all producer, ``batch.size`` 1 MB, ``linger.ms`` 10);
- ``mm2``: MirrorMaker 2 in dedicated mode (``org.apache.kafka.connect.mirror.MirrorMaker``) from Maven Central,
  stopped once the target holds every record.

Measured per mirror and round trip: steady throughput — records landed on the target (sum of high watermarks,
sampled every 0.2 s) from the first landed to the last, times the source's bytes per record: process start-up,
preflight and lane opening excluded, ramp-up and tail included — as MB/s and as a fraction of the link (the rate
over the middle 60 % is kept too, but exactly-once writes land in commit-sized steps, which makes it jumpy); the
whole run's rate (start-up included); CPU seconds per GB of source batches, of the whole process (from ``wait4``:
start-up included) and of the active phase above (``/proc/<pid>/stat`` at its two samples); the proxy is another
process and not charged; peak RSS (the process's ``VmHWM``, sampled
every 0.2 s).

Run (root): ``.venv/bin/python -m bench.link_bench --rtt-ms 0 50 200``; results go to ``bench/results/link-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NS = "shoal-link"
HOST_DEV, NS_DEV = "shl-h", "shl-n"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"
PORT, CONTROLLER_PORT, SECURE_PORT = 39092, 39093, 39094
SECURE_USER = "shoal-bench"
KAFKA_VERSION = "4.4.0"
# connect-mirror 4.4.0 could not be resolved from Maven Central here (artifact not found); 3.9.2 (the sandbox's
# legacy broker version) speaks to 4.4 brokers
MM2_VERSION = "3.9.2"
PARTITIONS = 4
MIRRORS = ("shoal-copy", "shoal-copy-sasl", "shoal-copy-1p", "backfill", "backfill-units", "daemon", "deep", "mm2",
           "shoal-copy-before", "shoal-copy-sasl-before")
BEFORE_MIRRORS = ("shoal-copy-before", "shoal-copy-sasl-before")   # run from --before-tree
SAMPLE_S = 0.2
_PROBE_TOPIC = "__consumer_offsets"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def ns(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", NS, *cmd, check=check)


# -- the link -----------------------------------------------------------------------------------------------------

def link_up(ns_wmem_max: int) -> None:
    link_down()
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", HOST_DEV, "type", "veth", "peer", "name", NS_DEV)
    sh("ip", "link", "set", NS_DEV, "netns", NS)
    sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_DEV)
    sh("ip", "link", "set", HOST_DEV, "up")
    ns("ip", "addr", "add", f"{NS_IP}/24", "dev", NS_DEV)
    ns("ip", "link", "set", NS_DEV, "up")
    ns("ip", "link", "set", "lo", "up")
    # per-namespace TCP limits: the broker's send buffer may autotune up to this (the host's are left alone)
    ns("sysctl", "-q", "-w", f"net.ipv4.tcp_wmem=4096 16384 {ns_wmem_max}")
    ns("sysctl", "-q", "-w", f"net.ipv4.tcp_rmem=4096 131072 {ns_wmem_max}")


def shape(rate_mbit: float) -> None:
    """The link's rate on the far end's egress (the data direction); the delay is the proxy's."""
    ns("tc", "qdisc", "replace", "dev", NS_DEV, "root", "tbf", "rate", f"{rate_mbit:g}mbit", "burst", "256kb",
       "latency", "500ms")


def unshape() -> None:
    ns("tc", "qdisc", "del", "dev", NS_DEV, "root", check=False)


class DelayProxy:
    """``bench.delay_proxy`` on the host: 127.0.0.1:PORT → the far broker, half the round trip each way."""

    def __init__(self, rtt_ms: float):
        self.procs = [subprocess.Popen([sys.executable, "-m", "bench.delay_proxy", "--listen", f"127.0.0.1:{port}",
                                        "--to", f"{NS_IP}:{port}", "--one-way-ms", f"{rtt_ms / 2:g}"], cwd=ROOT,
                                       start_new_session=True) for port in (PORT, SECURE_PORT)]
        for port, proc in zip((PORT, SECURE_PORT), self.procs, strict=True):
            _wait_listening(port, proc)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Until the proxy on ``port`` accepts a connection. A fixed one-second sleep was not enough on a loaded machine:
    the first mirror after a proxy restart met ECONNREFUSED on the secure port and failed the row."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the delay proxy for port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the delay proxy for port {port} did not listen within {timeout_s:g} s") from None
            time.sleep(0.1)


def link_down() -> None:
    sh("ip", "netns", "del", NS, check=False)  # takes the veth pair with it
    sh("ip", "link", "del", HOST_DEV, check=False)


def measured_rtt_ms(bootstrap: str) -> float:
    """A Kafka round trip through the proxy: the median of 5 Metadata requests on one connection."""
    from mirror_core.kafka.wire_client import WireClient

    with WireClient("far", {"bootstrap.servers": bootstrap}) as client:
        client.topic_metadata(_PROBE_TOPIC, refresh=True)  # connected
        times = []
        for _ in range(5):
            started = time.monotonic()
            client.topic_metadata(_PROBE_TOPIC, refresh=True)
            times.append((time.monotonic() - started) * 1000)
    return sorted(times)[2]


# -- the far source broker ------------------------------------------------------------------------------------------

class FarBroker:
    """A private single-node KRaft broker inside the namespace; ``socket.send.buffer.bytes`` pinned by the caller."""

    def __init__(self, home: Path, send_buffer: int):
        import secrets

        from mirror_core.dev.sandbox import jars
        from mirror_core.dev.sandbox.broker import LOG_CONFIG
        from mirror_core.dev.sandbox.spec import FAST_TIMERS, SINGLE_NODE, ClusterSpec
        from mirror_core.dev.sandbox.tls import ensure_tls_material

        self.home = home
        self.lib = jars.resolve_classpath(ClusterSpec("link", KAFKA_VERSION, PORT, CONTROLLER_PORT),
                                          Path.home() / ".cache" / "shoal")
        self.log_config = LOG_CONFIG["kafka4"]
        self.props = home / "server.properties"
        # a SASL_SSL listener beside the PLAINTEXT one (SCRAM-SHA-512, certificate for localhost): the secure copy
        # runs over the same link; its password lives in this process and the mirror's 0600 settings file only
        self.tls = ensure_tls_material(home / "tls")
        self.password = secrets.token_urlsafe(18)
        secure = "listener.name.secure."
        settings = {
            "process.roles": "broker,controller", "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{CONTROLLER_PORT}", "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            # every address in the namespace; clients on the host reach it through the delay proxy's address
            "listeners": f"PLAINTEXT://0.0.0.0:{PORT},CONTROLLER://127.0.0.1:{CONTROLLER_PORT},"
                         f"SECURE://0.0.0.0:{SECURE_PORT}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{PORT},SECURE://localhost:{SECURE_PORT}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURE:SASL_SSL",
            f"{secure}sasl.enabled.mechanisms": "SCRAM-SHA-512",
            f"{secure}scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                                       "required;",
            f"{secure}ssl.keystore.type": "PKCS12", f"{secure}ssl.keystore.location": self.tls["keystore"],
            f"{secure}ssl.keystore.password": self.tls["password"], f"{secure}ssl.key.password": self.tls["password"],
            "log.dirs": str(home / "data"), "socket.send.buffer.bytes": str(send_buffer),
            **SINGLE_NODE, **FAST_TIMERS}
        home.mkdir(parents=True, exist_ok=True)
        self.props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.props.chmod(0o600)
        self.proc: subprocess.Popen | None = None

    def _java(self, main: str, *args: str) -> list[str]:
        return ["ip", "netns", "exec", NS, shutil.which("java") or "java", "-Xms256m", "-Xmx768m",
                "-XX:+UseSerialGC", "-Djava.awt.headless=true", f"-Dkafka.logs.dir={self.home / 'logs'}",
                f"-Dlog4j2.configurationFile={self.log_config}", "-cp", f"{self.lib}/*", main, *args]

    def start(self, timeout_s: float = 120.0) -> None:
        from mirror_core.dev.sandbox.broker import new_cluster_id

        cluster_id = new_cluster_id()  # never "-…", which the storage tool reads as an option
        subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.props)),
                       check=True, capture_output=True)
        console = open(self.home / "console.log", "wb")  # noqa: SIM115 - kept open for the JVM's lifetime
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(self.props)), stdout=console,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"far broker exited: see {self.home / 'console.log'}")
            try:
                from confluent_kafka.admin import AdminClient

                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(1)
        else:
            raise RuntimeError("far broker did not come up")
        self._create_user()

    def _create_user(self) -> None:
        from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        upsert = UserScramCredentialUpsertion(SECURE_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                              self.password.encode())
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        admin.alter_user_scram_credentials([upsert])[SECURE_USER].result(timeout=30)

    def secure_config(self) -> dict:
        """librdkafka-style settings for the far broker's SASL_SSL listener (through the delay proxy)."""
        return {"bootstrap.servers": f"localhost:{SECURE_PORT}", "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": SECURE_USER, "sasl.password": self.password,
                "ssl.ca.location": self.tls["ca"]}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{PORT}"  # the delay proxy

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# -- data -----------------------------------------------------------------------------------------------------------

def order_event(i: int) -> bytes:
    """A ~650-byte JSON order event (uncompressed on the wire)."""
    body = {"order_id": f"ord-{i:012d}", "customer": {"id": f"cust-{i * 7919 % 1_000_003:09d}",
                                                        "segment": ["retail", "pro", "b2b"][i % 3],
                                                        "country": ["DE", "FR", "US", "JP", "BR"][i % 5]},
            "created_at": f"2026-11-23T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1000:03d}Z",
            "status": ["placed", "paid", "shipped", "delivered"][i % 4], "currency": "EUR",
            "items": [{"sku": f"SKU-{(i * 31 + k) % 100_000:06d}", "qty": 1 + (i + k) % 4,
                       "unit_price": round(((i * 13 + k * 101) % 50_000) / 100, 2)} for k in range(4)],
            "shipping": {"method": ["standard", "express"][i % 2], "address_hash": f"{(i * 2654435761) % 2**64:016x}"},
            "notes": "gift wrap requested; deliver to the back door if nobody answers the bell" if i % 2 else
            "no special handling required for this order, standard packaging is fine"}
    return json.dumps(body, separators=(",", ":")).encode()


def generate(bootstrap: str, topic: str, records: int, partitions: int = PARTITIONS) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0, "enable.idempotence": True,
                         "acks": "all", "compression.type": "none", "batch.size": 256 * 1024, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"ord-%012d" % i, value=order_event(i), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("generating the data did not finish")


def source_facts(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict:
    """Records and on-disk batch bytes per partition (read once through Shoal's fetcher, before shaping)."""
    from mirror_core.kafka.fetcher import RawBatchFetcher
    from mirror_core.kafka.list_offsets import list_offsets
    from mirror_core.kafka.wire_client import WireClient

    out = {"ends": {}, "records": 0, "bytes": 0}
    with WireClient("far", {"bootstrap.servers": bootstrap}) as client:
        for p in range(partitions):
            end = list_offsets(client, topic, p, "latest")
            out["ends"][p] = end
            fetcher = RawBatchFetcher(client, topic, p, 0, end, max_bytes=8 << 20)
            for view in fetcher:
                out["records"] += view.records_count
                out["bytes"] += view.size
    return out


# -- watching a mirror ----------------------------------------------------------------------------------------------

class TargetWatch:
    """Records landed on the target topic (sum of high watermarks: exactly-once markers add one per commit)."""

    def __init__(self, target_conf: dict, topic: str, partitions: list[int]):
        from confluent_kafka import Consumer

        self.topic, self.partitions = topic, partitions
        self.consumer = Consumer({**target_conf, "group.id": f"lb-watch-{uuid.uuid4().hex[:6]}", "log_level": 0})

    def landed(self) -> int:
        from confluent_kafka import TopicPartition

        total = 0
        for p in self.partitions:
            try:
                total += self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2)[1]
            except Exception:  # noqa: BLE001 - the topic may not exist yet
                return 0
        return total

    def close(self) -> None:
        self.consumer.close()


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                children.setdefault(int(st[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, ()))
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process so far: all its threads, its live descendants (a backfill's
    spark-submit JVM and Python workers) and the children they have already reaped."""
    if _stat(pid) is None:
        return float("nan")
    total = 0
    for member in _tree(pid):
        st = _stat(member)
        if st is not None:
            total += int(st[11]) + int(st[12]) + int(st[13]) + int(st[14])
    return total / _TICK


def tree_rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its live descendants now (a peak is the maximum over samples)."""
    total = 0
    for member in _tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def vm_hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_mirror(cmd: list[str], watch: TargetWatch, expected: int, *, done=None, env=None, log: Path,
               timeout_s: float, cwd: Path = ROOT) -> dict:
    """Start ``cmd``, sample the target and the process until it exits (or ``done()`` is true: then SIGTERM)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    started = time.monotonic()
    samples: list[tuple[float, int]] = []
    peak = 0
    status = None
    while True:
        now = time.monotonic() - started
        peak = max(peak, vm_hwm_kib(proc.pid), tree_rss_kib(proc.pid))
        samples.append((now, watch.landed(), cpu_s(proc.pid)))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if done is not None and done():
            os.killpg(proc.pid, signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        if now > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            raise RuntimeError(f"{cmd[:4]} timed out after {timeout_s:.0f}s; log {log}")
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - started
    samples.append((wall, watch.landed(), float("nan")))
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, -signal.SIGTERM) and done is None:
        raise RuntimeError(f"{cmd[:4]} exited {code}; log {log}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": peak / 1024,
            "samples": samples, "exit": code, "expected_records": expected}


def active_phase(samples: list[tuple], expected: int, bytes_per_record: float) -> tuple[float | None, float | None]:
    """(MB/s, CPU-s per GB) from the first sample with anything landed to the first with everything landed:
    start-up, preflight and lane opening excluded; ramp-up and the tail included. The CPU figure needs the
    process alive at both samples (NaN otherwise)."""
    first = next((x for x in samples if x[1] > 0), None)
    last = next((x for x in samples if x[1] >= expected), None)
    if first is None or last is None or last[0] <= first[0]:
        return None, None
    moved = (last[1] - first[1]) * bytes_per_record
    cpu = last[2] - first[2]
    return moved / (last[0] - first[0]) / 1e6, (cpu / (moved / 1e9) if moved and cpu == cpu else None)


def steady_rate(samples: list[tuple[float, int]], expected: int, bytes_per_record: float) -> float | None:
    """MB/s between the samples where 20 % and 80 % of the records had landed."""
    def crossing(fraction: float) -> float | None:
        for t, n, *_ in samples:
            if n >= fraction * expected:
                return t
        return None

    t20, t80 = crossing(0.2), crossing(0.8)
    if t20 is None or t80 is None or t80 <= t20:
        return None
    return 0.6 * expected * bytes_per_record / (t80 - t20) / 1e6


# -- the mirrors ----------------------------------------------------------------------------------------------------

def child_backfill(spec: dict) -> None:
    """What a backfill task runs per unit: CheckpointedCopier.copy of each partition's range, one after another."""
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.config.commit_policy import CommitPolicy
    from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
    from mirror_core.engine.copier import CopyOptions
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.model.ranges import PartitionRange
    from mirror_core.services.preflight import run_preflight
    from mirror_core.state.checkpoint import CheckpointStore

    src = ClusterConfig("far", {"bootstrap.servers": spec["source"]})
    dst = ClusterConfig("target", spec["target"])
    ends = {int(p): e for p, e in spec["ends"].items()}
    run_preflight(src, dst, spec["topic"], target_topic=spec["target_topic"],
                  start_offsets=dict.fromkeys(ends, 0)).raise_if_refused()
    with WireClient.for_cluster(src) as source, WireClient.for_cluster(dst) as target:
        store = CheckpointStore(dst, target)
        store.ensure_topic()
        copier = CheckpointedCopier(source, target, store, pipeline=spec["pipeline"], mode=DeliveryMode.EXACTLY_ONCE,
                                    options=CopyOptions(max_inflight_bytes=4 << 20), policy=CommitPolicy())
        for p, end in sorted(ends.items()):
            copier.copy(PartitionRange(spec["topic"], p, 0, end, spec["target_topic"], p))


def child_deep(spec: dict) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": spec["source"], "log_level": 0,
                         "group.id": f"lb-deep-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    producer = Producer({**spec["target"], "log_level": 0, "enable.idempotence": True, "acks": "all",
                         "compression.type": "none", "batch.size": 1_000_000, "linger.ms": 10})
    ends = {int(p): e for p, e in spec["ends"].items()}
    consumer.assign([TopicPartition(spec["topic"], p, 0) for p in ends])
    positions = dict.fromkeys(ends, 0)
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err.str())

    while any(positions[p] < ends[p] for p in ends):
        for msg in consumer.consume(1000, 1.0):
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consume: {msg.error()}")
            while True:
                try:
                    producer.produce(spec["target_topic"], value=msg.value(), key=msg.key(), headers=msg.headers(),
                                     timestamp=msg.timestamp()[1], partition=msg.partition(),
                                     on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            positions[msg.partition()] = msg.offset() + 1
        producer.poll(0)
    if producer.flush(300) or errors:
        raise RuntimeError(f"deep produce failed: {errors[:3]}")
    consumer.close()


def _create_target(target_conf: dict, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(target_conf)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def _checkpoints_done(target_conf: dict, pipeline: str, topic: str, ends: dict[int, int]):
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore

    cluster = ClusterConfig("target", target_conf)
    state = {"last": 0.0}

    def done() -> bool:
        if time.monotonic() - state["last"] < 1.0:
            return False
        state["last"] = time.monotonic()
        try:
            with WireClient.for_cluster(cluster) as client:
                store = CheckpointStore(cluster, client)
                for p, end in ends.items():
                    cp = store.read(pipeline, topic, p)
                    if cp is None or cp.position < end:
                        return False
            return True
        except Exception:  # noqa: BLE001 - store not there yet
            return False

    return done


def mm2_lib() -> Path:
    lib = Path.home() / ".cache" / "shoal" / "mm2" / MM2_VERSION / "lib"
    marker = lib / ".complete"
    if not marker.exists():
        lib.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mvn", "-q", "-B", "-f", str(ROOT / "bench" / "mm2" / "pom.xml"),
                        f"-Dkafka.version={MM2_VERSION}", "dependency:copy-dependencies",
                        f"-DoutputDirectory={lib}"], check=True)
        marker.touch()
    return lib


def drop_target_topic(target_conf: dict, topic: str) -> None:
    """Delete a mirror's copy on the target once it is measured: every run copies a few hundred MB per mirror and
    round trip, which filled the sandbox's disk over a day of runs. Best effort: a failure is printed, not raised."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**target_conf, "log_level": 0})  # held until the answer: a dropped handle fails its futures
    try:
        admin.delete_topics([topic])[topic].result(30)
    except Exception as exc:  # noqa: BLE001 - a measurement is not lost over a clean-up
        print(f"   (target topic {topic} not deleted: {exc})", flush=True)


def mirror_command(mirror: str, ctx: dict, work: Path) -> tuple[list[str], str, list[int], object]:
    """(command, target topic, target partitions watched, done-check or None)."""
    py = sys.executable
    tag = f"{ctx['run']}.{mirror}.{ctx['rtt']:g}"
    target_topic = f"lb.{tag}"
    source_yaml = work / "far.yaml"
    source_yaml.write_text(json.dumps({"bootstrap.servers": ctx["source"]}))
    copy_args = ["--source", str(source_yaml), "--target", "target", "--topic", ctx["topic"], "--target-topic",
                 target_topic, "--mode", "exactly-once", "--pipeline", f"lb.{tag}", "--link-mbps",
                 f"{ctx['link_MBps']:g}"]
    spec = {"source": ctx["source"], "target": ctx["target"], "topic": ctx["topic"], "target_topic": target_topic,
            "ends": ctx["facts"]["ends"], "pipeline": f"lb.{tag}"}
    everything = list(range(PARTITIONS))
    shoal = [py, "-m", "mirror_core.cli"]
    if ctx.get("wire_diag") and mirror in ("shoal-copy", "shoal-copy-sasl"):   # this tree's copy, calls counted
        shoal = [py, "-m", "bench.wire_diag", "--out", str(ctx["wire_diag"] / f"{tag}.json"),
                 "--profile", str(ctx["wire_diag"] / f"{tag}.prof"), "--"]
    if mirror == "shoal-copy":
        return [*shoal, "copy", *copy_args], target_topic, everything, None
    if mirror in ("shoal-copy-sasl", "shoal-copy-sasl-before"):  # SASL_SSL/SCRAM-SHA-512 on both sides
        far_secure, near_secure = work / "far-secure.yaml", work / "near-secure.yaml"
        for path, conf in ((far_secure, ctx["source_secure"]), (near_secure, ctx["target_secure"])):
            path.touch(mode=0o600)
            path.write_text(json.dumps(conf))
        secure_args = ["--source", str(far_secure), "--target", str(near_secure), *copy_args[4:]]
        if mirror == "shoal-copy-sasl-before":
            shoal = [py, "-m", "mirror_core.cli"]
        return [*shoal, "copy", *secure_args], target_topic, everything, None
    if mirror == "backfill":  # the real thing: `shoal backfill plan` + `shoal backfill run` (Spark local[2])
        clusters = work / f"clusters-{ctx['rtt']:g}.yaml"
        clusters.touch(mode=0o600)
        clusters.write_text(json.dumps({"far": {"bootstrap.servers": ctx["source"]}, "target": ctx["target"]}))
        plan = work / f"plan-{ctx['rtt']:g}.json"
        shoal = [py, "-m", "mirror_core.cli", "backfill"]
        plan_cmd = [*shoal, "plan", "--source", str(source_yaml), "--target", "target", "--pipeline", f"lbb.{tag}",
                    "--include", ctx["topic"].replace(".", "\\."), "--naming", f"map:{ctx['topic']}={target_topic}",
                    "--mode", "exactly-once", "--no-deadlines", "--out", str(plan), *ctx.get("backfill_plan_args", [])]
        run_cmd = [*shoal, "run", "--plan", str(plan), "--clusters", str(clusters), "--ledger", str(work / "ledger"),
                   "--master", "local[2]"]
        script = " && ".join(shlex.join(c) for c in (plan_cmd, run_cmd))
        return ["sh", "-c", script], target_topic, everything, None
    if mirror == "shoal-copy-1p":  # ctx["topic"] is the one-partition topic here
        return [py, "-m", "mirror_core.cli", "copy", *copy_args], target_topic, [0], None
    if mirror == "shoal-copy-before":  # the same command from another tree (--before-tree), without --link-mbps
        return [py, "-m", "mirror_core.cli", "copy", *copy_args[:-2]], target_topic, everything, None
    if mirror in ("backfill-units", "deep"):
        if mirror == "deep":
            _create_target(ctx["target"], target_topic)
        return [py, "-m", "bench.link_bench", "--child", mirror, json.dumps(spec)], target_topic, everything, None
    if mirror == "daemon":
        import yaml

        prefix = f"lbd{ctx['run'][-4:]}r{int(ctx['rtt'])}."
        config = work / f"daemon-{ctx['rtt']:g}.yaml"
        pipeline = f"lbd.{tag}"
        config.write_text(yaml.safe_dump({
            "pipeline": pipeline, "source": {"bootstrap.servers": ctx["source"]}, "target": ctx["target"],
            "include": ctx["topic"].replace(".", "\\."), "naming": f"prefix:{prefix}", "mode": "exactly-once",
            "metrics_port": 0, "link_mbps": ctx["link_MBps"]}))
        ends = {int(p): e for p, e in ctx["facts"]["ends"].items()}
        return ([py, "-m", "mirror_core.daemon", "--config", str(config)], prefix + ctx["topic"], everything,
                _checkpoints_done(ctx["target"], pipeline, ctx["topic"], ends))
    if mirror == "mm2":
        lib = mm2_lib()
        props = work / f"mm2-{ctx['rtt']:g}.properties"
        alias = f"far{ctx['run'][-4:]}r{int(ctx['rtt'])}"
        props.write_text("\n".join([
            f"clusters = {alias}, near", f"{alias}.bootstrap.servers = {ctx['source']}",
            f"near.bootstrap.servers = {ctx['target']['bootstrap.servers']}",
            f"{alias}->near.enabled = true", f"{alias}->near.topics = {ctx['topic'].replace('.', '[.]')}",
            "near->" + alias + ".enabled = false", "replication.factor = 1",
            "checkpoints.topic.replication.factor = 1", "heartbeats.topic.replication.factor = 1",
            "offset-syncs.topic.replication.factor = 1", "offset.storage.replication.factor = 1",
            "status.storage.replication.factor = 1", "config.storage.replication.factor = 1",
            "sync.topic.configs.enabled = false", "sync.topic.acls.enabled = false", "emit.heartbeats.enabled = false",
            "emit.checkpoints.enabled = false", "refresh.topics.interval.seconds = 5", "tasks.max = 4",
            f"{alias}.consumer.isolation.level = read_committed", ""]))
        log_cfg = ROOT / "mirror_core" / "sandbox" / "log4j2.properties"
        cmd = [shutil.which("java") or "java", "-Xms256m", "-Xmx1g", f"-Dlog4j2.configurationFile={log_cfg}",
               f"-Dkafka.logs.dir={work / 'mm2-logs'}",
               "-cp", f"{lib}/*", "org.apache.kafka.connect.mirror.MirrorMaker", str(props)]
        target_topic = f"{alias}.{ctx['topic']}"
        expected = ctx["facts"]["records"]
        state = {"watch": None}

        def done() -> bool:
            if state["watch"] is None:
                state["watch"] = TargetWatch(ctx["target"], target_topic, everything)
            return state["watch"].landed() >= expected

        return cmd, target_topic, everything, done
    raise ValueError(mirror)


# -- the run --------------------------------------------------------------------------------------------------------

def run(args) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("the link benchmark needs root (network namespace, tc)")
    from mirror_core.dev.sandbox import Sandbox

    sandbox_dir = Path(os.environ.get("SHOAL_SANDBOX_DIR", ROOT / ".sandbox"))
    sandbox = Sandbox(sandbox_dir, Path.home() / ".cache" / "shoal")
    target_conf = sandbox.client_config("target")
    target_secure = (sandbox.client_config("target", secure=True)
                     if {"shoal-copy-sasl", "shoal-copy-sasl-before"} & set(args.mirrors) else None)
    run_id = time.strftime("%H%M%S")
    before = subprocess.run(["git", "-C", str(args.before_tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="shoal-link-"))
    out: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "shared": True},
                 "config": {"link_mbit": args.rate_mbit, "link_MBps": args.rate_mbit / 8, "records": args.records,
                            "partitions": PARTITIONS, "far_broker_socket_send_buffer_bytes": args.send_buffer,
                            "commit": here, "before_commit": before, "before_tree": str(args.before_tree),
                            "namespace_tcp_wmem_max": args.ns_wmem_max, "kafka": KAFKA_VERSION,
                            "shoal_copy": "defaults (--fetch-max-bytes 4194304 per partition, --commit-bytes "
                                          "4194304, --max-inflight-bytes 8388608 capped to commit-bytes) plus "
                                          "--link-mbps <link>: fetches sized for the measured round trip",
                            "daemon": "defaults (fetch_max_bytes 16 MiB per request, partition 4 MiB, commit 4 MiB) "
                                      "plus link_mbps <link>: rounds sized for the measured round trip",
                            "shoal_copy_sasl": "as shoal_copy, SASL_SSL SCRAM-SHA-512 both sides (TLS 1.3)",
                            "backfill": "shoal backfill plan (exactly-once, --no-deadlines "
                                        f"{args.backfill_plan_args}) + shoal backfill run --master local[2]",
                            "deep": "librdkafka defaults consumer (read_committed); producer idempotent acks=all "
                                    "batch.size 1000000 linger.ms 10 compression none",
                            "mm2": f"connect-mirror {MM2_VERSION}, dedicated mode, tasks.max 4, defaults otherwise "
                                   "(read_committed consumer)"},
                 "runs": []}
    broker = FarBroker(work / "far", args.send_buffer)
    proxy = None
    try:
        link_up(args.ns_wmem_max)
        proxy = DelayProxy(0)
        broker.start()
        topic = f"lb.orders.{run_id}"
        global _PROBE_TOPIC
        _PROBE_TOPIC = topic
        generate(broker.bootstrap, topic, args.records)
        facts = source_facts(broker.bootstrap, topic)
        out["source"] = {"records": facts["records"], "bytes": facts["bytes"],
                         "bytes_per_record": facts["bytes"] / facts["records"]}
        print(f"source: {facts['records']} records, {facts['bytes'] / 1e6:.1f} MB", flush=True)
        single_topic, single_facts = f"lb.single.{run_id}", None
        if "shoal-copy-1p" in args.mirrors:
            generate(broker.bootstrap, single_topic, args.one_partition_records, partitions=1)
            single_facts = source_facts(broker.bootstrap, single_topic, partitions=1)
            out["source_one_partition"] = {"records": single_facts["records"], "bytes": single_facts["bytes"]}
            print(f"one-partition source: {single_facts['records']} records, {single_facts['bytes'] / 1e6:.1f} MB",
                  flush=True)
        shape(args.rate_mbit)
        for rtt in args.rtt_ms:
            proxy.stop()
            proxy = DelayProxy(rtt)
            measured = measured_rtt_ms(broker.bootstrap)
            out.setdefault("measured_rtt_ms", {})[str(rtt)] = measured
            print(f"-- RTT {rtt} ms (a Metadata round trip through the proxy: {measured:.1f} ms)", flush=True)
            for mirror in args.mirrors:
                one_partition = mirror == "shoal-copy-1p"
                mirror_facts = single_facts if one_partition else facts
                ctx = {"run": run_id, "rtt": rtt, "topic": single_topic if one_partition else topic,
                       "source": broker.bootstrap, "target": target_conf, "facts": mirror_facts,
                       "link_MBps": args.rate_mbit / 8,
                       "source_secure": broker.secure_config(), "target_secure": target_secure,
                       "backfill_plan_args": shlex.split(args.backfill_plan_args), "wire_diag": args.wire_diag}
                cmd, target_topic, partitions, done = mirror_command(mirror, ctx, work)
                expected = mirror_facts["records"]
                watch = TargetWatch(target_conf, target_topic, partitions)
                tree = args.before_tree if mirror in BEFORE_MIRRORS else ROOT
                env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "200", "SHOAL_SANDBOX_DIR": str(sandbox_dir)}
                try:
                    result = run_mirror(cmd, watch, expected, done=done, env=env, log=work / f"{mirror}-{rtt}.log",
                                        timeout_s=args.timeout_s, cwd=tree)
                except RuntimeError as exc:
                    print(f"   {mirror}: FAILED {exc}", flush=True)
                    out["runs"].append({"rtt_ms": rtt, "mirror": mirror, "error": str(exc)})
                    continue
                finally:
                    watch.close()
                    if not args.keep_topics:
                        drop_target_topic(target_conf, target_topic)
                source_bytes = mirror_facts["bytes"]
                per_record = mirror_facts["bytes"] / mirror_facts["records"]
                steady, active_cpu = active_phase(result["samples"], expected, per_record)
                middle = steady_rate(result["samples"], expected, per_record)
                row = {"rtt_ms": rtt, "mirror": mirror, "steady_MBps": steady,
                       "steady_link_fraction": None if steady is None else steady / (args.rate_mbit / 8),
                       "middle_60pct_MBps": middle, "samples": result["samples"],
                       "whole_MBps": source_bytes / result["wall_s"] / 1e6, "wall_s": result["wall_s"],
                       "cpu_s": result["cpu_s"], "cpu_s_per_GB": result["cpu_s"] / (source_bytes / 1e9),
                       "active_cpu_s_per_GB": active_cpu,
                       "peak_rss_mib": result["peak_rss_mib"], "landed": result["samples"][-1][1],
                       "expected": expected}
                out["runs"].append(row)
                print(f"   {mirror:15s} steady {steady or 0:6.2f} MB/s ({(row['steady_link_fraction'] or 0):4.0%})"
                      f"  whole {row['whole_MBps']:6.2f} MB/s  CPU {row['cpu_s']:6.1f} s = {row['cpu_s_per_GB']:6.1f}"
                      f" s/GB (active {active_cpu or float('nan'):5.1f})  peak RSS {row['peak_rss_mib']:6.0f} MiB",
                      flush=True)
    finally:
        unshape()
        broker.stop()
        if proxy is not None:
            proxy.stop()
        link_down()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0, 50, 200])
    parser.add_argument("--rate-mbit", type=float, default=160.0, help="link rate (default 160 Mbit/s = 20 MB/s)")
    parser.add_argument("--records", type=int, default=150_000)
    parser.add_argument("--one-partition-records", type=int, default=300_000,
                        help="records of the one-partition topic shoal-copy-1p copies")
    parser.add_argument("--mirrors", nargs="+", default=list(MIRRORS), choices=MIRRORS)
    parser.add_argument("--send-buffer", type=int, default=-1,
                        help="the far broker's socket.send.buffer.bytes (default -1: OS autotuning; Kafka's is 102400)")
    parser.add_argument("--ns-wmem-max", type=int, default=32 << 20)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per mirror and round trip")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--wire-diag", type=Path,
                        help="a directory: run this tree's shoal-copy and shoal-copy-sasl under bench.wire_diag "
                             "(channel calls counted and cProfile of the copying thread, a JSON and a .prof per "
                             "mirror and round trip; a measurement aid that adds its own CPU)")
    parser.add_argument("--keep-topics", action="store_true",
                        help="leave each mirror's target topic on the target (default: deleted once measured)")
    parser.add_argument("--backfill-plan-args", default="",
                        help="extra `shoal backfill plan` arguments for the backfill mirror, one string")
    parser.add_argument("--before-tree", type=Path, default=Path("/work/main"),
                        help="a checkout whose `shoal copy` runs as shoal-copy-before (default /work/main)")
    parser.add_argument("--child", choices=("backfill-units", "deep"), help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.wire_diag:
        args.wire_diag.mkdir(parents=True, exist_ok=True)
    if args.child:
        {"backfill-units": child_backfill, "deep": child_deep}[args.child](json.loads(args.spec))
        return
    out = run(args)
    path = args.out or ROOT / "bench" / "results" / f"link-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
