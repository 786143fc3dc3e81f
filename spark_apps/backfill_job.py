"""PySpark entry point of a Shoal backfill: one Spark task per lane, a Parquet ledger, an honest exit code.

    spark-submit spark_apps/backfill_job.py --plan plan.json --clusters clusters.yaml --ledger DIR [--run-id ID]

``--plan`` is a plan file or the plan's JSON itself; ``--clusters`` a YAML/JSON file mapping cluster names to
librdkafka settings (the only place credentials live: never on the command line). Speculation is off and each
lane is one task, so order within a partition holds; a retried task of a lane is fenced by the broker through the
lane's transactional.id. Each task prints which lane it runs and with which Python to its executor's log (on a
standalone cluster: ``<worker dir>/<app id>/<executor id>/stderr``). Exit 0 when every unit is ok or skipped, 1 when
any failed (they are named), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="backfill_job")
    parser.add_argument("--plan", required=True, help="plan JSON file, or the JSON itself")
    parser.add_argument("--clusters", required=True, help="YAML/JSON file: {cluster name: {librdkafka settings}}")
    parser.add_argument("--ledger", required=True, help="directory of the Parquet ledger")
    parser.add_argument("--run-id", help="default: <plan id>-<unix time>")
    return parser.parse_args(argv)


def load_inputs(args: argparse.Namespace) -> tuple[dict, dict]:
    import yaml

    from mirror_core.errors import ConfigError

    text = args.plan.strip()
    try:
        plan = json.loads(text if text.startswith("{") else Path(text).read_text())
        clusters = yaml.safe_load(Path(args.clusters).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the plan or clusters file: {exc}") from None
    if not isinstance(clusters, dict):
        raise ConfigError(f"{args.clusters}: expected a mapping of cluster names to settings")
    if plan.get("version") != 1:
        raise ConfigError(f"plan version {plan.get('version')!r} is not supported (expected 1)")
    return plan, clusters


def prepare_targets(plan: dict, jobs) -> None:
    """Driver side, before any task: preflight every target topic (create or refuse) and the checkpoint topic."""
    from mirror_core.checkpoint import CheckpointStore
    from mirror_core.kafka_wire import WireClient
    from mirror_core.preflight import run_preflight

    if not jobs:
        return
    source, target = jobs[0].source, jobs[0].target
    for topic, target_topic in sorted({(u["topic"], u["target_topic"]) for u in plan["units"]}):
        report = run_preflight(source, target, topic, target_topic=target_topic,
                               start_offsets={u["partition"]: u["start"] for u in plan["units"] if u["topic"] == topic})
        for finding in report.findings:
            print(f"preflight {finding.severity.name}: {finding.message}", flush=True)
        report.raise_if_refused()
    with WireClient.for_cluster(target) as client:
        CheckpointStore(target, client).ensure_topic()


def run_lane_task(job) -> list:
    """One Spark task: copy one lane, after saying where it runs (the executor's log, not the driver's)."""
    import socket

    from pyspark import TaskContext

    from mirror_core.backfill import run_lane

    ctx = TaskContext.get()
    print(f"shoal task: lane {job.units[0]['lane']} ({len(job.units)} units) partition {ctx.partitionId()} "
          f"attempt {ctx.attemptNumber()} on {socket.gethostname()} python {sys.executable}", flush=True)
    return run_lane(job)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from mirror_core.backfill import failed_units, lane_jobs
    from mirror_core.errors import MirrorError
    from mirror_core.ledger import loss_rows, write_ledger

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan, clusters = load_inputs(args)
        run_id = args.run_id or f"{plan['plan_id']}-{int(time.time())}"
        spark = (SparkSession.builder.appName(f"shoal-backfill-{plan['pipeline']}")
                 .config("spark.speculation", "false").config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        jobs = lane_jobs(plan, clusters, run_id, parallelism=spark.sparkContext.defaultParallelism)
        prepare_targets(plan, jobs)
    except MirrorError as exc:
        print(f"backfill: error: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print(f"backfill {run_id}: the plan has no work units; nothing to do")
        write_ledger(Path(args.ledger), run_id, loss_rows(run_id, plan["pipeline"], plan.get("losses", [])))
        return 0
    print(f"backfill {run_id}: {len(plan['units'])} units in {len(jobs)} lanes, pipeline {plan['pipeline']!r}",
          flush=True)
    rows = (spark.sparkContext.parallelize(jobs, numSlices=len(jobs))  # one task per lane, in urgency order
            .flatMap(run_lane_task).collect())
    rows.extend(loss_rows(run_id, plan["pipeline"], plan.get("losses", [])))
    path = write_ledger(Path(args.ledger), run_id, rows)
    failed = failed_units(rows)
    copied = sum(r.records for r in rows)
    print(f"backfill {run_id}: {copied} records copied; {len(rows) - len(failed)} units ok or skipped, "
          f"{len(failed)} failed; ledger {path}")
    for row in failed:
        print(f"  FAILED {row.unit_id} -> {row.target_topic}-{row.target_partition}: {row.error}", file=sys.stderr)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
