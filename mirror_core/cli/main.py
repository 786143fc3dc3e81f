"""``shoal``: the command line of Shoal.

Entry point only: parses arguments, reads the environment (the one place that does), calls library code, prints
with rich, and turns a :class:`~mirror_core.errors.MirrorError` into one readable error and an exit code
(2: bad input or configuration; 1: anything else that went wrong) instead of a stack trace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from mirror_core.cli import deadlines_command, groups_command, plan_command
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
            return _sandbox(args, sandbox_from_environ(environ), console)
        if args.command == "probe":
            return _probe(args, sandbox_from_environ(environ), console)
        if args.command == "copy":
            return _copy(args, sandbox_from_environ(environ), console)
        if args.command == "backfill":
            return _backfill(args, sandbox_from_environ(environ), console, environ)
        if args.command == "mirror":
            if args.action == "status":
                return _mirror_status(args, console)
            from mirror_core.daemon.main import run_daemon

            return run_daemon(args.config, args.worker_id)
        if args.command == "lanes":
            return _lanes(args, sandbox_from_environ(environ), console)
        if args.command == "handoff":
            return _handoff(args, sandbox_from_environ(environ), console)
        if args.command == "verify":
            return _verify_seam(args, sandbox_from_environ(environ), console)
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


def _sandbox(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.dev.sandbox import DEFAULT_CLUSTERS

    if args.action == "up":
        names = args.clusters or list(DEFAULT_CLUSTERS)
        t0 = time.monotonic()
        with console.status(f"starting {', '.join(names)} (first run downloads Kafka from Maven Central)…"):
            sandbox.up(names, timeout=args.timeout)
        console.print(f"sandbox up in {time.monotonic() - t0:.1f}s")
        _print_status(console, sandbox.status(names))
    elif args.action == "down":
        stopped = sandbox.down(args.clusters or None)
        console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
    elif args.action == "wipe":
        names = args.clusters or None
        for b in [sandbox.broker(n) for n in (names or [s.name for s in sandbox.status()])]:
            b.wipe()
        console.print(f"wiped: {', '.join(names or ['all clusters'])}")
    elif args.action == "status":
        statuses = sandbox.status()
        if args.json:
            console.print_json(json.dumps([{**s.__dict__, "log_file": str(s.log_file)} for s in statuses]))
        else:
            _print_status(console, statuses)
    return 0


def _print_status(console, statuses) -> None:
    from rich.table import Table

    table = Table(title="Shoal sandbox")
    for col in ("cluster", "kafka", "state", "bootstrap", "SASL_SSL"):
        table.add_column(col, no_wrap=True)
    for s in statuses:
        state = f"[green]running[/] pid {s.pid}" if s.running else "[dim]stopped[/]"
        table.add_row(s.name, s.version, state, s.bootstrap, s.secure_bootstrap or "-")
    console.print(table)
    for s in statuses:
        files = f", open-file limit {s.open_files}" if s.open_files is not None else ""
        console.print(f"{s.name}: cluster id {s.cluster_id or '-'}, log {s.log_file}{files}", highlight=False,
                      soft_wrap=True)


def resolve_cluster(spec: str, sandbox, *, role: str):
    """A cluster from a sandbox name, a YAML/JSON settings file, or a bare ``host:port`` bootstrap."""
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import CLUSTERS

    path = Path(spec)
    if path.is_file():
        import yaml

        try:
            settings = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"--{role} {spec}: not valid YAML/JSON ({exc})") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"--{role} {spec}: expected a mapping of librdkafka settings")
        return ClusterConfig(path.stem, {str(k): str(v) for k, v in settings.items()})
    if spec in CLUSTERS:
        return ClusterConfig(spec, sandbox.client_config(spec))
    if ":" in spec:
        return ClusterConfig(role, {"bootstrap.servers": spec})
    raise ConfigError(f"--{role} {spec!r} is neither a settings file, a sandbox cluster ({', '.join(CLUSTERS)}) "
                      "nor host:port")


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
                            round_max_bytes=args.round_max_bytes,
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


def _handoff(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.services.handoff import hand_off

    target = resolve_cluster(args.target, sandbox, role="target")
    partitions = _handed_partitions(args, target)
    source = resolve_cluster(args.source, sandbox, role="source") if args.wait_s > 0 else None
    done = hand_off(target, args.pipeline, args.topic, partitions, wait_for_daemon_s=args.wait_s, source=source)
    for cp in done:
        console.print(f"{cp.topic}-{cp.partition}: owner {cp.owner} epoch {cp.owner_epoch}, daemon resumes at "
                      f"{cp.position} (target {cp.target_topic}-{cp.target_partition} next offset {cp.target_next})",
                      highlight=False)
    return 0


def _handed_partitions(args: argparse.Namespace, target) -> list[int]:
    from mirror_core.config.positions import parse_partitions
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore

    with WireClient.for_cluster(target) as client:
        known = sorted(p for (_pl, topic, p) in CheckpointStore(target, client).read_all(args.pipeline)
                       if topic == args.topic)
    if not known:
        raise ConfigError(f"pipeline {args.pipeline!r} has no checkpoints for topic {args.topic!r}")
    if args.partitions is None:
        return known
    return parse_partitions(args.partitions, max(known) + 1, args.topic)


def _verify_seam(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.services.handoff import verify_seam

    source = resolve_cluster(args.source, sandbox, role="source")
    target = resolve_cluster(args.target, sandbox, role="target")
    failed = 0
    for partition in _handed_partitions(args, target):
        report = verify_seam(source, target, args.pipeline, args.topic, partition, window=args.window)
        verdict = "[green]contiguous[/]" if report.ok else f"[red]BROKEN[/]: {report.problem}"
        console.print(f"{args.topic}-{partition}: seam at {report.handoff_position}, "
                      f"{report.checked_source_records} records compared: {verdict}", highlight=False)
        failed += not report.ok
    return 1 if failed else 0


def _lanes(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.state.lane_control import lane_states, resume_lane

    target = resolve_cluster(args.target, sandbox, role="target")
    if args.action == "status":
        return _print_lanes(console, lane_states(target, args.pipeline), args.json)
    source = resolve_cluster(args.source, sandbox, role="source") if args.source else None
    decision = resume_lane(target, args.pipeline, args.topic, args.partition, ledger_dir=args.ledger_dir,
                           accept_loss=args.accept_loss, source=source,
                           transactional=args.mode == "exactly-once")
    cp, halt = decision.checkpoint, decision.previous
    what = (f"offsets [{decision.lost_range[0]}, {decision.lost_range[1]}) recorded as lost"
            if decision.lost_range else "resumed")
    console.print(f"{args.topic}-{args.partition}: {what}; it had halted ({halt.reason}): {halt.message}; the daemon "
                  f"continues at {cp.position}" + (" (lane retired)" if cp.lane_state else "") +
                  f"; ledger: {decision.ledger_path}", highlight=False, soft_wrap=True)
    return 0


def _mirror_status(args: argparse.Namespace, console) -> int:
    """The daemon group's members and who holds which lane (from the source), each lane's state and lag (from the
    checkpoints and the source), merged with the live states of a daemon whose /readyz answers on this machine."""
    import urllib.error
    import urllib.request

    from mirror_core.config.pipeline_file import load_pipeline_config
    from mirror_core.services.mirror_status import gather_mirror_status

    config = load_pipeline_config(args.config)
    status = gather_mirror_status(config)
    rows = {row["lane"]: row for row in status.lanes}
    if config.metrics_port:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{config.metrics_port}/readyz", timeout=5) as resp:
                live = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            live = json.loads(exc.read())
        except OSError:
            live = {"lanes": []}
        for lane in live["lanes"]:
            row = rows.setdefault(lane["lane"], {"lane": lane["lane"]})
            row.update({k: lane[k] for k in ("topic", "partition", "state", "reason", "message", "since_ms",
                                              "position", "range_end", "attempts")})
    if not args.json:
        _print_group(console, config, status)
    return _print_lanes(console, sorted(rows.values(), key=lambda r: r["lane"]), args.json, extra=not args.json)


def _print_group(console, config, status) -> None:
    group = status.group
    if group is None:
        console.print(f"daemon group of pipeline {config.pipeline!r}: not readable: {status.group_error}",
                      highlight=False, soft_wrap=True)
        return
    console.print(f"daemon group {group.group} on cluster {config.source.name!r}: protocol {group.protocol}, "
                  f"state {group.state}, {len(group.members)} member(s)", highlight=False, soft_wrap=True)
    for member in group.members:
        console.print(f"  {member.worker} ({member.host}): {len(member.partitions)} partition(s) "
                      f"{', '.join(f'{t}-{p}' for t, p in member.partitions) or '-'}", highlight=False,
                      soft_wrap=True)


def _print_lanes(console, rows: list[dict], as_json: bool, *, extra: bool = False) -> int:
    """Exit code 1 when a lane is halted or stalled, so scripts can alert. ``extra``: holder and lag columns."""
    from rich.table import Table

    from mirror_core.model.lane_status import NOT_READY

    if as_json:
        console.print_json(json.dumps(rows))
    else:
        table = Table(title="Shoal lanes")
        columns = ["lane", "source partition", "state", "reason", "position", "range end", "attempts", "detail"]
        if extra:
            columns[3:3] = ["holder", "lag"]
        for col in columns:
            table.add_column(col)
        for r in rows:
            cells = [r["lane"], f"{r.get('topic')}-{r.get('partition')}", r.get("state", "-"), r.get("reason", "-"),
                     str(r.get("position")), str(r.get("range_end") or "-"), str(r.get("attempts", "-")),
                     r.get("message") or ""]
            if extra:
                cells[3:3] = [r.get("holder") or "-", "-" if r.get("lag") is None else str(r["lag"])]
            table.add_row(*cells)
        console.print(table)
    return 1 if any(r.get("state") in NOT_READY for r in rows) else 0


def _probe(args: argparse.Namespace, sandbox, console) -> int:
    from rich.table import Table

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.kafka.probe import probe_cluster

    name = f"{args.cluster}{'-secure' if args.secure else ''}"
    probe = probe_cluster(ClusterConfig(name, sandbox.client_config(args.cluster, secure=args.secure)))
    console.print(f"cluster {name!r}: id {probe.cluster_id}, brokers {', '.join(probe.brokers)}")
    table = Table(title="finalized features")
    table.add_column("feature")
    table.add_column("level")
    for feat, (lo, hi) in sorted(probe.finalized_features.items()):
        table.add_row(feat, f"{lo}..{hi}" if lo != hi else str(hi))
    console.print(table)
    console.print("APIs: " + ", ".join(f"{k} v{lo}-{hi}" for k, (lo, hi) in probe.api_versions.items()
                                       if k in ("Produce", "Fetch", "ListOffsets", "InitProducerId", "EndTxn")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
