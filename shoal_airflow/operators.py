"""Shoal's Airflow operators: thin wrappers that resolve ``kafka`` connections through :class:`ShoalKafkaHook`,
call mirror_core, and push only paths and summaries to XCom (never settings or secrets).

- :class:`ShoalPreflightOperator`   check (and create) every selected target topic before anything is copied
- :class:`ShoalPlanOperator`        plan the backfill, write the plan JSON under ``work_dir``
- :class:`ShoalRetentionCheckOperator`  the retention model for the plan's (or a pipeline's) positions
- :class:`ShoalSparkBackfillOperator`   run the plan with spark-submit (provider's SparkSubmitOperator)
- :class:`ShoalVerifyOperator`      ledger accounting and a record-by-record comparison of every copied range
- :class:`ShoalHandoffOperator`     hand caught-up partitions to the daemon and verify each seam

Non-retriable Shoal errors fail the task without retries (:mod:`shoal_airflow.errors`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mirror_core.services.spark_env import (
    ARCHIVE_ALIAS,
    EXECUTOR_PYTHON,
    code_zip,
    default_cache_dir,
    is_local_master,
    ship,
)
from shoal_airflow.errors import airflow_errors
from shoal_airflow.hooks import ShoalKafkaHook, clusters_of, write_clusters_file
from shoal_airflow.params import coalesce_bytes

DEFAULT_WORK_DIR = "/tmp/shoal"
_SPARK_EXIT = re.compile(r"[Ee]rror code is: (\d+)")


def run_dir(work_dir: str, context) -> Path:
    """``<work_dir>/<dag_id>/<run_id>``: where a DAG run's plan and clusters file live."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", context["run_id"])
    path = Path(work_dir) / context["dag"].dag_id / safe
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_plan(plan_path: str):
    from mirror_core.services.plan_inputs import read_plan

    with airflow_errors():
        return read_plan(plan_path)


class ShoalPreflightOperator(BaseOperator):
    """Preflight every topic the selection names: refuse (non-retriable) before any byte is copied; create missing
    target topics. XCom: per topic the findings' severities and messages."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "include", "exclude", "naming", "pipeline",
                                      "create_missing", "coalesce_small_batches")
    ui_color = "#e8f4ff"

    def __init__(self, *, source_conn_id: str, target_conn_id: str, include: str, exclude: str | None = None,
                 naming: str = "identity", pipeline: str = "preflight", create_missing: bool | str = True,
                 coalesce_small_batches: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.include, self.exclude, self.naming, self.pipeline = include, exclude, naming, pipeline
        self.create_missing = create_missing
        self.coalesce_small_batches = coalesce_small_batches  # the target must take merged batches

    def execute(self, context) -> dict:
        from mirror_core.config.plan_request import PlanRequest
        from mirror_core.services.preflight import preflight_topics

        with airflow_errors():
            source = ShoalKafkaHook(self.source_conn_id).get_cluster()
            target = ShoalKafkaHook(self.target_conn_id).get_cluster()
            request = PlanRequest.parse(pipeline=self.pipeline, source_cluster=source.name,
                                        target_cluster=target.name, include=self.include,
                                        exclude=self.exclude or None, naming=self.naming,
                                        coalesce_bytes=coalesce_bytes(self.coalesce_small_batches))
            out = {}
            for topic, report in preflight_topics(source, target, request,
                                                  create_missing=_flag(self.create_missing)):
                for finding in report.findings:
                    self.log.info("preflight %s %s: %s", topic, finding.severity.name, finding.message)
                out[topic] = {"ok": report.ok, "created": report.created,
                              "findings": [f"{f.severity.name}: {f.message}" for f in report.findings]}
                report.raise_if_refused()
        return out




class ShoalPlanOperator(BaseOperator):
    """Plan a backfill (earliest retention deadline first) and write it to ``<work_dir>/<dag>/<run>/plan.json``.
    XCom: ``{"plan_path", "plan_id", "summary"}`` (the plan names clusters by connection id; no settings)."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "pipeline", "include", "exclude", "naming",
                                      "start", "end", "mode", "exact_bounds", "throttle_mb_s", "accept_loss",
                                      "work_dir", "start_without_checkpoints", "link_mb_s", "coalesce_small_batches")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, include: str,
                 exclude: str | None = None, naming: str = "identity", start: str = "earliest", end: str = "latest",
                 mode: str = "exactly-once", exact_bounds: bool | str = False, throttle_mb_s: float | None = None,
                 accept_loss: bool | str = False, use_deadlines: bool = True, work_dir: str = DEFAULT_WORK_DIR,
                 start_without_checkpoints: str | None = None, link_mb_s: float | str | None = None,
                 coalesce_small_batches: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.coalesce_small_batches = coalesce_small_batches  # the lanes merge runs of small batches
        self.start_without_checkpoints = start_without_checkpoints
        self.link_mb_s = link_mb_s  # the source link's rate: the run sizes its fetches for it
        self.source_conn_id, self.target_conn_id, self.pipeline = source_conn_id, target_conn_id, pipeline
        self.include, self.exclude, self.naming, self.start, self.end = include, exclude, naming, start, end
        self.mode, self.exact_bounds, self.throttle_mb_s, self.accept_loss = mode, exact_bounds, throttle_mb_s, \
            accept_loss
        self.use_deadlines, self.work_dir = use_deadlines, work_dir

    def execute(self, context) -> dict:
        from mirror_core.config.plan_request import PlanRequest
        from mirror_core.services.plan_inputs import build_plan, retention_deadlines

        with airflow_errors():
            source = ShoalKafkaHook(self.source_conn_id).get_cluster()
            target = ShoalKafkaHook(self.target_conn_id).get_cluster()
            throttle = None if self.throttle_mb_s in (None, "", "None") else float(self.throttle_mb_s)
            link = None if self.link_mb_s in (None, "", "None") else float(self.link_mb_s)
            start = self.start
            if start == "checkpoint" and self.start_without_checkpoints:
                from mirror_core.services.lag import stored_positions

                if not stored_positions(target, self.pipeline):
                    self.log.info("pipeline %s has no checkpoints yet: starting at %s", self.pipeline,
                                  self.start_without_checkpoints)
                    start = self.start_without_checkpoints
            request = PlanRequest.parse(
                pipeline=self.pipeline, source_cluster=source.name, target_cluster=target.name,
                include=self.include, exclude=self.exclude or None, naming=self.naming, start=start,
                end=self.end, mode=self.mode, exact_bounds=_flag(self.exact_bounds), throttle_mb_s=throttle,
                accept_loss=_flag(self.accept_loss), link_mb_s=link,
                coalesce_bytes=coalesce_bytes(self.coalesce_small_batches))
            plan = build_plan(source, target, request,
                              deadline_for=retention_deadlines(source) if self.use_deadlines else None)
        path = run_dir(self.work_dir, context) / "plan.json"
        path.write_text(plan.to_json())
        summary = plan.summary()
        self.log.info("plan %s: %s units, %s offsets, %s loss(es); written to %s", plan.plan_id, summary["units"],
                      summary["offsets"], summary["losses"], path)
        return {"plan_path": str(path), "plan_id": plan.plan_id, "summary": summary}


class ShoalRetentionCheckOperator(BaseOperator):
    """The retention model at a plan's start offsets (``plan_path``), or at a pipeline's checkpoints for every
    selected topic. Fails (no retries) on any status in ``fail_on``; LOST is refused unless ``accept_loss``.
    XCom: per status the partitions, and the most urgent deadline."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "plan_path", "pipeline", "include",
                                      "exclude", "accept_loss", "at_risk_below_s", "retention")

    def __init__(self, *, source_conn_id: str, plan_path: str | None = None, target_conn_id: str | None = None,
                 pipeline: str | None = None, include: str | None = None, exclude: str | None = None,
                 fail_on: Sequence[str] = ("LOSING", "LOST"), accept_loss: bool | str = False,
                 at_risk_below_s: float | str | None = None, retention: dict | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_conn_id, self.target_conn_id, self.plan_path = source_conn_id, target_conn_id, plan_path
        self.pipeline, self.include, self.exclude = pipeline, include, exclude
        self.fail_on, self.accept_loss, self.at_risk_below_s = tuple(fail_on), accept_loss, at_risk_below_s
        self.retention = retention  # the pipeline's retention policy keys (mirror_core.model.retention_policy)

    def execute(self, context) -> dict:
        from mirror_core.services.deadlines import assess_positions
        from mirror_core.services.lag import retention_policy

        with airflow_errors():
            source = ShoalKafkaHook(self.source_conn_id).get_cluster()
            target = ShoalKafkaHook(self.target_conn_id).get_cluster() if self.target_conn_id else None
            topics, positions = self._positions(source)
            if not topics:
                return {"statuses": {}, "failing": []}
            verdict = assess_positions(source, topics, positions,
                                       retention_policy(self.retention, self.at_risk_below_s), target=target,
                                       throttle_bytes_per_s=self._throttle, link_bytes_per_s=self._link)
            statuses = verdict.statuses
            self.log.info("retention verdict: copy %s; AT_RISK below %.0f s", verdict.copy.how,
                          verdict.policy.at_risk_below_s)
            losses = verdict.losses(accept_loss=_flag(self.accept_loss))
        by_status: dict[str, list[str]] = {}
        for s in statuses:
            by_status.setdefault(s.status.value, []).append(f"{s.topic}-{s.partition}")
            level = logging.INFO if s.status.value == "SAFE" else logging.WARNING
            self.log.log(level, "retention %s-%s: %s, %.0f s to loss, ETA %.0f s, margin %.0f s. %s", s.topic,
                         s.partition, s.status.value, s.time_to_loss_s, s.eta_s, s.margin_s, s.remedy.text)
        failing = [f"{s.topic}-{s.partition} {s.status.value}: {s.remedy.text or 'no remedy'}" for s in statuses
                   if s.status.value in self.fail_on and not (s.status.value == "LOST" and losses)]
        result = {"statuses": by_status, "failing": failing,
                  "not_safe": [f"{s.topic}-{s.partition} {s.status.value}: {s.remedy.text or 'no remedy'}"
                               for s in statuses if s.status.value != "SAFE"],
                  "accepted_losses": [f"{x.topic}-{x.partition} [{x.first_offset}, {x.end_offset})" for x in losses]}
        if failing:
            raise AirflowFailException(f"retention deadline check failed for {len(failing)} partition(s): "
                                       + "; ".join(failing[:10]))
        return result

    _throttle: float | None = None  # the plan's throttle (bytes/s): part of the ETA
    _link: float | None = None      # the plan's link rate (bytes/s): the ETA uses it and the fetches sized for it

    def _positions(self, source):
        if self.plan_path:
            plan = load_plan(self.plan_path)
            self._throttle = plan.throttle_mb_s * 1e6 if plan.throttle_mb_s else None
            self._link = plan.link_mb_s * 1e6 if plan.link_mb_s else None
            topics: dict[str, list[int]] = {}
            for u in plan.units:
                topics.setdefault(u.topic, []).append(u.partition)
            return topics, {(u.topic, u.partition): u.start for u in plan.units}
        if not (self.pipeline and self.include and self.target_conn_id):
            raise AirflowFailException("give plan_path, or pipeline, include and target_conn_id")
        from mirror_core.services.lag import checkpoint_positions

        target = ShoalKafkaHook(self.target_conn_id).get_cluster()
        return checkpoint_positions(source, target, self.pipeline, self.include, self.exclude or None)


class ShoalSparkBackfillOperator(SparkSubmitOperator):
    """Run a plan with ``spark_apps/backfill_job.py`` through the Spark provider.

    The clusters file (the connections' settings, secrets included) is written 0600 under the run's work dir and
    deleted when the job ends: credentials never reach the spark-submit command line, XCom or rendered fields.
    With a non-local master the executors get Shoal the way any remote cluster needs it: mirror_core and spark_apps
    as a zip in ``py_files`` and a packed environment in ``archives`` (:mod:`mirror_core.services.spark_env`), run by
    ``./environment/bin/python`` — never this worker's interpreter path.
    XCom: the run id, ledger dir and per-status unit counts."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "source_conn_id", "target_conn_id",
                                      "plan_path", "ledger_dir", "shoal_run_id", "work_dir", "progress_interval_s")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, plan_path: str, ledger_dir: str,
                 shoal_run_id: str = "{{ run_id }}", work_dir: str = DEFAULT_WORK_DIR, conn_id: str = "spark_default",
                 progress_interval_s: float | str = 10.0, **kwargs: Any) -> None:
        import spark_apps

        kwargs.setdefault("name", "shoal-backfill")
        conf = {"spark.speculation": "false", "spark.ui.showConsoleProgress": "false",
                **(kwargs.pop("conf", None) or {})}
        super().__init__(application=str(Path(spark_apps.__file__).parent / "backfill_job.py"), conf=conf,
                         conn_id=conn_id, **kwargs)
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.plan_path, self.ledger_dir, self.shoal_run_id, self.work_dir = plan_path, ledger_dir, shoal_run_id, \
            work_dir
        self.progress_interval_s = progress_interval_s  # the driver prints each lane's progress this often

    def execute(self, context) -> dict:
        plan = load_plan(self.plan_path)
        roles = {"source": (plan.source_cluster, self.source_conn_id), "target": (plan.target_cluster,
                                                                                  self.target_conn_id)}
        for role, (named, given) in roles.items():
            if named != given:
                raise AirflowFailException(f"plan {plan.plan_id} names {role} cluster {named!r} but the task was "
                                           f"given connection {given!r}")
        run_id = re.sub(r"[^A-Za-z0-9._-]", "_", self.shoal_run_id)
        if not plan.units:
            self.log.info("plan %s has no work units (%d empty partitions): nothing to submit", plan.plan_id,
                          len(plan.empty))
            return {"run_id": run_id, "ledger_dir": self.ledger_dir, "units": {}, "records": 0}
        self._require_spark_connection()
        workdir = run_dir(self.work_dir, context)
        with airflow_errors():
            clusters = clusters_of([self.source_conn_id, self.target_conn_id])
        clusters_file = write_clusters_file(clusters, workdir)
        try:
            self.application_args = ["--plan", self.plan_path, "--clusters", str(clusters_file),
                                     "--ledger", self.ledger_dir, "--run-id", run_id,
                                     "--progress-interval", str(float(self.progress_interval_s))]
            python_bin = str(Path(sys.executable).parent)
            self.env_vars = {"PYSPARK_DRIVER_PYTHON": sys.executable,
                             "PATH": f"{python_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                             **(self.env_vars or {})}
            self._hook = self._get_hook()
            master = str(self._hook._connection.get("master", ""))
            if is_local_master(master):  # tasks run in this interpreter
                self.env_vars = {"PYSPARK_PYTHON": sys.executable, **self.env_vars}
            else:  # executors on other machines: ship the code and a packed environment (services.spark_env)
                shipment = ship(default_cache_dir(os.environ), workdir)
                self._archives = f"{shipment.environment}#{ARCHIVE_ALIAS}"
                self.py_files = str(shipment.code)
                self.conf = {**self.conf, "spark.pyspark.python": EXECUTOR_PYTHON,
                             "spark.pyspark.driver.python": sys.executable}
            self._hook = self._get_hook()
            self.log.info("spark-submit backfill of plan %s on %s: run %s, ledger %s", plan.plan_id, master, run_id,
                          self.ledger_dir)
            try:
                super().execute(context)
            except AirflowException as exc:
                code = _SPARK_EXIT.search(str(exc))
                if code and code.group(1) == "2":  # the job refused its input: retrying cannot help
                    raise AirflowFailException(f"backfill job refused its input (exit 2): {exc}") from exc
                self._log_failed_units(run_id)
                raise
        finally:
            clusters_file.unlink(missing_ok=True)
        return self._ledger_summary(run_id)

    def _require_spark_connection(self) -> None:
        """The provider's hook falls back to master ``yarn`` when the connection is missing: refuse instead."""
        from airflow.sdk import BaseHook

        try:
            BaseHook.get_connection(self._conn_id)
        except AirflowException as exc:
            raise AirflowFailException(
                f"Spark connection {self._conn_id!r} is not defined ({type(exc).__name__}): define it as a `spark` "
                f"connection naming the master (e.g. AIRFLOW_CONN_{self._conn_id.upper()}='spark://host:7077' or "
                f"'{{\"conn_type\": \"spark\", \"host\": \"local[2]\"}}')") from None

    def _code_zip(self, workdir: Path) -> Path:
        return code_zip(workdir)

    def _ledger_summary(self, run_id: str) -> dict:
        from mirror_core.services.verify import ledger_rows

        rows = ledger_rows(self.ledger_dir, run_id)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        return {"run_id": run_id, "ledger_dir": self.ledger_dir, "units": counts,
                "records": sum(r.records for r in rows)}

    def _log_failed_units(self, run_id: str) -> None:
        from mirror_core.services.verify import failed_rows, ledger_rows

        for r in failed_rows(ledger_rows(self.ledger_dir, run_id)):
            self.log.error("unit %s -> %s-%s failed: %s", r.unit_id, r.target_topic, r.target_partition, r.error)


class ShoalVerifyOperator(BaseOperator):
    """Account for every planned unit in the ledger run (ok or skipped, reaching its planned end) and compare each
    copied range record by record (key, value, headers, timestamp, order) through the ledger's offset ranges.
    XCom: units checked, records compared, problems (empty when verified). Any problem fails the task."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "plan_path", "ledger_dir", "shoal_run_id")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, plan_path: str, ledger_dir: str,
                 shoal_run_id: str, compare_records: bool = True, check_offset_maps: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.plan_path, self.ledger_dir, self.shoal_run_id = plan_path, ledger_dir, shoal_run_id
        self.compare_records, self.check_offset_maps = compare_records, check_offset_maps

    def execute(self, context) -> dict:
        from mirror_core.services.verify import check_offset_maps, compare_copied, ledger_problems, run_rows

        plan = load_plan(self.plan_path)
        rows = run_rows(self.ledger_dir, self.shoal_run_id)
        problems = ledger_problems(plan, rows, self.shoal_run_id)
        compared = 0
        if self.compare_records and not problems:
            with airflow_errors():
                source = ShoalKafkaHook(self.source_conn_id).get_cluster()
                target = ShoalKafkaHook(self.target_conn_id).get_cluster()
                compared, differing = compare_copied(source, target, rows.values())
                problems += differing
        maps = 0
        if self.check_offset_maps and not problems:
            with airflow_errors():
                target = ShoalKafkaHook(self.target_conn_id).get_cluster()
                found, maps = check_offset_maps(target, plan.pipeline, rows.values())
                problems += found
        result = {"units": len(plan.units), "ledger_rows": len(rows), "records_compared": compared,
                  "offset_maps_checked": maps, "records_copied": sum(r.records for r in rows.values()),
                  "problems": problems}
        if problems:
            raise AirflowFailException("verification failed: " + "; ".join(problems[:10]))
        self.log.info("verified %d units, %d records compared", len(plan.units), compared)
        return result




class ShoalHandoffOperator(BaseOperator):
    """Hand each partition of a plan (or the given topic partitions) to the daemon at its checkpoint, optionally
    wait for a daemon to hold the lanes — deferred to :class:`~shoal_airflow.triggers.ShoalDaemonHoldsTrigger`, so the
    wait holds no worker slot — then prove each seam. XCom: per partition the handoff position and seam."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "pipeline", "plan_path", "include",
                                      "exclude", "wait_for_daemon_s")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, plan_path: str | None = None,
                 partitions: dict[str, list[int]] | None = None, include: str | None = None,
                 exclude: str | None = None, wait_for_daemon_s: float | str = 0.0, verify: bool = True,
                 deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_conn_id, self.target_conn_id, self.pipeline = source_conn_id, target_conn_id, pipeline
        self.plan_path, self.partitions, self.include, self.exclude = plan_path, partitions, include, exclude
        self.wait_for_daemon_s, self.verify, self.deferrable = wait_for_daemon_s, verify, deferrable

    def execute(self, context) -> dict:
        from mirror_core.config.names import default_lane
        from mirror_core.services.handoff import hand_off

        wanted = dict(self.partitions or {})
        if self.plan_path:
            for u in load_plan(self.plan_path).units:
                wanted.setdefault(u.topic, []).append(u.partition)
        out: dict[str, dict] = {}
        lanes: dict[str, tuple[str, int]] = {}  # lane → source partition
        wait_s = float(self.wait_for_daemon_s)
        with airflow_errors():
            source = ShoalKafkaHook(self.source_conn_id).get_cluster()
            target = ShoalKafkaHook(self.target_conn_id).get_cluster()
            if self.include:
                from mirror_core.services.lag import selected_partitions, stored_positions

                stored = stored_positions(target, self.pipeline)
                for t, p in selected_partitions(source, self.pipeline, self.include, self.exclude or None):
                    if (t, p) in stored:  # a partition never back-filled is the daemon's from its beginning
                        wanted.setdefault(t, []).append(p)
            if not wanted:
                raise AirflowFailException(f"pipeline {self.pipeline}: no checkpointed partition to hand off")
            for topic, parts in sorted(wanted.items()):
                for cp in hand_off(target, self.pipeline, topic, sorted(set(parts)),
                                   wait_for_daemon_s=0.0 if self.deferrable else wait_s, source=source):
                    out[f"{topic}-{cp.partition}"] = {"handoff_position": cp.handoff_position}
                    lanes[default_lane(cp.target_topic, cp.target_partition)] = (cp.topic, cp.partition)
        if self.deferrable and wait_s > 0:
            from datetime import timedelta

            from shoal_airflow.triggers import ShoalDaemonHoldsTrigger

            self.log.info("handed off %d partition(s); waiting (deferred) up to %.0f s for a daemon to hold %s",
                          len(out), wait_s, ", ".join(lanes))
            self.defer(trigger=ShoalDaemonHoldsTrigger(source_conn_id=self.source_conn_id,
                                                       target_conn_id=self.target_conn_id, pipeline=self.pipeline,
                                                       lanes=list(lanes), partitions=[list(p) for p in lanes.values()],
                                                       timeout_s=wait_s, handed=out),
                       method_name="execute_complete", timeout=timedelta(seconds=wait_s + 60))
        return self._verify(out)

    def execute_complete(self, context, event: dict[str, Any]) -> dict:
        """Resumed from the trigger, which carries the handed-off positions back (offsets and names only)."""
        if event.get("status") != "held":
            raise AirflowFailException(
                f"pipeline {self.pipeline}: no daemon took the handed-off lanes ({event.get('message', event)}); "
                "is `shoal mirror run` running for this pipeline? The handoff itself stands: the daemon resumes at "
                "the handoff positions whenever it starts")
        return self._verify(event["handed"])

    def _verify(self, out: dict[str, dict]) -> dict:
        from mirror_core.services.handoff import verify_seam

        if self.verify:
            with airflow_errors():
                source = ShoalKafkaHook(self.source_conn_id).get_cluster()
                target = ShoalKafkaHook(self.target_conn_id).get_cluster()
                for key, entry in out.items():
                    topic, _, part = key.rpartition("-")
                    seam = verify_seam(source, target, self.pipeline, topic, int(part))
                    entry.update(seam_ok=seam.ok, checked=seam.checked_source_records, problem=seam.problem)
        bad = [f"{k}: {v['problem']}" for k, v in out.items() if v.get("seam_ok") is False]
        if bad:
            raise AirflowFailException("seam verification failed: " + "; ".join(bad))
        return out


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


class ShoalDropTopicsOperator(BaseOperator):
    """Delete a plan's target topics, refusing any whose name does not start with ``required_prefix`` (a scratch
    namespace): a guard against deleting real topics. XCom: the deleted names."""

    template_fields: Sequence[str] = ("target_conn_id", "plan_path", "required_prefix")

    def __init__(self, *, target_conn_id: str, plan_path: str, required_prefix: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target_conn_id, self.plan_path, self.required_prefix = target_conn_id, plan_path, required_prefix

    def execute(self, context) -> list[str]:
        from mirror_core.services.clusters import drop_topics

        if len(self.required_prefix or "") < 3:
            raise AirflowFailException(f"refusing to drop topics with prefix {self.required_prefix!r}: too broad")
        topics = sorted({u.target_topic for u in load_plan(self.plan_path).units})
        foreign = [t for t in topics if not t.startswith(self.required_prefix)]
        if foreign:
            raise AirflowFailException(f"refusing to drop {foreign}: not under scratch prefix {self.required_prefix!r}")
        with airflow_errors():
            for topic in drop_topics(ShoalKafkaHook(self.target_conn_id).get_cluster(), topics):
                self.log.info("dropped scratch topic %s", topic)
        return topics
