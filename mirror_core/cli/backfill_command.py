"""``shoal backfill run|status``: run a plan as a PySpark job (``spark-submit``, local[N] or ``--master``) and read
the ledger it writes. (``plan`` lives in :mod:`mirror_core.cli.plan_command`.)

With a remote master the executors do not share the driver's interpreter: the submit ships Shoal's code and a
packed environment (:mod:`mirror_core.services.spark_env`) and the executors run the unpacked archive's Python."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mirror_core.errors import ConfigError, MirrorError
from mirror_core.services.spark_env import Shipment, default_cache_dir, is_local_master, ship
from mirror_core.state.ledger import STATUS_FAILED, STATUS_LOST, read_ledger, read_runs

# Spark's own log lines ("26/11/23 01:32:07 INFO SparkContext: ..."): shown only at ERROR
SPARK_LOG = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN) ")
SPARK_BANNER = ("Using Spark's default log4j", "To adjust logging level", "Setting default log level")


def spark_submit_command(master: str, job_args: list[str], shipment: Shipment | None = None) -> list[str]:
    """The spark-submit invocation of the backfill job (credentials travel in the clusters file, never here).

    A remote master needs ``shipment`` (what executors import); a local one runs tasks in this interpreter.
    pyspark and spark_apps are located, not imported: mirror_core stays importable without Spark."""
    pyspark, apps = importlib.util.find_spec("pyspark"), importlib.util.find_spec("spark_apps")
    if pyspark is None or pyspark.origin is None:
        raise ConfigError("pyspark is not installed; `shoal backfill run` needs it (run scripts/bootstrap.sh)")
    if apps is None or apps.origin is None:
        raise ConfigError("the spark_apps package is not installed next to mirror_core")
    submit = Path(pyspark.origin).parent / "bin" / "spark-submit"
    job = Path(apps.origin).parent / "backfill_job.py"
    if shipment is None and not is_local_master(master):
        raise ConfigError(f"master {master!r} runs tasks on other machines: the submit must ship Shoal's code and "
                          "environment (spark_env.ship)")
    shipped = shipment.submit_args(sys.executable) if shipment else []
    return [str(submit), "--master", master, "--conf", "spark.speculation=false",
            "--conf", "spark.ui.showConsoleProgress=false", *shipped, str(job), *job_args]


def run_backfill(*, plan: Path, clusters: Path, ledger: Path, master: str, run_id: str | None, console,
                 environ: Mapping[str, str]) -> int:
    if not plan.is_file():
        raise ConfigError(f"plan file {plan} does not exist (make one with `shoal backfill plan`)")
    if not clusters.is_file():
        raise ConfigError(f"clusters file {clusters} does not exist")
    args = ["--plan", str(plan), "--clusters", str(clusters), "--ledger", str(ledger)]
    if run_id:
        args += ["--run-id", run_id]
    env = {**environ, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with tempfile.TemporaryDirectory(prefix="shoal-submit-") as staging:
        if is_local_master(master):
            command = spark_submit_command(master, args)
            env["PYSPARK_PYTHON"] = sys.executable
        else:
            env.pop("PYSPARK_PYTHON", None)  # the executors' Python is the shipped one (spark.pyspark.python)
            command = spark_submit_command(master, args, ship(default_cache_dir(environ), Path(staging)))
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
            for line in proc.stdout:
                if not SPARK_LOG.match(line) and not line.startswith(SPARK_BANNER):
                    console.print(line.rstrip(), highlight=False, markup=False)
    return proc.returncode


def run_lines(runs, rows) -> list[str]:
    """One line per run: in flight (units finished so far) or ended (exit code)."""
    finished: dict[str, set[str]] = {}
    for r in rows:
        finished.setdefault(r.run_id, set()).add(r.unit_id)
    lines = []
    for m in runs:
        done = len(finished.get(m.run_id, set()) & set(m.units))
        state = "IN FLIGHT" if m.in_flight else f"ended (exit {m.exit_code})"
        lines.append(f"run {m.run_id} (pipeline {m.pipeline}, plan {m.plan_id}): {state}, {done} of {len(m.units)} "
                     "units finished")
    return lines


def show_status(ledger: Path, run_id: str | None, console) -> int:
    from rich.table import Table

    rows = read_ledger(ledger, run_id)
    runs = [m for m in read_runs(ledger) if run_id is None or m.run_id == run_id]
    if not rows and not runs:
        raise MirrorError(f"no ledger rows in {ledger}" + (f" for run {run_id!r}" if run_id else ""))
    for line in run_lines(runs, rows):
        console.print(line, highlight=False, markup=False)
    table = Table(title=f"backfill ledger {ledger}")
    for col in ("run", "unit", "status", "records", "source range", "target range", "deep", "s", "error"):
        table.add_column(col)
    for r in rows:
        status = f"[red]{r.status}[/]" if r.status in (STATUS_FAILED, STATUS_LOST) else r.status
        src = "-" if r.source_start is None else f"[{r.source_start}, {r.source_end})"
        tgt = "-" if r.target_start is None else f"[{r.target_start}, {r.target_end})"
        table.add_row(r.run_id, r.unit_id, status, str(r.records), src, tgt, str(r.deep_batches),
                      f"{r.duration_s:.1f}", r.error or "")
    console.print(table)
    failed = [r for r in rows if r.status == STATUS_FAILED]
    lost = [r for r in rows if r.status == STATUS_LOST]
    console.print(f"{len(rows)} unit rows, {sum(r.records for r in rows)} records, {len(failed)} failed, "
                  f"{sum(r.planned_end - r.planned_start for r in lost)} offsets recorded as lost")
    return 1 if failed else 0
