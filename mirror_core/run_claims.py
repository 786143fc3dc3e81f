"""One active backfill per pipeline: a claim file per pipeline, ``<claims dir>/<pipeline>.json``, naming the run
that holds it.

Two backfills of one pipeline would fence each other lane by lane (they derive the same transactional.ids), so the
backfill DAG claims its pipeline before it plans and the retention guard claims it before it triggers a run: a second
claimant is refused while the holder is active, and told which run holds it. A claim outlives a crashed run only
until someone asks: the caller says whether the holder is still active (for Airflow, the holder's DAG-run state),
and an inactive holder's claim is taken over.

Invariant: at most one claim file per pipeline, created with ``O_EXCL`` (an atomic create); a stale one is moved
aside with an atomic rename before the create is retried, so two claimants never both win. The directory must be
shared by everything that claims (the DAGs' work dir already is: plans and the ledger live there).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mirror_core.errors import ConfigError


@dataclass(frozen=True)
class Claim:
    pipeline: str
    run_id: str
    claimed_ms: int
    by: str = ""   # who claimed it: "shoal_backfill", "shoal_retention_guard", ...


class PipelineClaims:
    """Claims of pipelines under one directory (see the module docstring)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, pipeline: str) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", pipeline or ""):
            raise ConfigError(f"pipeline name {pipeline!r} cannot name a claim file")
        return self.directory / f"{pipeline}.json"

    def holder(self, pipeline: str) -> Claim | None:
        try:
            return Claim(**json.loads(self.path(pipeline).read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            return Claim(pipeline, "<unreadable claim>", 0)

    def claim(self, pipeline: str, run_id: str, *, is_active: Callable[[str], bool], by: str = "") -> Claim:
        """Claim ``pipeline`` for ``run_id``; returns the holder afterwards — ``run_id``'s own claim when it won (or
        already held it), else the active run that holds it."""
        path = self.path(pipeline)
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            mine = Claim(pipeline, run_id, int(time.time() * 1000), by)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = self.holder(pipeline)
                if held is None:
                    continue   # released meanwhile
                if held.run_id == run_id:
                    return held
                if is_active(held.run_id):
                    return held
                with contextlib.suppress(FileNotFoundError):   # stale: moved aside atomically, then race again
                    path.rename(path.with_name(f".{path.name}.stale-{uuid.uuid4().hex[:8]}"))
                continue
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(asdict(mine)))
            return mine
        raise ConfigError(f"pipeline {pipeline!r}: could not settle the claim in {path} (contended)")

    def release(self, pipeline: str, run_id: str) -> bool:
        """Drop ``run_id``'s claim (not another run's); True when it was held."""
        held = self.holder(pipeline)
        if held is None or held.run_id != run_id:
            return False
        self.path(pipeline).unlink(missing_ok=True)
        return True
