"""A bounded pool of lane workers, so the daemon's lanes open and commit side by side instead of in turn.

Why: one lane's share of a fetch round costs several target round trips in series (AddPartitionsToTxn, Produce of
the data, the target topic-id check, AddPartitionsToTxn and Produce of the checkpoint, EndTxn). Done lane after
lane, 50 busy lanes at a 20 ms target round trip wait seconds per round. Each worker thread here runs its own
lanes' steps, so the round trips of different lanes overlap; a lane's own steps stay in order.

Invariants (where the state lives):

- A lane is bound to one worker while the caller holds it (:meth:`LaneWorkerPool.worker_for`: the least loaded
  at first sight, then always the same, until :meth:`LaneWorkerPool.release`). Everything a lane's session does on
  the wire (its writer with the lane's transactional.id and producer state, its checkpoint reads, its landing
  checks) runs on that worker's thread, with that worker's own clients
  (:class:`~mirror_core.kafka.wire_client.WireClient`
  is one client per thread). The caller hands a lane's objects over with a task and takes them back with the
  task's result (the queue is the happens-before edge); it never uses a worker's clients itself.
- :meth:`LaneWorkerPool.run` returns when every task it was given has finished; a task's exception is its own
  result, never another task's. The pool holds nothing across calls, so memory stays what the tasks carry (a
  round's shares, already fetched).
- Workers are daemon threads: a forced shutdown (the grace period's alarm, raised on the main thread while it
  waits here) does not wait for them; their open transactions are aborted by the broker, as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TICK_S = 0.2  # how often run() wakes to call its tick (lease renewal) while the workers work


@dataclass
class LaneClients:
    """One worker's own connections: the lanes it runs use only these."""

    source: Any
    target: Any
    store: Any

    def close(self) -> None:
        for client in (self.source, self.target):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing a lane worker's client failed", exc_info=True)


@dataclass
class TaskOutcome:
    """What one task gave back: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_STOP = object()


class _Worker:
    def __init__(self, index: int, make_clients: Callable[[], LaneClients]):
        self.index = index
        self.make_clients = make_clients
        self.clients: LaneClients | None = None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.lanes = 0
        self.thread = threading.Thread(target=self._loop, name=f"shoal-lane-worker-{index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.inbox.get()
            if item is _STOP:
                break
            task, slot, outcomes, done = item
            try:
                if self.clients is None:  # made here, on the thread that uses them; if making them failed,
                    self.clients = self.make_clients()  # again with the next task (a task's failure keeps them)
                outcomes[slot] = TaskOutcome(value=task(self.clients))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller, who classifies it
                outcomes[slot] = TaskOutcome(error=exc)
            finally:
                # nothing of this task stays with the worker while it waits for the next one: a lane task carries
                # a view into a whole fetch answer, and a worker keeping its last task kept that answer alive until
                # the lane's next share (one answer per worker, rounds apart, when rounds rotate over partitions)
                item = task = outcomes = None
                done.put(slot)
        if self.clients is not None:
            self.clients.close()


class LaneWorkerPool:
    """``size`` worker threads; :meth:`run` runs a batch of per-lane tasks, each on its lane's worker."""

    def __init__(self, size: int, make_clients: Callable[[], LaneClients]):
        if size < 1:
            raise ValueError("a lane worker pool needs at least one worker")
        self._make_clients = make_clients
        self._workers: list[_Worker] = []
        self._size = size
        self._lanes: dict[str, _Worker] = {}
        self.running: frozenset[str] = frozenset()  # the lanes of the batch :meth:`run` is running (else empty)

    @property
    def size(self) -> int:
        return self._size

    def worker_for(self, lane: str) -> int:
        """The index of the worker that runs ``lane`` (fixed at first sight)."""
        worker = self._lanes.get(lane)
        if worker is None:
            if len(self._workers) < self._size:  # threads are started as lanes need them
                self._workers.append(_Worker(len(self._workers), self._make_clients))
            worker = min(self._workers, key=lambda w: (w.lanes, w.index))
            worker.lanes += 1
            self._lanes[lane] = worker
        return worker.index

    def release(self, lane: str) -> None:
        """The caller gave ``lane`` up (its session is gone): its worker's load drops, and the lane is bound anew
        at its next task, to the least loaded worker then — so lanes do not skew across workers as they move
        between daemons. Safe from a run's tick too: :meth:`run` queues all its tasks before it first ticks and
        returns only when they all finished, so a lane's tasks never run on two workers at once."""
        worker = self._lanes.pop(lane, None)
        if worker is not None:
            worker.lanes -= 1

    def run(self, tasks: Sequence[tuple[str, Callable[[LaneClients], Any]]], *,
            tick: Callable[[], object] | None = None) -> list[TaskOutcome]:
        """Run ``(lane, task)`` pairs, each ``task(clients)`` on its lane's worker, and return their outcomes in the
        given order once all have finished. Tasks of one lane run in the given order; of different lanes, side by
        side. ``tick`` is called on the calling thread every ``TICK_S`` while it waits (lease renewal)."""
        outcomes: list[TaskOutcome | None] = [None] * len(tasks)
        done: queue.SimpleQueue = queue.SimpleQueue()
        for slot, (lane, task) in enumerate(tasks):
            self._workers[self.worker_for(lane)].inbox.put((task, slot, outcomes, done))
        left = len(tasks)
        self.running = frozenset(lane for lane, _task in tasks)
        try:
            while left:
                try:
                    done.get(timeout=TICK_S)
                    left -= 1
                except queue.Empty:
                    pass
                if tick is not None:
                    tick()
        finally:
            self.running = frozenset()
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        """Ask every worker to close its clients and end after its current task; does not wait for them."""
        for worker in self._workers:
            worker.inbox.put(_STOP)
        self._workers = []
        self._lanes.clear()
