"""``shoal sandbox up|down|status|wipe`` and ``shoal probe``: the local Kafka clusters for development and tests, and
a look at what a sandbox cluster answers (versions, features).
"""

from __future__ import annotations

import argparse
import json
import time


def run_sandbox(args: argparse.Namespace, sandbox, console) -> int:
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


def run_probe(args: argparse.Namespace, sandbox, console) -> int:
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
