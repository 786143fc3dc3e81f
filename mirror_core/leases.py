"""Leases on lanes, so several daemon processes share a pipeline's lanes.

A lease is a record in the checkpoint topic (key ``{"lease": lane, "pipeline": p}``, value holder + expiry), read
with READ_COMMITTED like the checkpoints, through the same incremental cache (:class:`CheckpointStore` keeps the
last value per key of every partition; a lease read refreshes it with only the records appended since). The
lease only coordinates who *should* write a lane; what makes a second writer harmless is the broker: a lease taker
opens the lane with its transactional.id, which fences the former holder (a paused or partitioned process cannot
write after that). Clocks only decide when a lease looks expired; a wrong clock costs a fencing, never data.

Membership: every daemon also keeps a heartbeat record (lane ``__member__:<worker>``) renewed with its leases, so a
daemon that holds no lane yet (a newcomer) is counted when the others compute their fair share and give lanes back.
Membership records are never returned as lanes; a clean shutdown deletes its own (tombstone).

Since daemons share lanes through a consumer group (:mod:`mirror_core.daemon_membership`), lease records stay only
for the upgrade (``lease_compat``): a group daemon writes a lease marked ``"group": true`` for each lane it holds, so
a lease-based daemon of an older release counts it and keeps off its lanes, and it skips every lane an older
daemon holds by a live lease (no ``group`` mark) until that lease is released or expires. Group daemons ignore each
other's lease records: the group's assignment decides among them. Older readers ignore the extra field.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from mirror_core.checkpoint import CheckpointStore, checkpoint_partition

MEMBER_PREFIX = "__member__:"


def member_lane(holder: str) -> str:
    """The pseudo-lane of a daemon's membership heartbeat."""
    return MEMBER_PREFIX + holder


@dataclass(frozen=True)
class Lease:
    """``health``: the holder's live view of a lane that is not simply copying — ``state`` (retrying or stalled),
    ``reason``, ``message``, ``attempts``, ``since_ms`` — renewed with the lease, so readers outside the daemon
    (the Shoal page, ``shoal lanes status``) see what only the daemon's memory knew; None while copying."""

    pipeline: str
    lane: str
    holder: str
    expires_ms: int
    health: dict | None = None
    group: bool = False  # written by a group-membership daemon (see the module docstring)

    def held_by_other(self, holder: str, now_ms: int) -> bool:
        return self.holder != holder and self.expires_ms > now_ms

    def blocks_group_daemon(self, holder: str, now_ms: int) -> bool:
        """A live lease of a lease-based (older) daemon: a group daemon must not write the lane yet."""
        return not self.group and self.held_by_other(holder, now_ms)


def lease_key(pipeline: str, lane: str) -> bytes:
    return json.dumps({"lease": lane, "pipeline": pipeline}, sort_keys=True, separators=(",", ":")).encode()


class LeaseStore:
    """Reads and writes lane leases next to the checkpoints (same topic, same partitioning by key)."""

    def __init__(self, store: CheckpointStore, producer_config: dict):
        self.store = store
        self._producer_config = producer_config
        self._producer = None

    def read(self, pipeline: str) -> dict[str, Lease]:
        """Lane → lease (membership heartbeats left out)."""
        return self.read_with_members(pipeline)[0]

    def read_with_members(self, pipeline: str) -> tuple[dict[str, Lease], dict[str, Lease]]:
        """(lane → lease, worker → membership heartbeat), from the store's incremental cache of the topic
        (:meth:`CheckpointStore.latest_items`: one refresh of every partition, then only live keys; a released
        membership, i.e. a tombstone, is simply absent)."""
        leases: dict[str, Lease] = {}
        for key, value in self.store.latest_items():
            decoded = json.loads(key)
            if not isinstance(decoded, dict) or decoded.get("pipeline") != pipeline:
                continue
            body = json.loads(value)
            leases[decoded["lease"]] = Lease(pipeline, decoded["lease"], body["holder"], body["expires_ms"],
                                             body.get("health"), bool(body.get("group", False)))
        lanes = {lane: lease for lane, lease in leases.items() if not lane.startswith(MEMBER_PREFIX)}
        members = {lease.holder: lease for lane, lease in leases.items() if lane.startswith(MEMBER_PREFIX)}
        return lanes, members

    def write(self, lease: Lease) -> None:
        """Write (or renew) a lease; returns once the broker acknowledged it."""
        self.write_many([lease])

    def write_many(self, leases: list[Lease]) -> None:
        """Write (or renew) several leases: every record is produced, then one flush waits for all of them — one
        round trip for the batch, not one per lease (a daemon renewing 2,000 lanes' records must not spend a round
        trip per lane on its main thread). Returns once the broker acknowledged every one; raises naming the lanes
        that were not."""
        self._produce_many([(lease.pipeline, lease.lane, json.dumps(_body(lease)).encode()) for lease in leases])

    def heartbeat(self, pipeline: str, holder: str, expires_ms: int) -> None:
        """Renew this daemon's membership (see the module docstring)."""
        self.write(Lease(pipeline, member_lane(holder), holder, expires_ms))

    def leave(self, pipeline: str, holder: str) -> None:
        """Delete this daemon's membership record (a tombstone, so compaction drops the key)."""
        self._produce(pipeline, member_lane(holder), None)

    def _produce(self, pipeline: str, lane: str, value: bytes | None) -> None:
        self._produce_many([(pipeline, lane, value)])

    def _produce_many(self, records: list[tuple[str, str, bytes | None]]) -> None:
        from confluent_kafka import Producer

        if not records:
            return
        if self._producer is None:
            self._producer = Producer({**self._producer_config, "enable.idempotence": True, "linger.ms": 0})
        errors: list[str] = []
        for pipeline, lane, value in records:
            key = lease_key(pipeline, lane)
            while True:
                try:
                    self._producer.produce(
                        self.store.topic, key=key, value=value,
                        partition=checkpoint_partition(key, self.store.partitions),
                        on_delivery=lambda err, _m, lane=lane: errors.append(f"{lane}: {err}") if err else None)
                    break
                except BufferError:  # the local queue is full: let it drain, then go on
                    self._producer.poll(0.1)
        deadline = time.monotonic() + 30
        left = self._producer.flush(0.2)
        while left and not errors and time.monotonic() < deadline:  # in slices: signal handlers (a SIGTERM's
            left = self._producer.flush(0.2)                       # grace alarm) run between them
        if errors or left:
            from mirror_core.errors import MirrorError

            lanes = ", ".join(repr(lane) for _p, lane, _v in records[:5]) + (" …" if len(records) > 5 else "")
            raise MirrorError(f"could not write the lease record(s) of lane(s) {lanes}: {errors or 'timed out'}")

    def release(self, pipeline: str, lane: str, holder: str, *, group: bool = False) -> None:
        self.write(Lease(pipeline, lane, holder, 0, group=group))


def _body(lease: Lease) -> dict:
    body = {"holder": lease.holder, "expires_ms": lease.expires_ms}
    if lease.health:
        body["health"] = lease.health
    if lease.group:
        body["group"] = True
    return body


def now_ms() -> int:
    return int(time.time() * 1000)
