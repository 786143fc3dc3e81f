"""Helpers for copy-engine tests: run a copy with Shoal, read raw batches back, compare like a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mirror_core.codec.batch_codec import walk_batches
from mirror_core.engine.copier import CopyOptions, CopyResult, RangeCopier
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight

ROOT = Path(__file__).resolve().parents[1]


def shoal(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the ``shoal`` CLI as an operator would (a fresh process; output captured as text)."""
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"}, timeout=timeout)


def copy_topic(source_cluster, target_cluster, topic: str, target_topic: str | None = None, *,
               start: int | None = None, end: int | None = None, options: CopyOptions | None = None,
               preflight: bool = True) -> list[CopyResult]:
    """Copy every partition of ``topic`` (default: earliest to last stable offset) as the CLI would."""
    target_topic = target_topic or topic
    with WireClient.for_cluster(source_cluster.config) as source, \
            WireClient.for_cluster(target_cluster.config) as target:
        partitions = sorted(source.topic_metadata(topic, refresh=True).partitions)
        ranges = []
        for p in partitions:
            lo = list_offsets(source, topic, p, "earliest") if start is None else start
            hi = list_offsets(source, topic, p, "last_stable") if end is None else end
            ranges.append(PartitionRange(topic, p, lo, hi, target_topic, p))
        if preflight:
            run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic,
                          start_offsets={r.partition: r.start for r in ranges}).raise_if_refused()
        copier = RangeCopier(source, target, options=options or CopyOptions())
        return [copier.copy(r) for r in ranges]


def raw_batches(cluster, topic: str, partition: int = 0) -> list:
    """Every data batch of a partition as the broker stores it (READ_UNCOMMITTED: aborted data included; the
    fetcher drops commit/abort markers, so they never appear here)."""
    from kafka.protocol.consumer import IsolationLevel

    with WireClient.for_cluster(cluster.config) as client:
        start = list_offsets(client, topic, partition, "earliest")
        end = list_offsets(client, topic, partition, "latest")
        out = []
        fetcher = RawBatchFetcher(client, topic, partition, start, end, isolation=IsolationLevel.READ_UNCOMMITTED)
        while not fetcher.done:
            for view in fetcher.fetch().batches:
                out.append(walk_batches(bytes(view.buffer))[0][0])
        return out
