"""The daemon's structured log lines, shared by its loop and its watch threads."""

from __future__ import annotations

import logging

log = logging.getLogger("shoal.daemon")


def event(name: str, level: int = logging.INFO, *, exc_info: bool | BaseException = False, **fields) -> None:
    """One structured log line: ``event=<name> key=value ...`` (topic, partition and offsets wherever they apply)."""
    log.log(level, "event=%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()), exc_info=exc_info)
