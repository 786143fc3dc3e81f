"""``shoal backfill plan``: plan a backfill (ordered by retention deadline), print it, write it as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.coalescing import DEFAULT_COALESCE_BYTES
from mirror_core.config.plan_request import PlanRequest
from mirror_core.services.plan_inputs import retention_deadlines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, metavar="CLUSTER",
                        help="sandbox cluster name, settings file (its stem names the cluster) or host:port")
    parser.add_argument("--target", required=True, metavar="CLUSTER", help="same forms as --source")
    parser.add_argument("--pipeline", required=True, help="checkpoint namespace and transactional.id prefix")
    parser.add_argument("--include", required=True, help="topic regex; a comma also means 'or' (MirrorMaker style)")
    parser.add_argument("--exclude", help="topic regex to leave out")
    parser.add_argument("--naming", default="identity",
                        help="identity | prefix:dr. | map:src=dst,... (default identity)")
    parser.add_argument("--from", dest="start", default="earliest",
                        help="earliest | latest | checkpoint | ISO time | topic:partition=offset,... "
                             "(default earliest)")
    parser.add_argument("--to", dest="end", default="latest", help="latest | ISO time | topic:partition=offset,...")
    parser.add_argument("--mode", choices=("exactly-once", "at-least-once"), default="exactly-once")
    parser.add_argument("--exact-bounds", action="store_true")
    parser.add_argument("--throttle-mbps", type=float, help="limit the whole run to this many MB/s")
    parser.add_argument("--link-mbps", type=float, metavar="MB/s",
                        help="the source link's rate: the run measures the source's round trip and sizes its "
                             "fetches to keep the link busy (recorded in the plan)")
    parser.add_argument("--coalesce-small-batches", nargs="?", type=int, const=DEFAULT_COALESCE_BYTES, default=0,
                        metavar="BYTES", help="the lanes merge runs of small batches into batches of up to BYTES "
                                              f"(default {DEFAULT_COALESCE_BYTES}; recorded in the plan): see "
                                              "`shoal copy --help`")
    parser.add_argument("--accept-loss", action="store_true",
                        help="plan past data already deleted from the source; the lost ranges are recorded in the plan")
    parser.add_argument("--no-deadlines", action="store_true", help="skip the retention model (order by size only)")
    parser.add_argument("--out", type=Path, default=Path("plan.json"),
                        help="where to write the plan (default plan.json)")


def run(args: argparse.Namespace, source: ClusterConfig, target: ClusterConfig, console) -> int:
    from mirror_core.services.plan_inputs import build_plan, dry_run

    request = PlanRequest.parse(
        pipeline=args.pipeline, source_cluster=source.name, target_cluster=target.name, include=args.include,
        exclude=args.exclude, naming=args.naming, start=args.start, end=args.end, mode=args.mode,
        exact_bounds=args.exact_bounds, throttle_mb_s=args.throttle_mbps, accept_loss=args.accept_loss,
        link_mb_s=args.link_mbps, coalesce_bytes=args.coalesce_small_batches)
    deadline_for = None if args.no_deadlines else retention_deadlines(source)
    plan = build_plan(source, target, request, deadline_for=deadline_for)
    dry_run(plan, args.out, console)
    for loss in plan.losses:
        console.print(f"[yellow]accepted loss[/]: {loss.topic}-{loss.partition} offsets "
                      f"[{loss.lost_start}, {loss.lost_end}) were deleted before they were copied", highlight=False)
    return 0


