"""``shoal``: the command line of Shoal.

Entry point only: parses arguments, reads the environment (the one place that does), dispatches to the command
modules (``sandbox_command``, ``handoff_command``, ``lanes_command``, ``copy_command``, ``plan_command``,
``backfill_command``, ``deadlines_command``, ``groups_command``; what ``--source``/``--target`` name:
``clusters``), and turns a :class:`~mirror_core.errors.MirrorError` into one readable error and an exit code (2: bad
input or configuration; 1: anything else that went wrong) instead of a stack trace.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mirror_core.cli import (
    deadlines_command,
    groups_command,
    handoff_command,
    lanes_command,
    plan_command,
    sandbox_command,
)
from mirror_core.cli.clusters import resolve_cluster
from mirror_core.config.coalescing import DEFAULT_COALESCE_BYTES
from mirror_core.dev.sandbox import sandbox_from_environ
from mirror_core.errors import ConfigError, MirrorError

EXIT_FAILURE, EXIT_USAGE = 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description="Mirror and back-fill Kafka by copying raw batches.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sb = sub.add_parser("sandbox", help="local Kafka clusters for development and tests")
    sb_sub = sb.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sb_sub.add_parser("up", help="start clusters (default: source target); reuses running ones")
    up.add_argument("clusters", nargs="*", help="cluster names: source, target, legacy (Kafka 3.9)")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each broker (default 120)")
    down = sb_sub.add_parser("down", help="stop clusters (default: all)")
    down.add_argument("clusters", nargs="*")
    st = sb_sub.add_parser("status", help="show clusters, addresses and log files")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    wipe = sb_sub.add_parser("wipe", help="stop clusters and delete their data and logs")
    wipe.add_argument("clusters", nargs="*")

    pr = sub.add_parser("probe", help="check that a sandbox cluster answers; show its versions and features")
    pr.add_argument("cluster", help="sandbox cluster name")
    pr.add_argument("--secure", action="store_true", help="use the SASL_SSL/SCRAM listener")

    cp = sub.add_parser("copy", help="copy an offset range of a topic from one cluster to another, as raw batches")
    cp.add_argument("--source", required=True, metavar="CLUSTER",
                    help="a sandbox cluster name, a YAML/JSON file with librdkafka settings, or host:port")
    cp.add_argument("--target", required=True, metavar="CLUSTER", help="same forms as --source")
    cp.add_argument("--topic", required=True)
    cp.add_argument("--target-topic", help="name on the target (default: the same)")
    cp.add_argument("--partitions", help="e.g. 0,2,4-6 (default: all)")
    cp.add_argument("--from", dest="start", default="earliest", help="earliest | OFFSET | ISO time (default earliest)")
    cp.add_argument("--to", dest="end", default="latest", help="latest | OFFSET | ISO time (default latest)")
    cp.add_argument("--exact-bounds", action="store_true",
                    help="trim batches that straddle the bounds (default: copy whole batches, report the real end)")
    cp.add_argument("--producer-timestamps", action="store_true",
                    help="for LogAppendTime sources, keep the producers' create times instead of the broker's")
    cp.add_argument("--accept-loss", action="store_true",
                    help="start at the log start when --from is already deleted (the loss is reported)")
    cp.add_argument("--mode", choices=("exactly-once", "at-least-once", "none"), default="exactly-once",
                    help="exactly-once (default): data and checkpoint in one target transaction, a rerun resumes; "
                         "at-least-once: for targets without transactions; none: a one-off copy, no checkpoint")
    cp.add_argument("--pipeline", help="checkpoint name (default copy.<topic>.<target topic>)")
    cp.add_argument("--commit-interval-ms", type=int, default=1000, help="commit at least this often (default 1000)")
    cp.add_argument("--commit-bytes", type=int, default=4 * 1024 * 1024,
                    help="commit after this many bytes (default 4 MiB)")
    cp.add_argument("--fetch-max-bytes", type=int, default=4 * 1024 * 1024, help=argparse.SUPPRESS)
    cp.add_argument("--max-inflight-bytes", type=int, default=8 * 1024 * 1024, help=argparse.SUPPRESS)
    cp.add_argument("--round-max-bytes", type=int, default=64 * 1024 * 1024,
                    help="bytes one fetch round of all partitions may bring (memory: a copy holds about three rounds)")
    cp.add_argument("--throttle-mbps", type=float, help="limit the copy to this many MB/s (protects a busy source)")
    cp.add_argument("--coalesce-small-batches", nargs="?", type=int, const=DEFAULT_COALESCE_BYTES, default=0,
                    metavar="BYTES",
                    help="merge runs of small batches (e.g. one record each; a compressed run keeps its codec) into "
                         "batches of up to "
                         f"BYTES (default {DEFAULT_COALESCE_BYTES}): one Produce request per run instead of per "
                         "batch. Re-encodes records (offset and timestamp deltas; keys, values, headers, timestamps "
                         "and offsets stay), counted as deep; off by default")
    cp.add_argument("--link-mbps", type=float,
                    help="the source link's rate in MB/s: preflight warns when a source broker's socket buffer "
                         "caps one connection below it at the measured round trip")

    bf = sub.add_parser("backfill", help="bounded offset-range copies as a PySpark job")
    bf_sub = bf.add_subparsers(dest="action", required=True, metavar="ACTION")
    plan_command.add_arguments(bf_sub.add_parser("plan", help="plan ranges per partition, ordered by deadline"))
    bf_run = bf_sub.add_parser("run", help="run a plan with spark-submit (local[N] or --master)")
    bf_run.add_argument("--plan", required=True, type=Path, help="plan JSON written by `shoal backfill plan`")
    bf_run.add_argument("--clusters", type=Path,
                        help="YAML/JSON {cluster name: librdkafka settings}; default: the sandbox clusters")
    bf_run.add_argument("--ledger", type=Path, default=Path("ledger"), help="ledger directory (default ./ledger)")
    bf_run.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    bf_run.add_argument("--run-id", help="default: <plan id>-<unix time>")
    bf_status = bf_sub.add_parser("status", help="show the ledger")
    bf_status.add_argument("--ledger", type=Path, default=Path("ledger"))
    bf_status.add_argument("--run-id")

    mirror = sub.add_parser("mirror", help="the continuous shallow mirror daemon")
    mirror_sub = mirror.add_subparsers(dest="action", required=True, metavar="ACTION")
    mirror_run = mirror_sub.add_parser("run", help="run the daemon in the foreground (SIGTERM stops it cleanly)")
    mirror_run.add_argument("--config", required=True, type=Path,
                            help="pipeline YAML (see mirror_core/config/pipeline_file.py)")
    mirror_run.add_argument("--worker-id", help="this process's name in the group (its client.id) and in lease "
                                                "records (default: random)")
    mirror_status = mirror_sub.add_parser("status", help="the daemon group's members, who holds which lane, each "
                                                         "lane's state and lag (from the clusters, any machine)")
    mirror_status.add_argument("--config", required=True, type=Path, help="pipeline YAML")
    mirror_status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    lanes = sub.add_parser("lanes", help="daemon lanes: status, and resuming a halted lane")
    lanes_sub = lanes.add_subparsers(dest="action", required=True, metavar="ACTION")
    lanes_status = lanes_sub.add_parser("status", help="each lane's persisted state (halted/retired, reason, offsets)")
    lanes_status.add_argument("--target", required=True, metavar="CLUSTER", help="the cluster holding the checkpoints")
    lanes_status.add_argument("--pipeline", required=True)
    lanes_status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    resume = lanes_sub.add_parser("resume", help="let the daemon reopen a halted lane (after fixing the cause), or "
                                                 "accept a named loss; recorded in the ledger")
    resume.add_argument("--target", required=True, metavar="CLUSTER", help="the cluster holding the checkpoints")
    resume.add_argument("--pipeline", required=True)
    resume.add_argument("--topic", required=True, help="source topic")
    resume.add_argument("--partition", required=True, type=int)
    resume.add_argument("--accept-loss", action="store_true",
                        help="for a data_loss or source_deleted halt: record the named range as lost and continue "
                             "past it (a deleted topic's lane is retired)")
    resume.add_argument("--source", metavar="CLUSTER", help="needed with --accept-loss for a data_loss halt")
    resume.add_argument("--ledger-dir", type=Path, default=Path("ledger"),
                        help="ledger directory the decision is recorded in (default ./ledger)")
    resume.add_argument("--mode", choices=("exactly-once", "at-least-once"), default="exactly-once",
                        help="the pipeline's mode: exactly-once writes the state under the lane's transactional.id")

    ho = sub.add_parser("handoff", help="hand back-filled partitions over to the daemon at their checkpoint")
    ho.add_argument("--target", required=True, metavar="CLUSTER", help="the cluster holding the checkpoints")
    ho.add_argument("--pipeline", required=True)
    ho.add_argument("--topic", required=True, help="source topic")
    ho.add_argument("--partitions", help="e.g. 0,2-4 (default: all with a checkpoint)")
    ho.add_argument("--wait-s", type=float, default=0.0, help="wait until a daemon holds every lane (a member of "
                    "the pipeline's daemon group on --source has its partition assigned)")
    ho.add_argument("--source", default="source", metavar="CLUSTER",
                    help="the source cluster, where the daemons' group lives (read by --wait-s; default: source)")

    vf = sub.add_parser("verify", help="verification checks")
    vf_sub = vf.add_subparsers(dest="action", required=True, metavar="CHECK")
    seam = vf_sub.add_parser("seam", help="prove the target is contiguous across each partition's handoff")
    seam.add_argument("--source", required=True, metavar="CLUSTER")
    seam.add_argument("--target", required=True, metavar="CLUSTER")
    seam.add_argument("--pipeline", required=True)
    seam.add_argument("--topic", required=True)
    seam.add_argument("--partitions", help="default: all handed off")
    seam.add_argument("--window", type=int, default=500, help="offsets checked on each side of the seam")

    deadlines_command.add_parser(sub)
    groups_command.add_parser(sub)

    demo = sub.add_parser("demo", help="the main job on the local embedded default (see README)")
    demo.add_argument("--records", type=int, default=20_000, help="order events to produce (default 20000)")
    demo.add_argument("--partitions", type=int, default=3, help="partitions of the demo topic (default 3)")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from rich.console import Console

    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    console, err = Console(), Console(stderr=True)
    try:
        if args.command == "sandbox":
            return sandbox_command.run_sandbox(args, sandbox_from_environ(environ), console)
        if args.command == "probe":
            return sandbox_command.run_probe(args, sandbox_from_environ(environ), console)
        if args.command == "copy":
            return _copy(args, sandbox_from_environ(environ), console)
        if args.command == "backfill":
            return _backfill(args, sandbox_from_environ(environ), console, environ)
        if args.command == "mirror":
            if args.action == "status":
                return lanes_command.run_mirror_status(args, console)
            from mirror_core.daemon.main import run_daemon

            return run_daemon(args.config, args.worker_id)
        if args.command == "lanes":
            return lanes_command.run_lanes(args, sandbox_from_environ(environ), console)
        if args.command == "handoff":
            return handoff_command.run_handoff(args, sandbox_from_environ(environ), console)
        if args.command == "verify":
            return handoff_command.run_verify_seam(args, sandbox_from_environ(environ), console)
        if args.command == "groups":
            return groups_command.run(args, sandbox_from_environ(environ), console)
        if args.command == "deadlines":
            return deadlines_command.run(args, sandbox_from_environ(environ), console)
        if args.command == "demo":
            from mirror_core.dev.demo_job import run_demo

            return run_demo(sandbox_from_environ(environ), console, records=args.records,
                            partitions=args.partitions)
    except ConfigError as exc:
        err.print(f"[bold red]shoal: error:[/] {exc}", highlight=False, markup=True)
        return EXIT_USAGE
    except MirrorError as exc:
        err.print(f"[bold red]shoal: error:[/] {exc}", highlight=False, markup=True)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one readable line, never a stack trace
        if type(exc).__module__.startswith("kafka"):
            err.print(f"[bold red]shoal: error:[/] Kafka error not handled more specifically: {exc!r}")
            return EXIT_FAILURE
        raise
    except KeyboardInterrupt:
        err.print("shoal: interrupted")
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _copy(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.cli.copy_command import CopyCommand, run_copy
    from mirror_core.config.positions import parse_position
    from mirror_core.engine.copier import CopyOptions

    cmd = CopyCommand(
        source=resolve_cluster(args.source, sandbox, role="source"),
        target=resolve_cluster(args.target, sandbox, role="target"),
        topic=args.topic, target_topic=args.target_topic or args.topic, partitions=args.partitions,
        start=parse_position(args.start, what="--from"), end=parse_position(args.end, what="--to"),
        options=CopyOptions(exact_bounds=args.exact_bounds, preserve_log_append_time=not args.producer_timestamps,
                            fetch_max_bytes=args.fetch_max_bytes, max_inflight_bytes=args.max_inflight_bytes,
                            round_max_bytes=args.round_max_bytes, coalesce_bytes=args.coalesce_small_batches,
                            throttle_bytes_per_s=args.throttle_mbps * 1e6 if args.throttle_mbps else None),
        accept_loss=args.accept_loss, mode=args.mode, pipeline=args.pipeline,
        commit_interval_ms=args.commit_interval_ms, commit_bytes=args.commit_bytes,
        link_bytes_per_s=args.link_mbps * 1e6 if args.link_mbps else None)
    run_copy(cmd, console)
    return 0


def _backfill(args: argparse.Namespace, sandbox, console, environ: Mapping[str, str]) -> int:
    from mirror_core.cli.backfill_command import run_backfill, show_status

    if args.action == "status":
        return show_status(args.ledger, args.run_id, console)
    if args.action == "plan":
        return plan_command.run(args, resolve_cluster(args.source, sandbox, role="source"),
                                resolve_cluster(args.target, sandbox, role="target"), console)
    clusters = args.clusters or sandbox.write_clusters_file()
    return run_backfill(plan=args.plan, clusters=clusters, ledger=args.ledger, master=args.master,
                        run_id=args.run_id, console=console, environ=environ)


if __name__ == "__main__":
    sys.exit(main())
