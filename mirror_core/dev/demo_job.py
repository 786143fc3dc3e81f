"""The README's main job on the local embedded default.

Starts the two sandbox clusters, fills ``demo.orders`` on ``source`` with realistic order events (keys, headers,
zstd, plus committed and aborted transactions), copies it to ``dr.demo.orders`` on ``target`` exactly once as raw
batches, then checks the copy with an independent reader and prints a report. Later stages (Spark backfill →
daemon handoff) grow from here.
"""

from __future__ import annotations

import time

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.dev.demo_data import DEMO_TOPIC, produce_demo_data, produce_demo_transactions
from mirror_core.engine.checkpointed import CheckpointedCopier
from mirror_core.engine.copier import CopyResult
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.topics import TopicAdmin
from mirror_core.kafka.verify import compare_topics
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore

DR_TOPIC = f"dr.{DEMO_TOPIC}"


def run_demo(sandbox, console, *, records: int, partitions: int) -> int:
    from rich.progress import Progress

    if records <= 0 or partitions <= 0:
        raise ConfigError("--records and --partitions must be positive")
    with console.status("starting the sandbox clusters source and target…"):
        sandbox.up(["source", "target"])
    source = ClusterConfig("source", sandbox.client_config("source"))
    target = ClusterConfig("target", sandbox.client_config("target"))
    week_ms = str(7 * 86_400_000)
    TopicAdmin(source).recreate(DEMO_TOPIC, partitions, {"compression.type": "producer", "retention.ms": week_ms})
    TopicAdmin(target).delete(DR_TOPIC)

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {records} order events to source/{DEMO_TOPIC}", total=records)
        produce_demo_data(source, DEMO_TOPIC, records, progress=lambda n: progress.update(task, completed=n))
    produce_demo_transactions(source, DEMO_TOPIC)

    pipeline = f"demo-{int(time.time())}"  # a fresh pipeline: the demo topic was just recreated
    report = run_preflight(source, target, DEMO_TOPIC, target_topic=DR_TOPIC)
    for finding in report.findings:
        console.print(f"preflight {finding.severity.name}: {finding.message}", highlight=False)
    report.raise_if_refused()
    started = time.monotonic()
    with WireClient.for_cluster(source) as src, WireClient.for_cluster(target) as tgt, \
            Progress(console=console, transient=True) as progress:
        store = CheckpointStore(target, tgt)
        store.ensure_topic()
        copier = CheckpointedCopier(src, tgt, store, pipeline=pipeline, policy=CommitPolicy())
        results: list[CopyResult] = []
        for p in range(partitions):
            end = list_offsets(src, DEMO_TOPIC, p, "last_stable")
            task = progress.add_task(f"copying {DEMO_TOPIC}-{p} exactly once", total=max(end, 1))
            results.append(copier.copy(PartitionRange(DEMO_TOPIC, p, 0, end, DR_TOPIC, p),
                                       progress=lambda r, t=task: progress.update(t, completed=r.source_end)))
        checkpoints = store.read_all(pipeline)
    elapsed = time.monotonic() - started
    comparison = compare_topics(source, DEMO_TOPIC, target, DR_TOPIC)
    _report(console, pipeline, results, checkpoints, comparison, elapsed)
    if not comparison.equal:
        raise MirrorError(f"the copy of {DEMO_TOPIC} differs from the source: {comparison.first_difference}")
    return 0


def _report(console, pipeline, results, checkpoints, comparison, elapsed) -> None:
    from rich.table import Table

    table = Table(title=f"source/{DEMO_TOPIC} → target/{DR_TOPIC} (pipeline {pipeline}, exactly once)")
    for col in ("partition", "source range", "target range", "records", "batches", "deep", "commits",
                "checkpoint position", "offset-map runs"):
        table.add_column(col, justify="right")
    for r in results:
        cp = checkpoints[(pipeline, r.range.topic, r.range.partition)]
        target = "-" if r.first_target_offset is None else f"[{r.first_target_offset}, {r.next_target_offset})"
        table.add_row(str(r.range.partition), f"[{r.source_start}, {r.source_end})", target, str(r.records),
                      str(r.batches), str(r.deep_batches), str(r.commits), str(cp.position),
                      str(len(cp.offset_map) if cp.offset_map else 0))
    console.print(table)
    copied = sum(r.records for r in results)
    mb = sum(r.bytes for r in results) / 1e6
    console.print(f"copied {copied} records ({mb:.1f} MB of raw batches, "
                  f"{sum(r.deep_batches for r in results)} decompressed) in {elapsed:.1f}s")
    verdict = "[green]identical[/]" if comparison.equal else f"[red]DIFFERENT[/]: {comparison.first_difference}"
    console.print(f"independent check (read_committed consumer on both clusters): {comparison.records} records, "
                  f"keys, values, headers, timestamps and order {verdict}; aborted source transactions were not "
                  "copied. Stop the clusters with `.venv/bin/shoal sandbox down`.")
