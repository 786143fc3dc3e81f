"""Copies that survive restarts: exactly-once (data and checkpoint in one target transaction) or at-least-once.

Exactly-once: the writer of a lane uses the transactional.id ``shoal.<pipeline>.<lane>`` (DESIGN.md §3: a lane
is a fixed set of target partitions, default one). ``InitProducerId`` with that id fences every older writer of
the lane and aborts its open transaction; only then is the checkpoint read (READ_COMMITTED), so the copy resumes
exactly where the last *committed* transaction left it. Batches and the checkpoint record are committed together
every ``commit_bytes`` or ``commit_interval_ms``: a crash loses at most the open transaction, which the broker
aborts, and nothing is ever written twice.

At-least-once: the checkpoint is written after the data was acknowledged. A crash between the two re-copies what
was acknowledged since the last checkpoint: the duplicate window is at most one commit interval of records
(``commit_bytes`` of data). Writes are not transactional (no markers, no held-back LSO), but the writer still holds
the lane's transactional.id, so a new holder of the lane fences a former one by the broker: its InitProducerId
bumps the epoch, and one empty aborted transaction over the lane's target partition and checkpoint partition puts
that epoch in both logs (:meth:`BatchWriter.fence_partitions`), after which they refuse the former holder's writes.
On a target that refuses transactional producers, the lane falls back to an idempotent writer and, before each
copy, checks that nobody else committed the lane's checkpoint since it last did (best effort: a check, not a fence).

An open lane is a :class:`~mirror_core.engine.lane_session.LaneSession`: its writer and fence
(:mod:`mirror_core.engine.lane_fence`), the landing rule of each copy's first batch
(:mod:`mirror_core.engine.resume_landing`) and the commits of its checkpoints
(:mod:`mirror_core.engine.checkpoint_committer`).

Bounds: a transaction lasts one commit window plus the writer's retries; both must fit in
``TRANSACTION_RETRY_SHARE`` of ``transaction_timeout_ms`` (:class:`CommitPolicy`), so a write that keeps failing
ends as a retriable error before the coordinator aborts the transaction under it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import default_lane
from mirror_core.engine.copier import CopyOptions, CopyResult, Progress
from mirror_core.engine.lane_session import TARGET_DELETION_LOOKS, LaneSession, target_topic_gone
from mirror_core.errors import ConfigError, TargetTopicUnsettledError, TopicRecreatedError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore


class DeliveryMode(str, enum.Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


class CheckpointedCopier:
    """Copies one lane (one target partition) of a pipeline, resuming from and committing to the checkpoint store.

    Invariant: the stored checkpoint's position never passes data the target has not acknowledged (exactly-once:
    committed in the same transaction; at-least-once: written after the acknowledgement).
    """

    def __init__(self, source: WireClient, target: WireClient, store: CheckpointStore, *, pipeline: str,
                 mode: DeliveryMode = DeliveryMode.EXACTLY_ONCE, owner: str = "copy", owner_epoch: int = 0,
                 options: CopyOptions | None = None, policy: CommitPolicy | None = None,
                 accept_loss: bool = False):
        if not pipeline or any(c in pipeline for c in " /\\"):
            raise ConfigError(f"pipeline name {pipeline!r} must be non-empty, without spaces or slashes")
        self.source = source
        self.target = target
        self.store = store
        self.pipeline = pipeline
        self.mode = DeliveryMode(mode)
        self.exactly_once = self.mode is DeliveryMode.EXACTLY_ONCE
        self.owner = owner
        self.owner_epoch = owner_epoch
        self.options = options or CopyOptions(max_inflight_bytes=(policy or CommitPolicy()).commit_bytes)
        self.policy = policy or CommitPolicy()
        # a start past the checkpoint skips offsets never copied: refused, unless the operator accepts the loss
        # (then it is recorded in the checkpoint's lost ranges, where translation declines, and in the ledger)
        self.accept_loss = accept_loss

    def copy(self, rng: PartitionRange, progress: Progress | None = None, *, lane: int | str | None = None
             ) -> CopyResult:
        """Open the lane (fencing older writers), resume from its checkpoint and copy up to ``rng.end``."""
        session = self.open_lane(rng.topic, rng.partition, rng.target_topic, rng.target_partition, lane=lane)
        return session.copy(rng.start, rng.end, progress)

    def open_lane(self, topic: str, partition: int, target_topic: str, target_partition: int, *,
                  lane: int | str | None = None, read_checkpoint: bool = True) -> LaneSession:
        """Open the lane (see :class:`LaneSession`; ``read_checkpoint=False``: fenced only, the caller reads the
        checkpoint and calls :meth:`LaneSession.resume`)."""
        return LaneSession(self, topic, partition, target_topic, target_partition,
                           default_lane(target_topic, target_partition) if lane is None else lane,
                           read_checkpoint=read_checkpoint)

    def _target_topic_ids(self, pinned: dict[str, str]) -> dict[str, str | None]:
        """Each target topic's id now (None: the cluster gives none), asked fresh; ``pinned``: topic → the id a
        checkpoint of it names. A topic the target no longer has (no broker knows it, :func:`target_topic_gone`) was
        deleted under its lanes: :class:`TopicRecreatedError`; brokers that still disagree after
        ``TARGET_DELETION_LOOKS`` looks: :class:`TargetTopicUnsettledError` (retriable)."""
        import kafka.errors as Errors

        out: dict[str, str | None] = {}
        for topic, old_id in sorted(pinned.items()):
            for look in range(1, TARGET_DELETION_LOOKS + 1):
                try:
                    topic_id = self.target.topic_metadata(topic, refresh=True).topic_id
                    break
                except Errors.UnknownTopicOrPartitionError:
                    if target_topic_gone(self.target, topic):
                        raise TopicRecreatedError(self.target.cluster_name, topic, old_id, None) from None
                    if look == TARGET_DELETION_LOOKS:
                        raise TargetTopicUnsettledError(self.target.cluster_name, topic, look) from None
            out[topic] = str(topic_id) if topic_id else None
        return out

    def open_lanes(self, ranges: Sequence[PartitionRange], *, source_topic_id: str | None = None
                   ) -> list[LaneSession]:
        """A lane per range, opened as :meth:`open_lane` opens one, but each step once for all of them:

          0. one read of their checkpoints as they stand (:meth:`CheckpointStore.read_own_many`: the newest decided
             value of each): a lane whose checkpoint already refuses this copy whatever fencing decides (another
             target, a newer owner, a source or target topic recreated since:
             :func:`~mirror_core.engine.lane_session.refused_before_fencing`) stops the copy
             before any lane is fenced, so a daemon's lanes of the same pipeline keep their open transactions;
          1. every lane's InitProducerId (and, at-least-once, its fence), one lane after another;
          2. one more read of all their checkpoints. Sound for the same reason as each lane's own read after its
             InitProducerId: every InitProducerId of step 1 has returned, so each former holder is fenced and its
             transactions are decided (DESIGN §3.4);
          3. one OffsetsForLeaderEpoch per source leader for the resumed positions' epochs
             (:func:`~mirror_core.kafka.epochs.epoch_ends_many`, within the open's validation time; a partition it
             leaves out asks alone), then each session resumes from its own checkpoint (the authoritative checks);
             the topic ids come from one Metadata answer per cluster taken after the sessions were opened (their
             stamps predate it).

        ``source_topic_id``: the id of the source topic the caller resolved ``ranges`` against (None: unknown). A
        checkpoint or a session pinned to another id refuses the copy (:class:`TopicRecreatedError`): the topic
        was deleted and recreated since the ranges were chosen, and its offsets mean other records now — judged
        before any lane is fenced when the checkpoint shows it, else at resume.

        Over a long link to the source that is two round trips to it for any number of lanes instead of up to two
        per lane (a Metadata and, resuming, an OffsetsForLeaderEpoch). A failure in steps 1–3 leaves the sessions
        already opened as a failing :meth:`open_lane` leaves the earlier ones: their writers are fenced by the next
        holder."""
        from mirror_core.engine.lane_session import OPEN_VALIDATION_TIMEOUT_S, refused_before_fencing
        from mirror_core.kafka.epochs import epoch_ends_many

        lanes = [(r.topic, r.partition) for r in ranges]
        before = self.store.read_own_many(self.pipeline, lanes)
        pinned = {r.target_topic: cp.target_topic_id for r in ranges
                  if (cp := before[(r.topic, r.partition)]) is not None and cp.target_topic_id
                  and cp.target_topic == r.target_topic}
        target_ids = self._target_topic_ids(pinned)
        for r in ranges:
            refusal = refused_before_fencing(self, r, before[(r.topic, r.partition)], source_topic_id,
                                             target_ids.get(r.target_topic))
            if refusal is not None:
                raise refusal
        sessions = [self.open_lane(r.topic, r.partition, r.target_topic, r.target_partition, read_checkpoint=False)
                    for r in ranges]
        checkpoints = self.store.read_own_many(self.pipeline, lanes)
        asks = [(cp.topic, cp.partition, cp.position_epoch) for cp in checkpoints.values()
                if cp is not None and cp.position_epoch is not None and cp.position_epoch >= 0]
        ends = epoch_ends_many(self.source, asks, timeout_s=OPEN_VALIDATION_TIMEOUT_S) if asks else {}
        for session, r in zip(sessions, ranges, strict=True):
            cp = checkpoints[(r.topic, r.partition)]
            session.resume(cp, epoch_end=None if cp is None or cp.position_epoch is None else
                           ends.get((cp.topic, cp.partition, cp.position_epoch)))
            if source_topic_id and session.source_topic_id and session.source_topic_id != source_topic_id:
                raise TopicRecreatedError(self.source.cluster_name, r.topic, source_topic_id, session.source_topic_id)
        return sessions

