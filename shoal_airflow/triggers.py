"""``ShoalLagTrigger``: polls a pipeline's lag (source last stable offset − checkpoint) until it is at or under a
threshold. ``serialize()`` holds connection ids, names and numbers only: the trigger resolves the connections itself
each time it runs, so no setting or secret is stored in the metadata DB."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class ShoalLagTrigger(BaseTrigger):
    """Fires ``{"status": "caught_up", "lag": ...}`` once the total lag is ≤ ``max_lag``, ``{"status": "timeout"}``
    after ``timeout_s``, or ``{"status": "error", "message": ...}`` on a non-retriable error."""

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, include: str,
                 exclude: str | None = None, max_lag: int = 0, poll_interval_s: float = 5.0,
                 timeout_s: float = 3600.0) -> None:
        super().__init__()
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.pipeline, self.include, self.exclude = pipeline, include, exclude
        self.max_lag, self.poll_interval_s, self.timeout_s = max_lag, poll_interval_s, timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shoal_airflow.triggers.ShoalLagTrigger",
                {"source_conn_id": self.source_conn_id, "target_conn_id": self.target_conn_id,
                 "pipeline": self.pipeline, "include": self.include, "exclude": self.exclude,
                 "max_lag": self.max_lag, "poll_interval_s": self.poll_interval_s, "timeout_s": self.timeout_s})

    def _measure(self):
        from mirror_core.services.lag import measure_lag
        from shoal_airflow.hooks import ShoalKafkaHook

        source = ShoalKafkaHook(self.source_conn_id).get_cluster()
        target = ShoalKafkaHook(self.target_conn_id).get_cluster()
        return measure_lag(source, target, self.pipeline, self.include, self.exclude)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from mirror_core.errors import MirrorError

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                lag = await asyncio.to_thread(self._measure)
            except MirrorError as exc:
                if not exc.retriable:
                    yield TriggerEvent({"status": "error", "message": str(exc)})
                    return
                self.log.warning("lag of pipeline %s not measured (will retry): %s", self.pipeline, exc)
            except Exception as exc:  # noqa: BLE001 - e.g. an unknown connection: report it, never crash the triggerer
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            else:
                self.log.info("pipeline %s: lag %d offsets (threshold %d)", self.pipeline, lag.total, self.max_lag)
                if lag.total <= self.max_lag:
                    yield TriggerEvent({"status": "caught_up", "lag": lag.total, "partitions": lag.partitions})
                    return
            if time.monotonic() > deadline:
                yield TriggerEvent({"status": "timeout", "message": f"lag still above {self.max_lag} after "
                                                                    f"{self.timeout_s:.0f} s"})
                return
            await asyncio.sleep(self.poll_interval_s)


class ShoalPollTrigger(BaseTrigger):
    """Base of Shoal's polling triggers: ``check()`` (blocking, run in a thread) returns an event payload when the
    wait is over, or None to poll again; ``{"status": "timeout"}`` after ``timeout_s``; a non-retriable error ends
    the wait with ``{"status": "error"}``, a retriable one is logged and polled again."""

    def __init__(self, *, poll_interval_s: float = 5.0, timeout_s: float = 3600.0) -> None:
        super().__init__()
        self.poll_interval_s, self.timeout_s = poll_interval_s, timeout_s

    def check(self) -> dict | None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from mirror_core.errors import MirrorError

        deadline = time.monotonic() + self.timeout_s
        last_error = None
        while True:
            try:
                event = await asyncio.to_thread(self.check)
                last_error = None
            except MirrorError as exc:
                if not exc.retriable:
                    yield TriggerEvent({"status": "error", "message": str(exc)})
                    return
                last_error = str(exc)
                self.log.warning("%s: check failed (will retry): %s", type(self).__name__, exc)
            except Exception as exc:  # noqa: BLE001 - report it, never crash the triggerer
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            else:
                if event is not None:
                    yield TriggerEvent(event)
                    return
            if time.monotonic() > deadline:
                why = f"; the last check failed: {last_error}" if last_error else ""
                yield TriggerEvent({"status": "timeout", "message": f"still waiting after {self.timeout_s:.0f} s{why}"})
                return
            await asyncio.sleep(self.poll_interval_s)


class ShoalDaemonHoldsTrigger(ShoalPollTrigger):
    """Fires ``{"status": "held"}`` once a daemon holds every one of ``lanes`` — a member of the pipeline's daemon
    group on the source has their partitions assigned (``partitions``: ``[topic, partition]`` per lane, in order),
    or, during an upgrade, a lease-based daemon holds them by a live lease (the handoff's wait, off the worker). A
    group that cannot be described is retried, and named in the timeout, never taken for "no daemon"."""

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, lanes: list[str],
                 partitions: list[list], poll_interval_s: float = 2.0, timeout_s: float = 120.0,
                 handed: dict | None = None) -> None:
        super().__init__(poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self.source_conn_id, self.target_conn_id, self.pipeline = source_conn_id, target_conn_id, pipeline
        self.lanes, self.partitions = list(lanes), [list(p) for p in partitions]
        self.handed = handed or {}   # the handed-off positions, passed back in the event (offsets and names only)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shoal_airflow.triggers.ShoalDaemonHoldsTrigger",
                {"source_conn_id": self.source_conn_id, "target_conn_id": self.target_conn_id,
                 "pipeline": self.pipeline, "lanes": self.lanes, "partitions": self.partitions,
                 "poll_interval_s": self.poll_interval_s, "timeout_s": self.timeout_s, "handed": self.handed})

    def check(self) -> dict | None:
        from mirror_core.services.handoff import daemon_missing_lanes
        from shoal_airflow.hooks import ShoalKafkaHook

        lanes = {lane: (topic, int(part)) for lane, (topic, part) in zip(self.lanes, self.partitions, strict=True)}
        missing = daemon_missing_lanes(ShoalKafkaHook(self.source_conn_id).get_cluster(),
                                       ShoalKafkaHook(self.target_conn_id).get_cluster(), self.pipeline, lanes)
        if missing:
            self.log.info("pipeline %s: no daemon holds %s yet", self.pipeline, ", ".join(missing))
            return None
        return {"status": "held", "lanes": self.lanes, "handed": self.handed}


class ShoalRetentionTrigger(ShoalPollTrigger):
    """Polls the shared retention verdict at a pipeline's checkpoints: ``{"status": "safe"}`` once every selected
    partition is SAFE, ``{"status": "fatal", "message"}`` as soon as one is in ``fail_on``."""

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, include: str,
                 exclude: str | None = None, at_risk_below_s: float | None = None, retention: dict | None = None,
                 fail_on: list[str] | tuple[str, ...] = ("LOST",), poll_interval_s: float = 60.0,
                 timeout_s: float = 3600.0) -> None:
        super().__init__(poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.pipeline, self.include, self.exclude = pipeline, include, exclude
        self.at_risk_below_s, self.retention, self.fail_on = at_risk_below_s, retention, list(fail_on)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("shoal_airflow.triggers.ShoalRetentionTrigger",
                {"source_conn_id": self.source_conn_id, "target_conn_id": self.target_conn_id,
                 "pipeline": self.pipeline, "include": self.include, "exclude": self.exclude,
                 "at_risk_below_s": self.at_risk_below_s, "retention": self.retention, "fail_on": self.fail_on,
                 "poll_interval_s": self.poll_interval_s, "timeout_s": self.timeout_s})

    def check(self) -> dict | None:
        from shoal_airflow.sensors import retention_verdict

        statuses = retention_verdict(self.source_conn_id, self.target_conn_id, self.pipeline, self.include,
                                     self.exclude, self.retention, self.at_risk_below_s)
        fatal = [s for s in statuses if s.status.value in self.fail_on]
        if fatal:
            return {"status": "fatal", "message": "; ".join(f"{s.topic}-{s.partition} {s.status.value}: "
                                                            f"{s.remedy.text}" for s in fatal[:10])}
        pending = [f"{s.topic}-{s.partition} {s.status.value} (margin {s.margin_s:.0f} s)" for s in statuses
                   if s.status.value != "SAFE"]
        if pending:
            self.log.warning("pipeline %s not safe yet: %s", self.pipeline, "; ".join(pending[:10]))
            return None
        return {"status": "safe", "partitions": len(statuses)}
