"""The raw-batch producer's pipeline: one write of one or several writers' batches, up to ``MAX_IN_FLIGHT`` Produce
requests in flight per broker (:class:`ProducePipeline`; its failure side is :mod:`mirror_core.kafka.produce_retry`,
its sends go through :mod:`mirror_core.kafka.produce_transport`).

Produce requests are pipelined: up to ``MAX_IN_FLIGHT`` (5, the most for which Kafka's idempotence keeps order)
per broker, with sequences assigned in send order. Answers are taken in send order; when a batch fails, the
partition's later batches in flight are resent after it with their original bytes (the broker rejects those it did
not write as out of sequence and acknowledges those it did as duplicates), so a partition's order never changes.
That holds only where the broker has our producer state: a partition with no state for a producer id accepts that
producer's first batch whatever its sequence (Kafka's ``ProducerAppendInfo.checkSequence``), so with several in flight
a batch behind a refused first one (a new topic's partition answering NOT_LEADER_OR_FOLLOWER until its leader is
ready) would land first. So until the broker acknowledged a batch of the current producer id and epoch on a
partition, that partition has one batch in flight; and should a later batch still land ahead of a refused one (the
broker dropped our state, e.g. when retention deleted all our batches), the writer halts with
:class:`~mirror_core.errors.WriteOrderError` rather than re-initialise and write the refused batch after it.
One copy path runs one partition, so one Produce round trip per batch was the limit without this (see
``docs/performance.md``). A Produce request (v3+) carries one batch per partition (Kafka's
``ProduceRequest.validateRecords``), and a broker handles one request per connection at a time, so a single
partition of one-record batches stays bound by the broker's time per request; several partitions share requests:
one writer's partitions always, several writers' (lanes') outside transactions through
:func:`~mirror_core.kafka.writer.write_together`.

The knobs below are read here at each turn (tests and benchmarks set them on this module).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

import kafka.errors as Errors
from kafka.future import Future

from mirror_core.errors import MirrorError, ProducerFencedError
from mirror_core.kafka.produce_errors import STATE_LOST
from mirror_core.kafka.produce_retry import PipelineRetry
from mirror_core.kafka.produce_transport import PRODUCE_MAX_VERSION, ProduceTransport
from mirror_core.kafka.retries import Backoff

if TYPE_CHECKING:
    from mirror_core.kafka.writer import BatchWriter, OutgoingBatch, ProduceStats

# Produce requests in flight per broker connection (so per partition too): the broker keeps the idempotence
# state of the last 5 batches per producer and partition, and kafka-python pauses a connection at 5 in flight.
MAX_IN_FLIGHT = 5
# After waiting for an answer, the pipeline takes the answers that already arrived before sending again, but only
# while more than this many requests stay in flight (work queued at the broker while the answers are handled)
KEEP_QUEUED = 3
# A write of one writer to one partition takes ProducePipeline._run_one_partition (same requests, less Python per
# request); False sends every write through the general turns (tests compare the two)
ONE_PARTITION_LOOP = True

_MAX_SEQUENCE = 2**31 - 1
_SEQUENCE_SPACE = _MAX_SEQUENCE + 1


def next_sequence(sequence: int, records: int) -> int:
    """Kafka's sequence arithmetic: wraps to 0 after 2^31 - 1."""
    return (sequence + records) % _SEQUENCE_SPACE


class PendingBatch:
    """One batch of a write: where it sits in its writer's list, its record count, and what the pipeline knows of it."""

    __slots__ = ("index", "batch", "records", "stamped_for", "ambiguous", "landed_at")

    def __init__(self, index: int, batch: OutgoingBatch, records: int):
        self.index = index
        self.batch = batch
        self.records = records
        self.stamped_for: tuple[int, int, int, bool] | None = None  # (producer id, epoch, sequence, transactional)
        self.ambiguous = False
        self.landed_at = -1  # target offset of a write the broker acknowledged behind a failed batch


class _Request:
    __slots__ = ("node", "items", "keys", "size", "future")

    def __init__(self, node: int, items: dict[tuple[str, int], PendingBatch], keys: list, size: int, future):
        self.node = node
        self.items = items  # {tp: batch}: one batch per partition per request (the broker's rule)
        self.keys = keys    # the pipeline key (writer slot, tp) of each item, in the order of ``items``
        self.size = size
        self.future = future


class ProducePipeline(PipelineRetry):
    """One write of one or several writers' batches: keeps up to ``MAX_IN_FLIGHT`` Produce requests in flight per
    broker. Several writers (lanes) share requests only outside transactions (:func:`write_together`); their
    batches are queued per (writer, partition), a request carries at most one batch per partition whoever writes it.

    Invariants: per partition the batches in flight are the leading ones of ``unacked[key]``, sent in order, and
    only the first ``sent[key]`` of them; at most one until the broker acknowledged a batch of the current producer
    id and epoch on the partition (before that it may hold no state for us and accept any sequence); a batch's
    sequence is ``_next_seq[tp]`` plus the records of the unacked batches before it, so a resend carries the same
    sequence and identical bytes (same producer epoch);
    acknowledgements are taken in send order and a partition's batches behind a failed one are resent after it,
    whatever their own answer was (the broker dedupes those that landed), so order on the target is the given
    order; a failure stops new sends until every request in flight has been answered, then retries after a
    backoff (or re-initialises the producer id of the writer whose state the broker lost); unacknowledged request
    bytes stay under ``max_inflight_bytes`` (one request may exceed it alone).

    Turns (:meth:`run`): :meth:`_fill` queues the requests the limits allow and :meth:`ProduceTransport.flush` hands
    them to the sockets before anything waits (one ``sendmsg`` per connection per turn); then the oldest answer is
    waited for, and the answers already received are taken while more than ``KEEP_QUEUED`` requests stay in
    flight. Only the timing of sends changes: which batches a request carries, their order and every limit above
    are decided exactly as with one send per answer. ``leaders`` caches each partition's leader for a healthy
    stretch only (cleared by any failed batch and before every retry). A write of one writer to one partition on a
    fast connection runs these turns in :meth:`_run_one_partition` (the same decisions on the same state, without
    the per-request maps), until a failure hands it back to them.
    """

    def __init__(self, jobs: Sequence[tuple[BatchWriter, Sequence[OutgoingBatch], list[int], Sequence[int]]],
                 stats: ProduceStats | None = None):
        self.stats = stats
        self.writers = [job[0] for job in jobs]
        self.writer = writer = self.writers[0]  # sends the requests: its client, acks and transaction
        self.results = [job[2] for job in jobs]
        self.max_request_bytes = min(w.max_request_bytes for w in self.writers)
        self.max_inflight_bytes = max(w.max_inflight_bytes for w in self.writers)
        # key: (writer slot, tp)
        self.unacked: dict[tuple, collections.deque[PendingBatch]] = collections.defaultdict(collections.deque)
        for slot, (_, batches, _, counts) in enumerate(jobs):
            for index, batch in enumerate(batches):
                self.unacked[(slot, (batch.topic, batch.partition))].append(PendingBatch(index, batch, counts[index]))
        self.sent: dict[tuple, int] = dict.fromkeys(self.unacked, 0)
        self.send_seq: dict[tuple, int] = {}
        self.inflight: collections.deque[_Request] = collections.deque()
        self.node_load: dict[int, int] = collections.defaultdict(int)
        self.inflight_bytes = 0
        self.failed: dict[tuple, tuple[PendingBatch, type | None]] = {}  # first failure per (writer, partition)
        self.draining = False
        self.last_error = "no leader"
        self.backoff = Backoff(give_up_after=writer._retry_window_s())
        self.transport = ProduceTransport(writer.client)
        # (writer slot, tp) -> leader node, looked up once per healthy stretch: forgotten whenever a request fails
        # (a moved leader answers NOT_LEADER_OR_FOLLOWER, which fails it) and before every retry, so a retry
        # always asks the client's metadata afresh, as each send did before
        self.leaders: dict[tuple, int] = {}
        # pump's one-partition route (key, tp, connection), found once: a noted failure ends pumping for good
        self._pump_route: tuple | None = None

    def run(self) -> None:
        # Per turn: send what the limits allow (the requests queued in one turn leave together, one sendmsg per
        # connection), wait for the oldest answer, then take the answers that have already arrived as long as
        # more than KEEP_QUEUED requests stay in flight: the refill then goes out in one sendmsg, and the broker
        # (one request per connection at a time) still has queued work while this process handles the answers.
        inflight, transport = self.inflight, self.transport
        single = len(self.writers) == 1
        try:
            while self.unacked:
                if not self.draining:
                    if single and ONE_PARTITION_LOOP and len(self.unacked) == 1 and self._run_one_partition():
                        continue
                    self._fill()
                    transport.flush()
                if inflight:
                    self._complete(inflight.popleft())
                    while len(inflight) > KEEP_QUEUED and transport.answered(inflight[0].future):
                        self._complete(inflight.popleft())
                else:
                    self._retry()
        except BaseException:
            self._abandon()
            if self._outcome_unknown():
                self._mark_unknown()
            raise

    def _run_one_partition(self) -> bool:
        """The turns of :meth:`run` for a write of one writer to one partition on a fast connection, without the
        general per-request passes (:meth:`_fill`'s maps, :meth:`_send`'s and :class:`ProduceTransport`'s regrouping,
        :meth:`_complete`'s outcome dict): on one partition each request carries exactly the partition's next
        batch, so a turn sends while the same limits as :meth:`_fill` allow (the first-acknowledgement rule,
        ``MAX_IN_FLIGHT``, ``max_inflight_bytes``), stamps each batch with the same sequence, flushes, waits for
        the oldest answer and takes the arrived ones while more than ``KEEP_QUEUED`` stay in flight. The
        requests are the general path's, byte for byte and in the same order (tested); the state kept is the
        general path's too (``unacked``, ``sent``, ``send_seq``, ``inflight``, ``node_load``,
        ``inflight_bytes``), so any answer other than a clean acknowledgement of the batch is handed to
        :meth:`_complete` as it is, and once a failure is noted (``draining``) the general turns take over.

        Returns False (nothing done) when the write is not on this shape: the partition's leader not yet looked
        up (the general :meth:`_fill` looks it up), no fast connection to it, or a failure being drained."""
        route = self._one_partition_route()
        if route is None:
            return False
        key, tp, conn = route
        inflight = self.inflight
        while True:
            self._send_one_partition(key, tp, conn)
            if not inflight:
                return False
            self._take_one_partition(inflight.popleft(), key, tp)
            while len(inflight) > KEEP_QUEUED and conn.answered(inflight[0].future):
                self._take_one_partition(inflight.popleft(), key, tp)
            if self.draining or key not in self.unacked:
                return True

    def _one_partition_route(self):
        """(key, tp, fast connection) when this write is one writer's to one partition whose leader is known and
        reached by a fast connection, and no failure is being handled; else None."""
        if self.failed or self.draining or len(self.writers) != 1 or len(self.unacked) != 1:
            return None
        (key, _), = self.unacked.items()
        node = self.leaders.get(key)
        if node is None:
            return None
        conn = self.transport.fast_connection(node)
        if conn is None:
            return None
        return key, key[1], conn

    def _send_one_partition(self, key: tuple, tp: tuple[str, int], conn) -> None:
        """Send the partition's next batches while :meth:`_fill`'s limits allow, then flush (one ``sendmsg``)."""
        queue = self.unacked[key]
        node = self.leaders[key]
        topic, partition = tp
        writer = self.writer
        acknowledged, next_seq = writer._acknowledged, writer._next_seq
        sent, send_seq, inflight, node_load, stats = self.sent, self.send_seq, self.inflight, self.node_load, \
            self.stats
        max_inflight_bytes, produce = self.max_inflight_bytes, conn.produce_one
        count = sent[key]
        load = node_load[node]
        while count < len(queue) and load < MAX_IN_FLIGHT and (not count or tp in acknowledged):
            p = queue[count]
            data = p.batch.data
            size = len(data)
            if inflight and self.inflight_bytes + size > max_inflight_bytes:
                break
            sequence = next_seq[tp] if not count else send_seq[key]
            writer._stamp(p, sequence)
            send_seq[key] = (sequence + p.records) % _SEQUENCE_SPACE   # next_sequence, inline
            count += 1
            sent[key] = count
            timeout_ms = writer.produce_timeout_ms
            try:
                future = produce(transactional_id=writer.transactional_id if writer._in_txn else None,
                                 acks=writer.acks, timeout_ms=timeout_ms, topic=topic, partition=partition,
                                 records=data, max_version=PRODUCE_MAX_VERSION, request_timeout_ms=timeout_ms + 5_000)
            except Errors.KafkaError as exc:
                future = Future().failure(exc)
            inflight.append(_Request(node, {tp: p}, [key], size, future))
            load += 1
            node_load[node] = load
            self.inflight_bytes += size
            if stats is not None:
                stats.requests += 1
                stats.batches += 1
        conn.flush()

    # -- a write given a batch at a time (WriteStream) --------------------------------------------------------

    def add(self, slot: int, pending: PendingBatch) -> None:
        """One more batch of writer ``slot``, after every batch given before (a partition's order is the order
        given, whether the batches came at construction or one by one)."""
        key = (slot, (pending.batch.topic, pending.batch.partition))
        self.unacked[key].append(pending)
        self.sent.setdefault(key, 0)

    def pump(self) -> None:
        """A turn that never waits: send what the limits allow and, when a batch still waits for room, take the
        answers that already arrived and send again (the same decisions as :meth:`run`'s turns, which differ only
        in waiting for the oldest answer). A failure is only noted here (``draining``): its handling (resends,
        backoff, a new producer id, or the error) is :meth:`run`'s, when the writer's caller finishes the write."""
        if self.failed or self.draining:
            return
        inflight = self.inflight
        try:
            route = self._pump_route if len(self.unacked) == 1 else None
            if route is None and ONE_PARTITION_LOOP:
                route = self._pump_route = self._one_partition_route()
            if route is not None:
                key, tp, conn = route
                queue = self.unacked.get(key)
                if queue is None:
                    return
                self._send_one_partition(key, tp, conn)
                if self.sent[key] < len(queue):   # a batch waits for room: take the answers already here
                    # the kernel is asked once (one readv takes every answer that has arrived); the answers after
                    # the first are taken only if that read brought them: a second readv a few microseconds later
                    # nearly always finds nothing (follow-up 9 in docs/performance.md counted 1.9 per batch)
                    took = False
                    while inflight and not self.draining and conn.answered(inflight[0].future, ask=not took):
                        self._take_one_partition(inflight.popleft(), key, tp)
                        took = True
                    if took and not self.draining and key in self.unacked:
                        self._send_one_partition(key, tp, conn)
                return
            transport = self.transport
            while inflight and not self.draining and transport.answered(inflight[0].future):
                self._complete(inflight.popleft())
            if not self.draining:
                self._fill()
                transport.flush()
        except BaseException:
            self._abandon()
            self._mark_unknown()
            raise

    def settle(self) -> ProducerFencedError | None:
        """The caller gives up on this write (its own error, before :meth:`run`): take the answers of the requests
        in flight as :meth:`run` would, then leave; batches never sent are dropped, nothing is resent. Unless every
        batch sent was acknowledged, the writers' sequences no longer match the broker's (a request without an
        answer, or refused after it was written, may have landed): they are marked so, and take a new producer id
        or epoch before they write again (:meth:`BatchWriter._sequences_unknown`). Returns the fence if the
        broker fenced a writer meanwhile (the caller reports it: the lane is no longer ours); raises only what is
        not a Kafka answer."""
        fence = None
        try:
            while self.inflight:
                self._complete(self.inflight.popleft())
        except ProducerFencedError as exc:
            fence = exc
            self._abandon()
        except BaseException:
            self._abandon()
            self._mark_unknown()
            raise
        if fence is not None or self.failed or any(self.sent.get(key) for key in self.unacked):
            self._mark_unknown()
        return fence

    def _outcome_unknown(self) -> bool:
        """Whether a batch of this write may be on the target without the writer knowing it: one whose request got
        no answer (``ambiguous``) or that landed behind a refused batch (``landed_at``). A write stopped with only
        answered requests behind it is not: the same writer resending from its first unacknowledged batch is
        deduplicated by the broker (tested), so its sequences stay."""
        return any(p.ambiguous or p.landed_at >= 0 for queue in self.unacked.values() for p in queue)

    def _mark_unknown(self) -> None:
        for writer in self.writers:
            writer._sequences_unknown = True

    def _take_one_partition(self, request: _Request, key: tuple, tp: tuple[str, int]) -> None:
        """:meth:`_complete` for a request of :meth:`_run_one_partition`: a clean acknowledgement of its batch is
        taken directly; anything else (a failed request, an error code, an answer of another shape, and every
        answer once a batch failed: those behind it are resent whatever they say) goes to :meth:`_complete`
        unchanged."""
        future = request.future
        conn = getattr(future, "conn", None)
        if conn is not None:
            if not future.is_done:
                conn.wait(future)
            if future.exception is None and not self.failed:   # behind a failed batch: _complete's rule decides
                responses = future.value.responses
                if len(responses) == 1 and responses[0].name == tp[0]:
                    parts = responses[0].partition_responses
                    if len(parts) == 1 and parts[0].index == tp[1] and not parts[0].error_code:
                        self.node_load[request.node] -= 1
                        self.inflight_bytes -= request.size
                        self._acknowledge(key, request.items[tp], parts[0].base_offset)
                        return
        self._complete(request)

    # -- sending ---------------------------------------------------------------------------------------------

    def _fill(self) -> None:
        """Send requests, one batch per partition each, until a limit is hit or nothing is left to send."""
        sent, node_load, leaders = self.sent, self.node_load, self.leaders
        while True:
            groups: dict[int, dict[tuple[str, int], PendingBatch]] = {}
            keys: dict[int, list] = {}
            sizes: dict[int, int] = {}
            total = 0  # bytes of this pass's requests
            for key, queue in self.unacked.items():
                count = sent[key]
                if count >= len(queue):
                    continue
                slot, tp = key
                if count and tp not in self.writers[slot]._acknowledged:
                    continue  # the broker may have no state for our producer id here: see the class docstring
                node = leaders.get(key)
                if node is None:
                    node = self._leader(key)
                    if node is None:
                        continue
                if node_load[node] >= MAX_IN_FLIGHT:
                    continue
                group = groups.get(node)
                if group is not None and tp in group:
                    continue
                pending = queue[count]
                size = len(pending.batch.data)
                if group and sizes[node] + size > self.max_request_bytes:
                    continue
                if (self.inflight or total) and self.inflight_bytes + total + size > self.max_inflight_bytes:
                    continue
                if group is None:
                    group = groups[node] = {}
                    keys[node], sizes[node] = [], 0
                group[tp] = pending
                keys[node].append(key)
                sizes[node] += size
                total += size
            if not groups:
                return
            for node, items in groups.items():
                self._send(node, items, keys[node], sizes[node])

    def _leader(self, key: tuple) -> int | None:
        """The partition's leader, remembered in ``leaders`` until a batch fails or a retry begins (then cleared)."""
        slot, tp = key
        try:
            node = self.leaders[key] = self.writer.client.leader_for(*tp)[0]
            return node
        except Errors.KafkaError as exc:
            queue = self.unacked[key]
            self.writers[slot]._raise_if_final(queue[self.sent[key]], type(exc), None)
            self.writer.client.invalidate(tp[0])
            self.last_error = type(exc).__name__
            return None

    def _send(self, node: int, items: dict[tuple[str, int], PendingBatch], keys: list, size: int) -> None:
        for key, p in zip(keys, items.values(), strict=True):
            writer = self.writers[key[0]]
            if self.sent[key] == 0:
                self.send_seq[key] = writer._next_seq[key[1]]
            writer._stamp(p, self.send_seq[key])
            self.send_seq[key] = next_sequence(self.send_seq[key], p.records)
            self.sent[key] += 1
        timeout_ms = self.writer.produce_timeout_ms
        future = self.transport.send(node, self.writer, items, timeout_ms + 5_000, timeout_ms)
        self.inflight.append(_Request(node, items, keys, size, future))
        if self.stats is not None:
            self.stats.requests += 1
            self.stats.batches += len(items)
        self.node_load[node] += 1
        self.inflight_bytes += size

    # -- answers ---------------------------------------------------------------------------------------------

    def _complete(self, request: _Request) -> None:
        """Take the answer of the oldest request in flight: acknowledge in order, or note the first failure."""
        self.transport.wait(request.future)
        self.node_load[request.node] -= 1
        self.inflight_bytes -= request.size
        if len(request.keys) == 1 and len(self.writers) == 1:
            owners = None  # the one writer: _outcome's default
        else:
            owners = {key[1]: self.writers[key[0]] for key in request.keys}
        outcome = self.writer._outcome(request.node, request.items, request.future, owners)
        if not outcome and request.future.failed():  # the connection failed: say so if the retries run out
            exc = request.future.exception
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        failed = self.failed
        for key, (tp, p) in zip(request.keys, request.items.items(), strict=True):
            error, base_offset = outcome.get(tp, (None, -1))
            if failed and key in failed:      # behind a failed batch: resent after it, whatever its answer
                if error is Errors.NoError and base_offset >= 0 and p.landed_at < 0:
                    p.landed_at = base_offset  # written (or a duplicate of a write) while an earlier one was not
                continue
            if error is Errors.NoError or error is Errors.DuplicateSequenceNumberError:
                self._acknowledge(key, p, base_offset)
            else:
                failed[key] = (p, error)
                self.draining = True
                self.leaders.clear()
                if error is not None:
                    self.last_error = error.__name__
                    if error not in STATE_LOST:
                        self.writer.client.invalidate(tp[0])

    def _acknowledge(self, key: tuple, p: PendingBatch, base_offset: int) -> None:
        slot, tp = key
        queue = self.unacked[key]
        if queue[0] is not p:                 # cannot happen while answers come in send order
            raise MirrorError(f"{tp[0]}-{tp[1]}: acknowledgement out of order at source offset "
                              f"{p.batch.source_offset}")
        queue.popleft()
        self.sent[key] -= 1
        self.results[slot][p.index] = base_offset
        writer = self.writers[slot]
        writer._next_seq[tp] = (writer._next_seq[tp] + p.records) % _SEQUENCE_SPACE   # next_sequence, inline
        writer._acknowledged.add(tp)
        if not queue:
            del self.unacked[key], self.sent[key]
        self.backoff.reset()

