"""Lane health records: the live state of a lane that is not simply copying, for readers outside the daemon.

``retrying`` and ``stalled`` live in the holder's memory (:class:`~mirror_core.model.lane_status.LaneHealth`); halts and
retirements are persisted with the checkpoint. So the Shoal page, ``shoal lanes status`` and ``shoal mirror status``
see the first two, the holder writes a record of its own per such lane into the checkpoint topic:

    key   {"lane_health": [pipeline, lane, holder]} (a JSON object without "pipeline": checkpoint and lease readers
                                                    of every release skip it; one key per lane AND writer, so a
                                                    former holder's late tombstone never erases the next holder's
                                                    record; readers of the two-element key of the first release
                                                    still find the lane at index 1)
    value {"state", "reason", "message", "attempts", "since_ms", "holder", "written_ms", "expires_ms"}
          or a tombstone once the lane copies again (or is no longer the writer's)

Written when the state CHANGES, not per round per lane (the rule :func:`plan_health_writes` owns): a record when a
held lane enters ``retrying``/``stalled`` or moves between them or to another reason; while that lasts, rewritten at
most every ``HEALTH_REFRESH_S`` (new attempts and message, and a fresh ``expires_ms``); a tombstone when it copies
again or is dropped. A copying lane costs nothing. A holder that dies leaves its record behind: readers take a
record as live only before its ``expires_ms`` (three refreshes after it was written), and the lane's next holder
writes its own under its own key. Several workers may have a live record of one lane (a former holder killed or
cut off while its lane retried): readers take only the record of the worker the group says holds the lane
(:meth:`mirror_core.model.lane_holders.LaneHolders.live_health`).

Pure except :class:`LaneHealthWriter` (one batched produce through a
:class:`~mirror_core.state.leases.SideRecordProducer`) and :func:`read_health_records` (a read of the store's cache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mirror_core.model.lane_status import RETRYING, STALLED, LaneHealth

HEALTH_REFRESH_S = 30.0  # a record of a lane still retrying/stalled is rewritten this often
HEALTH_EXPIRY_REFRESHES = 3  # a record not rewritten for this many refreshes is taken as left by a dead holder
MESSAGE_CHARS = 500


def health_key(pipeline: str, lane: str, holder: str) -> bytes:
    return json.dumps({"lane_health": [pipeline, lane, holder]}, separators=(",", ":")).encode()


def live_health(health: LaneHealth) -> dict | None:
    """What a health record says of a lane in ``health``'s state: None while it copies (or is halted/retired:
    those are stored with the checkpoint)."""
    if health.state not in (RETRYING, STALLED):
        return None
    return {"state": health.state, "reason": health.reason, "message": (health.message or "")[:MESSAGE_CHARS],
            "attempts": health.attempts, "since_ms": health.since_ms}


def plan_health_writes(current: dict[str, dict], written: dict[str, tuple[dict, int]], now_ms: int, *,
                       refresh_s: float = HEALTH_REFRESH_S) -> tuple[dict[str, dict], list[str]]:
    """(lane → record body to write, lanes to clear) for one writer.

    ``current``: lane → :func:`live_health` of every lane this writer holds that is retrying or stalled now;
    ``written``: lane → (body, written at ms) of the records it wrote and has not cleared. A lane is written when it
    has no record yet or its state or reason changed (at once), or when its record is ``refresh_s`` old (attempts
    and message follow then, at most that often); a record whose lane is no longer in ``current`` is cleared."""
    writes = {}
    for lane, health in current.items():
        before = written.get(lane)
        if before is None or (before[0]["state"], before[0]["reason"]) != (health["state"], health["reason"]) \
                or now_ms - before[1] >= refresh_s * 1000:
            writes[lane] = health
    clears = sorted(lane for lane in written if lane not in current)
    return writes, clears


@dataclass(frozen=True)
class HealthRecord:
    """A lane's health as its holder last wrote it (see the module docstring)."""

    lane: str
    holder: str
    state: str
    reason: str
    message: str
    attempts: int
    since_ms: int | None
    written_ms: int
    expires_ms: int

    def live(self, now_ms: int) -> bool:
        return self.expires_ms > now_ms

    def detail(self, clock) -> str:
        """The page's sentence: what fails, how often, since when (``clock``: ms → text); a lane held up with no
        failure (``attempts`` 0: a source transaction left open) since when it has not moved."""
        if not self.attempts:
            return f"{self.message or 'held up'} (not moving since {clock(self.since_ms)}, reported by {self.holder})"
        return (f"{self.message or 'failing'} (attempt {self.attempts}, failing since {clock(self.since_ms)}, "
                f"reported by {self.holder})")


def record_body(health: dict, holder: str, now_ms: int, *, refresh_s: float = HEALTH_REFRESH_S) -> dict:
    return {**health, "holder": holder, "written_ms": now_ms,
            "expires_ms": now_ms + int(HEALTH_EXPIRY_REFRESHES * refresh_s * 1000)}


def parse_health_records(items, pipeline: str) -> dict[str, HealthRecord]:
    """Lane → the newest health record of ``pipeline`` among ``(key, value)`` items of the checkpoint topic
    (tombstoned keys are absent from a store's items). Newest is not necessarily the holder's: readers that show a
    lane's state use :func:`parse_all_health_records` and take the holder's (see the module docstring)."""
    out: dict[str, HealthRecord] = {}
    for lane, records in parse_all_health_records(items, pipeline).items():
        out[lane] = max(records, key=lambda r: r.written_ms)  # ties: the later key read
    return out


def parse_all_health_records(items, pipeline: str) -> dict[str, list[HealthRecord]]:
    """Lane → every health record of ``pipeline`` (one per writer), in the order read."""
    out: dict[str, list[HealthRecord]] = {}
    for key, value in items:
        if not key.startswith(b'{"lane_health":'):
            continue
        decoded = json.loads(key)["lane_health"]
        if decoded[0] != pipeline or value is None:
            continue
        body = json.loads(value)
        lane = decoded[1]
        out.setdefault(lane, []).append(HealthRecord(lane, body.get("holder", "?"), body.get("state", RETRYING),
                                 body.get("reason", "unknown"), body.get("message") or "", int(body.get("attempts", 0)),
                                 body.get("since_ms"), int(body.get("written_ms", 0)), int(body.get("expires_ms", 0))))
    return out


def read_health_records(store, pipeline: str) -> dict[str, HealthRecord]:
    """Lane → health record of ``pipeline``, from a :class:`~mirror_core.state.checkpoint.CheckpointStore`'s cache."""
    return parse_health_records(store.latest_items(), pipeline)


def read_all_health_records(store, pipeline: str) -> dict[str, list[HealthRecord]]:
    """Lane → every health record of ``pipeline`` (one per writer), from the store's cache."""
    return parse_all_health_records(store.latest_items(), pipeline)


def health_refresh_s(round_interval_s: float) -> float:
    """How often a writer whose records are written once per round of ``round_interval_s`` (the daemon's group
    round, ``lease_ttl_s / 3``) refreshes them: ``HEALTH_REFRESH_S``, or the round when it is longer — a record
    must never expire between two rounds of a holder that is alive (its lane would look healthy to readers while
    it still fails: a silent stall). The expiry follows (``HEALTH_EXPIRY_REFRESHES`` of this)."""
    return max(HEALTH_REFRESH_S, round_interval_s)


class LaneHealthWriter:
    """Writes a daemon's health records, one batch per call (see :func:`plan_health_writes` for when), each
    expiring ``HEALTH_EXPIRY_REFRESHES`` × ``refresh_s`` after it was written (:func:`health_refresh_s`)."""

    def __init__(self, producer, *, refresh_s: float = HEALTH_REFRESH_S):
        self.producer = producer  # a mirror_core.state.leases.SideRecordProducer on the checkpoint topic
        self.refresh_s = refresh_s

    def write(self, pipeline: str, holder: str, writes: dict[str, dict], clears: list[str], now_ms: int) -> None:
        records = [(health_key(pipeline, lane, holder),
                    json.dumps(record_body(health, holder, now_ms, refresh_s=self.refresh_s)).encode(), lane)
                   for lane, health in sorted(writes.items())]
        records += [(health_key(pipeline, lane, holder), None, lane) for lane in clears]
        self.producer.produce(records, what="lane health record(s) of lane(s)", timeout_s=5.0)
