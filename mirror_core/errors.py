"""Shoal's error hierarchy.

One root, :class:`MirrorError`, with a ``retriable`` attribute: operators and the CLI map non-retriable errors to an
immediate failure and retriable ones to retries. Errors that describe a situation carry that situation as fields
and print one sentence an operator can act on, naming cluster, topic, partition and offsets wherever they apply.
"""

from __future__ import annotations


class MirrorError(Exception):
    """Root of every error Shoal raises on purpose."""

    retriable: bool = False


class ConfigError(MirrorError):
    """Invalid configuration or arguments given by the user; the message names the offending item."""


class SandboxError(MirrorError):
    """The local Kafka sandbox could not be resolved, started or stopped."""


class ClusterUnavailableError(MirrorError):
    """A cluster did not answer (connection refused, authentication failed, timeout)."""

    def __init__(self, cluster: str, bootstrap: str, reason: str, *, retriable: bool = True):
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.reason = reason
        self.retriable = retriable
        super().__init__(f"cluster {cluster!r} at {bootstrap}: {reason}")


class CorruptBatchError(MirrorError):
    """A record batch failed its CRC or structural checks; copying it would propagate corruption."""

    def __init__(self, base_offset: int, reason: str, *, cluster: str | None = None,
                 topic: str | None = None, partition: int | None = None):
        self.base_offset = base_offset
        self.reason = reason
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        super().__init__(self._sentence())

    def _sentence(self) -> str:
        where = _where(self.cluster, self.topic, self.partition)
        return f"corrupt record batch at offset {self.base_offset}{where}: {self.reason}"

    def located(self, cluster: str, topic: str, partition: int) -> CorruptBatchError:
        """The same error with the partition it was found in (the pure codec does not know it)."""
        return CorruptBatchError(self.base_offset, self.reason, cluster=cluster, topic=topic, partition=partition)


class DataLossError(MirrorError):
    """Source data in the requested range was deleted (retention, delete_records) before it was copied."""

    def __init__(self, cluster: str, topic: str, partition: int, expected_offset: int, log_start_offset: int):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.expected_offset = expected_offset
        self.log_start_offset = log_start_offset
        super().__init__(
            f"data loss on cluster {cluster!r} {topic}-{partition}: offsets [{expected_offset}, "
            f"{log_start_offset}) were deleted before they were copied (log start is now {log_start_offset}); "
            "rerun with --accept-loss to record the loss and continue from the log start"
        )

    @property
    def lost_range(self) -> tuple[int, int]:
        return (self.expected_offset, self.log_start_offset)


def _where(cluster: str | None, topic: str | None, partition: int | None) -> str:
    parts = []
    if cluster is not None:
        parts.append(f"cluster {cluster!r}")
    if topic is not None:
        parts.append(f"{topic}-{partition}" if partition is not None else topic)
    return (" in " + " ".join(parts)) if parts else ""
