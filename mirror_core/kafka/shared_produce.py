"""Several lanes' writes in the same Produce requests (at-least-once and ``none`` copies, never exactly-once).

A concurrent copy writes its lanes' shares of a fetch round; written one lane after another, each lane's small
batches make Produce requests of their own (one-record batches: one request per record per partition). Here each
lane's share runs as a task on a thread of its own for the round (long-lived worker threads, reused from round to
round until :meth:`SharedProduce.close`), **one task at a time** (a strict hand-off, so the clients, which are
not thread-safe, are only ever used by one thread): a task runs until its writer's :meth:`BatchWriter.write`
*parks* the batches, then the next task runs; once every task has parked or finished, the parked writes go out
together (:func:`mirror_core.kafka.writer.write_together`: one request per broker carries a batch of every lane), and
each parked task resumes with its own base offsets — the lane's copier, checkpoint commit included, then goes on as if
it had written alone.

Invariants: at most one thread runs lane code at any moment (the hub waits while a task runs; a task waits while
the hub or another task runs); each writer has at most one write parked, and a lane's next write is parked only
after its previous one was acknowledged, so per partition the order is the lane's order; a failed shared write
fails every lane that had a write in it (with the same error) — each lane then handles it as a failed write of its
own (nothing acknowledged is lost; at-least-once resumes at its checkpoint). Transactions never share requests
(the broker takes one transactional producer per request): writers inside one write alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from mirror_core.kafka.writer import BatchWriter, OutgoingBatch, ProduceStats, write_together


class _Task:
    __slots__ = ("fn", "worker", "ran", "finished", "result", "error", "parked", "reply", "reply_error")

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.worker: _Worker | None = None  # the thread it runs on (given by the hub for the round)
        self.ran = False  # its worker began running it (set by the worker: only then may it hold lane state)
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.parked: tuple[BatchWriter, Sequence[OutgoingBatch], list[int]] | None = None
        self.reply: list[int] | None = None
        self.reply_error: BaseException | None = None


class _Worker:
    """A long-lived thread running lane tasks (one at a time, when it holds the turn); kept for the copy's run."""

    __slots__ = ("thread", "task", "wake", "stop")

    def __init__(self, lock: threading.Lock):
        self.thread: threading.Thread | None = None
        self.task: _Task | None = None  # the task it runs to its end (bound by the hub before its first turn)
        self.wake = threading.Condition(lock)
        self.stop = False


class SharedProduce:
    """Runs lane tasks one at a time and sends their parked writes together; see the module docstring.

    Attach with :meth:`attach` (sets ``writer.shared``); a write outside :meth:`run` (a lane opening) goes alone.
    The worker threads live until :meth:`close` (one per task of the largest round; they are daemon threads)."""

    def __init__(self):
        self._local = threading.local()
        # One lock guards the hand-off state; the hub waits on ``_hub_wake``, each worker on its own condition.
        # ``_turn`` says who may run: a task (its worker runs lane code) or None (the hub). It is the only truth
        # of the hand-off (no permits to lose): a hub interrupted anywhere (KeyboardInterrupt) finds from it
        # whether a task still runs and waits for exactly that (:meth:`_unwind`).
        self._lock = threading.Lock()
        self._hub_wake = threading.Condition(self._lock)
        self._turn: _Task | None = None
        self._workers: list[_Worker] = []
        self.shared_writes = 0  # writes that went out together with another lane's (counted: tests, benchmarks)
        self.rounds = 0         # shared write rounds
        self.stats = ProduceStats()  # Produce requests of the shared writes and the batches they carried

    def attach(self, writer: BatchWriter) -> None:
        writer.shared = self

    # -- inside a task ---------------------------------------------------------------------------------------

    def write(self, writer: BatchWriter, batches: Sequence[OutgoingBatch]) -> list[int]:
        task: _Task | None = getattr(self._local, "task", None)
        if task is None:  # not a lane task of run(): write alone
            return write_together([(writer, batches, writer.prepare_write(batches))])[0]
        counts = writer.prepare_write(batches)
        with self._lock:
            task.parked = (writer, batches, counts)
            self._turn = None  # hand over: the hub resumes the next task or writes
            self._hub_wake.notify()
            self._local.worker.wake.wait_for(lambda: self._turn is task)  # ... and gives the turn back, answered
            task.parked = None
        if task.reply_error is not None:
            error, task.reply_error = task.reply_error, None
            raise error
        reply, task.reply = task.reply, None
        return reply

    def _serve(self, worker: _Worker) -> None:
        self._local.worker = worker
        while True:
            with self._lock:
                worker.wake.wait_for(lambda: worker.stop or (worker.task is not None and self._turn is worker.task))
                if worker.stop:
                    return
                task = worker.task
                task.ran = True
            self._local.task = task
            try:
                task.result = task.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the hub, which returns it to the caller
                task.error = exc
            finally:
                self._local.task = None
                with self._lock:
                    task.finished = True
                    worker.task = None
                    # not kept while this worker idles until its next task: a lane task holds its share of a fetch
                    # round, a view into the whole fetch answer
                    task = None
                    self._turn = None
                    self._hub_wake.notify()

    # -- the hub (the caller's thread) -----------------------------------------------------------------------

    def run(self, fns: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
        """Run ``fns`` as lane tasks; returns ``(result, error)`` per task, in order. Should the hub fail
        (KeyboardInterrupt, a thread that cannot start), tasks that never ran end with that error without running,
        parked ones get it at their write and run to their end, then it is raised."""
        tasks = [_Task(fn) for fn in fns]
        running = list(tasks)
        try:
            self._grow(len(tasks))
            for task, worker in zip(tasks, self._workers, strict=False):  # the pool may be larger than this round
                task.worker = worker
            while running:
                for task in running:
                    self._resume(task)
                running = [task for task in running if not task.finished]
                if running:
                    self._write(running)
        except BaseException as exc:
            self._unwind(tasks, exc)
            raise
        return [(task.result, task.error) for task in tasks]

    def close(self) -> None:
        """Stop the worker threads (idle between rounds); :meth:`run` may be called again afterwards."""
        with self._lock:
            workers, self._workers = self._workers, []
            for worker in workers:
                worker.stop = True
                worker.wake.notify()
        for worker in workers:
            if worker.thread is not None and worker.thread is not threading.current_thread():
                worker.thread.join()

    def _grow(self, count: int) -> None:
        while len(self._workers) < count:
            worker = _Worker(self._lock)
            worker.thread = threading.Thread(target=self._serve, args=(worker,), daemon=True, name="shoal-lane")
            worker.thread.start()  # may fail (no threads left): run() unwinds, nothing of this round ran yet
            self._workers.append(worker)

    def _resume(self, task: _Task) -> None:
        """Let ``task`` run (on its worker, which keeps it to its end) until it parks a write or finishes: exactly
        one thread runs lane code meanwhile."""
        with self._lock:
            worker = task.worker
            worker.task = task  # a task stays on its worker to its end (it is that thread's stack)
            self._turn = task
            worker.wake.notify()
            self._hub_wake.wait_for(lambda: self._turn is None)

    def _write(self, parked: list[_Task]) -> None:
        self.rounds += 1
        if len(parked) > 1:
            self.shared_writes += len(parked)
        try:
            replies = write_together([task.parked for task in parked], stats=self.stats)
        except Exception as exc:  # noqa: BLE001 - every lane in the shared write fails with it
            for task in parked:
                task.reply_error = exc
            return
        for task, reply in zip(parked, replies, strict=True):
            task.reply = reply

    def _unwind(self, tasks: list[_Task], exc: BaseException) -> None:
        """The hub itself failed (KeyboardInterrupt, a bug, a thread that would not start), possibly in the middle
        of a hand-off: first the task holding the turn (if any) runs to its park or its end; then every started,
        unfinished task gets the error at its parked write and runs to its end (its session aborts as after any
        failed write); a task that never started ends with the error without running (no lane work begins after
        the copy failed)."""
        with self._lock:
            active = self._turn
            if active is not None:  # interrupted mid hand-off: the task has (or will get) the turn; wake it anew
                active.worker.wake.notify()
                self._hub_wake.wait_for(lambda: self._turn is None)
        for task in tasks:
            if task.finished:
                continue
            if not task.ran:  # never got a turn (the turn is the hub's now): ends without running
                with self._lock:
                    if task.worker is not None and task.worker.task is task:
                        task.worker.task = None
                task.error, task.finished = exc, True
                continue
            while not task.finished:
                if task.parked is not None:
                    task.reply_error = exc
                self._resume(task)
