"""The continuous shallow mirror daemon against real brokers: exact under live load, backfill → handoff with a
clean seam, SIGKILL / SIGTERM / target broker restart, two daemons sharing a pipeline, regex rescans, metrics.

Daemons run as subprocesses (``python -m mirror_core.daemon --config <yaml>``), exactly as operators run them;
every test uses its own pipeline name and topics (the sandbox is shared). Exactness is always judged by an
independent reader (``KafkaTestCluster.read_all``, confluent-kafka, read_committed) on both sides after the
producers stopped and the daemon caught up.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[3]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


# ---- helpers (also used by test_daemon_soak.py) ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_pipeline(path: Path, sandbox, pipeline: str, include: str, **overrides) -> Path:
    config = {"pipeline": pipeline, "source": sandbox.client_config("source"),
              "target": sandbox.client_config("target"), "include": include, "naming": "prefix:dr.",
              "mode": "exactly-once", "commit_interval_ms": 200, "commit_bytes": 1 << 20, "poll_interval_ms": 50,
              "rescan_interval_s": 1, "lease_ttl_s": 3, "metrics_port": 0, **overrides}
    path.write_text(yaml.safe_dump(config))
    return path


# Tests that kill or stop a daemon and need its lanes back within seconds give the pipeline's group a short session
# timeout (KIP-848: a group config the daemon sets, bounded below by the broker's
# group.consumer.min.session.timeout.ms, which the sandbox lowers to 2 s): a killed member's partitions move after
# about this long instead of the default 45 s. Use them with the ``quick_group_source`` fixture, which checks the
# source broker allows it.
QUICK_GROUP = {"group_session_timeout_ms": 4000}


@pytest.fixture(scope="session")
def quick_group_source(source_cluster):
    """The shared source, checked to accept QUICK_GROUP's session timeout (a sandbox started before the lowered
    KIP-848 minimums keeps the 45 s default until it restarts)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(source_cluster.config.confluent())
    resource = ConfigResource(ResourceType.BROKER, "1")
    try:
        configs = next(iter(admin.describe_configs([resource]).values())).result(timeout=15)
        minimum = int(configs["group.consumer.min.session.timeout.ms"].value)
    except Exception as exc:  # noqa: BLE001 - named in the message
        unavailable(f"cannot read the source broker's group.consumer.min.session.timeout.ms: {exc}")
    if minimum > QUICK_GROUP["group_session_timeout_ms"]:
        unavailable(f"the sandbox source allows group session timeouts down to {minimum} ms only: restart it "
                    "(`shoal sandbox down && shoal sandbox up`) to get the lowered KIP-848 minimums")
    return source_cluster


def include_prefix(prefix: str) -> str:
    """A regex for every topic named ``<prefix>.<anything>``."""
    return re.escape(prefix) + r"\..+"


class DaemonProcess:
    """One ``python -m mirror_core.daemon`` subprocess, its log in a file."""

    def __init__(self, config: Path, log: Path, worker_id: str, metrics_port: int = 0):
        self.config, self.log_path, self.worker_id, self.metrics_port = config, log, worker_id, metrics_port
        self.proc: subprocess.Popen | None = None

    def start(self) -> DaemonProcess:
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {time.strftime('%H:%M:%S')}\n".encode())
            self.proc = subprocess.Popen([PYTHON, "-m", "mirror_core.daemon", "--config", str(self.config),
                                          "--worker-id", self.worker_id], cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.alive, f"daemon {self.worker_id} died early:\n{self.tail()}"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> tuple[int, float]:
        """SIGTERM; returns (exit code, seconds until exit)."""
        assert self.alive, f"daemon {self.worker_id} died early:\n{self.tail()}"
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        return rc, time.monotonic() - started

    def cleanup(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, lines: int = 40) -> str:
        """The log's last ``lines`` lines other than routine ``event=copied`` ones, then the last two copies. A
        busy lane's copies would otherwise fill a failure's tail and hide what its other lanes did (CI at 1dfbb92:
        a lane that never moved after a restart, and forty lines of the other lane's copies)."""
        text = self.log_path.read_text(errors="replace").splitlines()
        copies = [line for line in text if "event=copied" in line]
        other = [line for line in text if "event=copied" not in line]
        shown = other[-lines:]
        if copies:
            shown += [f"... {len(copies)} event=copied lines, the last two:", *copies[-2:]]
        return "\n".join(shown)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """``{(sample name, sorted label items): value}`` from ``/metrics``."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200, body
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body) for s in family.samples}


@pytest.fixture
def daemon_factory(sandbox, tmp_path):
    """Makes daemon processes for one test; any still running at the end are killed (only ours, by pid)."""
    made: list[DaemonProcess] = []

    def make(config: Path, worker_id: str, metrics_port: int = 0) -> DaemonProcess:
        d = DaemonProcess(config, tmp_path / f"{worker_id}.log", worker_id, metrics_port)
        made.append(d)
        return d

    yield make
    for d in made:
        d.cleanup()


class LoadProducer(threading.Thread):
    """Keeps writing to source topics until stopped: idempotent lz4 batches with keys, headers and CreateTime
    timestamps, plus a committed and an aborted source transaction every ``txn_every_s`` (so markers and aborted
    data are in the daemon's way). Topics can be added while it runs."""

    def __init__(self, cluster, topics: list[str], *, rate: int = 800, txn_every_s: float = 1.0, seed: int = 1,
                 value_bytes: tuple[int, int] = (50, 400)):
        super().__init__(name="load-producer", daemon=True)
        self.cluster, self.topics, self.rate, self.txn_every_s = cluster, list(topics), rate, txn_every_s
        self.value_bytes = value_bytes
        self.random = random.Random(seed)
        self.produced = 0
        self.produced_bytes = 0
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start producing; return once the first records are acknowledged (60 s at most). A test that judges
        "caught up" right after must not find an empty source because the producer was still starting: CI on
        a8854d0 saw the transactional producer's init take longer than the daemon's start, every source end at
        0, the pipeline "caught up" at once and the load stopped before it produced anything."""
        super().start()
        deadline = time.monotonic() + 60
        while self.produced == 0:
            assert self.is_alive(), f"load producer ended before producing: {self.errors[:3]}"
            assert time.monotonic() < deadline, f"load producer produced nothing in 60 s: {self.errors[:3]}"
            time.sleep(0.05)

    def add_topic(self, topic: str) -> None:
        with self._lock:
            self.topics.append(topic)

    def run(self) -> None:
        from confluent_kafka import Producer

        plain = Producer(self.cluster.config.confluent(**{
            "enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4", "batch.size": 32768}))
        txn = Producer(self.cluster.config.confluent(**{"transactional.id": f"load.{self.topics[0]}.{id(self)}"}))
        txn.init_transactions(30)

        def on_delivery(err, msg):
            if err is None:
                self.produced += 1
                self.produced_bytes += len(msg.value())
            else:
                self.errors.append(err.str())

        tick, n, next_txn, commit = 0.05, 0, time.monotonic() + self.txn_every_s, True
        per_tick = max(1, int(self.rate * tick))
        try:
            while not self._stop_event.is_set():
                started = time.monotonic()
                with self._lock:
                    topics = list(self.topics)
                for _ in range(per_tick):
                    topic = topics[n % len(topics)]
                    plain.produce(topic, key=b"k%d" % (n % 101), value=b"%d:" % n + self.random.randbytes(
                        self.random.randint(*self.value_bytes)), headers=[("n", b"%d" % n)], on_delivery=on_delivery)
                    n += 1
                plain.poll(0)
                if time.monotonic() >= next_txn:
                    txn.begin_transaction()
                    for i in range(40):
                        txn.produce(topics[i % len(topics)], key=b"t%d" % i,
                                    value=b"%s-%d-%d" % (b"ok" if commit else b"ABORTED", n, i))
                    txn.flush(30)
                    txn.commit_transaction(30) if commit else txn.abort_transaction(30)
                    commit = not commit
                    next_txn = time.monotonic() + self.txn_every_s
                self._stop_event.wait(max(0.0, tick - (time.monotonic() - started)))
        finally:
            left = plain.flush(30)
            if left:
                self.errors.append(f"{left} records unflushed")

    def stop(self) -> int:
        self._stop_event.set()
        self.join(60)
        assert not self.is_alive(), "load producer did not stop"
        assert not self.errors, f"load producer errors: {self.errors[:3]}"
        return self.produced


def contents(cluster, topic: str) -> list[tuple]:
    return [(r.partition, r.content()) for r in cluster.read_all(topic, timeout_s=60)]


def assert_exact(source_cluster, target_cluster, topic: str, target_topic: str) -> int:
    """Every committed source record on the target exactly once, in order, nothing else; returns the count."""
    source, target = contents(source_cluster, topic), contents(target_cluster, target_topic)
    assert source, f"no data in {topic}"
    assert not any(b"ABORTED" in (value or b"") for _p, (_k, value, _h, _t) in target), "aborted data leaked"
    if target != source:
        dup = [c for c, k in Counter(target).items() if k > 1]
        missing = len(set(source) - set(target))
        raise AssertionError(f"{target_topic}: {len(target)} records vs {len(source)} on the source; "
                             f"{len(dup)} duplicated, {missing} missing")
    return len(source)


def source_ends(source_cluster, topic: str, partitions: int) -> dict[int, int]:
    with WireClient.for_cluster(source_cluster.config) as client:
        return {p: list_offsets(client, topic, p, "last_stable") for p in range(partitions)}


def checkpoints(target_cluster, pipeline: str) -> dict[tuple[str, int], Checkpoint]:
    with WireClient.for_cluster(target_cluster.config) as client:
        return {(t, p): cp for (_pl, t, p), cp in CheckpointStore(target_cluster.config, client)
                .read_all(pipeline).items()}


def _readyz(d: DaemonProcess) -> str:
    """A daemon's /readyz answer, for a failure message (which lanes it holds not ready, and why)."""
    if not (d.alive and d.metrics_port):
        return "not running" if not d.alive else "no metrics port"
    try:
        status, body = d.get("/readyz")
    except OSError as exc:
        return f"unreachable: {exc}"
    return f"{status} {body[:1500]}"


def wait_caught_up(source_cluster, target_cluster, pipeline: str, topics: dict[str, int], *,
                   timeout_s: float = 90.0, daemons: tuple[DaemonProcess, ...] = ()) -> None:
    """Wait until the pipeline's checkpoint of every partition reached the source's last stable offset."""
    ends = {(t, p): end for t, n in topics.items() for p, end in source_ends(source_cluster, t, n).items()}
    deadline = time.monotonic() + timeout_s
    while True:
        cps = checkpoints(target_cluster, pipeline)
        behind = {k: (cps[k].position if k in cps else None, end) for k, end in ends.items()
                  if (k not in cps and end > 0) or (k in cps and cps[k].position < end)}
        if not behind:
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.worker_id} (/readyz: {_readyz(d)})\n{d.tail()}\n{_lanes_seen(d, behind)}"
                             for d in daemons)
            raise AssertionError(f"pipeline {pipeline} did not catch up: {behind}\n"
                                 f"{_own_checkpoints(target_cluster, pipeline, behind)}\n{logs}")
        time.sleep(0.5)


def _lanes_seen(d: DaemonProcess, behind) -> str:
    """For a failure message: what daemon ``d`` logged about each lane left behind — its lines other than copies
    (opened, failed, fenced, halted, dropped), its copies counted with the last one, and its position gauge."""
    text = d.log_path.read_text(errors="replace").splitlines()
    try:
        gauges = {dict(labels).get("partition"): value for (name, labels), value in d.metrics().items()
                  if name == "shoal_position"} if d.alive and d.metrics_port else {}
    except (AssertionError, OSError) as exc:
        gauges = {"error": str(exc)}
    out = []
    for topic, partition in behind:
        mine = [line for line in text if f"partition={partition} " in line or f"{topic}-{partition}" in line
                or line.endswith(f"partition={partition}")]
        copies = [line for line in mine if "event=copied" in line]
        other = [line for line in mine if "event=copied" not in line]
        out.append(f"  {topic}-{partition}: position gauge {gauges.get(str(partition))}; {len(copies)} copies"
                   f"{', the last: ' + copies[-1] if copies else ''}; its other lines (last 15):")
        out += [f"    {line}" for line in other[-15:]]
    return "\n".join(out)


def _own_checkpoints(target_cluster, pipeline: str, behind) -> str:
    """For a failure message: the lanes' checkpoints as the daemon reads them (its own key past the last stable
    offset), beside the committed view above — a difference means a transaction left open on the checkpoint
    topic hides newer checkpoints from READ_COMMITTED readers."""
    try:
        with WireClient.for_cluster(target_cluster.config) as client:
            store = CheckpointStore(target_cluster.config, client)
            own = {k: store.read_own(pipeline, *k) for k in behind}
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"own checkpoints not readable: {type(exc).__name__}: {exc}"
    return "own checkpoints (past the LSO): " + ", ".join(
        f"{t}-{p}: {cp.position if cp is not None else None}"
        f"{' ' + str(cp.lane_state) if cp is not None and cp.lane_state is not None else ''}"
        for (t, p), cp in own.items())


def held_lanes(source_cluster, pipeline: str, naming_prefix: str = "dr.") -> dict[str, str] | None:
    """Lane → the worker its source partition is assigned to in the pipeline's daemon group (as `shoal mirror
    status` reads it); None while the group cannot be described or a partition has more than one assignee."""
    from mirror_core.errors import MirrorError
    from mirror_core.kafka.daemon_group import describe_group

    try:
        group = describe_group(source_cluster.config, pipeline)
    except MirrorError:
        return None
    holders = group.holders()
    if any(len(workers) != 1 for workers in holders.values()):
        return None
    return {f"{naming_prefix}{topic}-{p}": workers[0] for (topic, p), workers in holders.items()}


def wait_for(predicate, timeout_s: float, what: str, *, daemons: tuple[DaemonProcess, ...] = ()):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.worker_id} (/readyz: {_readyz(d)})\n{d.tail()}" for d in daemons)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.3)


def no_hanging_transaction(target_cluster, topic: str, partitions: int) -> bool:
    with WireClient.for_cluster(target_cluster.config) as client:
        return all(list_offsets(client, topic, p, "last_stable") == list_offsets(client, topic, p, "latest")
                   for p in range(partitions))


def per_partition_counts(cluster, topic: str) -> Counter:
    return Counter(r.partition for r in cluster.read_all(topic, timeout_s=60))


# ---- tests -------------------------------------------------------------------------------------------------------

def test_live_load_exact_new_topic_and_metrics(sandbox, source_cluster, target_cluster, unique_name, tmp_path,
                                               daemon_factory):
    """Under live load (markers and aborted transactions included) the target equals the source exactly; a topic
    created mid-run that matches the regex is mirrored without a restart; /metrics agrees with the target."""
    prefix = unique_name()
    first, second = f"{prefix}.a", f"{prefix}.b"
    source_cluster.create_topic(first, partitions=3)
    pipeline = f"live-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port,
                            config_sync_interval_s=1, retention_interval_s=2)
    daemon = daemon_factory(config, "live-1", port).start()
    load = LoadProducer(source_cluster, [first], rate=800, seed=11)
    load.start()
    time.sleep(8)
    source_cluster.create_topic(second, partitions=2)  # matches the regex: picked up by a rescan
    load.add_topic(second)
    time.sleep(12)
    produced = load.stop()
    assert produced > 8_000
    wait_caught_up(source_cluster, target_cluster, pipeline, {first: 3, second: 2}, daemons=(daemon,))
    copied = assert_exact(source_cluster, target_cluster, first, f"dr.{first}")
    copied += assert_exact(source_cluster, target_cluster, second, f"dr.{second}")
    assert copied > 8_000
    assert "event=lane_discovered topic=" + second in daemon.log_text()

    # the metrics agree with what the target holds; lag is 0 once caught up
    status, body = daemon.get("/healthz")
    assert (status, body.strip()) == (200, "ok")
    metrics = daemon.metrics()
    for topic, partitions in ((first, 3), (second, 2)):
        on_target = per_partition_counts(target_cluster, f"dr.{topic}")
        for p in range(partitions):
            labels = (("partition", str(p)), ("topic", topic))
            assert metrics[("shoal_records_copied_total", labels)] == on_target[p], (topic, p)
            assert metrics[("shoal_lag_records", labels)] == 0, (topic, p)
            assert metrics[("shoal_position_offset", labels)] == source_ends(source_cluster, topic, partitions)[p]
            assert metrics[("shoal_bytes_copied_total", labels)] > 0
    assert metrics[("shoal_lanes_owned", ())] == 5
    assert not [k for k, v in metrics.items() if k[0] == "shoal_errors_total" and v]
    # one Fetch per source broker per round, carrying every held partition (the sandbox source has one broker);
    # a fetch per lane would make partitions per request exactly 1
    rounds, requests = metrics[("shoal_fetch_rounds_total", ())], metrics[("shoal_fetch_requests_total", ())]
    assert rounds > 20 and requests == rounds
    assert metrics[("shoal_fetch_partitions_total", ())] / requests > 2.5
    # retention margin of every held partition: caught up on a topic with the broker's 7-day retention → SAFE,
    # nothing unmirrored, nothing lost
    def retention_seen():
        m = daemon.metrics()
        return all(("shoal_retention_status", (("partition", str(p)), ("status", "SAFE"), ("topic", t))) in m
                   for t, n in ((first, 3), (second, 2)) for p in range(n)) and m
    metrics = wait_for(retention_seen, 20, "retention gauges", daemons=(daemon,))
    for topic, partitions in ((first, 3), (second, 2)):
        for p in range(partitions):
            labels = (("partition", str(p)), ("topic", topic))
            assert metrics[("shoal_retention_status", (("partition", str(p)), ("status", "SAFE"), ("topic", topic)))] \
                == 1
            assert metrics[("shoal_retention_lost_offsets", labels)] == 0
            assert metrics[("shoal_retention_margin_seconds", labels)] > 3600

    # a topic config that matters, changed on the source, reaches the target without a restart
    from tests.integration.kafka.test_topic_config_sync_kafka import alter, described

    alter(source_cluster, first, {"retention.ms": "777600000", "cleanup.policy": "compact,delete"})
    wait_for(lambda: described(target_cluster, f"dr.{first}")["retention.ms"][0] == "777600000" and
             described(target_cluster, f"dr.{first}")["cleanup.policy"][0] == "compact,delete", 30,
             "retention.ms and cleanup.policy synced to the target", daemons=(daemon,))
    assert f"event=config_synced topic={first} target_topic=dr.{first} change='retention.ms:" in daemon.log_text()
    assert daemon.metrics()[("shoal_topic_config_changes_total", (("topic", f"dr.{first}"),))] >= 2
    rc, seconds = daemon.terminate()
    assert rc == 0 and seconds < 10, (rc, seconds, daemon.tail())


def test_sigkill_and_sigterm_mid_stream(sandbox, quick_group_source, target_cluster, unique_name, tmp_path,
                                        daemon_factory):
    """SIGKILL twice mid-stream and restart: exact. SIGTERM mid-stream: the step in flight ends with a commit,
    the process exits 0 promptly, leaves the daemon group and no transaction is left open on the target."""
    source_cluster = quick_group_source
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=2)
    pipeline = f"kill-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), **QUICK_GROUP)
    daemon = daemon_factory(config, "kill-1")
    load = LoadProducer(source_cluster, [topic], rate=1000, seed=22)
    load.start()
    rng = random.Random(2026)
    kills_in_txn = 0
    for _ in range(2):
        daemon.start()
        wait_for(lambda: "event=copied" in daemon.log_text().rsplit("---- start", 1)[-1], 30, "copying",
                 daemons=(daemon,))
        time.sleep(rng.uniform(1.0, 2.5))
        daemon.kill()
        kills_in_txn += not no_hanging_transaction(target_cluster, f"dr.{topic}", 2)

    daemon.start()
    wait_for(lambda: "event=copied" in daemon.log_text().rsplit("---- start", 1)[-1], 30, "copying",
             daemons=(daemon,))
    time.sleep(2)
    rc, seconds = daemon.terminate()
    assert rc == 0, daemon.tail()
    assert seconds < 5, f"SIGTERM took {seconds:.1f}s"
    assert "event=stop" in daemon.log_text()
    assert held_lanes(source_cluster, pipeline) == {}, "the daemon left its group at SIGTERM"
    assert no_hanging_transaction(target_cluster, f"dr.{topic}", 2), "the step in flight ended with a commit"
    # what is on the target now is an exact prefix of the source, per partition
    src, tgt = contents(source_cluster, topic), contents(target_cluster, f"dr.{topic}")
    for p in range(2):
        s, t = [c for q, c in src if q == p], [c for q, c in tgt if q == p]
        assert t and t == s[:len(t)], f"partition {p}: target is not a prefix of the source"

    daemon.start()
    time.sleep(2)
    load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 2}, daemons=(daemon,))
    assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}")
    rc, _ = daemon.terminate()
    assert rc == 0
    print(f"kills that left a transaction open on the target (aborted on restart): {kills_in_txn}/2")


def test_two_daemons_one_killed_other_takes_over(sandbox, quick_group_source, target_cluster, unique_name, tmp_path,
                                                 daemon_factory):
    """Two daemons share a pipeline's lanes through the daemon group; SIGKILL one and the other takes its lanes over
    once the group's session timeout expires it (its transactional.id fences the dead one's writer). Still exact."""
    source_cluster = quick_group_source
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=4)
    pipeline = f"pair-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), **QUICK_GROUP)
    a = daemon_factory(config, "pair-a").start()
    b = daemon_factory(config, "pair-b").start()
    load = LoadProducer(source_cluster, [topic], rate=800, seed=33)
    load.start()
    # the group balances: each member gets two of the four partitions
    split = wait_for(lambda: (lambda h: h if h and len(h) == 4 and sorted(Counter(h.values()).items()) ==
                              [("pair-a", 2), ("pair-b", 2)] else None)(held_lanes(source_cluster, pipeline)), 40,
                     "a 2 + 2 split of the lanes", daemons=(a, b))
    a_lanes = sorted(lane for lane, holder in split.items() if holder == "pair-a")
    time.sleep(2)
    a.kill()
    killed_at = time.monotonic()
    wait_for(lambda: (lambda h: h is not None and len(h) == 4 and set(h.values()) == {"pair-b"})(
        held_lanes(source_cluster, pipeline)), 30, "pair-b holding every lane", daemons=(b,))
    takeover_s = time.monotonic() - killed_at
    time.sleep(2)
    load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 4}, daemons=(b,))
    assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}")
    log_b = b.log_text()
    for lane in a_lanes:
        assert f"event=lane_acquired lane={lane} worker=pair-b" in log_b
    assert b.alive
    rc, _ = b.terminate()
    assert rc == 0
    print(f"lanes of the killed daemon {a_lanes} taken over in {takeover_s:.1f}s (session timeout 4 s)")


def test_backfill_then_handoff_under_load_seam_is_clean(sandbox, source_cluster, target_cluster, unique_name,
                                                        tmp_path, daemon_factory):
    """A backfill (owner ``backfill:run-1``, epoch 0) copies up to X while producers keep writing; the daemon leaves
    its lanes alone until ``shoal handoff``; then it resumes at exactly X: ``verify_seam`` (and ``shoal verify seam``)
    pass for every partition and the whole target equals the source. A late backfill of a handed-off lane is
    refused (OwnershipError) and the daemon, whose writer it fenced on the way, recovers by itself."""
    from mirror_core.config.commit_policy import CommitPolicy
    from mirror_core.config.names import DAEMON_OWNER
    from mirror_core.engine.checkpointed import CheckpointedCopier
    from mirror_core.errors import OwnershipError
    from mirror_core.model.ranges import PartitionRange
    from mirror_core.services.handoff import verify_seam
    from mirror_core.services.preflight import run_preflight

    prefix = unique_name()
    topic = f"{prefix}.t"
    target_topic = f"dr.{topic}"
    source_cluster.create_topic(topic, partitions=3)
    pipeline = f"hand-{prefix.rsplit('.', 1)[-1]}"
    load = LoadProducer(source_cluster, [topic], rate=800, seed=44)
    load.start()
    time.sleep(4)
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic) \
            .raise_if_refused()
        backfill = CheckpointedCopier(source, target, store, pipeline=pipeline, owner="backfill:run-1",
                                      owner_epoch=0, policy=CommitPolicy(1 << 20, 200))
        ends = {p: list_offsets(source, topic, p, "last_stable") for p in range(3)}
        for p in range(3):
            backfill.copy(PartitionRange(topic, p, 0, ends[p], target_topic, p))

    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix))
    daemon = daemon_factory(config, "hand-1").start()
    wait_for(lambda: "event=lane_discovered" in daemon.log_text(), 30, "lane discovery", daemons=(daemon,))
    time.sleep(2)
    assert "event=lane_acquired" not in daemon.log_text(), "the daemon must not take lanes a backfill owns"
    assert {k: cp.position for k, cp in checkpoints(target_cluster, pipeline).items()} == \
        {(topic, p): ends[p] for p in range(3)}

    handoff = subprocess.run([PYTHON, "-m", "mirror_core.cli", "handoff", "--target", "target", "--pipeline",
                              pipeline, "--topic", topic, "--wait-s", "30"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert handoff.returncode == 0, handoff.stderr + handoff.stdout
    for p in range(3):
        assert f"{topic}-{p}: owner daemon epoch 1, daemon resumes at {ends[p]} " in handoff.stdout, handoff.stdout
    handed = checkpoints(target_cluster, pipeline)
    seams = {p: handed[(topic, p)].handoff_position for p in range(3)}
    assert seams == ends, "the seam X of each partition is recorded at the handoff"
    assert all(handed[(topic, p)].owner == DAEMON_OWNER and handed[(topic, p)].owner_epoch == 1 for p in range(3))

    # the handoff's wait ends once the group assigns the partitions, which can be before the daemon opened lane 0:
    # the zombie below is to meet a lane the daemon has opened (else there is no writer of the daemon's to fence)
    wait_for(lambda: f"event=lane_opened topic={topic} partition=0 " in daemon.log_text(), 30,
             "the daemon to open lane 0", daemons=(daemon,))
    # a late (zombie) backfill of the same lane: fenced by the newer owner epoch, nothing written
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        late = CheckpointedCopier(source, target, CheckpointStore(target_cluster.config, target), pipeline=pipeline,
                                  owner="backfill:run-1", owner_epoch=0)
        with pytest.raises(OwnershipError, match="handed off"):
            late.open_lane(topic, 0, target_topic, 0)

    time.sleep(4)
    load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 3}, daemons=(daemon,))
    assert f"event=lane_dropped lane={target_topic}-0 reason=fenced" in daemon.log_text(), \
        "the late backfill's InitProducerId fenced the daemon's writer of the lane; the daemon took it back"
    for p in range(3):
        report = verify_seam(source_cluster.config, target_cluster.config, pipeline, topic, p, window=400)
        assert report.ok, report.problem
        assert report.handoff_position == ends[p] and report.checked_source_records > 400
    seam = subprocess.run([PYTHON, "-m", "mirror_core.cli", "verify", "seam", "--source", "source", "--target",
                           "target", "--pipeline", pipeline, "--topic", topic], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert seam.returncode == 0 and seam.stdout.count("contiguous") == 3, seam.stdout + seam.stderr
    assert_exact(source_cluster, target_cluster, topic, target_topic)
    assert daemon.alive
    rc, _ = daemon.terminate()
    assert rc == 0


def test_seam_check_detects_duplicate_and_gap(source_cluster, target_cluster, unique_name):
    """Honest construction of broken seams: the target partition is the source's records produced by hand, with one
    record duplicated / one missing right after the handoff position X; the checkpoint claims a dense copy (offset
    map source [0, N) → target [0, N)) handed off at X. The clean control passes; each injected fault fails and is
    named."""
    from mirror_core.kafka.writer import BatchWriter
    from mirror_core.model.offset_map import OffsetMap
    from mirror_core.model.offset_runs import OffsetRun
    from mirror_core.services.handoff import verify_seam

    n, x = 300, 120
    topic = source_cluster.create_topic(unique_name(), partitions=1)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i, [("i", b"%d" % i)]) for i in range(n)], partition=0)
    src = source_cluster.read_all(topic)
    assert [r.offset for r in src] == list(range(n))
    records = [(r.key, r.value, r.headers, r.timestamp) for r in src]
    cases = {"clean": records, "duplicate": records[:x] + [records[x - 1]] + records[x:],
             "gap": records[:x] + records[x + 1:]}
    suffix = topic.rsplit(".", 1)[-1]
    reports = {}
    with WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        writer = BatchWriter(target)
        for name, recs in cases.items():
            target_topic = target_cluster.create_topic(f"{topic}.{name}", partitions=1)
            target_cluster.produce(target_topic, recs, partition=0)
            omap = OffsetMap.from_runs([OffsetRun(0, n, 0)], start=0, position=n, target_next=n)
            cp = Checkpoint(pipeline=f"seam-{suffix}-{name}", topic=topic, partition=0, position=n,
                            target_topic=target_topic, target_partition=0, target_next=n, owner="daemon",
                            owner_epoch=1, offset_map=omap, handoff_position=x)
            writer.write([store.checkpoint_batch(cp)])
            reports[name] = verify_seam(source_cluster.config, target_cluster.config, cp.pipeline, topic, 0,
                                        window=50)
    assert reports["clean"].ok and reports["clean"].checked_source_records == 100, reports["clean"]
    assert not reports["duplicate"].ok and reports["duplicate"].problem.startswith("duplicate"), reports["duplicate"]
    assert f"repeats source offset {x - 1}" in reports["duplicate"].problem
    assert not reports["gap"].ok and reports["gap"].problem.startswith("gap"), reports["gap"]
    assert f"source offset {x} is missing" in reports["gap"].problem


def test_target_broker_restart_daemon_resumes_by_itself(sandbox, session_sandbox, source_cluster, target_cluster,
                                                        unique_name, tmp_path, daemon_factory):
    """The target broker stops and starts again under load (once, briefly: it disturbs everyone on the sandbox);
    the daemon keeps running, retries, and the target ends up exactly the source."""
    prefix = unique_name()
    topic = f"{prefix}.t"
    source_cluster.create_topic(topic, partitions=2)
    pipeline = f"restart-{prefix.rsplit('.', 1)[-1]}"
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port)
    daemon = daemon_factory(config, "restart-1", port).start()
    load = LoadProducer(source_cluster, [topic], rate=800, seed=55)
    load.start()
    wait_for(lambda: "event=copied" in daemon.log_text(), 30, "copying", daemons=(daemon,))
    time.sleep(2)
    broker = session_sandbox.sandbox.broker("target")
    down_at = time.monotonic()
    try:
        assert broker.stop(timeout=20)
        time.sleep(2)
    finally:
        broker.start(timeout=90)
    outage_s = time.monotonic() - down_at
    time.sleep(3)
    load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 2}, timeout_s=120, daemons=(daemon,))
    assert daemon.alive, f"the daemon exited during the outage:\n{daemon.tail()}"
    assert_exact(source_cluster, target_cluster, topic, f"dr.{topic}")
    assert no_hanging_transaction(target_cluster, f"dr.{topic}", 2)
    # the outage shows as retried errors or as writes that waited it out inside the writer's own retries
    errors = sum(v for k, v in daemon.metrics().items() if k[0] == "shoal_errors_total")
    status, _ = daemon.get("/healthz")
    assert status == 200
    rc, _ = daemon.terminate()
    assert rc == 0
    print(f"target broker down and back in {outage_s:.1f}s; {errors:.0f} errors retried")
