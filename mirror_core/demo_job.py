"""The README's main job on the local embedded default.

Today: start the two sandbox clusters, create and fill the demo topic on ``source`` with realistic order events,
and show that they are there and that ``target`` does not have them yet. Later stages (backfill → handoff →
report) grow from here.
"""

from __future__ import annotations

from mirror_core.cluster import ClusterConfig
from mirror_core.demo import DEMO_TOPIC, produce_demo_data
from mirror_core.errors import ConfigError
from mirror_core.topics import TopicAdmin


def run_demo(sandbox, console, *, records: int, partitions: int) -> int:
    from rich.progress import Progress
    from rich.table import Table

    if records <= 0 or partitions <= 0:
        raise ConfigError("--records and --partitions must be positive")
    with console.status("starting the sandbox clusters source and target…"):
        sandbox.up(["source", "target"])
    source = ClusterConfig("source", sandbox.client_config("source"))
    target = ClusterConfig("target", sandbox.client_config("target"))
    week_ms = str(7 * 86_400_000)
    TopicAdmin(source).recreate(DEMO_TOPIC, partitions, {"compression.type": "producer", "retention.ms": week_ms})

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {records} order events to source/{DEMO_TOPIC}", total=records)
        summary = produce_demo_data(source, DEMO_TOPIC, records,
                                    progress=lambda n: progress.update(task, completed=n))

    table = Table(title=f"{DEMO_TOPIC} on the sandbox")
    for col in ("cluster", "bootstrap", "partition", "end offset"):
        table.add_column(col)
    for p, end in sorted(summary.end_offsets.items()):
        table.add_row("source", source.bootstrap, str(p), str(end))
    on_target = TopicAdmin(target).exists(DEMO_TOPIC)
    table.add_row("target", target.bootstrap, "-", "present" if on_target else "absent (not mirrored yet)")
    console.print(table)
    total = sum(summary.end_offsets.values())
    console.print(f"[green]ok[/]: {total} records on source/{DEMO_TOPIC} across {len(summary.end_offsets)} "
                  f"partitions; target untouched. Stop the clusters with `.venv/bin/shoal sandbox down`.")
    return 0 if total >= records else 1
