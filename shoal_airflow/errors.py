"""Mapping Shoal's errors onto Airflow's retry semantics: a non-retriable :class:`~mirror_core.errors.MirrorError`
(bad input, data loss, a refused preflight, a fenced writer) fails the task at once, without retries; a retriable one
(a cluster or partition briefly unavailable) is an ordinary failure that Airflow retries."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from airflow.sdk.exceptions import AirflowException, AirflowFailException


@contextlib.contextmanager
def airflow_errors() -> Iterator[None]:
    """Run a block of Shoal calls; re-raise its MirrorErrors as Airflow expects (message kept, secrets never in it)."""
    from mirror_core.errors import MirrorError

    try:
        yield
    except MirrorError as exc:
        if getattr(exc, "retriable", False):
            raise AirflowException(f"{type(exc).__name__} (retriable): {exc}") from exc
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
