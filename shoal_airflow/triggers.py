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
        from shoal_airflow.hooks import ShoalKafkaHook
        from shoal_airflow.lag import measure_lag

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
