"""The retention verdict, one function every component shares (issue #17: a user action's service).

``shoal deadlines``, the daemon's retention watch, the Airflow retention check, sensor and trigger, and the Shoal
page all call :func:`assess_positions`, so the paging path and the page cannot contradict each other. Inputs are
gathered by :mod:`mirror_core.kafka.retention_inputs`, decided by :mod:`mirror_core.model.retention` with the
settings of :mod:`mirror_core.model.retention_policy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.retention_inputs import (
    OldestTimestamps,
    RetentionInputs,
    SkippedPartition,
    copy_round_trip,
    gather_inputs,
)


@dataclass(frozen=True)
class Assessment:
    """One retention verdict: the statuses (most urgent first), the capacity and policy that produced them."""

    cluster: str
    statuses: list
    copy: object            # mirror_core.model.copy_capacity.CopyCapacity
    policy: object          # mirror_core.model.retention_policy.RetentionPolicy
    inputs: RetentionInputs

    def losses(self, *, accept_loss: bool) -> list:
        """The LOST ranges a copy starting here would skip, to record in the ledger; refused (RetentionLossError
        naming them) unless ``accept_loss`` (:func:`mirror_core.model.retention.guard_plan`)."""
        from mirror_core.model.retention import guard_plan

        return guard_plan(self.cluster, self.statuses, accept_loss=accept_loss)


def assess_positions(source: ClusterConfig, topics: Mapping[str, Sequence[int] | None],
                     positions: Mapping[tuple[str, int], int] | None, policy=None, *,
                     target: ClusterConfig | None = None, throttle_bytes_per_s: float | None = None,
                     link_bytes_per_s: float | None = None, oldest: OldestTimestamps | None = None,
                     skipped: list[SkippedPartition] | None = None) -> Assessment:
    """The retention verdict every component shares: inputs gathered at ``positions``, copy capacity from
    ``policy`` (the round trip the copy sees, :func:`copy_round_trip`; a throttle shared by the partitions that
    still have data to copy; ``link_bytes_per_s``: the copy's declared link rate, whose sized fetches the estimate
    then uses), statuses from :func:`mirror_core.model.retention.assess_partitions`. ``oldest``, ``skipped``: see
    :func:`gather_inputs`."""
    from mirror_core.model.retention import assess_partitions
    from mirror_core.model.retention_policy import RetentionPolicy

    policy = policy or RetentionPolicy()
    rtt, rtt_how = 0.0, ""
    if policy.throughput_bytes_per_s is None:
        rtt, rtt_how = copy_round_trip(source, target)
    inputs = gather_inputs(source, topics, positions, sample_s=policy.ingest_sample_s, oldest=oldest,
                           skipped=skipped)
    streams = sum(1 for s in inputs.snapshots if s.unmirrored_records > 0)
    copy = policy.capacity(rtt, throttle_bytes_per_s=throttle_bytes_per_s, streams=streams,
                           link_bytes_per_s=link_bytes_per_s, rtt_how=rtt_how)
    statuses = assess_partitions(inputs.snapshots, inputs.topics, copy, at_risk_below_s=policy.at_risk_below_s,
                                 check_interval_ms=inputs.check_interval_ms)
    return Assessment(source.name, statuses, copy, policy, inputs)
