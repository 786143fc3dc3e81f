"""Executes a backfill plan's work units lane by lane; the Spark job maps one task to each lane.

A lane is one target partition (DESIGN.md §3): its units run in order inside one task, exactly once through
:class:`~mirror_core.engine.checkpointed.CheckpointedCopier` with the lane's transactional.id, so a retried, speculative
or zombie task for the same lane is fenced by the broker. A unit whose checkpoint already reaches its end is
reported ``skipped`` (a resumed plan skips finished work); a unit failing with an error Shoal or kafka-python calls
retriable (the target restarting, a leader moving, the lane's own earlier transaction not yet decided) reopens the
lane from its checkpoint after a backoff, ``UNIT_RETRY_BACKOFF_S`` (:func:`copy_unit`); a failing unit is reported
``failed`` with its error and the lane stops there (later units of the lane would break the lane's order).

The Spark driver runs a lane through :func:`drive_lane`: one Spark job per unit, in the lane's order, so each unit's
ledger row is recorded the moment that unit ends, and a unit that ended stays ``ok`` whatever a later unit of the
lane does. Fetch sizes for a long link are decided once by the driver (:mod:`mirror_core.services.backfill_link`) and
carried in :attr:`LaneJob.fetch_max_bytes`.

No pyspark here: the same function runs inside Spark tasks, from the CLI, and in tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import ConfigError, MirrorError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from mirror_core.state.ledger import STATUS_FAILED, STATUS_OK, STATUS_SKIPPED, LedgerRow

MIN_THROTTLED_CHUNK = 16 * 1024  # smallest throttled fetch/flush: below it, request overhead dominates
# waits before a unit's retries after a retriable error (each reopens the lane: fenced, checkpoint read again);
# the daemon retries such errors for ever with backoff, a backfill task gives up after these and reports the unit
UNIT_RETRY_BACKOFF_S = (2.0, 5.0, 10.0)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneJob:
    """Everything one task needs: the plan's settings, the lane's units and the clusters' client settings."""

    run_id: str
    pipeline: str
    mode: str
    exact_bounds: bool
    throttle_bytes_per_s: float | None
    source: ClusterConfig
    target: ClusterConfig
    units: tuple[Mapping, ...]  # WorkUnit dicts of one lane, in plan order
    accept_loss: bool = False  # the plan accepted its recorded losses (a unit may start past its checkpoint)
    fetch_max_bytes: int | None = None  # sized for the link by the driver (backfill_link); None: the unsized size
    coalesce_bytes: int = 0  # the plan's: runs of small batches merged up to this size (0: off)


def lanes_of(units: Iterable[Mapping]) -> list[list[Mapping]]:
    """Units grouped by lane, lanes ordered by their most urgent deadline, then by size (largest first), so the
    scheduler starts the lanes that matter first and the long ones early."""
    grouped: dict[str, list[Mapping]] = {}
    for unit in units:
        grouped.setdefault(unit["lane"], []).append(unit)

    def urgency(lane: list[Mapping]):
        deadlines = [u["deadline_ms"] for u in lane if u.get("deadline_ms") is not None]
        return (min(deadlines) if deadlines else float("inf"), -sum(u.get("bytes_estimate", 0) for u in lane))

    return sorted(grouped.values(), key=urgency)


def cluster_from_settings(clusters: Mapping[str, Mapping[str, str]], name: str) -> ClusterConfig:
    if name not in clusters:
        raise ConfigError(f"cluster {name!r} is not in the clusters file (it has: {', '.join(sorted(clusters))})")
    return ClusterConfig(name, {str(k): str(v) for k, v in clusters[name].items()})


def run_lane(job: LaneJob) -> list[LedgerRow]:
    """Copy the lane's units in order; one ledger row per unit (failed, skipped or ok)."""
    rows: list[LedgerRow] = []
    options = lane_copy_options(job)
    with WireClient.for_cluster(job.source) as source, WireClient.for_cluster(job.target) as target:
        store = CheckpointStore(job.target, target)
        copier = CheckpointedCopier(source, target, store, pipeline=job.pipeline, mode=DeliveryMode(job.mode),
                                    owner=f"backfill:{job.run_id}", options=options, accept_loss=job.accept_loss)
        for index, unit in enumerate(job.units):
            started = time.monotonic()
            rng = PartitionRange(unit["topic"], unit["partition"], unit["start"], unit["end"], unit["target_topic"],
                                 unit["target_partition"])
            try:
                result = copy_unit(copier, rng, unit["lane"])
            except MirrorError as exc:
                rows.append(_row(job, unit, None, time.monotonic() - started, STATUS_FAILED, failure_text(exc)))
                rows.extend(_row(job, later, None, 0.0, STATUS_FAILED,
                                 f"not attempted: unit {unit['unit_id']} of the same lane failed before it")
                            for later in job.units[index + 1:])
                break
            finished_before = result.source_start >= unit["end"]  # the checkpoint already covered the unit
            status = STATUS_SKIPPED if finished_before else STATUS_OK
            rows.append(_row(job, unit, result, time.monotonic() - started, status, None))
    return rows


def copy_unit(copier, rng: PartitionRange, lane, *, backoff_s: Sequence[float] = UNIT_RETRY_BACKOFF_S,
              sleep: Callable[[float], object] = time.sleep):
    """``copier.copy(rng, lane=lane)``; an error that says it is ``retriable`` (a :class:`MirrorError`, or a Kafka
    error as kafka-python classifies it: a leader move, a connection lost) is tried again after each wait of
    ``backoff_s`` (each try opens the lane anew and resumes from its checkpoint, so nothing is copied twice and
    nothing skipped), then raised with ``attempts`` set. Other errors are raised at once."""
    import kafka.errors as Errors

    for attempt, wait in enumerate((*backoff_s, None), start=1):
        try:
            return copier.copy(rng, lane=lane)
        except (MirrorError, Errors.KafkaError) as exc:
            exc.attempts = attempt
            if wait is None or not exc.retriable:
                raise
            log.warning("backfill %s-%d [%s, %s): %s; retrying from the lane's checkpoint in %.0f s (attempt %d of %d)",
                        rng.topic, rng.partition, rng.start, rng.end, exc, wait, attempt + 1, len(backoff_s) + 1)
            sleep(wait)
    raise AssertionError("unreachable")


def failure_text(exc: BaseException) -> str:
    """A failed unit's ledger text: the error, and how often it was tried when it was retried."""
    attempts = getattr(exc, "attempts", 1)
    return str(exc) if attempts <= 1 else f"{exc} (tried {attempts} times; each retry resumed from the checkpoint)"


def lane_copy_options(job: LaneJob) -> CopyOptions:
    """The lane's copy options. Throttled, fetches and flushes are cut to ~1/8 s of the lane's rate: the throttle
    runs between a fetch and its write, so a whole 4 MiB fetch (and 4 MiB of pending batches) would otherwise leave
    the source and land on the target in one burst every few seconds, far above the rate in any short window."""
    chunk = unsized_chunk_bytes(job.throttle_bytes_per_s)
    fetch = max(unsized_fetch_bytes(job.throttle_bytes_per_s), job.fetch_max_bytes or 0)
    # overlap stays on: the prefetch of the next fetch travels while this one is written (budget: 2 fetches + chunk)
    return CopyOptions(exact_bounds=job.exact_bounds, throttle_bytes_per_s=job.throttle_bytes_per_s,
                       fetch_max_bytes=fetch, max_inflight_bytes=chunk, overlap=True,
                       coalesce_bytes=job.coalesce_bytes)


def unsized_chunk_bytes(throttle_bytes_per_s: float | None) -> int:
    """The lane's write window: the commit size, or ~1/8 s of a throttled lane's rate."""
    chunk = CommitPolicy().commit_bytes
    if throttle_bytes_per_s:
        chunk = max(MIN_THROTTLED_CHUNK, min(chunk, int(throttle_bytes_per_s / 8)))
    return chunk


def unsized_fetch_bytes(throttle_bytes_per_s: float | None) -> int:
    """A lane's fetch size before any sizing for the link."""
    return min(CopyOptions.fetch_max_bytes, unsized_chunk_bytes(throttle_bytes_per_s))


def _row(job: LaneJob, unit: Mapping, result, duration: float, status: str, error: str | None) -> LedgerRow:
    return LedgerRow(
        run_id=job.run_id, unit_id=unit["unit_id"], pipeline=job.pipeline, source_topic=unit["topic"],
        source_partition=unit["partition"], target_topic=unit["target_topic"],
        target_partition=unit["target_partition"], planned_start=unit["start"], planned_end=unit["end"],
        source_start=result.source_start if result else None, source_end=result.source_end if result else None,
        target_start=result.first_target_offset if result else None,
        target_end=result.next_target_offset if result else None, records=result.records if result else 0,
        batches=result.batches if result else 0, bytes=result.bytes if result else 0,
        deep_batches=result.deep_batches if result else 0, records_digest=result.records_digest if result else "",
        duration_s=round(duration, 3), status=status, error=error)


def lanes_at_once(plan: Mapping, parallelism: int) -> int:
    """How many lanes run at the same time: the task slots, or fewer lanes."""
    return max(1, min(parallelism, len(lanes_of(plan["units"]))))


def lane_throttle(plan: Mapping, parallelism: int) -> float | None:
    """Each lane's share (bytes/s) of the run's throttle, split evenly over the lanes that run at once."""
    throttle = plan.get("throttle_mb_s")
    return throttle * 1e6 / lanes_at_once(plan, parallelism) if throttle else None


def lane_jobs(plan: Mapping, clusters: Mapping[str, Mapping[str, str]], run_id: str, *,
              parallelism: int, fetch_max_bytes: int | None = None) -> list[LaneJob]:
    """One :class:`LaneJob` per lane; the run's throttle is split evenly over the lanes that run at once;
    ``fetch_max_bytes`` is the size the driver chose for the link (None: unsized)."""
    source = cluster_from_settings(clusters, plan["source_cluster"])
    target = cluster_from_settings(clusters, plan["target_cluster"])
    per_task = lane_throttle(plan, parallelism)
    return [LaneJob(run_id, plan["pipeline"], plan["mode"], plan["exact_bounds"], per_task, source, target,
                    tuple(lane), accept_loss=bool(plan.get("accept_loss")), fetch_max_bytes=fetch_max_bytes,
                    coalesce_bytes=int(plan.get("coalesce_bytes") or 0))
            for lane in lanes_of(plan["units"])]


def drive_lane(job: LaneJob, run_unit: Callable[[LaneJob], list[LedgerRow]],
               record: Callable[[LedgerRow], None], *, job_failure: Callable[[BaseException], str | None]
               ) -> list[LedgerRow]:
    """Run the lane's units one at a time, in order, each through ``run_unit`` (one Spark job: the job of a
    one-unit :class:`LaneJob`), and ``record`` each row the moment its unit ends.

    ``job_failure(exc)``: the error text when ``exc`` means the unit's job failed (its task retries exhausted, a
    lost executor, a bug in the task) — the unit is reported failed with it; None when the exception must
    propagate (the driver itself is gone: nothing can be recorded truthfully). After a failed unit the lane's
    later units are reported not attempted (running them would break the lane's order); units that ended before
    keep their rows."""
    rows: list[LedgerRow] = []
    for index, unit in enumerate(job.units):
        started = time.monotonic()
        try:
            unit_rows = run_unit(replace(job, units=(unit,)))
        except Exception as exc:  # noqa: BLE001 - classified by job_failure; the rest propagates
            error = job_failure(exc)
            if error is None:
                raise
            unit_rows = [_row(job, unit, None, time.monotonic() - started, STATUS_FAILED, error)]
        for row in unit_rows:
            record(row)
        rows.extend(unit_rows)
        if any(r.status == STATUS_FAILED for r in unit_rows):
            for later in job.units[index + 1:]:
                row = _row(job, later, None, 0.0, STATUS_FAILED,
                           f"not attempted: unit {unit['unit_id']} of the same lane failed before it")
                record(row)
                rows.append(row)
            break
    return rows


def failed_rows(job: LaneJob, error: str) -> list[LedgerRow]:
    """The lane's units as failed with ``error`` (its Spark job died before it could report them)."""
    return [_row(job, unit, None, 0.0, STATUS_FAILED, error) for unit in job.units]


def failed_units(rows: Sequence[LedgerRow]) -> list[LedgerRow]:
    return [r for r in rows if r.status == STATUS_FAILED]
