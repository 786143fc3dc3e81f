"""Which consumer-group offsets to move from the source to the target, and why not the others (pure).

A source group's committed offset ``s`` on a mirrored partition becomes the exact target offset
``OffsetMap.translate(s)`` of the pipeline's checkpoint for that partition (DESIGN.md §3.6): the target offset of
the record at ``s``, of the next copied record when ``s`` is a gap (marker, aborted data, compaction hole), or the
target's next offset when ``s`` is the copy position. The group then resumes on the target at exactly the next
record it has not read: no duplicate, no skip.

:func:`plan_group_sync` decides, the way MirrorMaker 2's ``MirrorCheckpointTask`` does, and never guesses:

- a partition whose offset the map does not vouch for (not copied yet, pruned, no checkpoint, or in a range the
  source log no longer holds since a truncation below the copy position) is **not committed** and reported with
  the reason;
- a group with members on the target, or in any state other than Empty/Dead there, is **skipped whole**: its
  consumers own their offsets, and the broker would refuse the commit anyway;
- a target offset already at or past the translation is **left alone**: a target group that has moved on is never
  rewound (that would re-deliver what it has processed).

Everything else is committed. The caller does the I/O (``mirror_core.services.group_sync``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mirror_core.state.checkpoint import Checkpoint

TopicPartitionKey = tuple[str, int]
DivergedRange = tuple[int | None, int]  # [source end offset of the shared epoch (None: unknown), copy position)

# Target group states in which nobody consumes: Empty (offsets only) and Dead (no such group; a commit creates it).
IDLE_STATES = frozenset({"EMPTY", "DEAD"})


class SyncStatus(str, enum.Enum):
    """What happens to one (group, partition)."""

    COMMIT = "commit"  # translated; committed on the target (or would be, in a dry run)
    IN_SYNC = "in sync"  # the target group already has exactly the translated offset
    TARGET_AHEAD = "target ahead"  # the target group is past the translation: never rewound
    NOT_TRANSLATABLE = "not translatable"  # the offset map does not vouch for the source offset
    GROUP_ACTIVE = "group active"  # the group has members on the target (or is rebalancing): skipped

    @property
    def committed(self) -> bool:
        return self is SyncStatus.COMMIT

    @property
    def settled(self) -> bool:
        """The target group resumes at the right place after this row (committed now or already there)."""
        return self in (SyncStatus.COMMIT, SyncStatus.IN_SYNC)


@dataclass(frozen=True)
class CommittedOffset:
    """A group's committed offset on one partition, with the metadata string its consumer stored."""

    offset: int
    metadata: str | None = None


@dataclass(frozen=True)
class TargetGroup:
    """A group as the target cluster knows it: state name (``ConsumerGroupState`` names: EMPTY, DEAD, STABLE, …),
    member count, and its committed offsets on target partitions."""

    state: str = "DEAD"
    members: int = 0
    committed: Mapping[TopicPartitionKey, int] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        has_members = self.members > 0
        idle_state = self.state.upper() in IDLE_STATES
        return has_members or not idle_state

    def describe(self) -> str:
        return f"state {self.state.upper()}, {self.members} member{'s' if self.members != 1 else ''}"


@dataclass(frozen=True)
class PartitionDecision:
    """One row of the failover table: a source group's partition and what the sync does with it."""

    group: str
    topic: str
    partition: int
    source_offset: int
    target_topic: str | None  # None: the pipeline has no checkpoint for this partition
    target_partition: int | None
    target_offset: int | None  # the exact translation; None when not translatable
    status: SyncStatus
    reason: str | None = None  # why not committed (None for COMMIT)
    metadata: str | None = None


@dataclass(frozen=True)
class GroupSyncPlan:
    """Every decision, plus the topics each group consumes that the pipeline does not mirror (not in the rows)."""

    decisions: tuple[PartitionDecision, ...]
    unmirrored: Mapping[str, tuple[str, ...]]

    def commits(self) -> dict[str, list[PartitionDecision]]:
        """Group → the decisions to commit on the target, in table order."""
        out: dict[str, list[PartitionDecision]] = {}
        for d in self.decisions:
            if d.status.committed:
                out.setdefault(d.group, []).append(d)
        return out

    @property
    def complete(self) -> bool:
        """True when every mirrored partition of every group resumes at the right place on the target."""
        return all(d.status.settled for d in self.decisions)


def translation_refusal(checkpoint: Checkpoint | None, source_offset: int,
                        diverged: DivergedRange | None = None) -> str | None:
    """Why ``source_offset`` has no exact target offset in ``checkpoint`` (None when it has one). ``diverged``: the
    range the target holds that the source log lost to a truncation (:class:`~mirror_core.errors.
    SourceTruncatedError`); offsets from its start on name different records on the two clusters now."""
    if checkpoint is None:
        return "partition not copied by this pipeline"
    if diverged is not None and (diverged[0] is None or source_offset >= diverged[0]):
        start = "?" if diverged[0] is None else diverged[0]
        return (f"the source log was truncated below the copy position: the target's copies of [{start}, "
                f"{diverged[1]}) are records the source no longer has, and the source's offsets from {start} on "
                "hold other records")
    offset_map = checkpoint.offset_map
    if offset_map is None:
        return f"nothing copied yet (copy position {checkpoint.position})"
    if source_offset > offset_map.position:
        return f"not copied yet: the copy is at {offset_map.position}"
    if source_offset < offset_map.start and checkpoint.map_pruned_below is not None:
        return (f"before the offset map, which was pruned to start at {offset_map.start}: when it was pruned the "
                "source log no longer held these offsets and no source consumer group held one")
    if source_offset < offset_map.start:
        return f"before the offset map, which starts at {offset_map.start} (where the copy began)"
    lost = offset_map.lost_range_at(source_offset)
    if lost is not None:
        return (f"its next records [{lost[0]}, {lost[1]}) were lost before they were copied (accepted loss); "
                "moving the group past them is an operator's decision")
    return None


def plan_group_sync(source_offsets: Mapping[str, Mapping[TopicPartitionKey, CommittedOffset]],
                    checkpoints: Mapping[TopicPartitionKey, Checkpoint],
                    target_groups: Mapping[str, TargetGroup],
                    diverged: Mapping[TopicPartitionKey, DivergedRange] | None = None) -> GroupSyncPlan:
    """Decide, per source group and mirrored partition, what to commit on the target (see the module docstring).

    ``source_offsets``: group → committed offsets on the source (negative offsets, "no commit", are ignored).
    ``checkpoints``: the pipeline's checkpoints by source (topic, partition). ``target_groups``: the target's view
    of each group; a group missing there is taken as Dead (nothing on the target yet). ``diverged``: partitions
    whose source log was truncated below the checkpoint's position, with the diverged range (nothing translates
    from its start on).
    """
    mirrored_topics = {topic for topic, _ in checkpoints}
    decisions: list[PartitionDecision] = []
    unmirrored: dict[str, tuple[str, ...]] = {}
    for group in sorted(source_offsets):
        target = target_groups.get(group, TargetGroup())
        offsets = {tp: c for tp, c in source_offsets[group].items() if c.offset >= 0}
        skipped_topics = sorted({topic for topic, _ in offsets if topic not in mirrored_topics})
        if skipped_topics:
            unmirrored[group] = tuple(skipped_topics)
        for (topic, partition) in sorted(tp for tp in offsets if tp[0] in mirrored_topics):
            decisions.append(_decide(group, topic, partition, offsets[(topic, partition)],
                                     checkpoints.get((topic, partition)), target,
                                     (diverged or {}).get((topic, partition))))
    return GroupSyncPlan(tuple(decisions), unmirrored)


def _decide(group: str, topic: str, partition: int, committed: CommittedOffset, checkpoint: Checkpoint | None,
            target: TargetGroup, diverged: DivergedRange | None = None) -> PartitionDecision:
    refusal = translation_refusal(checkpoint, committed.offset, diverged)
    translated = None if refusal is not None else checkpoint.offset_map.translate(committed.offset)
    if refusal is None and translated is None:  # the map declined for a reason of its own: never guess
        refusal = "the offset map does not vouch for this offset"

    def decision(status: SyncStatus, reason: str | None) -> PartitionDecision:
        return PartitionDecision(
            group=group, topic=topic, partition=partition, source_offset=committed.offset,
            target_topic=None if checkpoint is None else checkpoint.target_topic,
            target_partition=None if checkpoint is None else checkpoint.target_partition,
            target_offset=translated, status=status, reason=reason, metadata=committed.metadata)

    if target.active:
        return decision(SyncStatus.GROUP_ACTIVE, f"group active on the target ({target.describe()})")
    if refusal is not None:
        return decision(SyncStatus.NOT_TRANSLATABLE, refusal)
    current = target.committed.get((checkpoint.target_topic, checkpoint.target_partition))
    already_there = current is not None and current == translated
    moved_on = current is not None and current > translated
    if already_there:
        return decision(SyncStatus.IN_SYNC, f"the target group is already at {current}")
    if moved_on:
        return decision(SyncStatus.TARGET_AHEAD, f"the target group is at {current}, past {translated}; "
                                                 "not rewound")
    return decision(SyncStatus.COMMIT, None)


def select_groups(group_ids: Iterable[str], pattern) -> list[str]:
    """The group ids that ``pattern`` (a compiled regex) matches whole, like MirrorMaker 2's ``groups``, sorted."""
    return sorted(g for g in set(group_ids) if pattern.fullmatch(g))
