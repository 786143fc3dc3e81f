"""When a lane commits, and how long its transaction and its writer's retries may last: the commit bounds a
pipeline file, ``shoal copy`` and a backfill set, validated together where they are built.

The relation the bounds keep (``TRANSACTION_RETRY_SHARE``) is also what the writer enforces on the wire
(:class:`~mirror_core.kafka.writer.BatchWriter` gives up a retried write inside a transaction after that share of
the transaction timeout), so both read it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mirror_core.errors import ConfigError

# Inside a transaction, writes are retried for at most this share of transaction.timeout.ms from its begin: the rest
# is left for the commit, so a retried write ends as a retriable error before the coordinator aborts under it.
TRANSACTION_RETRY_SHARE = 0.5


@dataclass(frozen=True)
class CommitPolicy:
    """When a lane commits, and how long a transaction and the writer's retries may last.

    Invariant: ``commit_interval_ms + write_retry_s`` fit in ``TRANSACTION_RETRY_SHARE`` of
    ``transaction_timeout_ms``, so a window that keeps retrying gives up (retriable) before the coordinator
    aborts its transaction, and the rest of the timeout is left for the commit."""

    commit_bytes: int = 4 * 1024 * 1024
    commit_interval_ms: int = 1000
    transaction_timeout_ms: int | None = None  # None: 60 s, or longer when the commit interval needs it
    write_retry_s: float = 25.0
    # at-least-once: how often a lane renews its broker fence (see LaneSession.renew_fence_if_due)
    refence_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.commit_bytes <= 0 or self.commit_interval_ms <= 0:
            raise ConfigError("commit bytes and interval must be positive")
        if self.transaction_timeout_ms is None:
            needed = math.ceil((self.commit_interval_ms + self.write_retry_s * 1000) / TRANSACTION_RETRY_SHARE)
            object.__setattr__(self, "transaction_timeout_ms", max(60_000, needed))
        if self.write_retry_s <= 0 or self.transaction_timeout_ms <= 0:
            raise ConfigError("write_retry_s and transaction_timeout_ms must be positive")
        budget_ms = self.transaction_timeout_ms * TRANSACTION_RETRY_SHARE
        if self.commit_interval_ms + self.write_retry_s * 1000 > budget_ms:
            raise ConfigError(
                f"commit_interval_ms ({self.commit_interval_ms}) + write_retry_s ({self.write_retry_s:g} s) must fit "
                f"in {TRANSACTION_RETRY_SHARE:g} of transaction_timeout_ms ({self.transaction_timeout_ms}), i.e. "
                f"{budget_ms:g} ms: otherwise the coordinator aborts a transaction whose writes are still retried")
