"""Lane failures: each classified once, then retried, repaired, halted or retired.

Failure behaviour: a fenced lane (another daemon took it) or a handed-over one is dropped; a recreated source topic
or data deleted before it was copied (or truncated from the source log after it was) halts the partition with a
clear status and is not retried (an operator decides); a retriable source error (leader moved, broker restarting)
retries the fetch with a short backoff; an
unreachable target closes the lane's session and retries with backoff, resuming from the last committed checkpoint
— nothing is buffered across a failure, so memory stays at one fetch round plus one flush however long the target
is down. A deleted source topic retires its lanes (or halts them, naming what was never copied); a rejection a topic
config sync can fix is repaired and retried once. A halt is persisted with the lane's checkpoint, so a restart does
not reopen it; a failed lane stays in the retention watch (DESIGN §3).
"""

from __future__ import annotations

import logging
import time

import kafka.errors as Errors

from mirror_core.config.names import DAEMON_OWNER
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import LaneState
from mirror_core.errors import (
    BatchRejectedError,
    MirrorError,
    NotHandedOffError,
    OwnershipError,
    ProducerFencedError,
    SourceTopicDeletedError,
    TopicRecreatedError,
)
from mirror_core.kafka.retries import is_retriable
from mirror_core.model.lane_status import HALTED, RETIRED, PersistedLaneState, classify_failure
from mirror_core.state.checkpoint import Checkpoint
from mirror_core.state.lane_control import persist_lane_state
from mirror_core.state.leases import now_ms

REPAIRABLE_REJECTIONS = ("MESSAGE_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_TIMESTAMP")  # config sync may fix
DELETION_SIGNS = ("UnknownTopicOrPartition", "UnknownTopicId", "UNKNOWN_TOPIC", "InconsistentTopicId")
DELETION_CONFIRM_S = 1.0  # a source topic must be missing from metadata twice, this far apart, to count as deleted


class LaneFailures:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): a
    lane's failure classified and acted on."""

    def _deleted_source_topics(self, topics: set[str]) -> set[str]:
        """Of ``topics``, those confirmed deleted on the source: missing from metadata twice, DELETION_CONFIRM_S
        apart — one look-up (and at most one wait) for all of them, not one per lane."""
        gone = self._topics_missing_on_source(topics)
        if gone:
            time.sleep(DELETION_CONFIRM_S)
            gone &= self._topics_missing_on_source(gone)
        return gone

    def _topics_missing_on_source(self, topics: set[str]) -> set[str]:
        """Of ``topics``, those the source's metadata does not know (one request; an error: none)."""
        import kafka.errors as errors

        if not topics:
            return set()
        try:
            meta = self.source.metadata(sorted(topics))
        except Exception:  # noqa: BLE001 - cannot tell: treat as present (the fetch path still detects it)
            return set()
        return {t for t in topics if meta.get(t) is None
                or meta[t].error_code == errors.UnknownTopicOrPartitionError.errno}

    def _place_failed_lane(self, state: LaneState, position: int | None) -> None:
        """A failed lane is behind — assessed by the next retention assessment — at the best position known, so a
        lane that cannot copy is never left out of the watch (DESIGN §3: retention must not delete unmirrored data
        unannounced): its committed position (kept while it is reset); else the one reported before; else, for a
        lane never opened here, its checkpoint as last read (no request: the target may be what fails), the start
        it chose, or — with none, starting at the earliest — the log start. A lane starting at the latest with no
        start chosen yet has nothing retention could take from it."""
        tp = (state.topic, state.partition)
        positions = self.positions
        if position is None and positions.position(tp) is None:
            try:
                cp = None if self.store is None else self.store.cached(self.config.pipeline, state.topic,
                                                                       state.partition)
            except Exception:  # noqa: BLE001 - undecodable (a newer Shoal's): that is the lane's own failure
                cp = None      # already; placed as if it had none, from where the lane would start
            position = cp.position if cp is not None else state.start
            if position is None:
                if self.config.new_partitions == "earliest":
                    positions.behind_from_log_start(tp)
                return
        positions.behind(tp, position)

    def _failed(self, state: LaneState, exc: BaseException, *, fetching: bool = False) -> None:
        """Classify a lane's error once (:func:`~mirror_core.model.lane_status.classify_failure`): fenced → drop; a
        deleted source topic → halt naming what was not copied, or retire; a rejection config sync can repair →
        repair and retry; not retriable → halt (persisted); a retriable source fetch error → retry the fetch
        soon, session kept; anything else → reopen the lane after a backoff (``retrying``, ``stalled`` once it
        lasts longer than ``stall_after_s``)."""
        if isinstance(exc, ProducerFencedError | OwnershipError | NotHandedOffError):
            self.metrics.errors.labels("fenced").inc()
            self._drop(state.lane, f"fenced: {exc}")
            self._note_fenced(state.lane)
            return
        retriable, reason = classify_failure(exc)
        if self._maybe_deleted(exc) and self._source_deleted(state):
            return
        if isinstance(exc, BatchRejectedError) and self._repaired_by_config_sync(state, exc):
            retriable = True
        if not retriable:
            self._halt(state, exc, reason)
            return
        self.metrics.errors.labels(reason if reason != "unknown" else type(exc).__name__).inc()
        position = state.session.position if state.session else None
        state.health.failed(reason, f"{type(exc).__name__}: {exc}", now_ms(), position=position)
        self._health_failed(state)
        self._place_failed_lane(state, position)
        if fetching and isinstance(exc, Errors.KafkaError) and is_retriable(type(exc)):
            state.fetch_failures += 1
            state.retry_at = time.monotonic() + min(5.0, 0.1 * 2 ** min(state.fetch_failures, 6))
            self.openings.wait(state.lane, state.retry_at)
            event("fetch_retry", logging.INFO if state.fetch_failures < 5 else logging.WARNING, topic=state.topic,
                  partition=state.partition, offset=state.fetcher.position if state.fetcher else None,
                  error=type(exc).__name__, attempt=state.fetch_failures, state=state.health.state)
        else:  # MirrorError, or transport trouble the wire library raised as is
            state.failures += 1
            state.reset()
            state.retry_at = time.monotonic() + min(30.0, 0.5 * 2 ** min(state.failures, 6))
            self.openings.wait(state.lane, state.retry_at)
            event("lane_error", logging.WARNING, topic=state.topic, partition=state.partition, offset=position,
                  error=f"{type(exc).__name__}: {exc}", retry_in_s=round(state.retry_at - time.monotonic(), 1),
                  state=state.health.state, attempt=state.health.attempts,
                  # the error itself, not True: this runs outside the except that caught it (True logged
                  # "NoneType: None" instead of the traceback of an error nobody expected)
                  exc_info=False if isinstance(exc, MirrorError | Errors.KafkaError) else exc)
        if not self._round_books:  # inside a round the round's end publishes (once, not once per failed lane);
            self._publish_due_states()  # elsewhere the lanes marked since (nothing per idle lane)

    def _halt(self, state: LaneState, exc: BaseException | str, reason: str, *, stopped: str = HALTED,
              range_end: int | None = None, persist: bool = True) -> None:
        """Stop the lane until an operator acts: state persisted with the checkpoint (so a restart does not
        reopen it; ``persist=False``: in this process only), shown in metrics, /readyz and the log."""
        self.metrics.errors.labels(reason).inc()
        position = _first_known(state.session.position if state.session is not None else None,
                                getattr(exc, "expected_offset", None), getattr(exc, "position", None), state.start)
        if range_end is None:
            range_end = _first_known(getattr(exc, "log_start_offset", None), getattr(exc, "source_offset", None))
        persisted = PersistedLaneState(stopped, reason, str(exc), now_ms(), position, range_end)
        state.health.stop(persisted)
        self._health_dirty.add(state.lane)
        self._halts += 1
        self.openings.touch(state.lane)  # a halted lane stays out of the round (looked at: stopped, not opened)
        self.status.halted[state.lane] = str(exc)
        self._drop(state.lane, reason)
        saved = self._persist(state, persisted) if persist else False
        state.halt_stored = saved  # not stored: the halt holds in this process only, and no checkpoint resumes it
        event("lane_halted" if stopped == HALTED else "lane_retired", logging.ERROR if stopped == HALTED
              else logging.WARNING, topic=state.topic, partition=state.partition, lane=state.lane, reason=reason,
              position=position, range_end=range_end, persisted=saved, error=exc)
        # published once per pass (_publish_pending_states), not once per halt

    def _persist(self, state: LaneState, persisted: PersistedLaneState) -> bool:
        """Write the lane state into the lane's checkpoint; False (logged) when there is none or the write
        failed — the state then holds in this process only."""
        initial = None if persisted.position is None else Checkpoint(
            pipeline=self.config.pipeline, topic=state.topic, partition=state.partition, position=persisted.position,
            target_topic=state.target_topic, target_partition=state.partition, target_next=None,
            owner=DAEMON_OWNER, owner_epoch=1)
        try:
            return persist_lane_state(self.store, self.target, self.config.pipeline, state.topic, state.partition,
                                      persisted, transactional=self.config.mode == "exactly-once",
                                      initial=initial) is not None
        except Exception as exc:  # noqa: BLE001 - the halt stands in memory; the log says it was not stored
            event("lane_state_not_persisted", logging.WARNING, topic=state.topic, partition=state.partition,
                  error=f"{type(exc).__name__}: {exc}")
            return False

    @staticmethod
    def _maybe_deleted(exc: BaseException) -> bool:
        """Errors a deleted source topic shows up as (an unknown topic or topic id, as raised or inside a retry's
        give-up, or a topic id that is "now gone"); only these pay for the metadata look-ups that confirm it."""
        if isinstance(exc, TopicRecreatedError):
            return exc.new_id is None
        text = f"{type(exc).__name__} {exc}"
        return any(sign in text for sign in DELETION_SIGNS)

    def _source_deleted(self, state: LaneState, *, confirmed: bool = False) -> bool:
        """Confirm a source topic deletion (missing from fresh metadata twice, ``DELETION_CONFIRM_S`` apart; or
        ``confirmed`` already, for a whole topic at once), then retire the lane when it had copied everything it
        saw, else halt naming the range never copied."""
        if not confirmed and not (self._source_topic_missing(state.topic) and
                                  (time.sleep(DELETION_CONFIRM_S) or self._source_topic_missing(state.topic))):
            return False
        position = state.session.position if state.session is not None else None
        if position is None:
            position = state.start if state.start is not None else 0
        seen_end = state.last_stable if state.last_stable is not None else position
        exc = SourceTopicDeletedError(self.config.source.name, state.topic, state.partition, position,
                                      max(seen_end, position))
        if seen_end <= position:
            self._halt(state, f"source topic {state.topic!r} was deleted after the lane had copied everything it saw "
                              f"(up to offset {position}); the lane is retired", "source_deleted", stopped=RETIRED,
                       range_end=position)
        else:
            self._halt(state, exc, "source_deleted", range_end=seen_end)
        return True

    def _source_topic_missing(self, topic: str) -> bool:
        import kafka.errors as errors

        try:
            meta = self.source.metadata([topic]).get(topic)
        except Exception:  # noqa: BLE001 - cannot tell: not a confirmation
            return False
        return meta is None or meta.error_code == errors.UnknownTopicOrPartitionError.errno

    def _repaired_by_config_sync(self, state: LaneState, exc: BatchRejectedError) -> bool:
        """A refusal topic config sync can fix (the target's size or timestamp bounds below the source's): sync
        now and retry. Once per rejected batch: the same batch refused again after a repair halts."""
        if exc.error not in REPAIRABLE_REJECTIONS or state.repaired_at == exc.source_offset:
            return False
        from mirror_core.kafka.topic_config_sync import sync_topic_configs

        try:  # not undone by a batched sync running on the watch's thread (mirror_core.daemon.config_sync)
            with self.config_sync.repairing(state.target_topic) as synced_meanwhile:
                changes = sync_topic_configs(self.config.source, self.config.target, state.topic, state.target_topic)
        except MirrorError as sync_error:
            event("config_repair_failed", logging.WARNING, topic=state.topic, target_topic=state.target_topic,
                  error=sync_error)
            return False
        if not changes and not synced_meanwhile:
            return False
        # no changes left but the periodic sync (its own thread) changed the topic since a repair last looked: it
        # may have repaired it after the refusal — retried once too (the same batch refused again halts)
        state.repaired_at = exc.source_offset
        self.metrics.config_changes.labels(state.target_topic).inc(len(changes))
        event("config_repaired", logging.WARNING, topic=state.topic, partition=state.partition,
              target_topic=state.target_topic, rejected=exc.error, source_offset=exc.source_offset,
              changes=f"'{'; '.join(map(str, changes)) or 'made by the periodic config sync'}'")
        return True


def _first_known(*values):
    return next((v for v in values if v is not None), None)
