"""The pipeline's daemon group as an admin client sees it, from any machine: its members, their assigned partitions,
its state (``shoal mirror status``, the handoff's wait, the Shoal page). The membership itself, a daemon's side of
the group, is :mod:`mirror_core.daemon.membership`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.names import daemon_group_id as group_id
from mirror_core.errors import MirrorError
from mirror_core.kafka.admin import ClusterAdmin

Partition = tuple[str, int]


@dataclass(frozen=True)
class GroupMember:
    worker: str          # the daemon's worker id (its client.id)
    member_id: str
    host: str
    partitions: tuple[Partition, ...]


@dataclass(frozen=True)
class GroupDescription:
    group: str
    protocol: str        # consumer | classic | unknown
    state: str
    members: tuple[GroupMember, ...]

    def holders(self) -> dict[Partition, list[str]]:
        """Partition → the workers the group assigned it to (more than one only mid-rebalance, never for long)."""
        out: dict[Partition, list[str]] = {}
        for member in self.members:
            for part in member.partitions:
                out.setdefault(part, []).append(member.worker)
        return out


def describe_group(source: ClusterConfig, pipeline: str, *, timeout_s: float = 15.0) -> GroupDescription:
    """The pipeline's daemon group as the source's group coordinator sees it (works from any machine that reaches
    the source; needs Describe on the group)."""
    group = group_id(pipeline)
    admin = ClusterAdmin(source, timeout_s=timeout_s, log_level=3)
    try:
        described = admin.describe_groups([group])[group].result(timeout=timeout_s + 5)
    except Exception as exc:  # noqa: BLE001 - one sentence naming the cluster and the group
        error = MirrorError(f"cluster {source.name!r}: could not describe the daemon group {group!r} of pipeline "
                            f"{pipeline!r}: {type(exc).__name__}: {exc or 'no answer'} (the source must be reachable "
                            "and grant Describe on the group)")
        error.retriable = True
        raise error from None
    members = tuple(sorted(
        (GroupMember(m.client_id, m.member_id, m.host,
                     tuple(sorted((tp.topic, tp.partition) for tp in (m.assignment.topic_partitions
                                                                       if m.assignment else []))))
         for m in described.members), key=lambda m: (m.worker, m.member_id)))
    kind = getattr(getattr(described, "type", None), "name", "UNKNOWN").lower()
    state = getattr(described.state, "name", str(described.state)).lower()
    return GroupDescription(group, kind, state, members)
