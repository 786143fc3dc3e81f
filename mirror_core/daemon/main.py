"""The daemon's entry point: ``python -m mirror_core.daemon --config pipeline.yaml`` and ``shoal mirror run``.

The pipeline file loaded, the metrics endpoint served, SIGTERM/SIGINT turned into a stop after the round in
progress (bounded by ``shutdown_grace_s``: then :class:`~mirror_core.daemon.loop.ForcedShutdown`), and
:meth:`~mirror_core.daemon.loop.ShallowMirrorDaemon.run` until then.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading

from mirror_core.config.pipeline_file import load_pipeline_config
from mirror_core.daemon import thread_sampler
from mirror_core.daemon.loop import ForcedShutdown, ShallowMirrorDaemon
from mirror_core.daemon.metrics import serve_metrics
from mirror_core.errors import MirrorError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirror_core.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="pipeline YAML file")
    parser.add_argument("--worker-id", help="this process's name in the group (its client.id) and in lease records "
                                            "(default: random)")
    parser.add_argument("--thread-sample", metavar="PATH",
                        help="diagnostics: write CPU per thread name and busy stacks to PATH ({pid}: the process "
                             "id) every few seconds and at exit (mirror_core.daemon.thread_sampler)")
    args = parser.parse_args(argv)
    return run_daemon(args.config, args.worker_id, thread_sample=args.thread_sample)


def run_daemon(config_path, worker_id: str | None = None, *, thread_sample: str | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # the wire library narrates every connection at INFO
    try:
        config = load_pipeline_config(config_path)
        daemon = ShallowMirrorDaemon(config, worker_id=worker_id)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = serve_metrics(daemon.metrics, config.metrics_port, host=config.metrics_host) if config.metrics_port \
            else None
    except OSError as exc:  # before anything was joined, opened or installed
        print(f"shoal mirror: error: pipeline {config.pipeline!r}: cannot serve /metrics on "
              f"{config.metrics_host}:{config.metrics_port} ({exc.strerror or exc}); another process (a second daemon "
              "on this machine?) has that port: give this one another metrics_port, or 0 for none", file=sys.stderr)
        return 2
    stop = threading.Event()
    sampler = thread_sampler.start(thread_sample) if thread_sample else None  # diagnostics only

    def on_stop(*_):
        if not stop.is_set():  # the first signal: finish the round, commit, release; the alarm bounds that
            stop.set()
            signal.alarm(max(1, math.ceil(config.shutdown_grace_s)))

    def on_alarm(*_):
        raise ForcedShutdown()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        daemon.run(stop)
    except ForcedShutdown:
        print(f"shoal mirror: stopped after the {config.shutdown_grace_s:g}s grace period without finishing the "
              "round in progress; nothing is lost (the next start resumes at the last committed checkpoints)",
              file=sys.stderr)
    except MirrorError as exc:
        print(f"shoal mirror: error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
        if server is not None:
            server.shutdown()
        if sampler is not None:
            sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
