"""shoal deadlines: per partition, how long until the source deletes what has not been copied, against how long the
copy needs (model: mirror_core.model.retention; inputs: mirror_core.kafka.retention_inputs).

Mirror positions come from --positions FILE, JSON {"topic": {"partition": offset}} (what a checkpoint store or a
plan exports). Without it, or for a partition it does not list, the position is the source's log start: nothing
mirrored yet, the worst case. Copy throughput per partition is --throughput (measured), or estimated from the round
trip to the source (and --target, when given), the fetch size and the link bandwidth. With --link-mbps (the rate
the copy declares with its own --link-mbps) the estimate uses that link and the fetch size the copy sizes for it.
The figures the estimate used (link rate, round trip, fetch size, and where each came from) are printed.
Exit status: 0, or 3 when a partition is at or beyond --fail-on (for scripts and guards); 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mirror_core.config.durations import parse_duration
from mirror_core.errors import ConfigError
from mirror_core.model.retention import Status
from mirror_core.model.retention_policy import RetentionPolicy

EXIT_DEADLINE = 3
__all__ = ["parse_duration", "load_positions", "add_parser", "run"]


def load_positions(path: str | Path) -> dict[tuple[str, int], int]:
    """``{"topic": {"partition": offset}}`` → ``{(topic, partition): offset}``, refusing anything else by name."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--positions {path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--positions {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f'--positions {path}: expected {{"topic": {{"partition": offset}}}}')
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"--positions {path}: topic {topic!r} must map partitions to offsets")
        for part, offset in parts.items():
            if not str(part).isdigit() or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ConfigError(f"--positions {path}: {topic}[{part!r}] = {offset!r} is not partition -> offset "
                                  "(non-negative integers)")
            out[(str(topic), int(part))] = offset
    return out


def add_parser(subparsers) -> argparse.ArgumentParser:
    dl = subparsers.add_parser("deadlines", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                               help="time until the source deletes what has not been copied, per partition")
    dl.add_argument("--source", required=True, metavar="CLUSTER",
                    help="a sandbox cluster name, a YAML/JSON file with librdkafka settings, or host:port")
    dl.add_argument("--topic", action="append", default=[], help="topic to assess (repeatable; default: the "
                    "topics in --positions)")
    dl.add_argument("--partitions", help="e.g. 0,2,4-6 (default: all; only with a single --topic)")
    dl.add_argument("--positions", metavar="FILE", help='mirror positions, JSON {"topic": {"partition": offset}}; '
                    "default: the log start (nothing mirrored)")
    dl.add_argument("--target", metavar="CLUSTER", help="target cluster, to include its round trip in the estimate")
    dl.add_argument("--config", metavar="PIPELINE_FILE", help="take the retention policy (threshold, link, fetch "
                    "size, throughput) from this pipeline file's `retention:` section; flags below override it")
    dl.add_argument("--throughput", type=float, metavar="MB/s", help="measured copy throughput per partition stream "
                    "(default: estimated from round trip, fetch size and bandwidth)")
    dl.add_argument("--bandwidth", type=float, metavar="MB/s",
                    help="link bandwidth for the estimate and the ceiling for more streams (default 100)")
    dl.add_argument("--fetch-bytes", type=int, help="fetch size for the estimate (default 4 MiB, the copier's)")
    dl.add_argument("--link-mbps", type=float, metavar="MB/s",
                    help="the copy's declared link rate (shoal copy / backfill --link-mbps): the estimate uses it and "
                         "the fetch size the copy sizes for it at the measured round trip")
    dl.add_argument("--throttle-mb-s", type=float, metavar="MB/s", help="the copy's throttle (shared by the "
                    "partitions being copied): part of the ETA")
    dl.add_argument("--at-risk-below", metavar="DURATION", help="a margin below this is AT_RISK (default 1h)")
    dl.add_argument("--sample-seconds", type=float,
                    help="measure ingest over this many seconds (default 0: estimate from the retained log)")
    dl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dl.add_argument("--chart", action="append", default=[], metavar="PATH",
                    help="write the chart: PATH.png or PATH.html (repeatable)")
    dl.add_argument("--fail-on", choices=[s.value for s in Status], metavar="STATUS",
                    help=f"exit {EXIT_DEADLINE} when a partition is at or beyond STATUS (AT_RISK, LOSING, LOST)")
    return dl


def cli_policy(args: argparse.Namespace) -> RetentionPolicy:
    """The pipeline file's policy (or the defaults), with the flags given on the command line on top."""
    policy = RetentionPolicy()
    if args.config:
        from mirror_core.config.pipeline_file import load_pipeline_config

        policy = load_pipeline_config(Path(args.config)).retention
    for name, value in (("--bandwidth", args.bandwidth), ("--fetch-bytes", args.fetch_bytes),
                        ("--throughput", args.throughput), ("--sample-seconds", args.sample_seconds),
                        ("--throttle-mb-s", args.throttle_mb_s), ("--link-mbps", args.link_mbps)):
        if value is not None and (value < 0 if name == "--sample-seconds" else value <= 0):
            raise ConfigError(f"{name} must be {'>= 0' if name == '--sample-seconds' else 'positive'}, got {value}")
    return policy.overridden(
        at_risk_below_s=None if args.at_risk_below is None else parse_duration(args.at_risk_below,
                                                                               what="--at-risk-below"),
        link_bytes_per_s=None if args.bandwidth is None else args.bandwidth * 1e6, fetch_bytes=args.fetch_bytes,
        throughput_bytes_per_s=None if args.throughput is None else args.throughput * 1e6,
        ingest_sample_s=args.sample_seconds)


def run(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.cli.clusters import resolve_cluster
    from mirror_core.config.positions import parse_partitions
    from mirror_core.kafka.topics import topic_metadata_or_error
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.services.deadlines import assess_positions
    from mirror_core.services.deadlines_report import (
        render_chart_html,
        render_chart_png,
        render_table,
        report_to_dict,
    )

    policy = cli_policy(args)
    threshold = policy.at_risk_below_s
    for chart in args.chart:
        if Path(chart).suffix.lower() not in (".png", ".html", ".htm"):
            raise ConfigError(f"--chart {chart}: the file name must end in .png or .html")
    positions = load_positions(args.positions) if args.positions else {}
    topics = list(dict.fromkeys(args.topic or sorted({t for t, _ in positions})))
    if not topics:
        raise ConfigError("name at least one --topic (or give --positions)")
    if args.partitions and len(topics) != 1:
        raise ConfigError("--partitions needs exactly one --topic")
    source = resolve_cluster(args.source, sandbox, role="source")
    target = resolve_cluster(args.target, sandbox, role="target") if args.target else None
    with WireClient.for_cluster(source) as client:
        wanted = {}
        for topic in topics:
            count = len(topic_metadata_or_error(client, topic).partitions)
            wanted[topic] = parse_partitions(args.partitions, count, topic) if args.partitions else None
    throttle = args.throttle_mb_s * 1e6 if args.throttle_mb_s else None
    with console.status(f"reading {source.name}: configs, offsets, sizes"
                        f"{f', sampling ingest for {policy.ingest_sample_s:g}s' if policy.ingest_sample_s else ''}…"):
        verdict = assess_positions(source, wanted, positions, policy, target=target, throttle_bytes_per_s=throttle,
                                   link_bytes_per_s=args.link_mbps * 1e6 if args.link_mbps else None)
    statuses, copy = verdict.statuses, verdict.copy
    for chart in args.chart:
        render = render_chart_png if Path(chart).suffix.lower() == ".png" else render_chart_html
        render(statuses, chart, at_risk_below_s=threshold)
    if args.json:
        console.print_json(json.dumps(report_to_dict(source.name, statuses, at_risk_below_s=threshold,
                                                     copy_how=copy.how, copy=copy)))
    else:
        console.print(render_table(statuses, title=f"retention deadlines on {source.name}"))
        counts = ", ".join(f"{sum(s.status is st for s in statuses)} {st.value}" for st in Status)
        console.print(f"{counts}; copy throughput {copy.bytes_per_s / 1e6:.3g} MB/s per stream ({copy.how}); "
                      f"AT_RISK below {threshold:g}s", highlight=False)
        if copy.rtt_s is not None:
            console.print(f"ETA assumes: link {copy.link_bytes_per_s / 1e6:.4g} MB/s, round trip "
                          f"{copy.rtt_s * 1000:.2f} ms, fetch {copy.fetch_bytes / 1e6:.2f} MB: TP = B·D / (B·RTT + D)",
                          highlight=False)
        if not args.positions:
            console.print("[dim]no --positions: every partition is taken as not mirrored (position = log start)[/]")
        for chart in args.chart:
            console.print(f"chart written to {chart}", highlight=False)
    if args.fail_on:
        bar = Status(args.fail_on).severity
        if any(s.status.severity >= bar for s in statuses):
            return EXIT_DEADLINE
    return 0
