"""Produce raw record batches to the target as an idempotent (later: transactional) producer.

The batches arrive ready for the target (:func:`mirror_core.codec.batch_prepare.prepare_for_target` has fixed offsets,
attributes and timestamps); the writer only owns the producer fields. Each batch gets our producerId /
producerEpoch, the partition's next sequence number and the transactional bit (set only inside our transaction),
stamped into the batch's own buffer with the CRC resealed
(:func:`mirror_core.codec.batch_prepare.stamp_whole_batch`).

A batch is stamped once per producer identity and sequence, and every retry resends the identical bytes, so the
broker's idempotence check turns a retry of a batch that did land into a duplicate acknowledgement, not a second copy.

The parts: :class:`BatchWriter` here (what a write is, stamping, reading the Produce answers), its side with the
transaction coordinator (:mod:`mirror_core.kafka.producer_transactions`: producer id, transactions, fencing), the
pipeline of Produce requests in flight (:mod:`mirror_core.kafka.produce_pipeline`, with its retries in
:mod:`mirror_core.kafka.produce_retry` and its routes to the broker in :mod:`mirror_core.kafka.produce_transport`),
and the classification of Kafka's answers (:mod:`mirror_core.kafka.produce_errors`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.producer import ProduceRequest

from mirror_core.codec.batch_codec import LOG_OVERHEAD, V2_HEADER, parse_batch
from mirror_core.codec.batch_prepare import stamp_whole_batch
from mirror_core.errors import (
    AmbiguousWriteError,
    BatchRejectedError,
    CorruptBatchError,
    MirrorError,
    ProducerFencedError,
)
from mirror_core.kafka.produce_errors import FENCED, REJECTIONS, STATE_LOST, error_name
from mirror_core.kafka.produce_pipeline import PendingBatch, ProducePipeline
from mirror_core.kafka.produce_transport import PRODUCE_MAX_VERSION
from mirror_core.kafka.producer_transactions import TransactionalProducer
from mirror_core.kafka.retries import is_retriable
from mirror_core.kafka.wire_client import WireClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutgoingBatch:
    """One v2 batch for a target partition, ready apart from its producer fields.

    The writer owns ``data`` and stamps it in place on every write; the caller must not share the buffer.
    Handed anything but a ``bytearray`` or a writable byte ``memoryview`` (the copier's batches re-stamped in
    their Fetch frame), the batch copies it once.
    """

    topic: str
    partition: int
    data: bytearray | memoryview
    source_offset: int  # source base offset, named in errors

    def __post_init__(self):
        data = self.data
        if not isinstance(data, bytearray) and not (
                isinstance(data, memoryview) and not data.readonly and data.format == "B" and data.ndim == 1
                and data.c_contiguous):
            object.__setattr__(self, "data", bytearray(data))

    @property
    def records_count(self) -> int:
        return parse_batch(self.data).records_count


class BatchWriter(TransactionalProducer):
    """Writes raw batches to target partitions with broker-enforced idempotence.

    Invariants: per partition at most ``MAX_IN_FLIGHT`` batches are in flight and batches land in the order given;
    a batch's bytes never change between retries within one producer epoch; ``_next_seq[tp]`` is the sequence of
    the next unacknowledged batch and moves only when the broker acknowledged one; a non-retriable rejection stops
    the write with the partition and source offset named. Pipelined but single-threaded: :meth:`write` returns
    when every batch is acknowledged; batches are stamped in their own buffers, and the encoded requests in
    flight stay under ``max_inflight_bytes``.
    """

    def __init__(self, client: WireClient, *, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000, acks: int = -1, timeout_ms: int = 30_000,
                 max_request_bytes: int = 16 * 1024 * 1024, max_inflight_bytes: int = 8 * 1024 * 1024,
                 retry_timeout_s: float = 120.0):
        if acks != -1:
            raise ValueError("idempotent writes need acks=all (-1)")
        self.client = client
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.acks = acks
        self.timeout_ms = timeout_ms
        self.max_request_bytes = max_request_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self.retry_timeout_s = retry_timeout_s
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_seq: dict[tuple[str, int], int] = collections.defaultdict(int)
        # partitions where the broker acknowledged a batch of the current producer id and epoch (so it holds our
        # producer state and enforces our sequences there); see ProducePipeline._fill
        self._acknowledged: set[tuple[str, int]] = set()
        self._in_txn = False
        # a write given up (a stream settled or dropped, or a write that raised) left a batch whose outcome is
        # unknown: the broker may hold batches this writer never heard acknowledged, so its sequences are renewed
        # (a new producer id, or a new epoch for a transactional id) before it writes again; cleared by
        # init_producer_id
        self._sequences_unknown = False
        self._txn_started = 0.0  # monotonic time of begin_transaction
        self._txn_partitions: set[tuple[str, int]] = set()
        # outside transactions, writes may go through a SharedProduce (mirror_core.kafka.shared_produce): several lanes'
        # writes in the same Produce requests
        self.shared = None
        # partitions the open transaction will write (announced by the caller): added with the next
        # AddPartitionsToTxn, so a lane's data and checkpoint partitions cost one request, not two
        self._txn_expected: set[tuple[str, int]] = set()
        # the transaction coordinator's node, found once and kept until it answers "not me" or cannot be reached
        self._coordinator: int | None = None

    @property
    def _who(self) -> str:
        return f"transactional.id {self.transactional_id!r}" if self.transactional_id else \
            f"producer id {self.producer_id}"

    # -- writing ---------------------------------------------------------------------------------------------

    def write(self, batches: Sequence[OutgoingBatch]) -> list[int]:
        """Write ``batches`` (in order per partition) and return the base offset the target gave each one.

        Batches of different partitions share Produce requests (one batch per partition per request) and up to
        ``MAX_IN_FLIGHT`` requests per broker are in flight at once; a base offset of -1 means the broker
        reported the batch as an already-written duplicate without its offset.
        """
        self._renew_if_sequences_unknown()
        if self.shared is not None and not self._in_txn:
            return self.shared.write(self, batches)
        counts = [_check_ready(batch) for batch in batches]   # each batch parsed once
        if self.producer_id < 0:
            self.init_producer_id()
        results: list[int] = [-1] * len(batches)
        try:
            if self._in_txn:
                self._add_partitions([(b.topic, b.partition) for b in batches])
            if batches:
                ProducePipeline([(self, batches, results, counts)]).run()
        except ProducerFencedError as exc:
            raise self.fenced_or_timed_out(exc) from None
        return results

    def stream(self) -> WriteStream | None:
        """A write given a batch at a time (:class:`WriteStream`), or None where writes go through a
        :class:`~mirror_core.kafka.shared_produce.SharedProduce` (there lanes' writes meet in shared requests)."""
        if self.shared is not None and not self._in_txn:
            return None
        self._renew_if_sequences_unknown()
        return WriteStream(self)

    def _renew_if_sequences_unknown(self) -> None:
        """After a given-up write whose outcome is unknown: a new producer id (idempotent) or epoch
        (transactional, its current id and epoch sent so a newer holder is not fenced) before writing; inside a
        transaction the caller must abort first (the transaction holds batches it cannot account for)."""
        if not self._sequences_unknown:
            return
        if self._in_txn:
            raise MirrorError(f"{self._who}: a write of the open transaction was given up with its outcome unknown; "
                              "abort the transaction before writing again")
        self.init_producer_id(keep=True)

    def prepare_write(self, batches: Sequence[OutgoingBatch]) -> list[int]:
        """Before a shared write (:func:`write_together`): each batch's record count (ValueError naming a batch
        that cannot be written as it is), and a producer id."""
        counts = [_check_ready(batch) for batch in batches]
        if self.producer_id < 0:
            self.init_producer_id()
        return counts

    def _stamp(self, p: PendingBatch, sequence: int) -> None:
        stamp = (self.producer_id, self.producer_epoch, sequence, self._in_txn)
        if p.stamped_for != stamp:
            stamp_whole_batch(p.batch.data, producer_id=stamp[0], producer_epoch=stamp[1], base_sequence=stamp[2],
                              transactional=stamp[3])   # a whole batch: _check_ready saw it when it was given
            p.stamped_for = stamp
            p.ambiguous = False
            p.landed_at = -1

    def _produce_request(self, items: dict[tuple[str, int], PendingBatch]) -> ProduceRequest:
        Topic = ProduceRequest.TopicProduceData
        by_topic = collections.defaultdict(list)
        for (topic, partition), p in items.items():
            records = p.batch.data if isinstance(p.batch.data, bytearray) else bytes(p.batch.data)
            by_topic[topic].append(Topic.PartitionProduceData(index=partition, records=records))
        return ProduceRequest(
            transactional_id=self.transactional_id if self._in_txn else None, acks=self.acks,
            timeout_ms=self.produce_timeout_ms,
            topic_data=[Topic(name=t, partition_data=ps) for t, ps in by_topic.items()],
            min_version=3, max_version=PRODUCE_MAX_VERSION)

    def _outcome(self, node: int, items: dict[tuple[str, int], PendingBatch], future,
                 owners: dict[tuple[str, int], BatchWriter] | None = None) -> dict[tuple[str, int], tuple]:
        """{tp: (error type, base offset)} for the partitions a finished request got an answer for (``owners``:
        the writer of each partition's batch when several writers share the request; default this one)."""
        owners = owners or {}
        if future.failed():
            exc = future.exception
            if not isinstance(exc, Errors.KafkaError):
                raise exc
            for tp, p in items.items():
                owners.get(tp, self)._raise_if_final(p, type(exc), None)
                p.ambiguous = True
            for topic in {tp[0] for tp in items}:
                self.client.invalidate(topic)
            log.info("produce to node %s on %r: %s; retrying", node, self.client.cluster_name, type(exc).__name__)
            return {}
        outcome = {}
        for topic_response in future.value.responses:
            for part in topic_response.partition_responses:
                tp = (topic_response.name, part.index)
                if tp not in items:
                    continue
                if not part.error_code:  # NO_ERROR, never final: the common answer, taken without the checks
                    outcome[tp] = (Errors.NoError, part.base_offset)
                    continue
                error = Errors.for_code(part.error_code)
                owners.get(tp, self)._raise_if_final(items[tp], error, part.error_message)
                outcome[tp] = (error, part.base_offset)
        return outcome

    def _raise_if_final(self, p: PendingBatch, error: type, detail: str | None) -> None:
        batch = p.batch
        if issubclass(error, FENCED):
            raise ProducerFencedError(self.client.cluster_name, self._who, error.__name__)
        if issubclass(error, REJECTIONS) or not (
                is_retriable(error) or error in STATE_LOST
                or error in (Errors.NoError, Errors.DuplicateSequenceNumberError)):
            raise BatchRejectedError(self.client.cluster_name, batch.topic, batch.partition, batch.source_offset,
                                     error_name(error), detail)

    def _on_state_lost(self, p: PendingBatch, error: type) -> None:
        batch = p.batch
        if p.ambiguous or self._in_txn:
            raise AmbiguousWriteError(self.client.cluster_name, batch.topic, batch.partition, batch.source_offset,
                                      error_name(error))
        log.warning("target %r %s-%s: %s; re-initialising the producer id", self.client.cluster_name,
                    batch.topic, batch.partition, error_name(error))


@dataclass
class ProduceStats:
    """Produce requests sent and batches they carried (counted by a shared write; tests and benchmarks)."""

    requests: int = 0
    batches: int = 0


def write_together(writes: Sequence[tuple[BatchWriter, Sequence[OutgoingBatch], Sequence[int]]], *,
                   stats: ProduceStats | None = None) -> list[list[int]]:
    """Write several writers' batches (each writer's in order) in shared Produce requests: ``(writer, batches,
    counts from prepare_write)`` each; returns each writer's base offsets as :meth:`BatchWriter.write` does.

    Only outside transactions (DESIGN §3.4: one request carries one transactional producer): the writers' own
    producer ids and sequences stamp their batches, and one request carries at most one batch per partition, so a
    request may mix lanes of at-least-once and ``none`` copies. The writers must share one target client."""
    results = [[-1] * len(batches) for _, batches, _ in writes]
    jobs = [(writer, batches, out, counts)
            for (writer, batches, counts), out in zip(writes, results, strict=True) if batches]
    for writer, *_ in jobs:
        if writer._in_txn:
            raise MirrorError(f"{writer._who}: writes inside a transaction cannot share Produce requests")
        if writer.client is not jobs[0][0].client:
            raise MirrorError("writers sharing Produce requests must share one target client")
    if jobs:
        ProducePipeline(jobs, stats).run()
    return results


class WriteStream:
    """One write whose batches are given one at a time (:meth:`BatchWriter.stream`): :meth:`add` sends what the
    pipeline's limits allow and takes the answers that already arrived, never waiting; :meth:`finish` waits for
    the rest and returns the base offsets, as :meth:`BatchWriter.write` of the same batches would. So the caller
    prepares its next batches while the broker works on the ones in flight, instead of preparing a whole write
    before sending any of it (one partition of small batches: the broker then idled while the copier prepared).

    The pipeline is :meth:`BatchWriter.write`'s, with the same decisions (requests, sequences, limits, order;
    tested byte for byte): only when requests leave differs. A failure answered during :meth:`add` is handled
    (resent, retried, or raised) in :meth:`finish`, as a write would. A caller that fails before finishing calls
    :meth:`settle`: the answers in flight are taken and the batches not yet sent are dropped (unless every batch
    sent was acknowledged, the writer renews its producer id or epoch before its next write). Used by one thread;
    after :meth:`finish` or :meth:`settle` it is done."""

    def __init__(self, writer: BatchWriter):
        self.writer = writer
        self.results: list[int] = []      # base offsets, in the order given (-1 until acknowledged)
        self._pipeline: ProducePipeline | None = None
        self._partitions: set[tuple[str, int]] = set()
        self.done = False

    def __len__(self) -> int:
        return len(self.results)

    def add(self, batch: OutgoingBatch) -> None:
        """Queue ``batch`` after the ones given before and send what the limits allow; never waits for an answer.
        A batch that cannot be written as it is raises ValueError naming it (the stream stays open: settle it)."""
        if self.done:
            raise MirrorError("a finished write stream takes no more batches")
        writer = self.writer
        count = _check_ready(batch)
        tp = (batch.topic, batch.partition)
        try:
            if writer.producer_id < 0:
                writer.init_producer_id()
            if tp not in self._partitions and writer._in_txn:
                writer._add_partitions([tp])
        except ProducerFencedError as exc:
            raise writer.fenced_or_timed_out(exc) from None
        self._partitions.add(tp)
        if self._pipeline is None:
            self._pipeline = ProducePipeline([(writer, (), self.results, ())])
        self.results.append(-1)
        self._pipeline.add(0, PendingBatch(len(self.results) - 1, batch, count))
        try:
            self._pipeline.pump()
        except BaseException as exc:
            self.done = True  # the pipeline gave up (and waited for its requests in flight)
            if isinstance(exc, ProducerFencedError):
                raise writer.fenced_or_timed_out(exc) from None
            raise

    def finish(self) -> list[int]:
        """Wait until every batch given is acknowledged (retrying as a write does); their base offsets in order."""
        if self.done:
            raise MirrorError("the write stream was already finished or given up")
        self.done = True
        if self._pipeline is not None:
            # the retry window starts now, as a write's does when it is called (the stream may be older)
            self._pipeline.backoff.give_up_after = self.writer._retry_window_s()
            try:
                self._pipeline.run()
            except ProducerFencedError as exc:
                raise self.writer.fenced_or_timed_out(exc) from None
        return self.results

    def settle(self) -> MirrorError | None:
        """Give up the stream (the caller failed): wait for the answers in flight, send nothing more. Unless every
        batch sent was acknowledged, the writer takes a new producer id or epoch before it writes again. Returns
        the fence if the target fenced this writer meanwhile (the caller raises it over its own error: the lane is
        no longer ours); anything else going wrong here is logged, never raised over the caller's error."""
        if self.done:
            return None
        self.done = True
        if self._pipeline is None:
            return None
        try:
            fence = self._pipeline.settle()
        except Exception as exc:  # noqa: BLE001 - the caller's error is the one to report
            log.warning("%s: giving up a write stream: %s: %s (the writer takes a new producer id or epoch before "
                        "its next write)", self.writer._who, type(exc).__name__, exc)
            return None
        return None if fence is None else self.writer.fenced_or_timed_out(fence)

    def drop(self) -> None:
        """Give up the stream without waiting (the process is being interrupted): if anything was sent, the
        writer takes a new producer id or epoch before it writes again."""
        if not self.done:
            self.done = True
            if self._pipeline is not None and (self._pipeline.inflight or self._pipeline.failed):
                self.writer._sequences_unknown = True


def _check_ready(batch: OutgoingBatch) -> int:
    """The batch's record count, or ValueError naming it when it cannot be written as it is."""
    data = batch.data
    if len(data) >= V2_HEADER.size:   # the usual case, one unpack: a whole v2 batch with records and no holes
        fields = V2_HEADER.unpack_from(data, 0)
        # batchLength, magic, lastOffsetDelta, recordsCount (the field order of V2_HEADER: BatchView's)
        length, magic, last_delta, count = fields[1], fields[3], fields[6], fields[12]
        if length + LOG_OVERHEAD == len(data) and magic == 2 and count > 0 and last_delta + 1 == count:
            return count
    try:
        view = parse_batch(batch.data)
    except (ValueError, CorruptBatchError):
        view = None
    if view is not None and view.magic == 2 and view.records_count > 0 and not view.has_offset_holes:
        return view.records_count
    where = f"{batch.topic}-{batch.partition} source offset {batch.source_offset}"
    if view is None or view.magic != 2:
        raise ValueError(f"{where}: only whole magic-2 batches can be written")
    raise ValueError(f"{where}: batch has {view.records_count} records for {view.last_offset_delta + 1} "
                     "offsets; re-encode it first")
