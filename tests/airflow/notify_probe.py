"""A notifier for tests: appends what it was told to a file (configured as the Shoal failure notifier)."""

from __future__ import annotations

import json


def record(context, *, path: str) -> None:
    ti = context["ti"]
    with open(path, "a") as out:
        out.write(json.dumps({"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": context["run_id"]}) + "\n")
