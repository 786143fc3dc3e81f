"""PySpark entry point of a Shoal backfill: each lane from a driver thread, one Spark task per unit in the lane's
order, a Parquet ledger, an honest exit code.

While it runs the driver prints each lane's progress (offset reached, ~records, ~bytes, rate, ETA) from the lanes'
checkpoints on the target, and writes each unit's ledger row the moment the unit ends, so ``shoal backfill status``,
the Airflow task log and the Shoal page show a run in flight. The Spark UI stays on (its port retries upward when
4040 is taken).

    spark-submit spark_apps/backfill_job.py --plan plan.json --clusters clusters.yaml --ledger DIR [--run-id ID]
        [--link-mbps R]

With a link rate (the plan's ``link_mb_s``, or ``--link-mbps``) the driver measures each source broker's round trip
once and sizes the lanes' fetches for the link (:mod:`mirror_core.services.backfill_link`); the figures are printed and
kept in the run's manifest (``_run.json``: ``link``), and each task's log line names the fetch size it runs with.

``--plan`` is a plan file or the plan's JSON itself; ``--clusters`` a YAML/JSON file mapping cluster names to
librdkafka settings (the only place credentials live: never on the command line). Speculation is off and a lane's
units run one task at a time, so order within a partition holds; a retried task of a lane is fenced by the broker
through the lane's transactional.id. Each task prints which lane it runs and with which Python to its executor's log
(on a standalone cluster: ``<worker dir>/<app id>/<executor id>/stderr``). Exit 0 when every unit is ok or skipped,
1 when any failed (they are named) or the driver failed, 2 on bad input. Once the run has started, its manifest
records the end and exit code however the driver's work ends, as long as this process lives (a Spark JVM that
died leaves the units in flight without rows: their fate is in the checkpoints).
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
    parser.add_argument("--progress-interval", type=float, default=10.0, metavar="S",
                        help="print every lane's progress this often (default 10 s)")
    parser.add_argument("--link-mbps", type=float, metavar="MB/s",
                        help="the source link's rate (default: the plan's link_mb_s): fetches sized for it")
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
    if not isinstance(plan, dict) or plan.get("version") != 1:
        raise ConfigError(f"plan version {plan.get('version') if isinstance(plan, dict) else None!r} is not "
                          "supported (expected 1)")
    from mirror_core.services.backfill_run import check_plan

    check_plan(plan)   # a hand-edited plan is refused here, before any topic is touched
    return plan, clusters


def prepare_targets(plan: dict, jobs) -> None:
    """Driver side, before any task: preflight every target topic (create or refuse) and the checkpoint topic."""
    from mirror_core.services.backfill_run import prepare_targets as prepare

    if jobs:
        prepare(plan, jobs[0].source, jobs[0].target, emit=lambda line: print(line, flush=True))


def run_lane_task(job) -> list:
    """One Spark task: copy one lane's unit(s), after saying where it runs (the executor's log, not the driver's)."""
    import socket

    from pyspark import TaskContext

    from mirror_core.engine.backfill import lane_copy_options, run_lane

    ctx = TaskContext.get()
    print(f"shoal task: lane {job.units[0]['lane']} unit {job.units[0]['unit_id']} ({len(job.units)} units) "
          f"partition {ctx.partitionId()} attempt {ctx.attemptNumber()} "
          f"fetch {lane_copy_options(job).fetch_max_bytes} bytes "
          f"on {socket.gethostname()} python {sys.executable}", flush=True)
    return run_lane(job)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from mirror_core.errors import MirrorError
    from mirror_core.services.backfill_run import begin_run, run_manifest

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan, clusters = load_inputs(args)
        run_id = args.run_id or f"{plan['plan_id']}-{int(time.time())}"
        spark = (SparkSession.builder.appName(f"shoal-backfill-{plan['pipeline']}")
                 .config("spark.speculation", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.port.maxRetries", "64")   # the UI moves up from 4040 on a busy host
                 .getOrCreate())
        jobs, sizing = plan_lanes(plan, clusters, run_id, spark.sparkContext.defaultParallelism,
                                  link_mb_s=args.link_mbps)
        prepare_targets(plan, jobs)
    except MirrorError as exc:
        print(f"backfill: error: {exc}", file=sys.stderr)
        return 2
    ledger = Path(args.ledger)
    manifest = run_manifest(run_id, plan, link=sizing.to_dict() if sizing else None)
    code = 1
    try:  # from here on the run ends in the manifest however the driver's work ends (while this process lives)
        losses = begin_run(ledger, manifest, plan)
        if not jobs:
            print(f"backfill {run_id}: the plan has no work units; nothing to do")
            code = 0
            return code
        ui = spark.sparkContext.uiWebUrl
        print(f"backfill {run_id}: {len(plan['units'])} units in {len(jobs)} lanes, pipeline {plan['pipeline']!r}"
              f"{f'; Spark UI {ui}' if ui else ''}", flush=True)
        rows = run_lanes(spark, jobs, plan, ledger, run_id, progress_interval_s=args.progress_interval)
        rows.extend(losses)
        code = report(run_id, rows, ledger)
        return code
    except DriverLostError as exc:
        print(f"backfill {run_id}: error: {exc}", file=sys.stderr)
        return code
    except Exception as exc:  # noqa: BLE001 - the driver's own failure (the ledger, a bug): the run ends, failed
        print(f"backfill {run_id}: error: the driver failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return code
    finally:
        manifest.end(ledger, code)
        stop_quietly(spark)


def plan_lanes(plan: dict, clusters: dict, run_id: str, parallelism: int, *, link_mb_s: float | None = None):
    """The run's lane jobs, their fetches sized for the link when the plan (or ``--link-mbps``) declares its rate:
    each source broker's round trip is measured once here, on the driver (:mod:`mirror_core.services.backfill_link`)."""
    from mirror_core.engine.backfill import (
        cluster_from_settings,
        lane_jobs,
        lane_throttle,
        lanes_at_once,
        unsized_fetch_bytes,
    )

    link = link_mb_s or plan.get("link_mb_s")
    if not link or not plan["units"]:
        return lane_jobs(plan, clusters, run_id, parallelism=parallelism), None
    from mirror_core.services.backfill_link import measure_backfill_link

    throttle = lane_throttle(plan, parallelism)
    sizing, findings = measure_backfill_link(
        cluster_from_settings(clusters, plan["source_cluster"]), link * 1e6,
        lanes_at_once=lanes_at_once(plan, parallelism), unsized_fetch_bytes=unsized_fetch_bytes(throttle),
        throttle_bytes_per_s_per_lane=throttle)
    for finding in findings:
        print(f"preflight {finding.severity.name}: {finding.message}", flush=True)
    print(f"backfill: {sizing.describe()}", flush=True)
    return lane_jobs(plan, clusters, run_id, parallelism=parallelism, fetch_max_bytes=sizing.fetch_bytes), sizing


class DriverLostError(Exception):
    """The driver's Spark JVM is gone: no unit outcome can be learned or recorded truthfully."""


def stop_quietly(spark) -> None:
    try:
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - a JVM already gone cannot be stopped; the exit code says what happened
        print(f"backfill: stopping Spark failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def job_failure(sc, exc: BaseException) -> str | None:
    """What a unit's Spark job raising ``exc`` means: the failure text for the unit's ledger row, or None when the
    driver's JVM is gone (then no row: the unit's fate is unknown, the checkpoints tell a rerun where to resume)."""
    from py4j.protocol import Py4JJavaError

    if isinstance(exc, Py4JJavaError):  # the job failed: task retries exhausted, a lost executor
        return f"the unit's Spark job failed: {str(exc.java_exception)[:500]}"
    if not jvm_alive(sc):
        return None
    return f"the unit's Spark job could not be run: {type(exc).__name__}: {str(exc)[:500]}"


def jvm_alive(sc) -> bool:
    try:
        sc._jsc.sc().isStopped()   # any call through the gateway: it fails once the JVM is gone
        return True
    except Exception:  # noqa: BLE001 - Py4JNetworkError, ConnectionRefusedError, ...
        return False


def run_lanes(spark, jobs, plan: dict, ledger: Path, run_id: str, *, progress_interval_s: float) -> list:
    """Each lane from its own driver thread, in urgency order (as many at once as the cluster has task slots),
    one Spark job per unit (:func:`mirror_core.engine.backfill.drive_lane`): each unit's ledger row is written the
    moment the unit ends, and a progress thread prints every lane's position from the checkpoints meanwhile."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from mirror_core.engine.backfill import drive_lane
    from mirror_core.services.backfill_progress import BackfillProgress, ProgressReporter, checkpoint_reader
    from mirror_core.services.backfill_run import record_unit

    sc = spark.sparkContext
    printing = threading.Lock()  # lane threads and the progress thread print whole lines, never interleaved

    def say(line: str) -> None:
        with printing:
            print(line, flush=True)

    progress = BackfillProgress(run_id, plan["units"])
    reporter = ProgressReporter(progress, checkpoint_reader(jobs[0].target, plan["pipeline"]),
                                interval_s=progress_interval_s, emit=say).start()

    def record(row) -> None:
        record_unit(ledger, run_id, row)
        progress.finish(row.unit_id)
        say(f"unit {row.unit_id} {row.status}: {row.records} records, {row.bytes / 1e6:.1f} MB in "
            f"{row.duration_s:.1f}s" + (f" — {row.error}" if row.error else ""))

    def lane(index_job):
        index, job = index_job
        sc.setJobGroup(f"lane-{index}", f"shoal lane {job.units[0]['lane']}", interruptOnCancel=False)

        def run_unit(one):
            return sc.parallelize([one], numSlices=1).flatMap(run_lane_task).collect()

        def failure(exc):
            text = job_failure(sc, exc)
            if text is None:
                raise DriverLostError(f"the Spark driver's JVM is gone ({type(exc).__name__}: {str(exc)[:300]}); "
                                      "units in flight have no ledger row: rerun the plan, it resumes from the "
                                      "checkpoints") from exc
            return text

        return drive_lane(job, run_unit, record, job_failure=failure)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(sc.defaultParallelism, len(jobs))),
                                thread_name_prefix="shoal-lane") as pool:
            results = list(pool.map(lane, enumerate(jobs)))
    finally:
        reporter.stop()
    return [row for rows in results for row in rows]


def report(run_id: str, rows: list, ledger: Path) -> int:
    from mirror_core.engine.backfill import failed_units

    failed = failed_units(rows)
    copied = sum(r.records for r in rows)
    print(f"backfill {run_id}: {copied} records copied; {len(rows) - len(failed)} units ok or skipped, "
          f"{len(failed)} failed; ledger {ledger / f'run={run_id}'}")
    for row in failed:
        print(f"  FAILED {row.unit_id} -> {row.target_topic}-{row.target_partition}: {row.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
