"""What ``shoal mirror status --config …`` shows, from any machine that reaches both clusters: the pipeline's daemon
group (members, who holds which lane), each lane's state and its lag.

Gathered, never asked of a daemon: the group from the source's group coordinator
(:func:`~mirror_core.kafka.daemon_group.describe_group`), lane states and positions from the checkpoints on the
target (:func:`~mirror_core.state.lane_control.lane_states`), lag against the source's last stable offsets
(ListOffsets, READ_COMMITTED; a transient answer is asked again for a moment). A part that cannot be read is
reported as such (``group_error``; ``lag_unknown`` names the partition and the source's answer), the rest is still
shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.pipeline_file import PipelineConfig
from mirror_core.errors import MirrorError
from mirror_core.kafka.daemon_group import GroupDescription, describe_group
from mirror_core.model.lane_holders import LaneHolders

# how long ``shoal mirror status`` asks a partition again after a transient answer (a leader moving, a topic created
# a moment ago) before it shows the lag as unknown: a status answers in seconds, a deleted topic waits this long
STATUS_SETTLE_S = 3.0


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
    unknown: dict[tuple[str, int], str] = {}
    stable = last_stable_offsets(config, [(r["topic"], r["partition"]) for r in rows], unknown=unknown)
    for row in rows:
        part = (row["topic"], row["partition"])
        # a lease-based daemon (an older release during an upgrade) shows as the lease holder
        row["holder"] = ",".join([*holders.get(part, []), *([f"{row['lease_holder']} (lease)"]
                                                            if row.get("lease_holder") else [])]) or None
        end = stable.get(part)
        row["lag"] = None if end is None or row["position"] is None else max(0, end - row["position"])
        # why the lag is not shown: the source's answer for the partition (e.g. UNKNOWN_TOPIC_OR_PART: deleted)
        row["lag_unknown"] = None if end is not None else \
            f"cluster {config.source.name!r} {part[0]}-{part[1]}: {unknown.get(part, 'no answer')}"
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


def last_stable_offsets(config: PipelineConfig, parts: list[tuple[str, int]], *, timeout_s: float = 15.0,
                        settle_s: float = STATUS_SETTLE_S, unknown: dict[tuple[str, int], str] | None = None
                        ) -> dict[tuple[str, int], int]:
    """(topic, partition) → the source's last stable offset. A partition whose leader answers a transient error (a
    leader moving, a topic created a moment ago) is asked again for up to ``settle_s``; one still not answered
    then (a deleted topic, a source that does not answer) is left out, and recorded in ``unknown`` with the
    broker's answer when given."""
    if not parts:
        return {}
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from mirror_core.kafka.admin import ClusterAdmin

    admin = ClusterAdmin(config.source, timeout_s=timeout_s, log_level=3)
    failed: dict = {}
    (answer,) = admin.settled_offsets([{TopicPartition(t, p): OffsetSpec.latest() for t, p in parts}],
                                      settle_s=settle_s, unsettled=failed,
                                      isolation_level=IsolationLevel.READ_COMMITTED)
    if unknown is not None and failed:
        gone = _topics_gone(admin, {tp.topic for tp in failed})
        unknown.update({(tp.topic, tp.partition): f"no such topic on the source now ({why})" if tp.topic in gone
                        else why for tp, why in failed.items()})
    return {(tp.topic, tp.partition): info.offset for tp, info in answer.items()}


def _topics_gone(admin, topics: set[str]) -> set[str]:
    """Those of ``topics`` the source's metadata does not list (deleted): librdkafka answers a deleted topic's
    ListOffsets with words that do not say so ("_NOENT: … No leaders found"). Empty when the source cannot say."""
    try:
        listed = admin.metadata().topics
    except MirrorError:
        return set()
    return {topic for topic in topics if topic not in listed}
