"""Profile Shoal's shallow copy on the benchmark's data shapes (a measurement aid, not a test).

Source topics ``prof-<case>`` are generated once on the sandbox's source cluster (kept between runs; ``--regen``
makes them afresh) with :func:`bench.copy_bench.generate`; each run copies a case to a fresh target topic with
:class:`~mirror_core.engine.copier.RangeCopier`, in this process, under cProfile (``--profiler cprofile``, default) or
pyinstrument (``--profiler pyinstrument``, if installed), with the brokers pinned like the benchmark does.

    .venv/bin/python -m bench.profile_copy --cases zstd-1KiB lz4-1-record-batches --profiler cprofile
"""

from __future__ import annotations

import argparse
import os
import time

from bench.copy_bench import MIRROR_CORE, _status_kib, default_cases, describe_source, generate, pinned_brokers


def _copy(source_conf: dict, target_conf: dict, src: str, dst: str, data: dict, fetch_max_bytes: int,
          max_inflight_bytes: int):
    from mirror_core.engine.copier import CopyOptions, RangeCopier
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.kafka.writer import BatchWriter
    from mirror_core.model.ranges import PartitionRange

    with WireClient("source", source_conf) as source, WireClient("target", target_conf) as target:
        writer = BatchWriter(target)
        writer.init_producer_id()
        copier = RangeCopier(source, target, writer, CopyOptions(fetch_max_bytes=fetch_max_bytes,
                                                                 max_inflight_bytes=max_inflight_bytes))
        rng = PartitionRange(src, 0, data["start"], data["end"], dst, 0)
        yield
        return copier.copy(rng)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_copy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--profiler", choices=("cprofile", "pyinstrument", "none"), default="cprofile")
    parser.add_argument("--regen", action="store_true", help="re-generate the source topics")
    parser.add_argument("--fetch-max-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--max-inflight-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--top", type=int, default=45, help="cProfile rows to print")
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args(argv)

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import sandbox_from_environ
    from mirror_core.kafka.topics import TopicAdmin

    sandbox = sandbox_from_environ(os.environ)
    source_conf, target_conf = sandbox.client_config("source"), sandbox.client_config("target")
    source_admin = TopicAdmin(ClusterConfig("source", source_conf))
    target_admin = TopicAdmin(ClusterConfig("target", target_conf))
    for case in default_cases(1.0):
        if args.cases and case.name not in args.cases:
            continue
        src = f"prof-{case.name}"
        if args.regen and source_admin.exists(src):
            source_admin.delete(src)
            time.sleep(1)
        if not source_admin.exists(src):
            source_admin.create(src, 1)
            generate(case, source_conf, src)
        data = describe_source(source_conf, src)
        dst = f"prof-{case.name}-{time.strftime('%H%M%S')}"
        target_admin.create(dst, 1)
        try:
            with pinned_brokers(not args.no_pin):
                if (os.cpu_count() or 1) >= 2:
                    os.sched_setaffinity(0, {MIRROR_CORE})
                steps = _copy(source_conf, target_conf, src, dst, data, args.fetch_max_bytes,
                              args.max_inflight_bytes)
                next(steps)
                rss0 = _status_kib("VmRSS")
                t0, c0 = time.monotonic(), time.process_time()
                profiler = None
                if args.profiler == "cprofile":
                    import cProfile
                    profiler = cProfile.Profile(time.process_time)
                    profiler.enable()
                elif args.profiler == "pyinstrument":
                    from pyinstrument import Profiler
                    profiler = Profiler(interval=0.0005)
                    profiler.start()
                try:
                    next(steps)
                except StopIteration as stop:
                    result = stop.value
                if args.profiler == "cprofile":
                    profiler.disable()
                elif args.profiler == "pyinstrument":
                    profiler.stop()
                wall, cpu = time.monotonic() - t0, time.process_time() - c0
                os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        finally:
            target_admin.delete(dst)
        gb = data["bytes"] / 1e9
        print(f"== {case.name}: {result.records} records, {result.batches} batches, wall {wall:.2f}s, "
              f"cpu {cpu:.2f}s, {cpu / gb:.1f} CPU-s/GB, {data['bytes'] / 1e6 / wall:.1f} MB/s, "
              f"RSS start {rss0 / 1024:.1f} MiB peak {_status_kib('VmHWM') / 1024:.1f} MiB (profiler on)")
        if args.profiler == "cprofile":
            import pstats
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.top)
        elif args.profiler == "pyinstrument":
            print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
