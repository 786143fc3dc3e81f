"""``shoal copy``: copy a bounded offset range of one topic between two clusters, with progress and a summary.

The partitions are copied concurrently (:mod:`mirror_core.engine.concurrent_copy`): one multi-partition Fetch per source
broker per round, one writer (lane) per partition, the next round in flight while this one is written."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.positions import PositionSpec, parse_partitions
from mirror_core.engine.concurrent_copy import (
    ConcurrentCopy,
    ShareWriter,
    connections_for_link,
    lane_share_writer,
    plain_share_writer,
)
from mirror_core.engine.copier import CopyOptions, CopyResult
from mirror_core.kafka.resolve_positions import resolve_ranges
from mirror_core.kafka.topics import topic_metadata_or_error
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.preflight_rules import SourceLink
from mirror_core.model.ranges import PartitionRange


@dataclass(frozen=True)
class CopyCommand:
    source: ClusterConfig
    target: ClusterConfig
    topic: str
    target_topic: str
    partitions: str | None
    start: PositionSpec
    end: PositionSpec
    options: CopyOptions
    accept_loss: bool = False
    mode: str = "exactly-once"  # exactly-once | at-least-once | none (no checkpoints: a one-off copy)
    pipeline: str | None = None  # default: copy.<source topic>.<target topic>
    commit_interval_ms: int = 1000
    commit_bytes: int = 4 * 1024 * 1024
    link_bytes_per_s: float | None = None  # the source link's rate: preflight checks the brokers' send buffers


def run_copy(cmd: CopyCommand, console) -> list[CopyResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mirror_core.kafka.admin import ClusterAdmin
    from mirror_core.kafka.on_thread import on_thread
    from mirror_core.kafka.round_trips import measure_links
    from mirror_core.services.preflight import run_preflight

    # the source's admin client and link figures serve preflight and the fetch sizing both, and the links are
    # measured from the start, while the clients connect, the ranges are resolved and the topics described: over a
    # long link every new client, every measurement and every step in turn costs seconds before the first byte
    # (measured after the topic's metadata instead, the probe held preflight up ~0.9 s at 200 ms over SASL_SSL)
    source_admin = ClusterAdmin(cmd.source)
    measuring = on_thread(measure_links, cmd.source, admin=source_admin, name="shoal-link-probe") \
        if cmd.link_bytes_per_s else None
    with WireClient.for_cluster(cmd.source) as source, WireClient.for_cluster(cmd.target) as target:
        meta = topic_metadata_or_error(source, cmd.topic)
        partitions = parse_partitions(cmd.partitions, len(meta.partitions), cmd.topic)
        # the leaders' fast connections (preflight's first records, then the copy) are made while the ranges are
        # resolved and the topic described: over a long link with SASL_SSL a set-up costs ~1 s
        source.prepare_fast_connections(meta.partitions[p].leader for p in partitions
                                        if p in meta.partitions and meta.partitions[p].leader >= 0)
        resolved = resolve_ranges(source, cmd.topic, partitions, cmd.start, cmd.end, accept_loss=cmd.accept_loss)
        ranges = [PartitionRange(cmd.topic, p, *resolved[p], cmd.target_topic, p) for p in partitions]
        report = run_preflight(cmd.source, cmd.target, cmd.topic, target_topic=cmd.target_topic,
                               start_offsets={r.partition: r.start for r in ranges},
                               link_bytes_per_s=cmd.link_bytes_per_s, links=measuring, source_admin=source_admin,
                               source_client=source, coalesce_bytes=cmd.options.coalesce_bytes)
        del source_admin   # its connections are not needed while copying
        for finding in report.findings:
            console.print(f"[yellow]preflight {finding.severity.name}[/]: {finding.message}", highlight=False)
        report.raise_if_refused()
        links = None if measuring is None else measuring.result()
        if cmd.link_bytes_per_s:
            cmd = replace(cmd, options=_sized_for_link(cmd, len(ranges), console, links))
        # the id of the topic the ranges were resolved against: a topic recreated since (while preflight ran, say)
        # refuses the copy instead of being read at offsets that now mean other records
        topic_id = str(meta.topic_id) if meta.topic_id else None
        writers = _share_writers(cmd, source, target, ranges, topic_id)
        watch = ShareWatch(writers, ranges) if cmd.mode == "none" else None
        target_before = _target_ends(target, ranges) if watch is not None else {}
        copy = ConcurrentCopy(source, cmd.options, writers, ranges)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        try:
            with Progress(*columns, console=console, transient=True) as bar:
                tasks = {rng.partition: bar.add_task(f"{rng.topic}-{rng.partition}",
                                                     total=max(rng.end - rng.start, 1)) for rng in ranges}
                results = copy.run(progress=lambda g, r: bar.update(
                    tasks[g.partition], completed=max(0, min(r.source_end, g.end) - g.start)))
        except Exception:
            if watch is not None:  # no checkpoints to resume from: say where each partition got
                _report_stopped(console, cmd, copy, watch, target, target_before)
            raise
        _summary(console, cmd, results)
        return results


def _sized_for_link(cmd: CopyCommand, partitions: int, console, links: list[SourceLink]) -> CopyOptions:
    """Fetches sized so a round keeps the declared link busy at the round trip measured in ``links`` (never smaller
    than configured; a copy holds about three rounds, so a round stays under ``CopyOptions.round_max_bytes``)."""
    from mirror_core.model.preflight_rules import LINK_EFFICIENCY, fetch_bytes_for_link

    rtts = [link.rtt_s for link in links if link.rtt_s is not None]
    if not rtts:
        console.print(f"the link to cluster {cmd.source.name!r} could not be measured (no source broker answered the "
                      "round-trip probe): fetches stay at the configured size", highlight=False)
        return cmd.options
    rtt = max(rtts)
    connections = max((connections_for_link(window_bytes=link.send_buffer_bytes, rtt_s=link.rtt_s,
                                            link_bytes_per_s=cmd.link_bytes_per_s, partitions=partitions)
                       for link in links), default=1)
    if connections > 1:
        console.print(f"the source brokers' send buffer caps one connection below the link: {connections} fetch "
                      "connections per broker, each carrying different partitions", highlight=False)
    size = fetch_bytes_for_link(link_bytes_per_s=cmd.link_bytes_per_s, rtt_s=rtt, partitions=partitions,
                                floor=cmd.options.fetch_max_bytes,
                                cap=max(cmd.options.fetch_max_bytes, cmd.options.round_max_bytes // max(1, partitions)),
                                efficiency=LINK_EFFICIENCY)
    if size != cmd.options.fetch_max_bytes:
        console.print(f"sized for the link: fetches of {size / 1e6:.1f} MB per partition (round trip "
                      f"{rtt * 1000:.0f} ms, link {cmd.link_bytes_per_s / 1e6:.1f} MB/s, {partitions} partition(s))",
                      highlight=False)
    return replace(cmd.options, fetch_max_bytes=size, fetch_connections=max(connections,
                                                                              cmd.options.fetch_connections))


def _report_stopped(console, cmd: CopyCommand, copy: ConcurrentCopy, watch: ShareWatch, target: WireClient,
                    target_before: dict[int, int]) -> None:
    """The stopped copy's per-partition report; a failure to report never hides the copy's own error."""
    from mirror_core.engine.copy_stopped import print_stopped_copy

    try:
        print_stopped_copy(console, cmd, copy.lanes, watch.writing, target, target_before)
    except Exception as exc:  # noqa: BLE001 - the copy's error (re-raised by the caller) is what matters
        console.print(f"(where each partition got could not be reported: {type(exc).__name__}: {exc})",
                      highlight=False)


def _target_ends(target: WireClient, ranges: list[PartitionRange]) -> dict[int, int]:
    """Each target partition's end before the copy (mode none: what its acknowledged writes add to)."""
    from mirror_core.kafka.list_offsets import list_offsets

    return {r.target_partition: list_offsets(target, r.target_topic, r.target_partition, "latest") for r in ranges}


class ShareWatch:
    """Which lane's share was being written when a copy failed, so a ``--mode none`` copy can tell where each
    partition stopped: ``writing`` maps a partition to the share's ``[start, end)`` and its batches' target spans
    (:func:`mirror_core.engine.copy_stopped.share_spans`); wraps each writer's ``copy_share``."""

    def __init__(self, writers: list[ShareWriter], ranges: list[PartitionRange]):
        self.writing: dict[int, tuple[int, int, list[tuple[int, int]] | None]] = {}
        for writer, rng in zip(writers, ranges, strict=True):
            writer.copy_share = self._watched(writer.copy_share, rng.partition)

    def _watched(self, copy_share, partition: int):
        from mirror_core.engine.copy_stopped import share_spans

        def copy(start: int, end: int, fetched, first: bool, pace=None) -> CopyResult:
            self.writing[partition] = (start, end, share_spans(fetched.batches, start))
            result = copy_share(start, end, fetched, first, pace)
            del self.writing[partition]
            return result
        return copy


def _share_writers(cmd: CopyCommand, source: WireClient, target: WireClient, ranges: list[PartitionRange],
                   topic_id: str | None = None) -> list[ShareWriter]:
    """One writer per lane for the chosen delivery mode (the partitions are copied concurrently); ``topic_id``: the
    source topic's id the ranges were resolved against."""
    if cmd.mode == "none":
        return [plain_share_writer(source, target, cmd.options, rng, topic_id=topic_id) for rng in ranges]
    from mirror_core.config.commit_policy import CommitPolicy
    from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
    from mirror_core.state.checkpoint import CheckpointStore

    store = CheckpointStore(cmd.target, target)
    store.ensure_topic()
    policy = CommitPolicy(commit_bytes=cmd.commit_bytes, commit_interval_ms=cmd.commit_interval_ms)
    # the throttle is applied once per fetch round by ConcurrentCopy, over every partition
    options = replace(cmd.options, max_inflight_bytes=min(cmd.options.max_inflight_bytes, cmd.commit_bytes),
                      throttle_bytes_per_s=None)
    copier = CheckpointedCopier(source, target, store, pipeline=cmd.pipeline or f"copy.{cmd.topic}.{cmd.target_topic}",
                                mode=DeliveryMode(cmd.mode), options=options, policy=policy,
                                accept_loss=cmd.accept_loss)
    sessions = copier.open_lanes(ranges, source_topic_id=topic_id)
    return [lane_share_writer(session, r) for session, r in zip(sessions, ranges, strict=True)]




def _summary(console, cmd: CopyCommand, results: list[CopyResult]) -> None:
    from rich.table import Table

    table = Table(title=f"{cmd.source.name}/{cmd.topic} → {cmd.target.name}/{cmd.target_topic}")
    for col in ("partition", "source range", "target range", "records", "batches", "MB", "deep", "MB/s"):
        table.add_column(col, justify="right" if col not in ("source range", "target range") else "left")
    for r in results:
        target = "-" if r.first_target_offset is None else f"[{r.first_target_offset}, {r.next_target_offset})"
        rate = r.bytes / 1e6 / r.seconds if r.seconds > 0 else 0.0
        table.add_row(str(r.range.partition), f"[{r.source_start}, {r.source_end})", target, str(r.records),
                      str(r.batches), f"{r.bytes / 1e6:.2f}", str(r.deep_batches), f"{rate:.1f}")
    console.print(table)
    total = sum(r.records for r in results)
    coalesced = sum(r.coalesced_batches for r in results)
    merged = f", {coalesced} source batches coalesced into larger ones" if coalesced else ""
    console.print(f"copied {total} records in {sum(r.batches for r in results)} batches "
                  f"({sum(r.deep_batches for r in results)} deep{merged})")
    for r in results:
        for lo, hi in r.lost_ranges:
            console.print(f"[yellow]accepted loss[/]: {cmd.topic}-{r.range.partition} offsets [{lo}, {hi}) were "
                          "never copied (recorded in the checkpoint; group sync declines to translate into them)",
                          highlight=False)
