"""Thin PySpark entry points: parse the JSON spec, build the session, map work units to tasks, set the exit code.
The copy itself is ``mirror_core`` code running inside the tasks (docs/architecture.md)."""
