"""Who holds a pipeline's lanes and how they fare, as seen from outside the daemons — the one reading the handoff's
wait, the Shoal page, ``shoal lanes status`` and ``shoal mirror status`` share.

Three sources, gathered by the caller (:func:`mirror_core.services.mirror_status.read_lane_holders`):

- the daemon **group**'s assignment, from the source's group coordinator (source partition → workers); None when
  the group could not be described (source unreachable, no Describe ACL): then whether a lane is held is
  *unknown*, never "no daemon";
- live **leases** of lease-based daemons of an older release (records without the ``group`` mark), during an
  upgrade: such a daemon holds its lanes by them. Group-marked records (``lease_compat``) are ignored: the group's
  assignment is the truth for group daemons;
- the lanes' live **health records** (:mod:`mirror_core.state.lane_health_records`): retrying/stalled as the holder
  wrote it, taken only before the record expires and only from a worker that holds the lane (a group assignee of its
  partition, or the lease-based holder): a former holder killed or cut off while the lane retried leaves a live record
  that says nothing of the lane's new holder.

Pure: no I/O, the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Partition = tuple[str, int]


@dataclass(frozen=True)
class LaneHolders:
    group: Mapping[Partition, list[str]] | None  # None: the group could not be described
    leases: Mapping  # lane → mirror_core.state.leases.Lease (every record of the pipeline; old and group-marked)
    health: Mapping  # lane → HealthRecord or a list of them (one per writer; mirror_core.state.lane_health_records)
    now_ms: int
    group_error: str | None = None

    def _old_lease(self, lane: str):
        lease = self.leases.get(lane)
        if lease is None or getattr(lease, "group", False) or lease.expires_ms <= self.now_ms:
            return None
        return lease

    def holder(self, part: Partition, lane: str) -> str | None:
        """The workers holding the lane: its group assignees, and a lease-based daemon by a live lease (marked)."""
        names = list(self.group.get(part, [])) if self.group is not None else []
        old = self._old_lease(lane)
        if old is not None:
            names.append(f"{old.holder} (lease)")
        return ",".join(names) or None

    def held(self, part: Partition, lane: str) -> bool | None:
        """True: a group member has the partition assigned, or a lease-based daemon holds the lane by a live lease;
        None: not known (the group could not be described and no live lease says so); False: nobody."""
        if self._old_lease(lane) is not None or (self.group is not None and self.group.get(part)):
            return True
        return None if self.group is None else False

    def live_health(self, lane: str, part: Partition | None):
        """The lane's health record while it is live (retrying/stalled as its holder wrote it), else None. Only a
        holder's record counts: with the group readable, a record whose writer is neither an assignee of ``part``
        nor the lane's lease-based holder is ignored (it no longer holds the lane). With the group unreadable (or
        ``part`` unknown) the newest live record is taken."""
        records = self.health.get(lane)
        if records is None:
            return None
        live = [r for r in (records if isinstance(records, list | tuple) else [records]) if r.live(self.now_ms)]
        if self.group is not None and part is not None:
            holders = set(self.group.get(part, []))
            old = self._old_lease(lane)
            if old is not None:
                holders.add(old.holder)
            live = [r for r in live if r.holder in holders]
        return max(live, key=lambda r: r.written_ms) if live else None


def lanes_without_daemon(holders: LaneHolders, lanes: Mapping[str, Partition]) -> list[str]:
    """The ``lanes`` (lane → source partition) no daemon is known to hold (see :meth:`LaneHolders.held`)."""
    return [lane for lane, part in lanes.items() if holders.held(part, lane) is not True]


def daemon_health(group, group_error: str | None, leases: Mapping, now_ms: int) -> list[str]:
    """Sentences on a pipeline's daemons: the group (members, what each holds) as the source's coordinator sees it
    — or that it could not be read, which is not "no daemon" — and any lease-based daemon of an older release still
    holding lanes by live leases (an upgrade in progress). ``group``: a
    :class:`~mirror_core.kafka.daemon_group.GroupDescription` or None."""
    out = []
    if group is None:
        out.append(f"daemon group not readable, so whether a daemon runs is unknown: {group_error}")
    elif not group.members:
        out.append(f"daemon group {group.group}: no member — no daemon runs for this pipeline (group state "
                   f"{group.state})")
    else:
        out.append(f"daemon group {group.group}: {len(group.members)} member(s), protocol {group.protocol}, state "
                   f"{group.state}")
        for member in group.members:
            out.append(f"{member.worker} ({member.host}): holds {len(member.partitions)} partition(s)")
    old: dict[str, list[int]] = {}
    for lease in leases.values():
        if not getattr(lease, "group", False) and lease.expires_ms > now_ms:
            old.setdefault(lease.holder, []).append(lease.expires_ms)
    for holder, expiries in sorted(old.items()):
        out.append(f"{holder} (lease-based daemon of an older release): holds {len(expiries)} lane(s) by lease, "
                   f"next expiry in {(min(expiries) - now_ms) / 1000:.0f}s — an upgrade in progress; group daemons "
                   "keep off those lanes until it stops")
    return out
