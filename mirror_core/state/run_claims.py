"""One active backfill per pipeline: a claim file per pipeline, ``<claims dir>/<pipeline>.json``, naming the run
that holds it.

Two backfills of one pipeline would fence each other lane by lane (they derive the same transactional.ids), so the
backfill DAG claims its pipeline before it plans and the retention guard claims it before it triggers a run: a second
claimant is refused while the holder is active, and told which run holds it. A claim outlives a crashed run only
until someone asks: the caller says whether the holder is still active (for Airflow, the holder's DAG-run state),
and an inactive holder's claim is taken over.

Invariant: at most one claim file per pipeline; every read-decide-write of a claim happens under an exclusive
``flock`` of the directory's ``.lock`` file, and a claim is written whole (temp file + rename), so two claimants
never both win and no reader sees half a claim. The directory must be
shared by everything that claims (the DAGs' work dir already is: plans and the ledger live there).
"""

from __future__ import annotations

import contextlib
import json
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
        with self._locked():
            held = self.holder(pipeline)
            if held is not None and (held.run_id == run_id or is_active(held.run_id)):
                return held
            mine = Claim(pipeline, run_id, int(time.time() * 1000), by)
            draft = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
            draft.write_text(json.dumps(asdict(mine)))
            draft.replace(path)   # atomic: no reader sees it half-written
            return mine

    @contextlib.contextmanager
    def _locked(self):
        """An exclusive lock on the claims directory for one read-decide-write."""
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def release(self, pipeline: str, run_id: str) -> bool:
        """Drop ``run_id``'s claim (not another run's); True when it was held."""
        with self._locked():
            held = self.holder(pipeline)
            if held is None or held.run_id != run_id:
                return False
            self.path(pipeline).unlink(missing_ok=True)
            return True
