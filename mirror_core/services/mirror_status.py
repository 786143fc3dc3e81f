"""What ``shoal mirror status --config …`` shows, from any machine that reaches both clusters: the pipeline's daemon
group (members, who holds which lane), each lane's state and its lag.

Gathered, never asked of a daemon: the group from the source's group coordinator
(:func:`~mirror_core.kafka.daemon_group.describe_group`), lane states and positions from the checkpoints on the
target (:func:`~mirror_core.state.lane_control.lane_states`), lag against the source's last stable offsets (one
ListOffsets request, READ_COMMITTED). A part that cannot be read is reported as such (``group_error``), the rest is
still shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.pipeline_file import PipelineConfig
from mirror_core.errors import MirrorError
from mirror_core.kafka.daemon_group import GroupDescription, describe_group
from mirror_core.model.lane_holders import LaneHolders


@dataclass
class MirrorStatus:
    group: GroupDescription | None
    group_error: str | None
    lanes: list[dict] = field(default_factory=list)  # lane_states rows + holder, lag


def gather_mirror_status(config: PipelineConfig) -> MirrorStatus:
    from mirror_core.state.lane_control import lane_states

    rows = lane_states(config.target, config.pipeline)
    group, group_error = describe_group_or_error(config.source, config.pipeline)
    holders = group.holders() if group is not None else {}
    stable = last_stable_offsets(config, [(r["topic"], r["partition"]) for r in rows])
    for row in rows:
        part = (row["topic"], row["partition"])
        # a lease-based daemon (an older release during an upgrade) shows as the lease holder
        row["holder"] = ",".join([*holders.get(part, []), *([f"{row['lease_holder']} (lease)"]
                                                            if row.get("lease_holder") else [])]) or None
        end = stable.get(part)
        row["lag"] = None if end is None or row["position"] is None else max(0, end - row["position"])
    return MirrorStatus(group, group_error, rows)


def describe_group_or_error(source: ClusterConfig, pipeline: str, *, timeout_s: float = 15.0
                            ) -> tuple[GroupDescription | None, str | None]:
    """(the daemon group, None), or (None, why it could not be described)."""
    try:
        return describe_group(source, pipeline, timeout_s=timeout_s), None
    except MirrorError as exc:
        return None, str(exc)


def read_lane_holders(source: ClusterConfig, store, pipeline: str, *, timeout_s: float = 15.0
                      ) -> tuple[LaneHolders, GroupDescription | None]:
    """Who holds the pipeline's lanes (:class:`~mirror_core.model.lane_holders.LaneHolders`): the daemon group described
    on ``source``, lease and health records read through ``store`` (a :class:`CheckpointStore` on the target)."""
    from mirror_core.state.lane_health_records import read_all_health_records
    from mirror_core.state.leases import LeaseStore, now_ms

    group, group_error = describe_group_or_error(source, pipeline, timeout_s=timeout_s)
    leases = LeaseStore(store, producer_config={}).read(pipeline)
    holders = LaneHolders(group.holders() if group is not None else None, leases,
                          read_all_health_records(store, pipeline), now_ms(), group_error)
    return holders, group


def last_stable_offsets(config: PipelineConfig, parts: list[tuple[str, int]], *,
                        timeout_s: float = 15.0) -> dict[tuple[str, int], int]:
    """(topic, partition) → the source's last stable offset; partitions that could not be read are left out."""
    if not parts:
        return {}
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from mirror_core.kafka.admin import ClusterAdmin

    admin = ClusterAdmin(config.source, timeout_s=timeout_s, log_level=3)
    futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t, p in parts},
                                 isolation_level=IsolationLevel.READ_COMMITTED)
    out = {}
    for tp, future in futures.items():
        try:
            out[(tp.topic, tp.partition)] = future.result(timeout=timeout_s + 5).offset
        except Exception:  # noqa: BLE001 - a deleted source topic has no lag to show
            continue
    return out
