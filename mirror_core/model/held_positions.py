"""The held lanes' committed positions, kept by events, for the retention watch (issue #18: no walk per round).

The copy loop (the daemon's main thread) tells :class:`HeldPositions` what each lane's news said — a committed
position and whether that position reached the high watermark the fetch round saw — and when a lane leaves; the
retention watch (its own thread, :mod:`mirror_core.daemon.retention_watch`) takes a snapshot at each assessment.
Nothing here walks the held lanes: a lane without news since its last report keeps the position and verdict it had.

A lane is **caught up** when its committed position is at (or past) the high watermark of the partition as the last
fetch answer that named it reported. The standing fetch round names a partition in its answer whenever its high
watermark or log start moves (KIP-227's rule; a full request after a session error names all), so "no news since"
means that high watermark still holds: the source has nothing the mirror has not copied, and retention (which deletes
only below the high watermark) can delete nothing unmirrored there. Every other lane is **behind** — something
unmirrored, or not known: a lane just opened (no answer yet), one whose fetch or copy failed, one whose fetcher was
dropped, one reset. The caller marks a lane behind on each of those events (:meth:`HeldPositions.behind`), so a lane
that falls behind is behind at the next assessment.

A lane held but never opened by this process, with no checkpoint known here (its open keeps failing: the target's
coordinator down, its fence refused), is behind **from the log start** (position None in ``_behind``: the assessment
takes the partition's log start, everything there unmirrored): it would copy from there (``new_partitions:
earliest``), so that is what retention can take from it, and an operator is told before it does — instead of the lane
being left out of every assessment until it first opens.

Invariants (the state lives here, under ``_lock``): a lane is in at most one of ``_behind`` and ``_caught``; a
position in ``_caught`` is never None; ``version`` moves with every change.
"""

from __future__ import annotations

import threading

TopicPartition = tuple[str, int]


class HeldPositions:
    """(topic, partition) → committed position of every held lane whose position is known: the caught-up ones and
    the ones behind, in two maps (a lane is in at most one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._behind: dict[TopicPartition, int | None] = {}
        self._caught: dict[TopicPartition, int] = {}
        self.version = 0

    def caught_up(self, tp: TopicPartition, position: int, high_watermark: int | None) -> None:
        """A fetch answer named the lane (or its share was committed): ``position`` is committed, and the answer's
        ``high_watermark`` was the partition's. Caught up when the position reached it; behind otherwise."""
        if high_watermark is None or high_watermark < 0 or position < high_watermark:
            self.behind(tp, position)
            return
        with self._lock:
            if self._caught.get(tp) == position:
                return
            self._behind.pop(tp, None)
            self._caught[tp] = position
            self.version += 1

    def behind(self, tp: TopicPartition, position: int | None = None) -> None:
        """The lane may have something unmirrored (or it is not known): assessed by the next assessment, at
        ``position`` (None: the position last reported stays; a lane with none stays out)."""
        with self._lock:
            if position is None:
                position = self._caught.get(tp)
                if position is None:  # behind already, or unknown
                    return
            elif self._behind.get(tp) == position:
                return
            self._caught.pop(tp, None)
            self._behind[tp] = position
            self.version += 1

    def behind_from_log_start(self, tp: TopicPartition) -> None:
        """The lane's position is not known here (never opened by this process, no checkpoint read) and it would
        start at the log start: assessed from there. A known position, if any, is kept."""
        with self._lock:
            if tp in self._behind or tp in self._caught:
                return
            self._behind[tp] = None
            self.version += 1

    def forget(self, tp: TopicPartition) -> None:
        """The lane is not held any more (dropped, halted): not assessed by this process."""
        with self._lock:
            # membership, not the value: a lane assessed from the log start has None in ``_behind``
            if tp in self._behind or tp in self._caught:
                self._behind.pop(tp, None)
                self._caught.pop(tp, None)
                self.version += 1

    def is_caught_up(self, tp: TopicPartition) -> bool:
        with self._lock:
            return tp in self._caught

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._behind.get(tp, self._caught.get(tp))

    def all(self) -> dict[TopicPartition, int]:
        """Every known position (caught up or not)."""
        with self._lock:
            return {**self._behind, **self._caught}

    def caught_up_lanes(self) -> list[TopicPartition]:
        """The caught-up partitions (for the daemon's audit on the rescan cadence)."""
        with self._lock:
            return list(self._caught)

    def snapshot(self) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """(positions of the lanes behind, positions of the caught-up ones): copies taken under the lock (C-speed
        dictionary copies, once per assessment: no walk in Python)."""
        with self._lock:
            return dict(self._behind), dict(self._caught)

    def replace(self, positions: dict[TopicPartition, int]) -> None:
        """Every position at once, none known to be caught up (the watch's ``publish`` of a whole map)."""
        with self._lock:
            self._behind, self._caught = dict(positions), {}
            self.version += 1
