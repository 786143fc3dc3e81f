"""Shoal's error hierarchy.

One root, :class:`MirrorError`, with a ``retriable`` attribute: operators and the CLI map non-retriable errors to an
immediate failure and retriable ones to retries. Errors that describe a situation carry that situation as fields
and print one sentence an operator can act on, naming cluster, topic, partition and offsets wherever they apply.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: this module sits under every layer and imports none of them
    from mirror_core.config.plan_request import BoundSpec
    from mirror_core.model.preflight_rules import PreflightReport
    from mirror_core.model.retention import RetentionStatus
    from mirror_core.state.checkpoint import Checkpoint


class MirrorError(Exception):
    """Root of every error Shoal raises on purpose.

    ``retriable``: a retry may succeed without anyone acting. ``lane_reason``: the bounded reason a daemon lane
    reports for it (:data:`mirror_core.model.lane_status.REASONS`); a lane halts on a non-retriable error.
    """

    retriable: bool = False
    lane_reason: str = "unknown"


class ConfigError(MirrorError):
    """Invalid configuration or arguments given by the user; the message names the offending item."""

    lane_reason = "config"


class SandboxError(MirrorError):
    """The local Kafka sandbox could not be resolved, started or stopped."""


class ClusterUnavailableError(MirrorError):
    """A cluster did not answer (connection refused, authentication failed, timeout)."""

    lane_reason = "unavailable"

    def __init__(self, cluster: str, bootstrap: str, reason: str, *, retriable: bool = True):
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.reason = reason
        self.retriable = retriable
        super().__init__(f"cluster {cluster!r} at {bootstrap}: {reason}")


class CorruptBatchError(MirrorError):
    """A record batch failed its CRC or structural checks; copying it would propagate corruption."""

    lane_reason = "corrupt_batch"

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
        sentence = f"corrupt record batch at offset {self.base_offset}{where}: {self.reason}"
        if self.cluster is None:
            return sentence
        if "CRC" in self.reason:
            # what a broker serves comes from its leader's log segment: bytes that changed there (a disk, a segment
            # copied by hand) stay until an intact replica serves the partition
            advice = ("If it happens again, the bytes on the partition leader's disk changed: have an intact replica "
                      "serve the partition (elect it leader, or reassign the damaged one), then run again (a daemon "
                      "lane: shoal lanes resume)")
        else:   # bytes that pass their CRC but are no valid log: every replica may hold them alike
            advice = "Inspect the partition's log segment (kafka-dump-log) before resuming"
        return f"{sentence}. Nothing at or past it was used. {advice}"

    def located(self, cluster: str, topic: str, partition: int) -> CorruptBatchError:
        """The same error with the partition it was found in (the pure codec does not know it)."""
        return CorruptBatchError(self.base_offset, self.reason, cluster=cluster, topic=topic, partition=partition)


class DataLossError(MirrorError):
    """Source data in the requested range was deleted (retention, delete_records) before it was copied."""

    lane_reason = "data_loss"

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


class PartitionUnavailableError(MirrorError):
    """A partition stayed unreachable (no leader, broker down, retriable errors) past the retry deadline."""

    retriable = True
    lane_reason = "unavailable"

    def __init__(self, cluster: str, topic: str, partition: int, reason: str, *, offset: int | None = None):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.reason = reason
        self.offset = offset
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"cluster {cluster!r} {topic}-{partition}{at} is unavailable: {reason}")


class TopicRecreatedError(MirrorError):
    """The topic id changed under a running copy: the topic was deleted and created again."""

    lane_reason = "topic_recreated"

    def __init__(self, cluster: str, topic: str, old_id: uuid.UUID, new_id: uuid.UUID | None):
        self.cluster = cluster
        self.topic = topic
        self.old_id = old_id
        self.new_id = new_id
        now = f"now {new_id}" if new_id is not None else "now gone"
        super().__init__(
            f"topic {topic!r} on cluster {cluster!r} was recreated (topic id was {old_id}, {now}); "
            "offsets no longer refer to the same data, so the copy halts"
        )


class TargetTopicUnsettledError(MirrorError):
    """A Metadata answer said the target topic a lane wrote is unknown, but the brokers asked one by one did not all
    confirm it is gone, look after look: neither a deletion (a halt) nor an answer. Retriable: nothing was written
    after the look, and a retry resumes from the checkpoint."""

    retriable = True
    lane_reason = "unavailable"

    def __init__(self, cluster: str, topic: str, looks: int):
        self.cluster = cluster
        self.topic = topic
        self.looks = looks
        super().__init__(
            f"target topic {topic!r} on cluster {cluster!r}: Metadata said it is unknown {looks} times, but its "
            "brokers, asked one by one, did not all confirm it is gone (one may be catching up on metadata, or "
            "unreachable); not taken as deleted, nothing written after it: retry, the copy resumes from its "
            "checkpoint"
        )


class SourceTruncatedError(MirrorError):
    """The source partition's log was truncated below the copy position (unclean leader election, a replaced
    broker) and may have regrown with other records: the target holds records the source no longer has.

    ``diverged_from`` is the source's end offset for the last leader epoch both logs share (None when the source
    knows no epoch up to ours, so the point is unknown): the target holds copies of ``[diverged_from, position)``
    that the source lost, and the source's records from ``diverged_from`` on differ from what was copied.
    """

    lane_reason = "source_truncated"

    def __init__(self, cluster: str, topic: str, partition: int, diverged_from: int | None, position: int,
                 position_epoch: int | None, source_epoch: int | None = None):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.diverged_from = diverged_from
        self.position = position
        self.position_epoch = position_epoch
        self.source_epoch = source_epoch
        if diverged_from is None:
            what = (f"the source knows no leader epoch up to {position_epoch}, so offsets below the copy position "
                    f"{position} were replaced; the target holds copies of records the source no longer has")
        else:
            ends = f"epoch {source_epoch} ends" if source_epoch is not None and source_epoch >= 0 else "log ends"
            what = (f"the source's {ends} at {diverged_from}, below the copy position {position} (epoch "
                    f"{position_epoch}): the target holds copies of [{diverged_from}, {position}) that the source "
                    f"no longer has, and the source now holds different records from {diverged_from} on")
        super().__init__(
            f"source log truncation on cluster {cluster!r} {topic}-{partition}: {what} (unclean leader election or "
            "a replaced broker); the copy halts: rebuild the target from the diverged offset, or copy into a fresh "
            "target topic with a new pipeline")

    @property
    def diverged_range(self) -> tuple[int | None, int]:
        """``[diverged_from, position)``: what the target holds that the source lost."""
        return (self.diverged_from, self.position)


class ForeignWriteError(MirrorError):
    """The target partition does not hold what the lane's checkpoint says: another writer produced to it, or the
    target topic was truncated or recreated. The lane halts: continuing would make the offset map lie."""

    lane_reason = "foreign_write"

    def __init__(self, cluster: str, topic: str, partition: int, expected_offset: int, landed_offset: int,
                 detail: str):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.expected_offset = expected_offset
        self.landed_offset = landed_offset
        super().__init__(
            f"cluster {cluster!r} {topic}-{partition}: the lane's checkpoint says the target ends at "
            f"{expected_offset}, but its next batch landed at {landed_offset}: {detail}; the lane halts (find and "
            "stop the other writer, or copy into a fresh target topic with a new pipeline)")


class OwnTransactionUndecidedError(MirrorError):
    """The lane's own previous transaction (its transactional.id's producer id, an older epoch) is still open on
    the target partition below where its next batch landed: InitProducerId returned while that transaction's
    markers were not yet written (seen after the target broker restarted with a commit in progress). The lane's
    checkpoint, written in that same transaction, may be about to become visible, so the lane must neither halt
    (nothing foreign is there) nor copy on from the older checkpoint (duplicates): it aborts and reopens later."""

    retriable = True
    lane_reason = "checkpoint"

    def __init__(self, cluster: str, topic: str, partition: int, open_at: int, producer_id: int, epoch: int):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.open_at = open_at
        super().__init__(
            f"cluster {cluster!r} {topic}-{partition}: the lane's own earlier transaction (producer id {producer_id}, "
            f"epoch {epoch}) is still open at offset {open_at}: its commit or abort markers are not written yet; "
            "the lane reopens and reads its checkpoint again once it is decided. If this lasts past the "
            "transaction timeout, the coordinator will not decide it (a hanging transaction, e.g. markers lost in "
            "a broker restart): see it with kafka-transactions.sh --bootstrap-server <target> find-hanging "
            "--broker-id <leader>; aborting it there is safe only if the same transaction is also still open on "
            "the lane's __shoal_checkpoints partition (then data and checkpoint are dropped together and recopied)")


class TargetNotEmptyError(MirrorError):
    """A lane with no checkpoint found committed records already on its target partition. Nothing of this pipeline
    can have written them (its first write always commits with, or after, the lane's first checkpoint), so they
    are another pipeline's (a renamed one, or one seeded under another name), a ``--mode none`` copy's, another
    producer's, or this pipeline's own from before its checkpoints were lost. Copying on would put the source's
    records after them again (duplicates, even in exactly-once mode), and a start of "latest" would skip what
    lies in between; the lane halts instead, nothing written. ``position``: the source offset the lane was to
    start at (a halted daemon lane resumed by ``shoal lanes resume`` starts there, after what the target holds)."""

    lane_reason = "foreign_write"

    def __init__(self, cluster: str, topic: str, partition: int, pipeline: str, source_topic: str,
                 source_partition: int, position: int, log_start: int, end: int, checkpoint_topic: str, *,
                 open_transaction_at: int | None = None):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.pipeline = pipeline
        self.position = position
        self.log_start = log_start
        self.end = end
        held = "committed records" if open_transaction_at is None else \
            f"another producer's open transaction (from offset {open_transaction_at})"
        super().__init__(
            f"cluster {cluster!r} {topic}-{partition}: pipeline {pipeline!r} has no checkpoint there (nothing of "
            f"its own written), but the partition already holds {held} between offsets {log_start} and {end}: a "
            f"pipeline of another name (renamed?) or a --mode none copy wrote them, or another producer, or "
            f"{checkpoint_topic} lost this pipeline's checkpoints. Copying {source_topic}-{source_partition} from "
            f"source offset {position} would land after them (duplicates, or a gap), so nothing was written. Run "
            "under the pipeline name that wrote them, or copy into an empty target partition; to append after "
            "what is there, `shoal lanes resume` the halted daemon lane")


class SkipRefusedError(MirrorError):
    """A requested start lies beyond the partition's checkpoint: starting there would skip offsets never copied."""

    lane_reason = "skip_refused"

    def __init__(self, cluster: str, topic: str, partition: int, checkpoint_position: int, start: int):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.checkpoint_position = checkpoint_position
        self.start = start
        super().__init__(
            f"cluster {cluster!r} {topic}-{partition}: the requested start {start} is past the pipeline's checkpoint "
            f"{checkpoint_position}, so offsets [{checkpoint_position}, {start}) would never be copied; start at the "
            "checkpoint, or pass --accept-loss to skip them (recorded in the checkpoint and the ledger)")

    @property
    def lost_range(self) -> tuple[int, int]:
        return (self.checkpoint_position, self.start)


class FetchError(MirrorError):
    """The source broker refused a fetch or offset lookup with a non-retriable error (e.g. not authorized)."""

    lane_reason = "fetch_refused"

    def __init__(self, cluster: str, topic: str, partition: int, offset: int | None, error: str):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error = error
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"reading {topic}-{partition}{at} from cluster {cluster!r} failed: {error}")


class BatchRejectedError(MirrorError):
    """The target refused a batch for good (too large, corrupt, invalid record or timestamp, not authorized).
    ``error`` is the broker's error name (``MESSAGE_TOO_LARGE``, ``INVALID_TIMESTAMP``, ``POLICY_VIOLATION``, …)."""

    lane_reason = "batch_rejected"

    def __init__(self, cluster: str, topic: str, partition: int, source_offset: int, error: str,
                 detail: str | None = None):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.source_offset = source_offset
        self.error = error
        self.detail = detail
        more = f" ({detail})" if detail else ""
        super().__init__(f"cluster {cluster!r} rejected the batch for {topic}-{partition} copied from source "
                         f"offset {source_offset}: {error}{more}")


class ProducerFencedError(MirrorError):
    """Another writer took over our producer identity (same transactional.id, newer epoch); this one must stop.
    Not a lane failure: the lane moves to the newer writer (the daemon drops it)."""

    lane_reason = "none"

    def __init__(self, cluster: str, producer: str, error: str):
        self.cluster = cluster
        self.producer = producer
        self.error = error
        super().__init__(f"writer {producer} on cluster {cluster!r} was fenced ({error}): a newer writer owns "
                         "these partitions; stop this one")


class AmbiguousWriteError(MirrorError):
    """The broker lost our producer state after a send whose outcome we never heard: resending could duplicate.
    Retriable for a lane: reopening it resumes at the committed checkpoint and the landing rule checks the target."""

    retriable = True
    lane_reason = "ambiguous_write"

    def __init__(self, cluster: str, topic: str, partition: int, source_offset: int, error: str):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.source_offset = source_offset
        self.error = error
        super().__init__(f"cluster {cluster!r} {topic}-{partition}: the batch from source offset {source_offset} "
                         f"may or may not have been written ({error} after an unanswered send); verify the target "
                         "end offset before resuming")


class WriteOrderError(MirrorError):
    """The target wrote a later batch of a partition while an earlier one is missing: the broker had no producer
    state for us there (so it accepted any sequence) when the earlier batch was refused and the later one was not.
    Resending cannot restore the order (a new producer id would write the earlier batch after the later one and the
    later one twice), so the partition halts naming both batches; the target holds the later one at
    ``target_offset``."""

    lane_reason = "batch_rejected"

    def __init__(self, cluster: str, topic: str, partition: int, missing_offset: int, landed_offset: int,
                 target_offset: int, error: str):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.source_offset = missing_offset
        self.landed_offset = landed_offset
        self.target_offset = target_offset
        self.error = error
        super().__init__(f"cluster {cluster!r} {topic}-{partition}: the batch from source offset {landed_offset} "
                         f"was written at target offset {target_offset} before the one from source offset "
                         f"{missing_offset}, which the target now refuses ({error}); the target partition is out of "
                         "source order there")


class SourceTopicDeletedError(MirrorError):
    """The source topic of a running lane was deleted (and not recreated): what it still held past the lane's
    position can never be copied. ``last_seen_end`` is the partition's last stable offset as the lane last saw it
    (records produced after that and before the deletion are unknown)."""

    lane_reason = "source_deleted"

    def __init__(self, cluster: str, topic: str, partition: int, position: int, last_seen_end: int):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.position = position
        self.last_seen_end = last_seen_end
        super().__init__(
            f"source topic {topic!r} on cluster {cluster!r} was deleted under the running lane of partition "
            f"{partition}: offsets [{position}, {last_seen_end}) (at least; as last seen) were never copied; the "
            "lane halts: accept the loss with `shoal lanes resume --accept-loss`, or restore the source topic")

    @property
    def lost_range(self) -> tuple[int, int]:
        return (self.position, self.last_seen_end)


class CheckpointReadStalledError(MirrorError):
    """The checkpoint topic's partition did not reach the last stable offset measured before the read: its log
    was truncated below it (unclean leader election, a replaced broker) or the broker stopped answering with
    data. Retriable: the next read measures the offsets again."""

    retriable = True
    lane_reason = "checkpoint"

    def __init__(self, cluster: str, topic: str, partition: int, position: int, measured_end: int, log_end: int):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.position = position
        self.measured_end = measured_end
        self.log_end = log_end
        super().__init__(
            f"cluster {cluster!r} checkpoint topic {topic}-{partition}: reading [{position}, {measured_end}) made no "
            f"progress; the partition now ends at {log_end}, below the last stable offset measured before the read "
            "(its log was truncated: unclean leader election or a replaced broker); re-reading from the log start")


class TransactionTimedOutError(MirrorError):
    """The transaction coordinator aborted our open transaction because it outlived its timeout, bumping the
    producer epoch itself: on the wire this looks like a fencing (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED,
    INVALID_TXN_STATE), but no other writer took the transactional.id. Nothing of the transaction is committed;
    the writer reopens and resumes from its last committed checkpoint."""

    retriable = True
    lane_reason = "transaction_timeout"

    def __init__(self, cluster: str, producer: str, error: str, transaction_timeout_ms: int):
        self.cluster = cluster
        self.producer = producer
        self.error = error
        self.transaction_timeout_ms = transaction_timeout_ms
        super().__init__(f"writer {producer} on cluster {cluster!r}: the coordinator aborted its transaction after "
                         f"transaction.timeout.ms ({transaction_timeout_ms} ms) ran out ({error}); no other writer "
                         "took over, nothing of it was committed, and it resumes from its last checkpoint")


class CoordinatorUnavailableError(MirrorError):
    """The transaction coordinator of a transactional.id did not answer within the retry window (its
    ``__transaction_state`` partition has no leader: a target restarting, or one whose transaction state topic can
    never be created, e.g. ``transaction.state.log.replication.factor`` above its broker count)."""

    retriable = True
    lane_reason = "unavailable"

    def __init__(self, cluster: str, producer: str, request: str, error: str, waited_s: float):
        self.cluster = cluster
        self.producer = producer
        self.error = error
        self.waited_s = waited_s
        # a retry window already spent (the transaction's writes used it) gives one try: "in 0 s" would read as a bug
        waited = f"in {waited_s:.0f} s" if waited_s >= 1 else "within what was left of the transaction's retry window"
        super().__init__(f"{request} for {producer} on cluster {cluster!r}: no transaction coordinator answered "
                         f"{waited} ({error}); check the target's __transaction_state topic and "
                         "transaction.state.log.replication.factor / min.isr against its brokers")


class TransactionTimeoutRefusedError(MirrorError):
    """The broker refuses the transaction timeout Shoal asks for (above its ``transaction.max.timeout.ms``)."""

    lane_reason = "config"

    def __init__(self, cluster: str, producer: str, timeout_ms: int):
        self.cluster = cluster
        self.producer = producer
        self.timeout_ms = timeout_ms
        super().__init__(f"cluster {cluster!r} refuses transaction.timeout.ms {timeout_ms} for {producer}: it is above "
                         "the brokers' transaction.max.timeout.ms (15 min by default); lower commit_interval_ms and "
                         "write_retry_s (the timeout is derived from them) or set transaction_timeout_ms explicitly")


class TransactionsUnavailableError(MirrorError):
    """The target refuses transactional producers (no transaction support, or the principal may not use the
    transactional.id): exactly-once is impossible there, and at-least-once falls back to its owner check."""

    lane_reason = "config"

    def __init__(self, cluster: str, producer: str, error: str):
        self.cluster = cluster
        self.producer = producer
        self.error = error
        super().__init__(f"cluster {cluster!r} refuses transactional writer {producer} ({error}): grant the "
                         "principal WRITE on that transactional.id, or use at-least-once mode")


# -- refusals of a plan, a copy or a lane ---------------------------------------------------------------------------
# The values below are the deciding layers' own (a preflight report, retention statuses, a checkpoint, a bound spec):
# named for type checkers only, read for their fields, so this module still imports nothing of Shoal's.

class PreflightError(MirrorError):
    """Preflight refused a copy; ``refusals`` lists every reason, each naming the config to change."""

    def __init__(self, report: PreflightReport):
        self.report = report
        self.refusals = report.refusals
        reasons = " ".join(f"({i}) {f.message}" for i, f in enumerate(self.refusals, 1))
        super().__init__(f"preflight refused copying {report.source_cluster}/{report.source_topic} to "
                         f"{report.target_cluster}/{report.target_topic}: {reasons}")


class RetentionLossError(MirrorError):
    """A plan covers partitions whose data was deleted before it was copied, and the loss was not accepted."""

    def __init__(self, cluster: str, lost: Sequence[RetentionStatus]):
        self.cluster = cluster
        self.lost = list(lost)
        names = ", ".join(f"{s.topic}-{s.partition} [{s.lost_range[0]}, {s.lost_range[1]})" for s in lost[:5])
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        super().__init__(f"cluster {cluster!r}: data was deleted before it was copied: {names}{more}; the plan is "
                         "refused — pass --accept-loss to record the loss and start those partitions at the log start")


class PlanDataLossError(DataLossError, ConfigError):
    """The start of a requested range was already deleted and ``accept_loss`` was not given (both a data-loss
    situation, with its fields, and a refused input)."""

    def __init__(self, cluster: str, topic: str, partition: int, expected_offset: int, log_start_offset: int,
                 spec: BoundSpec):
        super().__init__(cluster, topic, partition, expected_offset, log_start_offset)
        self.spec = spec
        self.args = (f"cluster {cluster!r} {topic}-{partition}: start {spec} = offset {expected_offset} is below "
                     f"the log start {log_start_offset}; offsets [{expected_offset}, {log_start_offset}) were "
                     "already deleted. Rerun with accept-loss to record the loss and start at the log start",)


class NotHandedOffError(MirrorError):
    """The lane's checkpoint belongs to a backfill that has not handed it off: the daemon must not write it."""

    def __init__(self, pipeline: str, checkpoint: Checkpoint):
        self.pipeline = pipeline
        self.checkpoint = checkpoint
        super().__init__(f"pipeline {pipeline!r} {checkpoint.topic}-{checkpoint.partition}: owned by "
                         f"{checkpoint.owner!r} at position {checkpoint.position}, not handed off to the daemon yet; "
                         "left alone until `shoal handoff` (or the DAG's handoff task) transfers it")


class OwnershipError(MirrorError):
    """The partition's checkpoint belongs to a newer owner (a handoff happened): this writer must stop."""

    def __init__(self, pipeline: str, topic: str, partition: int, owner: str, epoch: int, stored: Checkpoint):
        self.pipeline, self.topic, self.partition = pipeline, topic, partition
        self.owner, self.epoch, self.stored = owner, epoch, stored
        super().__init__(
            f"pipeline {pipeline!r} {topic}-{partition}: owned by {stored.owner!r} at epoch {stored.owner_epoch}, "
            f"newer than this writer ({owner!r}, epoch {epoch}); it was handed off, so this writer stops")


class DaemonOwnsLaneError(OwnershipError):
    """A backfill (or ``shoal copy``) met a lane the daemon started itself and has copied data into: the daemon owns
    it, nobody handed it off, and writing below the daemon's data would break the partition's order."""

    def __init__(self, pipeline: str, topic: str, partition: int, owner: str, stored: Checkpoint):
        self.pipeline, self.topic, self.partition = pipeline, topic, partition
        self.owner, self.stored = owner, stored
        MirrorError.__init__(
            self, f"pipeline {pipeline!r} {topic}-{partition}: the continuous mirror daemon owns this lane (owner "
            f"{stored.owner!r}, epoch {stored.owner_epoch}) and has already copied it up to source offset "
            f"{stored.position}; it started the lane itself, nobody handed it off. {owner!r} cannot write below "
            "the daemon's data: back-fill older data under another pipeline name into another target topic, or "
            "exclude the topic from the daemon's pipeline and start the lane over. (A lane the daemon started but "
            "has not copied anything into yet is taken over by a backfill automatically.)")


class LaneTakenError(OwnershipError):
    """At-least-once without a broker fence: another writer committed the lane's checkpoint since this one did."""

    def __init__(self, pipeline: str, topic: str, partition: int, ours: Checkpoint | None, stored: Checkpoint | None):
        def at(cp: Checkpoint | None) -> str:
            return "none" if cp is None else f"position {cp.position}, target offset {cp.target_next}"

        self.pipeline, self.topic, self.partition = pipeline, topic, partition
        self.ours, self.stored = ours, stored
        MirrorError.__init__(
            self, f"pipeline {pipeline!r} {topic}-{partition}: the lane's checkpoint moved under this writer (ours: "
            f"{at(ours)}; stored: {at(stored)}): another writer holds the lane, so this one stops")


class TopicConfigSyncError(MirrorError):
    """Describing or altering a topic's configs failed; the message names cluster and topic."""

    def __init__(self, cluster: str, topic: str, reason: str, *, retriable: bool = False):
        self.cluster = cluster
        self.topic = topic
        self.reason = reason
        self.retriable = retriable
        super().__init__(f"topic config sync: cluster {cluster!r} topic {topic!r}: {reason}")


def _where(cluster: str | None, topic: str | None, partition: int | None) -> str:
    parts = []
    if cluster is not None:
        parts.append(f"cluster {cluster!r}")
    if topic is not None:
        parts.append(f"{topic}-{partition}" if partition is not None else topic)
    return (" in " + " ".join(parts)) if parts else ""
