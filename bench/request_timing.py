"""Where a one-partition copy waits: per-request timings of the fast connections (a measurement aid, not a test).

Copies the benchmark's ``lz4-1-record-batches`` data (one partition, one record per batch; the source topic
``prof-lz4-1-record-batches`` is generated once and kept, as :mod:`bench.profile_copy` does) to fresh target
topics, each mirror in a child process pinned to core 1 like ``bench/copy_bench.py``:

- ``shallow``: :class:`~mirror_core.engine.copier.RangeCopier` with :mod:`mirror_core.kafka.request_trace` on;
- ``null``: the same batches fetched and prepared first, then only produced (trace on);
- ``deep``: ``bench.copy_bench``'s confluent-kafka loop (no trace; context switches and CPU only);
- ``concurrent-alo``: ``bench.copy_bench``'s ``shoal copy`` engine in at-least-once mode (trace on; its requests
  include the checkpoint commits' and their Fetch rounds).

Per mirror: wall and CPU seconds of the copy, voluntary / involuntary context switches (blocking waits /
preemptions), and from the trace: Produce requests, requests in flight when each was sent, the share of answers
whose bytes were already in the socket when the writer began waiting for them (the process was behind the broker),
the time spent blocked waiting for Produce and for Fetch answers, and the process's own time from reading an
answer to sending the next request. ``wall - CPU - blocked`` is time runnable but not running (the shared core).

    SHOAL_SANDBOX_DIR=/tmp/sbx .venv/bin/python -m bench.request_timing --mirrors shallow null deep --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.copy_bench import MIRROR_CORE, default_cases, describe_source, generate

ROOT = Path(__file__).resolve().parent.parent
API_PRODUCE, API_FETCH = 0, 1


def _usage() -> tuple[float, int, int]:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nvcsw, u.ru_nivcsw


def summarize(trace) -> dict:
    """Figures of a :class:`~mirror_core.kafka.request_trace.RequestTrace` (see the module docstring)."""
    api = {(conn, cid): key for _, conn, key, cid, _, _ in trace.sends}
    produce_sends = [s for s in trace.sends if s[2] == API_PRODUCE]
    in_flight = [s[5] for s in produce_sends]
    produce = [a for a in trace.answers if api.get((a[2], a[3])) == API_PRODUCE]
    fetch = [a for a in trace.answers if api.get((a[2], a[3])) == API_FETCH]
    ready = sum(1 for a in produce if a[4])
    blocked_produce = sum(a[1] - a[0] for a in produce if not a[4])
    blocked_fetch = sum(a[1] - a[0] for a in fetch)
    # the process's own time per request: from reading a Produce answer to the next Produce send
    send_times = [s[0] for s in produce_sends]
    gaps, j = [], 0
    for a in produce:
        while j < len(send_times) and send_times[j] < a[1]:
            j += 1
        if j < len(send_times):
            gaps.append(send_times[j] - a[1])
    sent_at = {(s[1], s[3]): s[0] for s in produce_sends}
    latency = [a[1] - sent_at[(a[2], a[3])] for a in produce if (a[2], a[3]) in sent_at]
    waits = [a[1] - a[0] for a in produce if not a[4]]
    return {
        "produce_requests": len(produce_sends),
        "socket_writes": len(trace.writes),
        "in_flight_at_send": {n: in_flight.count(n) for n in sorted(set(in_flight))},
        "answers_ready": ready / max(1, len(produce)),
        "blocked_produce_s": blocked_produce,
        "blocked_fetch_s": blocked_fetch,
        "fetch_requests": len(fetch),
        "answer_to_next_send_us_median": 1e6 * statistics.median(gaps) if gaps else None,
        "send_to_answer_us_median": 1e6 * statistics.median(latency) if latency else None,
        "blocked_wait_us_median": 1e6 * statistics.median(waits) if waits else None,
    }


def child(mirror: str, spec: dict) -> dict:
    if (os.cpu_count() or 1) >= 2 and spec.get("pin", True):
        os.sched_setaffinity(0, {MIRROR_CORE})
    from mirror_core.kafka import produce_pipeline, request_trace
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.kafka.writer import BatchWriter

    if spec.get("keep_queued") is not None:  # an experiment: how many requests the pipeline keeps queued
        produce_pipeline.KEEP_QUEUED = spec["keep_queued"]

    if mirror in ("deep", "concurrent-alo"):  # copy_bench's own mirrors: their copy phase, setup excluded
        from bench.copy_bench import child_concurrent, child_deep
        trace = request_trace.start() if mirror != "deep" and spec.get("trace", True) else None
        c0, v0, i0 = _usage()
        report = child_deep(spec) if mirror == "deep" else child_concurrent({**spec, "mirror": mirror})
        c1, v1, i1 = _usage()
        request_trace.stop()
        report.update(voluntary=v1 - v0, involuntary=i1 - i0)  # setup included
        if trace is not None:
            report.update(summarize(trace))
            report["off_cpu_not_blocked_s"] = report["seconds"] - report["cpu_seconds"] \
                - report["blocked_produce_s"] - report["blocked_fetch_s"]
        return report
    with WireClient("source", spec["source"]) as source, WireClient("target", spec["target"]) as target:
        writer = BatchWriter(target)
        writer.init_producer_id()
        if mirror == "shallow":
            from mirror_core.engine.copier import CopyOptions, RangeCopier
            from mirror_core.model.ranges import PartitionRange
            copier = RangeCopier(source, target, writer, CopyOptions())
            rng = PartitionRange(spec["src_topic"], 0, spec["start"], spec["end"], spec["dst_topic"], 0)
            work = lambda: copier.copy(rng)  # noqa: E731
        else:
            from mirror_core.codec.batch_prepare import prepare_for_target
            from mirror_core.kafka.fetcher import RawBatchFetcher
            from mirror_core.kafka.writer import OutgoingBatch
            batches = []
            for view in RawBatchFetcher(source, spec["src_topic"], 0, spec["start"], spec["end"]):
                prepared = prepare_for_target(view)
                batches.append(OutgoingBatch(spec["dst_topic"], 0, prepared.data, prepared.source_first_offset))

            def work():
                step = 8 * 1024 * 1024 // len(batches[0].data)
                for i in range(0, len(batches), step):
                    writer.write(batches[i:i + step])
        trace = request_trace.start() if spec.get("trace", True) else None
        t0 = time.monotonic()
        c0, v0, i0 = _usage()
        work()
        c1, v1, i1 = _usage()
        wall = time.monotonic() - t0
        request_trace.stop()
    report = {"seconds": wall, "cpu_seconds": c1 - c0, "voluntary": v1 - v0, "involuntary": i1 - i0}
    if trace is not None:
        report.update(summarize(trace))
        report["off_cpu_not_blocked_s"] = wall - report["cpu_seconds"] - report["blocked_produce_s"] \
            - report["blocked_fetch_s"]
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", nargs="*", default=["shallow", "null", "deep"],
                        choices=["shallow", "null", "deep", "concurrent-alo"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-trace", action="store_true", help="measure without the trace switch (its cost)")
    parser.add_argument("--keep-queued", type=int, nargs="*", default=[None],
                        help="run each mirror once per value of produce_pipeline.KEEP_QUEUED (default: the module's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, json.loads(sys.stdin.read()))))
        return

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.kafka.topics import TopicAdmin

    sandbox = sandbox_from_environ(os.environ)
    source_conf, target_conf = sandbox.client_config("source"), sandbox.client_config("target")
    source_admin = TopicAdmin(ClusterConfig("source", source_conf))
    target_admin = TopicAdmin(ClusterConfig("target", target_conf))
    case = next(c for c in default_cases(1.0) if c.name == "lz4-1-record-batches")
    src = f"prof-{case.name}"
    if not source_admin.exists(src):
        source_admin.create(src, 1)
        generate(case, source_conf, src)
    data = describe_source(source_conf, src)
    print(f"{src}: {data['records']} records in {data['batches']} batches; load {os.getloadavg()}", flush=True)
    from dataclasses import asdict
    for rep in range(args.repeat):
        for mirror, keep in [(m, k) for m in args.mirrors for k in (args.keep_queued if m != "deep" else [None])]:
            dst = f"timing-{mirror}-{time.strftime('%H%M%S')}-{rep}"
            target_admin.create(dst, 1)
            spec = {"source": source_conf, "target": target_conf, "src_topic": src, "dst_topic": dst,
                    "start": data["start"], "end": data["end"], "starts": data["starts"], "ends": data["ends"],
                    "case": asdict(case), "trace": not args.no_trace, "keep_queued": keep,
                    "fetch_max_bytes": 4 * 1024 * 1024, "max_inflight_bytes": 8 * 1024 * 1024}
            try:
                proc = subprocess.run([sys.executable, "-m", "bench.request_timing", "--child", mirror],
                                      input=json.dumps(spec), capture_output=True, text=True, cwd=ROOT,
                                      timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
            finally:
                target_admin.delete(dst)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            report = json.loads(proc.stdout.strip().splitlines()[-1])
            report["records_per_s"] = data["records"] / report["seconds"]
            report["keep_queued"] = keep
            print(f"rep {rep} {mirror:<8} " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                                          for k, v in report.items()}), flush=True)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
