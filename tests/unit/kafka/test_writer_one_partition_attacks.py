"""Review of i14-one-partition-2: what a real broker does that the one-partition loop's own tests do not script.

The scripted cluster of ``test_writer_fast_route_faults`` (real sockets, Kafka's idempotence rules) gains the answers
a Kafka committer would throw at a pipelined idempotent producer, and every write runs with the one-partition loop on
and off (``ONE_PARTITION_LOOP``): the target log, the base offsets returned and the error raised must be the same, and
each must be what Kafka's contract asks for.

Extra per-batch actions (besides those of ``test_writer_fast_route_faults.Cluster``):

- ``"dupcode"``: a resend of a batch the partition holds is answered DUPLICATE_SEQUENCE_NUMBER with base offset -1
  (an older broker's "already have it"), a new batch is appended as usual;
- ``"fence"``: INVALID_PRODUCER_EPOCH for this batch and every later one of this producer id (a newer epoch took
  over the partition: fencing is sticky, nothing of the old epoch lands again);
- ``"oos"``: OUT_OF_ORDER_SEQUENCE_NUMBER for this batch, nothing appended (the broker refuses a gap it sees);
- ``"silent"``: append, never answer (the client's request timeout must end the wait);
- ``("throttle", ms)``: append and answer with ``throttle_time_ms`` = ms;
- ``("forget", code)``: the broker drops our producer state (retention deleted our batches), this batch is
  answered ``code`` and not written; the next batch is taken as a first one, whatever its sequence (Kafka's
  ``checkSequence`` without a producer epoch);
- ``("appended", code)``: append, then answer ``code`` (NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT of an
  acks=all write whose replication timed out: the leader holds the batch).

Answer delivery (``delivery``): ``"whole"`` (one ``sendall`` per answer), ``"bytes"`` (each answer a byte at a
time), ``"coalesced"`` (answers held while more requests are already waiting, then sent in one ``sendall``: a
refusal and the clean answers behind it arrive in one read).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from types import SimpleNamespace

import kafka.errors as Errors
import pytest
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceResponse,
)

from mirror_core.codec.batch_codec import parse_batch
from mirror_core.codec.kafka_primitives import API_VERSIONS
from mirror_core.codec.sasl_messages import API_SASL_AUTHENTICATE, API_SASL_HANDSHAKE
from mirror_core.errors import ProducerFencedError
from mirror_core.kafka import produce_pipeline
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.produce_pipeline import next_sequence
from mirror_core.kafka.wire_channel import FastSecurity, tls_context
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch
from tests.unit.kafka import test_writer_fast_route_faults as faults
from tests.unit.kafka.test_kafka_wire_pure import make_batch
from tests.unit.kafka.test_wire_channel_records import material  # noqa: F401 - fixture
from tests.unit.kafka.test_wire_fastpath import _recv

pytestmark = pytest.mark.timeout(60)

NOT_LEADER = Errors.NotLeaderForPartitionError.errno
DUPLICATE = Errors.DuplicateSequenceNumberError.errno
FENCED = Errors.InvalidProducerEpochError.errno
OUT_OF_ORDER = Errors.OutOfOrderSequenceNumberError.errno


class AttackCluster(faults.Cluster):
    def __init__(self, leaders, script=None, *, delivery="whole", tls=None, session_ms=0):
        self.delivery = delivery
        self.tls = tls                       # a server SSLContext: every connection is TLS
        self.session_ms = session_ms         # SASL PLAIN on every connection, sessions of this lifetime (KIP-368)
        self.logins: list = []               # (connection number, monotonic time) per SaslAuthenticate
        self.expired_requests = 0            # requests that came on a connection whose session had expired
        self.accepted = 0
        self.fenced: set = set()             # (tp, producer id) refused for good
        self.frames: list[bytes] = []        # every Produce frame received, in order
        self.throttle_ms = 0
        super().__init__(leaders, script)

    def _serve(self, node, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            self.accepted += 1
            number = self.accepted
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                return
        held, session_ends = [], None
        with conn:
            while True:
                if held and not select.select([conn], [], [], 0.03)[0]:
                    self._deliver(conn, b"".join(held))   # nothing more waiting: the held answers go together
                    held = []
                head = _recv(conn, 4)
                if head is None:
                    return
                frame = _recv(conn, struct.unpack(">i", head)[0])
                if frame is None:
                    return
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if api_key == API_VERSIONS:
                    apis = [(0, 3, 11), (1, 4, 17)] + ([(17, 0, 1), (36, 0, 1)] if self.session_ms else [])
                    body = struct.pack(">hi", 0, len(apis)) + b"".join(struct.pack(">hhh", *a) for a in apis)
                    conn.sendall(struct.pack(">ii", len(body) + 4, correlation_id) + body)
                    continue
                if api_key == API_SASL_HANDSHAKE:
                    body = struct.pack(">hih", 0, 1, 5) + b"PLAIN"
                    conn.sendall(struct.pack(">ii", len(body) + 4, correlation_id) + body)
                    continue
                if api_key == API_SASL_AUTHENTICATE:   # v1: error, null message, empty auth bytes, lifetime
                    with self.lock:
                        self.logins.append((number, time.monotonic()))
                    session_ends = time.monotonic() + self.session_ms / 1000
                    body = struct.pack(">hhiq", 0, -1, 0, self.session_ms)
                    conn.sendall(struct.pack(">ii", len(body) + 4, correlation_id) + body)
                    continue
                if session_ends is not None and time.monotonic() > session_ends:
                    with self.lock:                   # Kafka closes a connection used past its session
                        self.expired_requests += 1
                    return
                self.frames.append(bytes(frame))
                _, version, correlation_id, topics = faults._parse_produce(frame)
                answers, action = [], 0
                with self.lock:
                    self.throttle_ms = 0
                    for tp, records in topics:
                        code, base, action = self._answer(node, tp, records)
                        answers.append((tp, code, base))
                R = ProduceResponse.TopicProduceResponse
                body = bytes(ProduceResponse(responses=[R(name=tp[0], partition_responses=[
                    R.PartitionProduceResponse(index=tp[1], error_code=code, base_offset=base)])
                    for tp, code, base in answers], throttle_time_ms=self.throttle_ms).encode(version=version))
                out = struct.pack(">ii", len(body) + 5, correlation_id) + b"\x00" + body
                if action == "reset":
                    return
                if action == "silent":
                    time.sleep(30)           # the client gives up first and closes
                    return
                if self.delivery == "coalesced":
                    held.append(out)
                else:
                    self._deliver(conn, out)

    def _deliver(self, conn, out):
        if self.delivery == "slow":                  # a broker taking 10 ms per request
            time.sleep(0.01)
            conn.sendall(out)
        elif self.delivery == "bytes":
            for i in range(len(out)):
                conn.sendall(out[i:i + 1])
                time.sleep(0.0002)
        else:
            conn.sendall(out)

    def _answer(self, node, tp, data):
        view = parse_batch(data)
        if (tp, view.producer_id) in self.fenced and self.leader[tp] == node:
            self.received.append((node, tp, view.base_sequence, view.base_offset))
            return FENCED, -1, 0
        actions = self.script.get(tp)
        action = actions[0] if actions and self.leader[tp] == node else 0
        if action == "fence":
            actions.pop(0)
            self.received.append((node, tp, view.base_sequence, view.base_offset))
            self.fenced.add((tp, view.producer_id))
            return FENCED, -1, 0
        if action == "oos":
            actions.pop(0)
            self.received.append((node, tp, view.base_sequence, view.base_offset))
            return OUT_OF_ORDER, -1, 0
        if isinstance(action, tuple) and action[0] == "forget":     # state dropped, this batch refused with code
            actions.pop(0)
            self.received.append((node, tp, view.base_sequence, view.base_offset))
            self.state.pop(tp, None)
            return action[1], -1, 0
        if isinstance(action, tuple) and action[0] == "appended":   # written, then an error answered
            actions[0] = 0
            code, base, _ = super()._answer(node, tp, data)
            return (action[1] if code == 0 else code), -1, 0
        if isinstance(action, tuple) and action[0] == "throttle":
            actions[0] = 0
            self.throttle_ms = action[1]
        if action in ("dupcode", "silent"):
            actions[0] = 0 if action == "dupcode" else "reset"   # "silent": the base class appends for "reset"
            pid, _, recent = self.state.get(tp, (None, 0, {}))
            if action == "dupcode" and pid == view.producer_id and view.base_sequence in recent:
                actions.pop(0)
                self.received.append((node, tp, view.base_sequence, view.base_offset))
                return DUPLICATE, -1, 0
            code, base, _ = super()._answer(node, tp, data)
            return code, base, action
        return super()._answer(node, tp, data)


class TxnClient(faults.FastClient):
    """FastClient plus the coordinator calls of a transactional writer (every answer NO_ERROR)."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self.coordinator_calls: list[str] = []

    def find_coordinator(self, key, kind):
        return 1

    def send(self, node, request, timeout_ms=None):
        self.coordinator_calls.append(type(request).__name__)
        if isinstance(request, InitProducerIdRequest):
            self.init_calls += 1
            return SimpleNamespace(error_code=0, producer_id=900 + self.init_calls, producer_epoch=0)
        if isinstance(request, AddPartitionsToTxnRequest):
            return SimpleNamespace(error_code=0, results_by_topic_v3_and_below=[
                SimpleNamespace(results_by_partition=[SimpleNamespace(partition_error_code=0)])])
        assert isinstance(request, EndTxnRequest)
        return SimpleNamespace(error_code=0)


def _batches(n, counts=None, topic="t"):
    offset, out = 0, []
    for count in counts or [1] * n:
        out.append(OutgoingBatch(topic, 0, make_batch(offset, count), source_offset=offset))
        offset += count
    return out


def _run(monkeypatch, loop, script, n=30, *, delivery="whole", counts=None, keep_queued=3, transactional=False,
         **writer_kwargs):
    """One write of ``n`` one-record batches to ("t", 0) through the scripted cluster; returns what a caller and
    the broker see: (results or the error raised, the target log, the cluster, the client, the writer)."""
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
    monkeypatch.setattr(produce_pipeline, "KEEP_QUEUED", keep_queued)
    tp = ("t", 0)
    cluster = AttackCluster({tp: 1}, {tp: list(script)}, delivery=delivery)
    client = TxnClient(cluster) if transactional else faults.FastClient(cluster)
    writer_kwargs.setdefault("retry_timeout_s", 10)
    if transactional:
        writer_kwargs.setdefault("transaction_timeout_ms", 600_000)
    writer = BatchWriter(client, transactional_id="shoal.p.0" if transactional else None, **writer_kwargs)
    try:
        if transactional:
            writer.begin_transaction()
        try:
            outcome = writer.write(_batches(n, counts))
        except Exception as exc:  # noqa: BLE001 - the error is part of what is compared
            outcome = exc
        if transactional and not isinstance(outcome, Exception):
            writer.commit_transaction()
        return outcome, list(cluster.log.get(tp, [])), cluster, client, writer
    finally:
        client.close()
        cluster.close()


def _both(monkeypatch, script, **kwargs):
    general = _run(monkeypatch, False, script, **kwargs)
    loop = _run(monkeypatch, True, script, **kwargs)
    return general, loop


# -- answers a real broker gives -----------------------------------------------------------------------------------

@pytest.mark.parametrize("delivery", ["whole", "bytes", "coalesced"])
def test_a_duplicate_answered_with_duplicate_sequence_number_and_no_offset_is_taken_as_written(monkeypatch,
                                                                                                delivery):
    """The connection drops after the broker appended batch 3 (answers of it and, coalesced, of the batches before
    it lost); the first resend meets the broker's 'already have it' of
    an older broker (DUPLICATE_SEQUENCE_NUMBER, base offset -1): acknowledged, reported as -1, never written again."""
    general, loop = _both(monkeypatch, [0, 0, 0, "reset", "dupcode"], delivery=delivery)
    for outcome, log, *_ in (general, loop):
        assert log == list(range(30))
        assert outcome.count(-1) == 1                  # the first resent batch whose answer the drop lost
        assert all(base == i for i, base in enumerate(outcome) if base != -1)
    assert general[0] == loop[0]


@pytest.mark.parametrize("delivery", ["whole", "coalesced"])
def test_a_fenced_epoch_with_batches_in_flight_stops_the_write_and_nothing_lands_after(monkeypatch, delivery):
    """INVALID_PRODUCER_EPOCH on batch 8 while later ones are in flight (a newer writer's epoch took the partition):
    the write ends with ProducerFencedError, the target holds exactly batches 0-7, and the connection is left with
    no request of the abandoned write in flight (all answered before the error left write())."""
    general, loop = _both(monkeypatch, [0] * 8 + ["fence"], delivery=delivery)
    for outcome, log, _, client, _ in (general, loop):
        assert isinstance(outcome, ProducerFencedError), outcome
        assert log == list(range(8))
        assert all(conn.in_flight == 0 for conn in client.conns.values())
    # (how many later batches reached the broker before the refusal was read depends on timing: not compared)


@pytest.mark.parametrize("delivery", ["whole", "coalesced"])
def test_out_of_order_sequence_on_a_batch_mid_stream_renews_the_producer_id_and_keeps_order(monkeypatch, delivery):
    """OUT_OF_ORDER_SEQUENCE_NUMBER on batch 10 with four behind it in flight (each refused the same way, the broker
    expecting batch 10's sequence): nothing landed out of order, so the writer takes a new producer id and resends
    from batch 10; the target holds every record once, in order."""
    general, loop = _both(monkeypatch, [0] * 10 + ["oos"], delivery=delivery)
    for outcome, log, _, client, writer in (general, loop):
        assert outcome == list(range(30)) and log == list(range(30))
        assert client.init_calls == 2
        assert writer._next_seq[("t", 0)] == 20         # 20 records under the new producer id


@pytest.mark.parametrize("delivery", ["whole", "coalesced"])
@pytest.mark.parametrize("code", [Errors.NotEnoughReplicasAfterAppendError.errno, Errors.RequestTimedOutError.errno])
def test_an_error_answered_for_a_batch_the_leader_appended_is_resent_and_deduplicated(monkeypatch, delivery, code):
    """NOT_ENOUGH_REPLICAS_AFTER_APPEND / REQUEST_TIMED_OUT for batch 6: the leader holds it, and the batches behind
    it in flight are appended and acknowledged. All are resent after it with their bytes; the broker answers them as
    duplicates with their first offsets, so every record is on the target once, in order, with its offset."""
    general, loop = _both(monkeypatch, [0] * 6 + [("appended", code)], delivery=delivery)
    for outcome, log, _, client, _ in (general, loop):
        assert outcome == list(range(30)) and log == list(range(30))
        assert client.init_calls == 1


@pytest.mark.parametrize("delivery", ["whole", "coalesced"])
def test_a_batch_that_may_have_landed_ahead_of_a_refused_one_halts_instead_of_a_new_producer_id(monkeypatch,
                                                                                                delivery):
    """The WriteOrderError case when the answer that would prove it is lost. The broker dropped our state; batch 2
    is refused (NOT_ENOUGH_REPLICAS) and batch 3, behind it, is taken as a first batch — and the connection drops
    before its answer. The resend: batch 2 is OUT_OF_ORDER (the broker now expects 4), batch 3 is a duplicate, and
    the connection drops before that answer too. Batch 3 is on the target ahead of batch 2, with no answer saying
    so; a new producer id would write batch 2 after it, and batch 3 twice. The writer must halt (WriteOrderError /
    AmbiguousWriteError naming the partition), never leave the target out of source order."""
    from mirror_core.errors import AmbiguousWriteError, WriteOrderError
    script = [0, 0, ("forget", Errors.NotEnoughReplicasError.errno), "reset", 0, "reset"]
    general, loop = _both(monkeypatch, script, n=12, delivery=delivery)
    for outcome, log, *_ in (general, loop):
        assert log == sorted(log) and len(log) == len(set(log)), log      # never out of order, never twice
        assert isinstance(outcome, (WriteOrderError, AmbiguousWriteError)), outcome
        assert "t-0" in str(outcome) or "'t' partition 0" in str(outcome) or "t 0" in str(outcome), str(outcome)


def test_throttle_time_is_honoured_before_the_next_request(monkeypatch):
    """A Produce answer carrying throttle_time_ms: the connection sends nothing more until it has passed (KIP-219),
    in the loop as in the general turns; the write still completes in order."""
    for loop in (False, True):
        began = time.monotonic()
        outcome, log, cluster, *_ = _run(monkeypatch, loop, [0, 0, ("throttle", 300)], n=12)
        assert outcome == list(range(12)) and log == list(range(12))
        assert time.monotonic() - began >= 0.3


@pytest.mark.parametrize("delivery", ["bytes", "coalesced"])
@pytest.mark.parametrize("keep_queued", [0, 3, 4])
@pytest.mark.parametrize("script", [[0, 0, NOT_LEADER], [0, 0, 0, "half", 0, NOT_LEADER, 0, "reset"],
                                    [0, 0, ("move", 2), 0, 0, Errors.NotEnoughReplicasError.errno]],
                         ids=["not-leader", "half-reset", "move"])
def test_answers_split_at_every_byte_or_coalesced_keep_order(monkeypatch, delivery, keep_queued, script):
    general, loop = _both(monkeypatch, script, n=25, delivery=delivery, keep_queued=keep_queued)
    for outcome, log, *_ in (general, loop):
        assert outcome == list(range(25)) and log == list(range(25))


@pytest.mark.parametrize("delivery", ["bytes", "coalesced"])
def test_state_lost_with_answers_split_or_coalesced_halts_with_write_order_error(monkeypatch, delivery):
    from mirror_core.errors import WriteOrderError
    general, loop = _both(monkeypatch, [0, 0, "forget"], n=12, delivery=delivery, keep_queued=0)
    for outcome, log, *_ in (general, loop):
        assert isinstance(outcome, WriteOrderError), outcome
        assert log[:2] == [0, 1] and len(log) == len(set(log))


def test_a_request_the_broker_never_answers_times_out_and_its_resend_is_deduplicated(monkeypatch):
    """Batch 4 is appended but its answer never comes: the request timeout (timeout_ms + 5 s) fails the connection
    and everything in flight on it; the resend on a new connection is a duplicate the broker acknowledges with the
    original offset. Every record once, in order."""
    outcome, log, _, client, _ = _run(monkeypatch, True, [0, 0, 0, 0, "silent"], n=10, timeout_ms=100)
    assert outcome == list(range(10)) and log == list(range(10))


# -- edges of the limits --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("counts", [[1], [3], [5, 1, 1], [1] * 6])
@pytest.mark.parametrize("max_inflight_bytes", [1, 150])
def test_one_batch_larger_than_the_in_flight_limit_goes_alone(monkeypatch, counts, max_inflight_bytes):
    """max_inflight_bytes below one batch: each batch goes alone (one request may exceed the limit by itself), the
    same requests as the general turns; a write of exactly one batch too."""
    general, loop = _both(monkeypatch, [], n=len(counts), counts=counts, max_inflight_bytes=max_inflight_bytes)
    assert loop[2].frames == general[2].frames
    for outcome, log, cluster, *_ in (general, loop):
        assert log == list(range(sum(counts)))
        assert outcome == [sum(counts[:i]) for i in range(len(counts))]
        if max_inflight_bytes == 1:
            assert [r[2] for r in cluster.received] == [sum(counts[:i]) for i in range(len(counts))]


def test_sequences_continue_across_writes_of_the_same_writer(monkeypatch):
    """The next write of the same writer continues the partition's sequence (no new producer id, no gap): three
    writes through the loop, the second with a refusal in it."""
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", True)
    tp = ("t", 0)
    cluster = AttackCluster({tp: 1}, {tp: [0] * 12 + [NOT_LEADER]})
    client = faults.FastClient(cluster)
    try:
        writer = BatchWriter(client, retry_timeout_s=10)
        batches = _batches(30)
        assert writer.write(batches[:10]) == list(range(10))
        assert writer.write(batches[10:20]) == list(range(10, 20))
        assert writer.write(batches[20:]) == list(range(20, 30))
        assert cluster.log[tp] == list(range(30)) and client.init_calls == 1
        assert [r[2] for r in cluster.received if r[2] >= 0][-1] == 29
    finally:
        client.close()
        cluster.close()


# -- exactly-once -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", [[], [NOT_LEADER], [0, 0, NOT_LEADER, 0, 0, 0, 0,
                                                      Errors.NotEnoughReplicasError.errno]],
                         ids=["clean", "first-refused", "refusals"])
def test_inside_a_transaction_the_loop_sends_the_general_paths_transactional_requests(monkeypatch, script):
    """Inside a transaction (AddPartitionsToTxn first) the loop carries the transactional.id and the batches their
    transactional bit; byte for byte as the general turns do where the requests do not depend on timing (clean
    answers, a refused first batch); with refusals mid-stream the target holds the same."""
    general, loop = _both(monkeypatch, script, n=20, transactional=True)
    if script in ([], [NOT_LEADER]):
        assert loop[2].frames == general[2].frames
    for outcome, log, cluster, client, _ in (general, loop):
        assert outcome == list(range(20)) and log == list(range(20))
        assert client.coordinator_calls == ["InitProducerIdRequest", "AddPartitionsToTxnRequest", "EndTxnRequest"]
        for frame in cluster.frames:
            assert b"shoal.p.0" in frame
            (_, records), = faults._parse_produce(frame)[3]
            assert parse_batch(records).transactional


# -- the caller stops a write -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", [False, True], ids=["general", "loop"])
@pytest.mark.parametrize("where", ["acknowledge", "stamp"])
def test_a_write_interrupted_with_requests_in_flight_leaves_nothing_in_flight_and_resumes_without_duplicates(
        monkeypatch, loop, where):
    """KeyboardInterrupt in the middle of a write (while acknowledging the 6th batch, or stamping the 9th): it
    propagates, every request already handed to the connection is answered before it does (nothing lands behind
    the caller's back later), and a new write of the same writer from the first batch it had not acknowledged
    lands every record exactly once, in order (the broker dedupes the resent ones that had landed)."""
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
    tp = ("t", 0)
    cluster = AttackCluster({tp: 1}, {tp: []})
    client = faults.FastClient(cluster)
    target = produce_pipeline.ProducePipeline._acknowledge if where == "acknowledge" else BatchWriter._stamp
    calls = []

    def interrupting(*args):
        calls.append(1)
        if len(calls) == (6 if where == "acknowledge" else 9):
            raise KeyboardInterrupt
        return target(*args)

    try:
        writer = BatchWriter(client, retry_timeout_s=10)
        batches = _batches(30)
        if where == "acknowledge":
            monkeypatch.setattr(produce_pipeline.ProducePipeline, "_acknowledge", interrupting)
        else:
            monkeypatch.setattr(BatchWriter, "_stamp", interrupting)
        with pytest.raises(KeyboardInterrupt):
            writer.write(batches)
        monkeypatch.undo()
        monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
        assert all(conn.in_flight == 0 and not conn._unsent for conn in client.conns.values())
        landed = len(cluster.log[tp])
        done = writer._next_seq[tp]                     # one record per batch: the batches acknowledged
        assert done <= landed <= done + produce_pipeline.MAX_IN_FLIGHT
        results = writer.write(batches[done:])
        assert cluster.log[tp] == list(range(30))
        assert results == list(range(done, 30))
        assert next_sequence(0, 30) == writer._next_seq[tp]
    finally:
        client.close()
        cluster.close()


# -- TLS and re-authentication (KIP-368) ------------------------------------------------------------------------------

class SecureClient(faults.FastClient):
    """FastClient whose connections are SASL_SSL (PLAIN), as WireClient makes them for a secure cluster."""

    def __init__(self, cluster, ca):
        super().__init__(cluster)
        self.security = FastSecurity("SASL_SSL", tls_context({"ssl.ca.location": ca}), "PLAIN", "shoal", "secret")

    def fast_connection(self, node):
        conn = self.conns.get(node)
        if conn is None or conn.closed:
            conn = self.conns[node] = FastConnection("localhost", self.cluster.port(node), node_id=node,
                                                     request_timeout_s=5, security=self.security)
        return conn


@pytest.mark.parametrize("loop", [False, True], ids=["general", "loop"])
@pytest.mark.parametrize("script", [[], [0, 0, 0, NOT_LEADER, 0, 0, 0, 0, 0, "half"]], ids=["clean", "faults"])
def test_a_long_write_over_tls_re_authenticates_on_its_connection_between_requests(
        monkeypatch, material, loop, script):  # noqa: F811
    """A write over SASL_SSL that outlives its SASL session (2 s; the broker takes 10 ms per request, 250
    requests): the connection logs in again between requests before the session ends (KIP-368), so the broker
    never meets a request on an expired session (it closes such a connection, as Kafka does), and the target holds
    every record once, in order, whether the loop or the general turns send.

    (The broker reads a pipelined request only after answering those before it, as Kafka does with a muted
    channel; the client's 5-15 % margin must cover that queue: with a 300 ms session and slow answers it does
    not, in both paths alike — a property of FastConnection's re-authentication, not of the loop.)"""
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(material["cert"], material["key"])
    tp = ("t", 0)
    cluster = AttackCluster({tp: 1}, {tp: list(script)}, delivery="slow", tls=server, session_ms=2000)
    client = SecureClient(cluster, material["ca"])
    try:
        writer = BatchWriter(client, retry_timeout_s=10)
        assert writer.write(_batches(250)) == list(range(250))
        assert cluster.log[tp] == list(range(250))
        assert cluster.expired_requests == 0
        connections = {number for number, _ in cluster.logins}
        assert len(cluster.logins) > len(connections)   # some connection logged in again, mid-write
        assert all(conn.tls_version for conn in client.conns.values())
    finally:
        client.close()
        cluster.close()


def test_the_loop_takes_over_a_two_partition_write_once_one_partition_is_done(monkeypatch):
    """A write of two partitions becomes a one-partition write when the short one is done: the loop takes over with
    the general turns' requests still in flight, and a refusal and a dropped connection after that keep order."""
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", True)
    turns = []
    run_one = produce_pipeline.ProducePipeline._run_one_partition

    def counted(self):
        ran = run_one(self)
        turns.append(ran)
        return ran

    monkeypatch.setattr(produce_pipeline.ProducePipeline, "_run_one_partition", counted)
    a, b = ("t", 0), ("t", 1)
    cluster = AttackCluster({a: 1, b: 1}, {b: [0] * 8 + [NOT_LEADER] + [0] * 6 + ["reset"]})
    client = faults.FastClient(cluster)
    try:
        writer = BatchWriter(client, retry_timeout_s=10)
        short = [OutgoingBatch("t", 0, make_batch(i), source_offset=i) for i in range(3)]
        long = [OutgoingBatch("t", 1, make_batch(i), source_offset=i) for i in range(30)]
        results = writer.write(short + long)
        assert results == list(range(3)) + list(range(30))
        assert cluster.log[a] == list(range(3)) and cluster.log[b] == list(range(30))
        assert any(turns)
    finally:
        client.close()
        cluster.close()
