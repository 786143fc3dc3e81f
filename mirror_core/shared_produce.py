"""Several lanes' writes in the same Produce requests (at-least-once and ``none`` copies, never exactly-once).

A concurrent copy writes its lanes' shares of a fetch round; written one lane after another, each lane's small
batches make Produce requests of their own (one-record batches: one request per record per partition). Here each
lane's share runs as a task in its own thread, **one task at a time** (a strict hand-off, so the clients, which are
not thread-safe, are only ever used by one thread): a task runs until its writer's :meth:`BatchWriter.write`
*parks* the batches, then the next task runs; once every task has parked or finished, the parked writes go out
together (:func:`mirror_core.writer.write_together`: one request per broker carries a batch of every lane), and each
parked task resumes with its own base offsets — the lane's copier, checkpoint commit included, then goes on as if
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

from mirror_core.writer import BatchWriter, OutgoingBatch, ProduceStats, write_together


class _Task:
    __slots__ = ("fn", "go", "finished", "result", "error", "parked", "reply", "reply_error", "thread")

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.go = threading.Semaphore(0)
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.parked: tuple[BatchWriter, Sequence[OutgoingBatch], list[int]] | None = None
        self.reply: list[int] | None = None
        self.reply_error: BaseException | None = None
        self.thread: threading.Thread | None = None


class SharedProduce:
    """Runs lane tasks one at a time and sends their parked writes together; see the module docstring.

    Attach with :meth:`attach` (sets ``writer.shared``); a write outside :meth:`run` (a lane opening) goes alone."""

    def __init__(self):
        self._local = threading.local()
        self._hub = threading.Semaphore(0)
        self._active: _Task | None = None  # the task running now (the hub waits for it to park or finish)
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
        task.parked = (writer, batches, counts)
        self._hub.release()   # hand over: the hub resumes the next task or writes
        task.go.acquire()     # ... and wakes us with the answer
        task.parked = None
        if task.reply_error is not None:
            error, task.reply_error = task.reply_error, None
            raise error
        reply, task.reply = task.reply, None
        return reply

    def _body(self, task: _Task) -> None:
        task.go.acquire()
        self._local.task = task
        try:
            task.result = task.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the hub, which re-raises it in the caller
            task.error = exc
        finally:
            task.finished = True
            self._hub.release()

    # -- the hub (the caller's thread) -----------------------------------------------------------------------

    def run(self, fns: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
        """Run ``fns`` as lane tasks; returns ``(result, error)`` per task, in order."""
        tasks = [_Task(fn) for fn in fns]
        for task in tasks:
            task.thread = threading.Thread(target=self._body, args=(task,), daemon=True, name="shoal-lane")
            task.thread.start()
        running = list(tasks)
        try:
            while running:
                for task in running:
                    self._resume(task)
                running = [task for task in running if not task.finished]
                if running:
                    self._write(running)
        except BaseException as exc:
            self._unwind(running, exc)
            raise
        for task in tasks:
            task.thread.join()
        return [(task.result, task.error) for task in tasks]

    def _resume(self, task: _Task) -> None:
        """Let ``task`` run until it parks a write or finishes (exactly one thread runs lane code meanwhile)."""
        self._active = task
        task.go.release()
        self._hub.acquire()
        self._active = None

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

    def _unwind(self, running: list[_Task], exc: BaseException) -> None:
        """The hub itself failed (KeyboardInterrupt, a bug): every unfinished task gets the error at its parked
        write and runs to its end (its session aborts as after any failed write)."""
        if self._active is not None:  # interrupted while a task ran: let it reach its park or its end first
            self._hub.acquire()
            self._active = None
        for task in running:
            while not task.finished:
                if task.parked is not None:
                    task.reply_error = exc
                self._resume(task)
