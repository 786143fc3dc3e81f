"""Lease compatibility: a group daemon and an older, lease-based daemon of the same pipeline side by side.

During an upgrade both kinds run together (:mod:`mirror_core.state.leases`): the group daemon keeps off lanes a
lease-based daemon holds by a live lease (:mod:`mirror_core.daemon.group_lanes`) and — ``lease_compat``, by default
only while such a daemon is seen — writes lease records for its own lanes (and a membership heartbeat) so the old one
keeps off them and counts it in its fair share. Records of ours are released only while they are still ours.
"""

from __future__ import annotations

from mirror_core.config.pipeline_file import PipelineConfig
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import LaneState
from mirror_core.daemon.membership import GroupMembership
from mirror_core.state.leases import Lease, LeaseStore, compat_records_wanted, member_lane, now_ms


class CompatLeaseRecords:
    """Our compat lease records and membership heartbeat: written while wanted, released while still ours. Main
    thread only; the lease store, this process's name (``me``: its worker id), the membership and the lanes are
    the daemon's, passed in at each call."""

    def __init__(self, config: PipelineConfig):
        self.config = config
        self.writing = False  # lease_compat records are being written (logged when that changes)
        self.until = 0  # wall-clock ms our last compat lease records expire (0: none written)
        self.heartbeat = False  # our compat membership heartbeat was written and not yet tombstoned

    def release(self, leases: LeaseStore, me: str, membership: GroupMembership, states: dict[str, LaneState],
                lanes: list[str], records: dict[str, Lease] | None = None) -> None:
        """Release our lease records of ``lanes`` — only those still ours at write time, as far as a log without
        conditional writes allows: the record read is ours and not expired (an older daemon writes a lane's lease
        only once ours has expired), and the group still has the partition with this process (assigned, possibly
        being revoked: no other group daemon writes the lane's record before the revocation completes). A lane the
        group already moved (a lost assignment, a revocation that timed out) keeps our record until it expires:
        its next holder may have written its own record since, which a release would erase."""
        if records is None:
            records = leases.read(self.config.pipeline)
        ours = membership.view().assigned
        limit = now_ms() + 1000  # a record about to expire may be taken over before our release lands
        release = []
        for lane in lanes:
            record, state = records.get(lane), states.get(lane)
            if record is None or record.holder != me or record.expires_ms <= limit:
                continue
            if state is None or (state.topic, state.partition) not in ours:
                continue
            release.append(Lease(self.config.pipeline, lane, me, 0, group=True))
        leases.write_many(release)

    def write(self, leases: LeaseStore, me: str, held: set[str], old_daemon: str | None, now: int) -> None:
        """``lease_compat``: a lease record (marked ``group``) per held lane, in one batch (every record produced, one
        flush: not a round trip per lane) — always, never, or (auto) only while a lease-based daemon is seen."""
        wanted = compat_records_wanted(self.config.lease_compat, old_daemon)
        if wanted != self.writing:
            self.writing = wanted
            event("lease_compat_records", state="writing" if wanted else "stopped", mode=self.config.lease_compat,
                  lease_based_daemon=old_daemon or "-",
                  note="lease records for our lanes and a membership heartbeat, so a lease-based daemon keeps off "
                       "our lanes and counts us in its fair share" if wanted else
                       "no lease-based daemon seen: nothing written per lane; our last records expire by themselves")
        if not wanted:
            self.release_heartbeat(leases, me)
            return
        expires = now + int(self.config.lease_ttl_s * 1000)
        pipeline = self.config.pipeline
        # the heartbeat (first, so the lease-based daemon counts us even while we hold no lane: its fair share then
        # leaves lanes to us and it gives back what it holds beyond it — 18af6cc _maintain_leases)
        leases.write_many([Lease(pipeline, member_lane(me), me, expires, group=True)]
                          + [Lease(pipeline, lane, me, expires, group=True) for lane in sorted(held)])
        self.heartbeat = True
        self.until = expires

    def release_heartbeat(self, leases: LeaseStore, me: str) -> None:
        """Tombstone our compat membership heartbeat, if written (compat writing stopped, or leaving)."""
        if self.heartbeat:
            leases.release_member(self.config.pipeline, me)
            self.heartbeat = False

    def live(self) -> bool:
        """Whether a compat lease record we wrote may still be live (then a lane we give up is released)."""
        return now_ms() < self.until
