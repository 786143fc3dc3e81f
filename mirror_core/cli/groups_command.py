"""``shoal groups sync``: move the committed offsets of source consumer groups to the target, exactly.

For every source group whose id matches ``--groups`` (a regex matched whole, like MirrorMaker 2's ``groups``), the
committed offsets on partitions the pipeline mirrors are translated through the pipeline's checkpoints (stored on
the target) and committed on the target: a group moved there resumes at exactly the next record. A partition the
offset map does not vouch for is not committed, nor an offset in a range the source log lost to a truncation below
the checkpoint (checked with OffsetsForLeaderEpoch); a group with active members on the target is skipped; a target
group already past the translation is never rewound (decisions: :mod:`mirror_core.model.group_translation`). The
failover table shows every (group, partition) with its source offset, target offset and what happened; ``--dry-run``
commits nothing.

Exit status: 0; 3 with ``--strict`` when a partition was left behind (not translatable, group active, target
ahead); 1 when a cluster refused a listing or a commit (one line naming cluster and group); 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re

from mirror_core.errors import ConfigError, MirrorError
from mirror_core.model.group_translation import (
    PartitionDecision,
    SyncStatus,
)
from mirror_core.services.group_sync import GroupSyncResult, sync_groups

EXIT_INCOMPLETE = 3














# -- command line --------------------------------------------------------------------------------------------


def add_parser(subparsers) -> argparse.ArgumentParser:
    gr = subparsers.add_parser("groups", help="consumer groups: move committed offsets to the target exactly",
                               description="Consumer groups across a mirror.")
    actions = gr.add_subparsers(dest="action", required=True, metavar="ACTION")
    sync = actions.add_parser("sync", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                              help="translate source groups' committed offsets and commit them on the target")
    sync.add_argument("--source", required=True, metavar="CLUSTER",
                      help="a sandbox cluster name, a YAML/JSON file with librdkafka settings, or host:port")
    sync.add_argument("--target", required=True, metavar="CLUSTER", help="same forms as --source")
    sync.add_argument("--pipeline", required=True,
                      help="the pipeline whose checkpoints translate the offsets (shoal copy --pipeline; its "
                           "default is copy.<topic>.<target topic>)")
    sync.add_argument("--groups", required=True, metavar="REGEX",
                      help="source group ids to sync, a regular expression matched against the whole id")
    sync.add_argument("--dry-run", action="store_true", help="print the failover table, commit nothing")
    sync.add_argument("--strict", action="store_true",
                      help=f"exit {EXIT_INCOMPLETE} when any partition was left behind")
    sync.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return gr


def compile_group_pattern(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(f"--groups {text!r} is not a valid regular expression: {exc}") from None


def run(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.cli.clusters import resolve_cluster

    if args.action != "sync":
        raise ConfigError(f"unknown groups action {args.action!r}")
    pattern = compile_group_pattern(args.groups)
    source = resolve_cluster(args.source, sandbox, role="source")
    target = resolve_cluster(args.target, sandbox, role="target")
    with console.status(f"reading groups on {source.name}, checkpoints of {args.pipeline!r} on {target.name}…"):
        result = sync_groups(source, target, args.pipeline, pattern, dry_run=args.dry_run)
    if args.json:
        console.print_json(json.dumps(result_to_dict(result)))
    else:
        _print_result(console, result, source=source.name, target=target.name, pipeline=args.pipeline)
    if result.failures:
        message = next(iter(result.failures.values()))
        more = f" (and {len(result.failures) - 1} more group(s))" if len(result.failures) > 1 else ""
        raise MirrorError(f"{message}{more}")
    if args.strict and not result.plan.complete:
        return EXIT_INCOMPLETE
    return 0


def _action(d: PartitionDecision, result: GroupSyncResult) -> str:
    if d.status is SyncStatus.COMMIT:
        if result.dry_run:
            return "would commit (dry run)"
        return f"not committed: {result.failures[d.group]}" if d.group in result.failures else "committed"
    if d.status is SyncStatus.NOT_TRANSLATABLE:
        return "not committed"
    return f"skipped: {d.reason}"


def _target_offset(d: PartitionDecision) -> str:
    if d.status is SyncStatus.NOT_TRANSLATABLE:
        return f"not translatable ({d.reason})"
    return "-" if d.target_offset is None else str(d.target_offset)


def _print_result(console, result: GroupSyncResult, *, source: str, target: str, pipeline: str) -> None:
    from rich.table import Table

    plan = result.plan
    table = Table(title=f"failover table: {source} → {target}, pipeline {pipeline}"
                        f"{' (dry run: nothing committed)' if result.dry_run else ''}")
    for col in ("group", "partition", "source offset", "target offset", "action"):
        table.add_column(col, justify="right" if col == "source offset" else "left", overflow="fold")
    for d in plan.decisions:
        where = f"{d.topic}-{d.partition}"
        if d.target_topic is not None:
            where += f" → {d.target_topic}-{d.target_partition}"
        table.add_row(d.group, where, str(d.source_offset), _target_offset(d), _action(d, result))
    console.print(table)
    groups = {d.group for d in plan.decisions}
    for group, topics in plan.unmirrored.items():
        if group in groups:
            console.print(f"group {group}: offsets on {', '.join(topics)} ignored (not mirrored by pipeline "
                          f"{pipeline})", highlight=False)
    elsewhere = sorted(set(plan.unmirrored) - groups)
    if elsewhere:
        shown = ", ".join(elsewhere[:5]) + (f" and {len(elsewhere) - 5} more" if len(elsewhere) > 5 else "")
        console.print(f"{len(elsewhere)} matching group(s) consume nothing pipeline {pipeline} mirrors: {shown}",
                      highlight=False)
    verb = "would commit" if result.dry_run else "committed"
    done = sum(d.status.committed and d.group not in result.failures for d in plan.decisions)
    left = sum(not d.status.settled for d in plan.decisions)
    console.print(f"{len(groups)} group(s), {len(plan.decisions)} partition(s): {verb} {done}, "
                  f"{sum(d.status is SyncStatus.IN_SYNC for d in plan.decisions)} already in sync, "
                  f"{left} left behind", highlight=False)


def result_to_dict(result: GroupSyncResult) -> dict:
    return {
        "dry_run": result.dry_run,
        "committed_groups": list(result.committed),
        "failures": dict(result.failures),
        "unmirrored": {g: list(t) for g, t in result.plan.unmirrored.items()},
        "partitions": [{"group": d.group, "topic": d.topic, "partition": d.partition,
                        "source_offset": d.source_offset, "target_topic": d.target_topic,
                        "target_partition": d.target_partition, "target_offset": d.target_offset,
                        "status": d.status.value, "reason": d.reason,
                        "committed": d.status.committed and not result.dry_run and d.group not in result.failures}
                       for d in result.plan.decisions],
    }
