"""The pipeline's failure side (:class:`PipelineRetry`, a part of
:class:`~mirror_core.kafka.produce_pipeline.ProducePipeline`): once every request in flight has been answered after a
failure, every unacknowledged batch is resent, after a backoff or under a new producer id when the broker lost our
state; or the write halts.

Invariants: a new producer id is taken only when no batch of the writer could then be written twice: a batch that
landed behind a refused one (:class:`~mirror_core.errors.WriteOrderError`) or whose answer never came
(:class:`~mirror_core.errors.AmbiguousWriteError`) halts the write instead; retries end with
:class:`~mirror_core.errors.PartitionUnavailableError` when the backoff's window runs out; leaving with an error
waits for the requests in flight first, so none lands behind the caller's back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mirror_core.errors import AmbiguousWriteError, PartitionUnavailableError, WriteOrderError
from mirror_core.kafka.produce_errors import STATE_LOST, error_name

if TYPE_CHECKING:
    from mirror_core.kafka.produce_pipeline import PendingBatch
    from mirror_core.kafka.writer import BatchWriter

log = logging.getLogger(__name__)


class PipelineRetry:
    """The retry turns of :class:`~mirror_core.kafka.produce_pipeline.ProducePipeline` (a mixin on its state:
    ``unacked``, ``sent``, ``failed``, ``inflight``, ``leaders``, ``backoff``, ``writers``)."""

    def _retry(self) -> None:
        """Nothing in flight and batches left: every unacked batch is resent, after a backoff or a new producer id."""
        for key in self.sent:
            self.sent[key] = 0
        self.leaders.clear()
        lost = [(key, p, error) for key, (p, error) in self.failed.items() if error in STATE_LOST]
        self.failed.clear()
        self.draining = False
        if lost:
            renew = []
            for key, p, error in lost:
                writer = self.writers[key[0]]
                writer._on_state_lost(p, error)
                self._refuse_if_order_broken(key, p, error)
                if writer not in renew:
                    renew.append(writer)
            for writer in renew:
                self._refuse_if_renewal_ambiguous(writer, {key for key, _, _ in lost}, lost[0][2])
            for key, p, error in lost:
                self._refuse_if_landing_unknown(key, p, error)
            for writer in renew:
                writer.init_producer_id(keep=True)
        elif not self.backoff.wait():
            p = next(iter(self.unacked.values()))[0]
            raise PartitionUnavailableError(self.writer.client.cluster_name, p.batch.topic, p.batch.partition,
                                            f"write failed: {self.last_error}", offset=p.batch.source_offset)

    def _refuse_if_renewal_ambiguous(self, writer: BatchWriter, lost: set[tuple], error: type) -> None:
        """``writer`` is about to take a new producer id because partitions ``lost`` lost our state. Its
        unacknowledged batches of its OTHER partitions are then resent under the new id too, which the broker cannot
        dedupe against the old one: so should any of them have been sent without an answer (it may have landed) or
        landed behind a refused batch, halt instead of writing it twice. (Only a writer of several partitions in one
        write meets this; a lost partition's own batches are checked by :meth:`BatchWriter._on_state_lost` and
        :meth:`_refuse_if_order_broken` and :meth:`_refuse_if_landing_unknown`.)"""
        for key, queue in self.unacked.items():
            if key in lost or self.writers[key[0]] is not writer or not queue:
                continue
            for p in queue:
                if p.ambiguous:
                    raise AmbiguousWriteError(writer.client.cluster_name, p.batch.topic, p.batch.partition,
                                              p.batch.source_offset,
                                              f"{error_name(error)} re-initialises the producer id")
            self._refuse_if_order_broken(key, queue[0], error)

    def _refuse_if_order_broken(self, key: tuple, head: PendingBatch, error: type) -> None:
        """The broker refuses ``head`` (the partition's first unacknowledged batch) as out of sequence; if a batch
        behind it was acknowledged meanwhile, that one is on the target and ``head`` is not: a new producer id would
        write ``head`` after it and it twice. Halt instead, naming both."""
        tp = key[1]
        for p in self.unacked.get(key, ()):
            if p is not head and p.landed_at >= 0:
                raise WriteOrderError(self.writer.client.cluster_name, tp[0], tp[1], head.batch.source_offset,
                                      p.batch.source_offset, p.landed_at, error_name(error))

    def _refuse_if_landing_unknown(self, key: tuple, head: PendingBatch, error: type) -> None:
        """As :meth:`_refuse_if_order_broken` for a batch behind ``head`` sent under this producer id whose answer
        never came (``ambiguous``): a broker without our state takes it as a first batch, so it may be on the target
        ahead of ``head`` without our hearing of it, and a new producer id would write ``head`` after it and it
        twice. Halt, naming it (checked last: a proven landing or another partition's doubt is named first)."""
        tp = key[1]
        for p in self.unacked.get(key, ()):
            if p is not head and p.ambiguous:
                raise AmbiguousWriteError(self.writer.client.cluster_name, tp[0], tp[1], p.batch.source_offset,
                                          f"{error_name(error)} for the batch from source offset "
                                          f"{head.batch.source_offset} before it")

    def _abandon(self) -> None:
        """On the way out with an error: let the requests in flight finish so none lands behind our back later."""
        while self.inflight:
            try:
                self.transport.wait(self.inflight.popleft().future)
            except Exception:  # noqa: BLE001 - the error being raised is the one to report
                log.debug("abandoned produce request failed", exc_info=True)
