"""Which held lanes a daemon round must look at to open (issue #18: a round costs what changed, not what is held).

The daemon's round used to walk — and sort — every held lane to find those needing a session or a fetcher. Here the
lanes to look at are kept instead: a lane is *touched* wherever its standing can change (acquired, dropped, reset,
halted, resumed, given a retry time), and a lane waiting for its retry time is kept in a heap keyed by that time, so
it is looked at again when the time comes even if nothing else happens. What the round finds open and fetching goes
to ``ready`` (insertion ordered), which the round fetches; a touched lane leaves ``ready`` until it is looked at again.

Invariant (DESIGN §3: a lane that should copy is never silently left unopened): every held lane that is not halted
is in ``ready``, touched (``due``) or waiting (``waiting``). :func:`audit` checks that against the lanes themselves
every audit period (the daemon's ``AUDIT_MAX_S``) and touches (repairs) any lane that is not — the caller logs it:
never a silent stall."""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class LaneOpenings:
    """The books of which lanes to (re)consider opening. Main thread only."""

    def __init__(self) -> None:
        self.ready: dict[str, object] = {}  # lane → its state: held, open (session and fetcher), not backing off
        self._due: set[str] = set()  # touched since the last take
        self._waiting: dict[str, float] = {}  # lane → the retry time it waits for (monotonic)
        self._heap: list[tuple[float, str]] = []  # (retry time, lane); entries not matching _waiting are stale
        self.version = 0  # moves whenever ``ready`` may have changed (a caller's list built from it is then stale)

    def set_ready(self, lane: str, state: object) -> None:
        """The lane is held, open and not backing off: fetched by the rounds until it is touched again."""
        self.ready[lane] = state
        self.version += 1

    def touch(self, lane: str) -> None:
        """The lane's standing may have changed: it leaves ``ready`` and is looked at by the next :meth:`take`."""
        self.ready.pop(lane, None)
        self._waiting.pop(lane, None)
        self._due.add(lane)
        self.version += 1

    def wait(self, lane: str, at: float) -> None:
        """The lane backs off until ``at``: looked at by the first :meth:`take` at or after it."""
        self.ready.pop(lane, None)
        self._due.discard(lane)
        self._waiting[lane] = at
        self.version += 1
        heapq.heappush(self._heap, (at, lane))

    def take(self, now: float) -> list[str]:
        """The lanes to look at now — touched, or whose retry time has come — forgotten here until the caller puts
        each back (``ready``, :meth:`wait`) or something touches it again. Sorted (a stable order to open in)."""
        heap, waiting = self._heap, self._waiting
        while heap and heap[0][0] <= now:
            at, lane = heapq.heappop(heap)
            if waiting.get(lane) == at:
                del waiting[lane]
                self._due.add(lane)
        if not self._due:
            return []
        due, self._due = self._due, set()
        return sorted(due)

    def queued(self, lane: str) -> bool:
        return lane in self._due or lane in self._waiting or lane in self.ready

    def __len__(self) -> int:  # lanes accounted for (ready, touched or waiting)
        return len(self.ready) + len(self._due) + len(self._waiting)


def audit(openings: LaneOpenings, held: Iterable[str], lanes: dict, now: float) -> list[str]:
    """Compare the books with the lanes (O(held), every audit period): a held, not halted lane that is in none
    of ready/touched/waiting, or in ``ready`` without a session and fetcher or before its retry time, or a lane in
    ``ready`` not held — each touched (repaired: looked at by the next round). Returns the repaired lanes, sorted.
    The ready lanes (an idle daemon's every lane) are checked in one pass over ``ready``; the others are the held
    set's difference with it, taken in C."""
    held = held if isinstance(held, (set, frozenset)) else set(held)
    ready = openings.ready
    wrong = []
    for lane in ready:
        state = lanes.get(lane) if lane in held else None
        if state is None or state.health.stopped or state.session is None or state.fetcher is None \
                or now < state.retry_at:
            wrong.append(lane)
    for lane in held - ready.keys():
        state = lanes.get(lane)
        if state is not None and not state.health.stopped and not openings.queued(lane):
            wrong.append(lane)
    for lane in wrong:
        openings.touch(lane)
    return sorted(wrong)


class HeldLanes(set):
    """The daemon's held lanes: a set that touches a lane in its :class:`LaneOpenings` whenever it is added or
    removed, so no acquisition or drop can be missed by the openings' books."""

    def __init__(self, lanes: Iterable[str] = (), *, on_change: Callable[[str], None]) -> None:
        super().__init__(lanes)
        self._on_change = on_change
        for lane in self:
            on_change(lane)

    def add(self, lane: str) -> None:
        if lane not in self:
            super().add(lane)
            self._on_change(lane)

    def discard(self, lane: str) -> None:
        if lane in self:
            super().discard(lane)
            self._on_change(lane)

    def remove(self, lane: str) -> None:
        super().remove(lane)
        self._on_change(lane)

    def clear(self) -> None:
        lanes = list(self)
        super().clear()
        for lane in lanes:
            self._on_change(lane)
