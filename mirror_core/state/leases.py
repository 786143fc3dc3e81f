"""Lease records of the lease-based daemon (an older release), read and written only for the upgrade.

Earlier releases shared a pipeline's lanes through lease records in the checkpoint topic (key ``{"lease": lane,
"pipeline": p}``, value holder + expiry) and a membership heartbeat per daemon (lane ``__member__:<worker>``), with a
fair share computed by every daemon. Daemons now share lanes through a consumer group
(:mod:`mirror_core.daemon.membership`); what stays here is the upgrade path:

- **reading** (always): a group daemon skips every lane an older daemon holds by a live lease (a record without the
  ``group`` mark) until that lease is released or expires, and :func:`lease_based_daemon_seen` tells whether such a
  daemon is around (a live unmarked lease or a live membership heartbeat);
- **writing** (``lease_compat``; :func:`compat_records_wanted` decides): a lease marked ``"group": true`` for each
  lane a group daemon holds, so an older daemon counts it and keeps off its lanes, and a membership heartbeat
  (:func:`member_lane`, also marked) so the older daemon counts the group daemon in its fair share even while it
  holds no lane — without it, an older daemon started late leases every lane (its share counts nobody), the group
  daemons drop those lanes and then hold nothing, and the older daemon never gives a lane back. The heartbeat is
  tombstoned when compat writing stops and on leave. Group daemons ignore each other's records (marked): the
  group's assignment decides among them. Older readers ignore the extra field.

Records are read with READ_COMMITTED like the checkpoints, through the same incremental cache
(:meth:`CheckpointStore.latest_items`). A record only says who *should* write a lane; what makes a second writer
harmless is the broker: a lane is opened with its transactional.id, which fences the former holder. Clocks only
decide when a lease looks expired; a wrong clock costs a fencing, never data.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from mirror_core.state.checkpoint import CheckpointStore, checkpoint_partition

MEMBER_PREFIX = "__member__:"


COMPAT_AUTO, COMPAT_ALWAYS, COMPAT_OFF = "auto", "always", "off"


def member_lane(holder: str) -> str:
    """The pseudo-lane of a daemon's membership heartbeat (the lease-based release's format)."""
    return MEMBER_PREFIX + holder


@dataclass(frozen=True)
class Lease:
    """One lane's lease record. ``health``: what a lease-based daemon of the previous release wrote of a lane that
    was not simply copying (read, never written: lane health now has records of its own,
    :mod:`mirror_core.state.lane_health_records`)."""

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

    def __init__(self, store: CheckpointStore, producer_config: dict, producer: SideRecordProducer | None = None):
        self.store = store
        self.producer = producer or SideRecordProducer(store, producer_config)
        self._read_cache: tuple | None = None  # (pipeline and store content version, lanes, members) last decoded

    def read(self, pipeline: str) -> dict[str, Lease]:
        """Lane → lease (membership heartbeats left out)."""
        return self.read_with_members(pipeline)[0]

    def read_with_members(self, pipeline: str, *, refresh: bool = True, skip_damaged: bool = False
                          ) -> tuple[dict[str, Lease], dict[str, Lease]]:
        """(lane → lease, worker → membership heartbeat), from the store's incremental cache of the topic
        (:meth:`CheckpointStore.latest_items`: one refresh of every partition, then only live keys; a released
        membership, i.e. a tombstone, is simply absent). ``refresh=False``: the caller refreshed the store.
        Decoded again only when the store's content changed (CheckpointStore.content_version): a daemon's group
        round reads this every few seconds, the records almost never change. ``skip_damaged``: the records of a
        damaged partition of the topic are left out instead of raising (see ``CheckpointStore.damaged``)."""
        if refresh:
            self.store.refresh(skip_damaged=skip_damaged)
        version = (pipeline, self.store.content_version())
        cached = self._read_cache
        if cached is not None and cached[0] == version:
            return dict(cached[1]), dict(cached[2])
        leases: dict[str, Lease] = {}
        for key, value in self.store.latest_items(refresh=False):
            decoded = json.loads(key)
            if not isinstance(decoded, dict) or decoded.get("pipeline") != pipeline:
                continue
            body = json.loads(value)
            leases[decoded["lease"]] = Lease(pipeline, decoded["lease"], body["holder"], body["expires_ms"],
                                             body.get("health"), bool(body.get("group", False)))
        lanes = {lane: lease for lane, lease in leases.items() if not lane.startswith(MEMBER_PREFIX)}
        members = {lease.holder: lease for lane, lease in leases.items() if lane.startswith(MEMBER_PREFIX)}
        self._read_cache = (version, lanes, members)
        return dict(lanes), dict(members)

    def write(self, lease: Lease) -> None:
        """Write (or renew) a lease; returns once the broker acknowledged it."""
        self.write_many([lease])

    def write_many(self, leases: list[Lease]) -> None:
        """Write (or renew) several leases: every record is produced, then one flush waits for all of them — one
        round trip for the batch, not one per lease (a daemon renewing 2,000 lanes' records must not spend a round
        trip per lane on its main thread). Returns once the broker acknowledged every one; raises naming the lanes
        that were not."""
        self._produce_many([(lease.pipeline, lease.lane, json.dumps(_body(lease)).encode()) for lease in leases])

    def _produce_many(self, records: list[tuple[str, str, bytes | None]]) -> None:
        self.producer.produce([(lease_key(pipeline, lane), value, lane) for pipeline, lane, value in records],
                              what="lease record(s) of lane(s)")

    def release_member(self, pipeline: str, holder: str) -> None:
        """Delete ``holder``'s membership heartbeat (a tombstone, so compaction drops the key)."""
        self._produce_many([(pipeline, member_lane(holder), None)])

    def release(self, pipeline: str, lane: str, holder: str, *, group: bool = False) -> None:
        self.write(Lease(pipeline, lane, holder, 0, group=group))


class SideRecordProducer:
    """Writes records that share the checkpoint topic beside the checkpoints (lease records, lane health records),
    keyed like them (same partition per key), through one idempotent producer made on first use."""

    def __init__(self, store: CheckpointStore, producer_config: dict):
        self.store = store
        self._producer_config = producer_config
        self._producer = None

    def produce(self, records: list[tuple[bytes, bytes | None, str]], *, what: str, timeout_s: float = 30.0) -> None:
        """``(key, value or None for a tombstone, name)``: every record produced, then one flush waits for all of
        them — one round trip for the batch, not one per record. Raises naming the records not acknowledged."""
        from confluent_kafka import Producer

        if not records:
            return
        if self._producer is None:
            self._producer = Producer({**self._producer_config, "enable.idempotence": True, "linger.ms": 0})
        _produce_and_flush(self._producer, self.store, records, what, timeout_s)


def _produce_and_flush(producer, store: CheckpointStore, records: list[tuple[bytes, bytes | None, str]],
                       what: str, timeout_s: float) -> None:
    errors: list[str] = []
    for key, value, name in records:
        while True:
            try:
                producer.produce(store.topic, key=key, value=value,
                                 partition=checkpoint_partition(key, store.partitions),
                                 on_delivery=lambda err, _m, name=name: errors.append(f"{name}: {err}") if err
                                 else None)
                break
            except BufferError:  # the local queue is full: let it drain, then go on
                producer.poll(0.1)
    deadline = time.monotonic() + timeout_s
    left = producer.flush(0.2)
    while left and not errors and time.monotonic() < deadline:  # in slices: signal handlers (a SIGTERM's grace
        left = producer.flush(0.2)                              # alarm) run between them
    if errors or left:
        from mirror_core.errors import MirrorError

        names = ", ".join(repr(name) for _k, _v, name in records[:5]) + (" …" if len(records) > 5 else "")
        raise MirrorError(f"could not write the {what} {names}: {errors or 'timed out'}")


def lease_based_daemon_seen(leases: dict[str, Lease], members: dict[str, Lease], me: str, now_ms: int) -> str | None:
    """The worker id of a lease-based daemon (an older release) that is alive by the records: a live lease without
    the ``group`` mark, or a live membership heartbeat (only lease-based daemons write those; ``members`` as
    :meth:`LeaseStore.read_with_members` returns them). None when there is none."""
    for lease in [*leases.values(), *members.values()]:
        if lease.blocks_group_daemon(me, now_ms):
            return lease.holder
    return None


def compat_records_wanted(mode: str, old_daemon: str | None) -> bool:
    """Whether a group daemon writes lease records for the lanes it holds (``lease_compat``): ``always``; never with
    ``off``; with ``auto`` only while a lease-based daemon is seen (:func:`lease_based_daemon_seen`). With no such
    daemon around, nothing is written per held lane."""
    if mode == COMPAT_ALWAYS:
        return True
    if mode == COMPAT_OFF:
        return False
    return old_daemon is not None


def _body(lease: Lease) -> dict:
    body = {"holder": lease.holder, "expires_ms": lease.expires_ms}
    if lease.health:
        body["health"] = lease.health
    if lease.group:
        body["group"] = True
    return body


def now_ms() -> int:
    return int(time.time() * 1000)
