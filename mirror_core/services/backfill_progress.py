"""Progress of a running backfill, seen from the Spark driver: per lane the offset reached, ~records and ~bytes
copied, the rate and an ETA, printed every few seconds while the lanes copy.

Why the driver polls checkpoints: on a cluster an executor's output stays on its worker and accumulators merge only
when a task ends, but every lane commits its checkpoint (position after the last copied batch) to the target every
``commit_bytes`` / ``commit_interval_ms``. :class:`BackfillProgress` keeps those positions and turns them into
lines (pure); :class:`ProgressReporter` is the driver thread that reads them through one
:class:`~mirror_core.state.checkpoint.CheckpointStore` (whose caches refresh incrementally) and prints.

Offsets count control markers and aborted records too, so "records" is approximate (marked ``~``); bytes are the
plan's estimate pro rata. A unit the driver has seen finish is reported by its ledger row, not here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

RATE_WINDOW_S = 30.0   # the rate is measured over the last half minute of samples
MAX_LANE_LINES = 20    # per tick, lanes that moved are listed up to this many; the summary line covers the rest


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


@dataclass
class LaneProgress:
    """One unit's progress. Invariant: ``samples`` hold (monotonic time, position) with positions never falling."""

    unit_id: str
    lane: str
    topic: str
    partition: int
    start: int
    end: int
    bytes_estimate: int
    samples: deque = field(default_factory=lambda: deque(maxlen=256))
    finished: bool = False

    def observe(self, at: float, position: int) -> bool:
        """Record a checkpoint position; True when it moved since the last sample."""
        position = min(max(position, self.start), self.end)
        moved = not self.samples or position > self.samples[-1][1]
        if self.samples and position < self.samples[-1][1]:
            return False   # an older checkpoint read late: positions never fall
        self.samples.append((at, position))
        while len(self.samples) > 2 and at - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        return moved

    @property
    def position(self) -> int:
        return self.samples[-1][1] if self.samples else self.start

    @property
    def done_offsets(self) -> int:
        return self.position - self.start

    @property
    def fraction(self) -> float:
        span = self.end - self.start
        return 1.0 if span <= 0 else self.done_offsets / span

    def rate(self) -> float | None:
        """Offsets per second over the window (None until two samples apart in time)."""
        if len(self.samples) < 2 or self.samples[-1][0] <= self.samples[0][0]:
            return None
        (t0, p0), (t1, p1) = self.samples[0], self.samples[-1]
        return (p1 - p0) / (t1 - t0)

    def eta_s(self) -> float | None:
        rate = self.rate()
        remaining = self.end - self.position
        if remaining <= 0:
            return 0.0
        return None if not rate else remaining / rate

    def line(self) -> str:
        rate = self.rate()
        bytes_per_offset = self.bytes_estimate / max(1, self.end - self.start)
        speed = "rate unknown" if rate is None else (f"{rate:,.0f} offsets/s, "
                                                     f"~{rate * bytes_per_offset / 1e6:.2f} MB/s")
        return (f"progress {self.unit_id} lane {self.lane}: offset {self.position} of [{self.start}, {self.end}) "
                f"{self.fraction:.1%}, ~{self.done_offsets:,} records, ~{self.fraction * self.bytes_estimate / 1e6:.1f}"
                f" MB; {speed}; ETA {format_eta(self.eta_s())}")


class BackfillProgress:
    """Every unit of a run, fed with checkpoint positions; renders the lines one tick prints."""

    def __init__(self, run_id: str, units: Iterable[Mapping]):
        self.run_id = run_id
        self.lanes = {u["unit_id"]: LaneProgress(u["unit_id"], u["lane"], u["topic"], u["partition"], u["start"],
                                                  u["end"], int(u.get("bytes_estimate") or 0)) for u in units}
        self.by_partition = {(p.topic, p.partition): p for p in self.lanes.values()}
        self.started = time.monotonic()

    def finish(self, unit_id: str) -> None:
        if unit_id in self.lanes:
            self.lanes[unit_id].finished = True

    def observe(self, positions: Mapping[tuple[str, int], int], at: float) -> list[LaneProgress]:
        """Positions by (source topic, partition); returns the running units that moved."""
        moved = []
        for tp, position in positions.items():
            lane = self.by_partition.get(tp)
            if lane is not None and not lane.finished and lane.observe(at, position):
                moved.append(lane)
        return moved

    def summary(self) -> str:
        lanes = list(self.lanes.values())
        done = sum(1 for p in lanes if p.finished)
        total = sum(p.end - p.start for p in lanes)
        reached = sum(p.end - p.start if p.finished else p.done_offsets for p in lanes)
        rates = [r for p in lanes if not p.finished and (r := p.rate()) is not None]
        rate = sum(rates) if rates else None
        eta = None if not rate else (total - reached) / rate
        return (f"progress run {self.run_id}: {done}/{len(lanes)} units ended, {reached:,} of {total:,} offsets "
                f"({(reached / total if total else 1):.1%}), "
                + ("rate unknown" if rate is None else f"{rate:,.0f} offsets/s") + f", ETA {format_eta(eta)}")

    def tick(self, positions: Mapping[tuple[str, int], int], at: float) -> list[str]:
        moved = self.observe(positions, at)
        return [p.line() for p in moved[:MAX_LANE_LINES]] + [self.summary()]


class ProgressReporter:
    """Driver thread: every ``interval_s`` read the run's checkpoints on the target and print the progress lines.
    A failed read is printed and retried at the next tick; it never stops the backfill."""

    def __init__(self, progress: BackfillProgress, read_positions: Callable[[], Mapping[tuple[str, int], int]], *,
                 interval_s: float = 5.0, emit: Callable[[str], None] = print):
        self.progress, self.read_positions = progress, read_positions
        self.interval_s, self.emit = interval_s, emit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-backfill-progress", daemon=True)

    def start(self) -> ProgressReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                lines = self.progress.tick(self.read_positions(), time.monotonic())
            except Exception as exc:  # noqa: BLE001 - progress is best effort; the copy goes on
                lines = [f"progress: checkpoints not read ({type(exc).__name__}: {exc}); retrying"]
            for line in lines:
                self.emit(line)


def checkpoint_reader(target, pipeline: str) -> Callable[[], dict[tuple[str, int], int]]:
    """A function returning the pipeline's checkpoint positions by (source topic, partition), reading through one
    long-lived checkpoint store (opened lazily, in the reporter's thread)."""
    from mirror_core.config.names import CHECKPOINT_TOPIC
    from mirror_core.kafka.wire_client import WireClient
    from mirror_core.state.checkpoint import CheckpointStore

    state: dict = {}

    def read() -> dict[tuple[str, int], int]:
        if "store" not in state:
            client = WireClient.for_cluster(target)
            meta = client.metadata([CHECKPOINT_TOPIC]).get(CHECKPOINT_TOPIC)
            if meta is None or meta.error_code:
                client.close()
                return {}
            state["store"] = CheckpointStore(target, client, partitions=len(meta.partitions))
        return {(t, p): cp.position for (_pl, t, p), cp in state["store"].read_all(pipeline,
                                                                                    whole_maps=False).items()}
    return read
