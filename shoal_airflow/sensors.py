"""Shoal's sensors.

- :class:`ShoalCaughtUpSensor` waits (deferred, in the triggerer) until a pipeline's lag is under a threshold.
- :class:`ShoalRetentionDeadlineSensor` waits (deferred) until every selected partition is SAFE under the shared
  retention verdict at the pipeline's checkpoints; it fails at once (no retries) when one is LOST or, optionally,
  LOSING. A wait that runs out fails as a sensor timeout (not retried), never as a retried error.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from shoal_airflow.errors import airflow_errors
from shoal_airflow.hooks import ShoalKafkaHook
from shoal_airflow.triggers import ShoalLagTrigger, ShoalRetentionTrigger


class ShoalCaughtUpSensor(BaseSensorOperator):
    """Succeeds when ``pipeline``'s total lag over the selected topics is ≤ ``max_lag``; returns the lag (XCom)."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "pipeline", "include", "exclude",
                                      "max_lag")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, include: str,
                 exclude: str | None = None, max_lag: int | str = 0, poll_interval_s: float = 5.0,
                 deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.pipeline, self.include, self.exclude, self.max_lag = pipeline, include, exclude, max_lag
        self.poll_interval_s, self.deferrable = poll_interval_s, deferrable

    def _lag(self):
        from mirror_core.services.lag import measure_lag

        with airflow_errors():
            source = ShoalKafkaHook(self.source_conn_id).get_cluster()
            target = ShoalKafkaHook(self.target_conn_id).get_cluster()
            return measure_lag(source, target, self.pipeline, self.include, self.exclude or None)

    def poke(self, context) -> bool:
        lag = self._lag()
        self.log.info("pipeline %s: lag %d offsets (threshold %s)", self.pipeline, lag.total, self.max_lag)
        return lag.total <= int(self.max_lag)

    def execute(self, context) -> Any:
        lag = self._lag()
        if lag.total <= int(self.max_lag):
            return {"lag": lag.total, "partitions": lag.partitions}
        if not self.deferrable:
            return super().execute(context)
        self.defer(trigger=ShoalLagTrigger(source_conn_id=self.source_conn_id, target_conn_id=self.target_conn_id,
                                           pipeline=self.pipeline, include=self.include,
                                           exclude=self.exclude or None, max_lag=int(self.max_lag),
                                           poll_interval_s=self.poll_interval_s, timeout_s=self.timeout),
                   method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context, event: dict[str, Any]) -> dict:
        status = event.get("status")
        if status == "caught_up":
            self.log.info("pipeline %s caught up: lag %s", self.pipeline, event["lag"])
            return {"lag": event["lag"], "partitions": event.get("partitions", {})}
        if status == "error":
            raise AirflowFailException(f"pipeline {self.pipeline}: {event.get('message')}")
        if status == "timeout":  # a timeout, not an error to retry
            raise AirflowSensorTimeout(f"pipeline {self.pipeline}: {event.get('message', status)}")
        raise AirflowFailException(f"pipeline {self.pipeline}: {event.get('message', status)}")


class ShoalRetentionDeadlineSensor(BaseSensorOperator):
    """Pokes the retention model at the pipeline's checkpoints; success when no partition is at risk."""

    template_fields: Sequence[str] = ("source_conn_id", "target_conn_id", "pipeline", "include", "exclude",
                                      "retention")

    def __init__(self, *, source_conn_id: str, target_conn_id: str, pipeline: str, include: str,
                 exclude: str | None = None, at_risk_below_s: float | None = None, retention: dict | None = None,
                 fail_on: Sequence[str] = ("LOST",), deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.source_conn_id, self.target_conn_id = source_conn_id, target_conn_id
        self.pipeline, self.include, self.exclude = pipeline, include, exclude
        self.at_risk_below_s, self.retention, self.fail_on = at_risk_below_s, retention, tuple(fail_on)

    def assess(self) -> list:
        """The shared retention verdict at the pipeline's checkpoints (most urgent first)."""
        return retention_verdict(self.source_conn_id, self.target_conn_id, self.pipeline, self.include,
                                 self.exclude, self.retention, self.at_risk_below_s)

    def poke(self, context) -> bool:
        statuses = self.assess()
        fatal = [s for s in statuses if s.status.value in self.fail_on]
        if fatal:
            raise AirflowFailException("; ".join(f"{s.topic}-{s.partition} {s.status.value}: {s.remedy.text}"
                                                 for s in fatal[:10]))
        pending = [s for s in statuses if s.status.value != "SAFE"]  # as fail_on names statuses
        for s in pending:
            self.log.warning("%s-%s %s: %.0f s to loss, margin %.0f s", s.topic, s.partition, s.status.value,
                             s.time_to_loss_s, s.margin_s)
        return not pending

    def execute(self, context) -> Any:
        """Deferred by default: the wait runs in the triggerer (:class:`ShoalRetentionTrigger`), not a worker slot."""
        if self.poke(context):
            return None
        if not self.deferrable:
            return super().execute(context)
        self.defer(trigger=ShoalRetentionTrigger(
            source_conn_id=self.source_conn_id, target_conn_id=self.target_conn_id, pipeline=self.pipeline,
            include=self.include, exclude=self.exclude or None, at_risk_below_s=self.at_risk_below_s,
            retention=self.retention, fail_on=list(self.fail_on), poll_interval_s=self.poke_interval,
            timeout_s=self.timeout), method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context, event: dict[str, Any]) -> None:
        status = event.get("status")
        if status == "safe":
            self.log.info("pipeline %s: every partition SAFE", self.pipeline)
            return
        if status == "timeout":
            raise AirflowSensorTimeout(f"pipeline {self.pipeline}: not SAFE after {self.timeout:.0f} s: "
                                       f"{event.get('message')}")
        raise AirflowFailException(f"pipeline {self.pipeline}: {event.get('message', status)}")


def retention_verdict(source_conn_id: str, target_conn_id: str, pipeline: str, include: str, exclude: str | None,
                      retention: dict | None, at_risk_below_s: float | None) -> list:
    """The shared retention verdict (:func:`mirror_core.services.deadlines.assess_positions`) at a pipeline's
    checkpoints, for the sensor and its trigger."""
    from mirror_core.services.deadlines import assess_positions
    from mirror_core.services.lag import checkpoint_positions, retention_policy

    with airflow_errors():
        source = ShoalKafkaHook(source_conn_id).get_cluster()
        target = ShoalKafkaHook(target_conn_id).get_cluster()
        topics, positions = checkpoint_positions(source, target, pipeline, include, exclude or None)
        return assess_positions(source, topics, positions, retention_policy(retention, at_risk_below_s),
                                target=target).statuses
