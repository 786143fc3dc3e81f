"""``shoal groups sync``: move the committed offsets of source consumer groups to the target, exactly.

For every source group whose id matches ``--groups`` (a regex matched whole, like MirrorMaker 2's ``groups``), the
committed offsets on partitions the pipeline mirrors are translated through the pipeline's checkpoints (stored on
the target) and committed on the target: a group moved there resumes at exactly the next record. A partition the
offset map does not vouch for is not committed, nor an offset in a range the source log lost to a truncation below
the checkpoint (checked with OffsetsForLeaderEpoch); a group with active members on the target is skipped; a target
group already past the translation is never rewound (decisions: :mod:`mirror_core.groups`). The failover table
shows every (group, partition) with its source offset, target offset and what happened; ``--dry-run`` commits
nothing.

Exit status: 0; 3 with ``--strict`` when a partition was left behind (not translatable, group active, target
ahead); 1 when a cluster refused a listing or a commit (one line naming cluster and group); 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from mirror_core.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.groups import (
    CommittedOffset,
    GroupSyncPlan,
    PartitionDecision,
    SyncStatus,
    TargetGroup,
    TopicPartitionKey,
    plan_group_sync,
    select_groups,
)

EXIT_INCOMPLETE = 3
REQUEST_TIMEOUT_S = 30.0


class ConsumerGroupAdmin:
    """Consumer groups of one cluster through confluent-kafka's AdminClient; errors name the cluster and group."""

    def __init__(self, cluster: ClusterConfig, *, timeout_s: float = REQUEST_TIMEOUT_S):
        from confluent_kafka.admin import AdminClient

        self.cluster = cluster
        self.timeout_s = timeout_s
        self._wait_s = timeout_s + 10  # past the request timeout, so the client's own error (with its reason) wins
        self._admin = AdminClient(cluster.confluent())

    def _fail(self, what: str, error: object, group: str | None = None) -> MirrorError:
        where = f" of group {group!r}" if group is not None else ""
        return MirrorError(f"cluster {self.cluster.name!r} ({self.cluster.bootstrap}): could not {what}{where}: "
                           f"{describe_kafka_error(error)}")

    def list_group_ids(self) -> list[str]:
        try:
            result = self._admin.list_consumer_groups(request_timeout=self.timeout_s).result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001 - confluent raises KafkaException wrapping a KafkaError
            raise self._fail("list consumer groups", exc) from None
        if result.errors:  # a partial list would silently leave groups behind
            raise self._fail("list the consumer groups", result.errors[0])
        return [listing.group_id for listing in result.valid]

    def committed(self, group: str) -> dict[TopicPartitionKey, CommittedOffset]:
        """The group's committed offsets (stable: offsets of an open transaction are waited for)."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        request = [ConsumerGroupTopicPartitions(group)]
        try:
            future = self._admin.list_consumer_group_offsets(request, require_stable=True,
                                                             request_timeout=self.timeout_s)[group]
            result = future.result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read the committed offsets", exc, group) from None
        out = {}
        for tp in result.topic_partitions or ():
            if tp.error is not None:
                raise self._fail(f"read the committed offset of {tp.topic}-{tp.partition}", tp.error, group)
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = CommittedOffset(tp.offset, tp.metadata or None)
        return out

    def committed_many(self, groups: list[str], partitions: list[TopicPartitionKey]
                       ) -> dict[str, dict[TopicPartitionKey, CommittedOffset]]:
        """Each group's committed offsets for ``partitions`` only, all groups asked at once (one request per
        group, in flight together: a source with thousands of groups costs about one round trip, not thousands)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        futures = {}
        for group in groups:
            try:
                futures[group] = self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group, wanted)], require_stable=True,
                    request_timeout=self.timeout_s)[group]
            except Exception as exc:  # noqa: BLE001
                raise self._fail("read the committed offsets", exc, group) from None
        out: dict[str, dict[TopicPartitionKey, CommittedOffset]] = {}
        for group, future in futures.items():
            try:
                result = future.result(timeout=self._wait_s)
            except Exception as exc:  # noqa: BLE001
                raise self._fail("read the committed offsets", exc, group) from None
            held = out[group] = {}
            for tp in result.topic_partitions or ():
                if tp.error is not None:
                    raise self._fail(f"read the committed offset of {tp.topic}-{tp.partition}", tp.error, group)
                if tp.offset >= 0:
                    held[(tp.topic, tp.partition)] = CommittedOffset(tp.offset, tp.metadata or None)
        return out

    def describe(self, groups: list[str]) -> dict[str, TargetGroup]:
        """State and members of each group, with its committed offsets (a group never seen is Dead, no offsets)."""
        if not groups:
            return {}
        futures = self._admin.describe_consumer_groups(groups, request_timeout=self.timeout_s)
        out = {}
        for group in groups:
            try:
                description = futures[group].result(timeout=self._wait_s)
            except Exception as exc:  # noqa: BLE001
                raise self._fail("describe the consumer group", exc, group) from None
            committed = {tp: c.offset for tp, c in self.committed(group).items()}
            out[group] = TargetGroup(state=description.state.name, members=len(description.members),
                                     committed=committed)
        return out

    def commit(self, group: str, offsets: list[PartitionDecision]) -> None:
        """Commit the decisions' target offsets for ``group`` (the broker refuses it if the group has members).

        The source's leader epoch is not carried over: it means nothing on the target's partitions."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        partitions = [TopicPartition(d.target_topic, d.target_partition, d.target_offset, metadata=d.metadata)
                      if d.metadata else TopicPartition(d.target_topic, d.target_partition, d.target_offset)
                      for d in offsets]
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            future = self._admin.alter_consumer_group_offsets(request, request_timeout=self.timeout_s)[group]
            result = future.result(timeout=self._wait_s)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("commit offsets", exc, group) from None
        for tp in result.topic_partitions or ():
            if tp.error is not None:
                raise self._fail(f"commit offset {tp.offset} on {tp.topic}-{tp.partition}", tp.error, group)


def describe_kafka_error(error: object) -> str:
    """``NAME: text`` for a confluent KafkaError, or the KafkaError inside a KafkaException; else ``str``."""
    args = getattr(error, "args", None)
    if isinstance(error, Exception) and args and hasattr(args[0], "name"):
        error = args[0]
    if callable(getattr(error, "name", None)) and callable(getattr(error, "str", None)):
        return f"{error.name()}: {error.str()}"
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class GroupSyncResult:
    plan: GroupSyncPlan
    committed: tuple[str, ...]  # groups whose offsets were committed on the target
    failures: Mapping[str, str]  # group → one-line error (the group's offsets were not, or not all, committed)
    dry_run: bool


def load_checkpoints(target: ClusterConfig, pipeline: str):
    """The pipeline's checkpoints by source (topic, partition), read from the target (READ_COMMITTED)."""
    from mirror_core.checkpoint import CHECKPOINT_TOPIC, CheckpointStore
    from mirror_core.kafka_wire import WireClient
    from mirror_core.topics import TopicAdmin

    if CHECKPOINT_TOPIC not in TopicAdmin(target).list_topics():
        raise ConfigError(f"cluster {target.name!r} has no checkpoint topic {CHECKPOINT_TOPIC!r}: nothing was "
                          "copied there with checkpoints (shoal copy --mode exactly-once or at-least-once)")
    with WireClient.for_cluster(target) as client:
        found = CheckpointStore(target, client).read_all(pipeline)
    if not found:
        raise ConfigError(f"pipeline {pipeline!r} has no checkpoints on cluster {target.name!r}")
    return {(topic, partition): cp for (_p, topic, partition), cp in found.items()}


def diverged_ranges(source: ClusterConfig, checkpoints) -> dict[TopicPartitionKey, tuple[int | None, int]]:
    """(topic, partition) → diverged range, for each checkpoint whose (position, position_epoch) the source
    leader no longer vouches for (OffsetsForLeaderEpoch, :func:`mirror_core.epochs.validate_position`); a
    checkpoint without an epoch cannot be checked and is left out (logged)."""
    from mirror_core.epochs import validate_position
    from mirror_core.errors import SourceTruncatedError
    from mirror_core.kafka_wire import WireClient

    out: dict[TopicPartitionKey, tuple[int | None, int]] = {}
    with WireClient.for_cluster(source) as client:
        for cp in checkpoints:
            try:
                validate_position(client, cp.topic, cp.partition, cp.position, cp.position_epoch)
            except SourceTruncatedError as exc:
                out[(cp.topic, cp.partition)] = exc.diverged_range
    return out


def sync_groups(source: ClusterConfig, target: ClusterConfig, pipeline: str, pattern: re.Pattern, *,
                dry_run: bool = False) -> GroupSyncResult:
    """Read, decide (:func:`~mirror_core.groups.plan_group_sync`), and commit unless ``dry_run``.

    A group the target refuses is recorded in ``failures`` and the others still go ahead."""
    source_admin, target_admin = ConsumerGroupAdmin(source), ConsumerGroupAdmin(target)
    groups = select_groups(source_admin.list_group_ids(), pattern)
    source_offsets = {g: source_admin.committed(g) for g in groups}
    # the checkpoints after the source offsets: a position read later only covers more of them
    checkpoints = load_checkpoints(target, pipeline)
    wanted = {tp for offsets in source_offsets.values() for tp in offsets}
    diverged = diverged_ranges(source, [cp for tp, cp in checkpoints.items() if tp in wanted])
    plan = plan_group_sync(source_offsets, checkpoints, target_admin.describe(groups), diverged)
    committed, failures = [], {}
    if not dry_run:
        for group, decisions in plan.commits().items():
            try:
                target_admin.commit(group, decisions)
                committed.append(group)
            except MirrorError as exc:
                failures[group] = str(exc)
    return GroupSyncResult(plan, tuple(committed), failures, dry_run)


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
    from mirror_core.cli import resolve_cluster

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
