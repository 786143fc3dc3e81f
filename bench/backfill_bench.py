"""Backfill benchmark: the PySpark backfill job (spark-submit, ``local[N]``) against the single-process copier on the
same data, across partition counts and executor slots.

For each partition count P (default 1, 2, 4) one source topic holds the same records (lz4, 1 KiB text-like values,
the ``lz4-1KiB`` shape of :mod:`bench.copy_bench`), spread evenly over its P partitions. Each is then copied, into a
fresh target topic and pipeline every time, by:

- ``single``: one Python process runs the plan's lanes one after another: the job's own driver preflight
  (:func:`spark_apps.backfill_job.prepare_targets`) then :func:`mirror_core.engine.backfill.run_lane` per lane, the code
  every Spark task runs (exactly-once, same copy options), without Spark.
- ``spark local[N]``: ``spark-submit spark_apps/backfill_job.py`` with ``--master local[N]`` for N ≤ P (N executor
  slots: at most N lanes copy at once).

Measured for every run: the process's wall time from start to exit; the **copy phase**, from the last 0.25 s sample
of the target's high watermarks (summed over partitions) still at 0 to the first one at the total (so it excludes
JVM start-up, Spark session, preflight and task launch, and includes ≤ 0.5 s of sampling slack); CPU seconds of the
run's process tree (``RUSAGE_CHILDREN``) and of both broker JVMs (``psutil``), and the whole machine's busy CPU
share during the copy phase. MB/s is over the bytes of the batches copied (from the ledger: source on-disk batch
bytes, compressed, MB = 10^6 B). Every run is checked to have copied exactly the source's records.

Nothing is pinned: brokers, the driver and the Python workers share the machine's cores, which is the point (what
does Spark buy on this machine). Run ``.venv/bin/python -m bench.backfill_bench --help``; raw results go to
``bench/results/backfill-*.json`` and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_S = 0.25


# -- data --------------------------------------------------------------------------------------------------------

def generate(source_conf: dict, topic: str, partitions: int, records: int) -> None:
    from confluent_kafka import Producer

    from bench.copy_bench import _values
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.topics import TopicAdmin

    TopicAdmin(ClusterConfig("source", source_conf)).create(topic, partitions)
    producer = Producer({**source_conf, "log_level": 0, "enable.idempotence": True, "acks": "all",
                         "compression.type": "lz4", "batch.size": 64 * 1024, "batch.num.messages": 10_000,
                         "linger.ms": 20})
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err.str())

    values = _values(1024)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"key-%08d" % i, value=values[i % len(values)], partition=i % partitions,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) or errors:
        raise RuntimeError(f"generating {topic}: {errors[:3]}")


def make_plan(source, target, topic: str, prefix: str, pipeline: str, path: Path) -> dict:
    import re

    from mirror_core.config.plan_request import PlanRequest
    from mirror_core.services.plan_inputs import build_plan

    request = PlanRequest.parse(pipeline=pipeline, source_cluster=source.name, target_cluster=target.name,
                                include=re.escape(topic), naming=f"prefix:{prefix}")
    plan = build_plan(source, target, request)
    path.write_text(plan.to_json())
    return plan.to_dict()


# -- measuring a run ---------------------------------------------------------------------------------------------

class Sampler:
    """Samples the target topic's summed high watermark, the machine's CPU and the brokers' CPU every SAMPLE_S."""

    def __init__(self, target_conf: dict, topic: str, partitions: int, total: int):
        import psutil

        self.topic, self.partitions, self.total = topic, partitions, total
        self.target_conf = target_conf
        self.samples: list[tuple[float, int, float]] = []  # (monotonic, offsets written, machine busy %)
        self.brokers = [psutil.Process(pid) for pid in broker_pids()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer({**self.target_conf, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                             "isolation.level": "read_uncommitted", "log_level": 0})
        psutil.cpu_percent(None)
        try:
            while not self._stop.is_set():
                written = 0
                for p in range(self.partitions):
                    with contextlib.suppress(KafkaException):  # not created yet
                        written += consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2)[1]
                self.samples.append((time.monotonic(), written, psutil.cpu_percent(None)))
                self._stop.wait(SAMPLE_S)
        finally:
            consumer.close()

    def broker_cpu(self) -> float | None:
        import psutil

        try:
            return sum(sum(p.cpu_times()[:2]) for p in self.brokers)
        except psutil.Error:  # a broker restarted (the sandbox is shared): no figure for this run
            return None

    def __enter__(self):
        self.broker_cpu_start = self.broker_cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        end = self.broker_cpu()
        self.broker_cpu_seconds = None if end is None or self.broker_cpu_start is None else end - self.broker_cpu_start

    def copy_phase(self) -> tuple[float | None, float | None]:
        """(seconds, machine busy % averaged over the phase); None when the samples do not bracket it."""
        zero = [t for t, n, _ in self.samples if n == 0]
        done = [t for t, n, _ in self.samples if n >= self.total]
        if not zero or not done:
            return None, None
        start, end = zero[-1], done[0]
        busy = [c for t, _, c in self.samples if start < t <= end]
        return end - start, (sum(busy) / len(busy) if busy else None)


def broker_pids() -> list[int]:
    pids = []
    for name in ("source", "target"):
        path = ROOT / ".sandbox" / name / "broker.pid"
        if path.exists():
            pids.append(int(path.read_text().split()[0]))
    return pids


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def background_busy(seconds: float = 2.0) -> float:
    """The machine's busy CPU share while this benchmark runs nothing (other users of a shared machine)."""
    import psutil

    return psutil.cpu_percent(seconds)


def run_measured(cmd: list[str], env: dict, sampler: Sampler, log: Path) -> dict:
    idle_busy = background_busy()
    cpu0, t0 = children_cpu(), time.monotonic()
    with sampler, log.open("w") as out:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}; see {log}")
    copy_s, busy = sampler.copy_phase()
    return {"wall_s": wall, "cpu_s": cpu, "copy_s": copy_s, "busy_pct": busy, "background_busy_pct": idle_busy,
            "broker_cpu_s": sampler.broker_cpu_seconds, "loadavg_1m_after": os.getloadavg()[0]}


def single_process_child(plan_path: str, clusters_path: str, ledger: str) -> None:
    """``--single``: the lanes one after another in this process (driver preflight first, as the job does)."""
    import yaml

    from mirror_core.engine.backfill import lane_jobs, run_lane
    from mirror_core.state.ledger import write_ledger
    from spark_apps.backfill_job import prepare_targets

    plan = json.loads(Path(plan_path).read_text())
    clusters = yaml.safe_load(Path(clusters_path).read_text())
    jobs = lane_jobs(plan, clusters, "single", parallelism=1)
    prepare_targets(plan, jobs)
    rows = [row for job in jobs for row in run_lane(job)]
    write_ledger(Path(ledger), "single", rows)


# -- the benchmark -----------------------------------------------------------------------------------------------

def run(args) -> dict:
    from mirror_core.cli.backfill_command import spark_submit_command
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.state.ledger import STATUS_OK, read_ledger

    sandbox = sandbox_from_environ(os.environ)
    clusters_file = sandbox.write_clusters_file()
    source = ClusterConfig("source", sandbox.client_config("source"))
    target = ClusterConfig("target", sandbox.client_config("target"))
    run_tag = time.strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix="shoal-backfill-bench-"))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = {"name": args.name or f"backfill-{run_tag}", "machine": machine(), "records": args.records,
           "sample_s": SAMPLE_S, "runs": [], "data": {}}
    for partitions in args.partitions:
        topic = f"shoal-bench.backfill.p{partitions}.{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        generate(source.settings, topic, partitions, args.records)
        out["data"][partitions] = {"topic": topic, "generate_s": round(time.monotonic() - started, 1)}
        modes = [("single", None)] * args.single_repeat + [("spark", n) for n in args.slots if n <= partitions]
        for index, (mode, slots) in enumerate(modes):
            label = "single" if mode == "single" else f"spark local[{slots}]"
            prefix, pipeline = f"b{index}.", f"bench.{run_tag}.p{partitions}.{index}"
            plan_path, ledger = work / f"plan-p{partitions}-{index}.json", work / f"ledger-p{partitions}-{index}"
            plan = make_plan(source, target, topic, prefix, pipeline, plan_path)
            total = sum(u["end"] - u["start"] for u in plan["units"])
            if mode == "single":
                cmd = [sys.executable, "-m", "bench.backfill_bench", "--single", str(plan_path), str(clusters_file),
                       str(ledger)]
            else:
                cmd = spark_submit_command(f"local[{slots}]", ["--plan", str(plan_path), "--clusters",
                                                               str(clusters_file), "--ledger", str(ledger),
                                                               "--run-id", "spark"])
            # offsets include the commit markers (one per transaction, a handful per lane): the copy phase may end
            # a few records early, which is below the sampling resolution
            sampler = Sampler(target.settings, f"{prefix}{topic}", partitions, args.records)
            measured = run_measured(cmd, env, sampler, work / f"log-p{partitions}-{index}.txt")
            rows = read_ledger(ledger)
            records, nbytes = sum(r.records for r in rows), sum(r.bytes for r in rows)
            if records != args.records or {r.status for r in rows} != {STATUS_OK}:
                raise RuntimeError(f"{label} P={partitions}: copied {records} of {args.records} records")
            result = {"partitions": partitions, "mirror": label, "slots": slots, "records": records,
                      "bytes": nbytes, "offsets": total, "lane_s": sorted(round(r.duration_s, 2) for r in rows),
                      **measured}
            result["copy_mb_s"] = nbytes / 1e6 / result["copy_s"] if result["copy_s"] else None
            result["wall_mb_s"] = nbytes / 1e6 / result["wall_s"]
            out["runs"].append(result)
            print(row(result), flush=True)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{out['name']}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"results: {path}; logs and ledgers: {work}")
    return out


def machine() -> dict:
    import psutil

    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
            "python": platform.python_version(), "platform": platform.platform(), "loadavg_start": os.getloadavg()}


HEADER = ("| P | mirror | MB | copy s | copy MB/s | wall s | wall MB/s | lane s | job CPU s | broker CPU s | "
          "busy % | background % |\n|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")


def row(r: dict) -> str:
    def f(value, spec=".1f"):
        return "-" if value is None else format(value, spec)

    lanes = ", ".join(f"{s:.1f}" for s in r["lane_s"])
    return (f"| {r['partitions']} | {r['mirror']} | {r['bytes'] / 1e6:.1f} | {f(r['copy_s'])} | {f(r['copy_mb_s'])} "
            f"| {r['wall_s']:.1f} | {r['wall_mb_s']:.1f} | {lanes} | {r['cpu_s']:.1f} | {f(r['broker_cpu_s'])} "
            f"| {f(r['busy_pct'], '.0f')} | {r['background_busy_pct']:.0f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="backfill_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=160_000, help="records per source topic (default 160000)")
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4],
                        help="partition counts, comma-separated (default 1,2,4)")
    parser.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4],
                        help="local[N] executor slots; only N <= partitions run (default 1,2,4)")
    parser.add_argument("--single-repeat", type=int, default=1, help="single-process runs per topic (default 1)")
    parser.add_argument("--name", help="results file name (default backfill-<time>)")
    parser.add_argument("--single", nargs=3, metavar=("PLAN", "CLUSTERS", "LEDGER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single:
        single_process_child(*args.single)
        return
    print(HEADER, flush=True)
    run(args)


if __name__ == "__main__":
    main()
