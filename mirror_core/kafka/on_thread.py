"""Work started on a thread of its own while the caller goes on (a probe, a connection's set-up over a long link):
its result or error in a :class:`~concurrent.futures.Future`. The thread is a daemon thread, so a process that fails
or ends meanwhile neither waits for it nor is kept alive by it (an executor's worker would be joined at exit)."""

from __future__ import annotations

import threading
from concurrent.futures import Future


def on_thread(fn, *args, name: str = "shoal-background", **kwargs) -> Future:
    """``fn(*args, **kwargs)`` on a daemon thread named ``name``; the future holds its result or its error. Raises
    RuntimeError when no thread can be started."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the future
                future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
