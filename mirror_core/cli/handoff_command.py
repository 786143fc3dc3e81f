"""``shoal handoff`` and ``shoal verify seam``: hand back-filled partitions over to the daemon at their checkpoint,
and prove the target is contiguous across each partition's handoff.
"""

from __future__ import annotations

import argparse

from mirror_core.cli.clusters import resolve_cluster
from mirror_core.errors import ConfigError


def run_handoff(args: argparse.Namespace, sandbox, console) -> int:
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


def run_verify_seam(args: argparse.Namespace, sandbox, console) -> int:
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
