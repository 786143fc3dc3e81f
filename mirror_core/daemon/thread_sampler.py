"""A diagnostic switch: which thread of this process spends CPU, and in what Python code (issue #18).

``python -m mirror_core.daemon --thread-sample <path>`` (``{pid}`` in it becomes the process id) starts
:class:`ThreadSampler`: every ``interval_s`` it reads each thread's CPU time from ``/proc/self/task/<tid>/stat``
and, for every Python thread whose CPU advanced since the previous sample, counts its current stack (innermost
frames). It writes a JSON report to ``<path>`` every few seconds and at stop: CPU seconds per thread *name* (Python
names mapped via ``threading.get_native_id``; native threads, librdkafka's ``rdk:*``, by their ``comm``), threads
seen starting and ending, and the most frequent busy stacks per name. Off by default; it never touches the copy
path. Linux only (``/proc``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_WORKER_SUFFIX = re.compile(r"[-_]\d+$")


def task_cpu(pid: int | None = None) -> dict[int, tuple[str, float]]:
    """tid → (comm, user + system CPU seconds so far) for every thread of ``pid`` (default: this process)."""
    out = {}
    for task in Path(f"/proc/{pid or os.getpid()}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def kind_of(name: str) -> str:
    """A thread name without its worker index: ``shoal-lane-worker-3`` → ``shoal-lane-worker``."""
    return _WORKER_SUFFIX.sub("", name)


class ThreadSampler:
    def __init__(self, path: str | Path, *, interval_s: float = 0.05, depth: int = 6):
        self.path, self.interval_s, self.depth = Path(path), interval_s, depth
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-thread-sampler", daemon=True)
        self.names: dict[int, str] = {}  # tid → name
        self.cpu: dict[int, float] = {}  # tid → last CPU seen
        self.first_cpu: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.ended: set[int] = set()
        self.stacks: dict[str, Counter] = defaultdict(Counter)
        self.t0 = time.monotonic()

    def start(self) -> ThreadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()  # a last look: threads that ended since the previous sample count as ended
        self.write()

    def _run(self) -> None:
        last_write = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.sample()
            if time.monotonic() - last_write > 5:  # a process killed without a stop still leaves a report
                self.write()
                last_write = time.monotonic()

    def sample(self) -> None:
        by_tid = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
        frames = sys._current_frames()
        now = time.monotonic() - self.t0
        seen = task_cpu()
        for tid, (comm, spent) in seen.items():
            thread = by_tid.get(tid)
            name = thread.name if thread is not None else comm
            if tid not in self.names:
                self.names[tid], self.first_cpu[tid], self.started_at[tid] = name, spent, now
            elif thread is not None and self.names[tid] != name:
                # first seen by its comm: a thread is in /proc a moment before threading knows it by name
                self.names[tid] = name
            busy = spent > self.cpu.get(tid, self.first_cpu[tid])
            self.cpu[tid] = spent
            if busy and thread is not None and thread.ident in frames:
                self.stacks[kind_of(name)][self._stack(frames[thread.ident])] += 1
        self.ended |= set(self.names) - set(seen)

    def _stack(self, frame) -> str:
        parts = []
        while frame is not None and len(parts) < self.depth:
            code = frame.f_code
            parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno}:{code.co_name}")
            frame = frame.f_back
        return " < ".join(parts)

    def report(self) -> dict:
        by_kind: dict[str, dict] = defaultdict(lambda: {"threads": 0, "ended": 0, "cpu_s": 0.0})
        for tid, name in self.names.items():
            entry = by_kind[kind_of(name)]
            entry["threads"] += 1
            entry["ended"] += tid in self.ended
            entry["cpu_s"] = round(entry["cpu_s"] + self.cpu[tid] - self.first_cpu[tid], 2)
        return {"window_s": round(time.monotonic() - self.t0, 1),
                "by_thread_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"])),
                "busy_stacks": {k: c.most_common(8) for k, c in self.stacks.items()}}

    def write(self) -> None:
        self.path.write_text(json.dumps(self.report(), indent=1))


def start(path: str) -> ThreadSampler:
    """A started sampler reporting to ``path`` (``{pid}`` in it: this process's id)."""
    return ThreadSampler(path.replace("{pid}", str(os.getpid()))).start()
