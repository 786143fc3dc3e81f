"""Review of i14-one-partition: the writer pipeline on the FAST route (deferred sends flushed per turn, answers taken
while more than KEEP_QUEUED stay in flight, remembered leaders) against a scripted multi-broker cluster on real
sockets. The branch's own writer tests run on the kafka-python route (PipelinedBroker: send_async / wait), which
never defers, never calls FastConnection.answered and never reads through the receive buffer; here every request
goes through FastConnection.

The cluster keeps Kafka's idempotence state per partition (shared by its brokers, as replication does): the next
sequence and the last 5 batches' sequences (a resend of one of those is acknowledged again with its first offset; a
gap is OUT_OF_ORDER_SEQUENCE_NUMBER; a producer id without state may start anywhere). ``script[tp]`` lists, per
batch the partition's leader receives: 0 (append, answer), an error code (answer it, append nothing), "reset"
(append, then close the connection without answering), "half" (append, send half the answer, close), or
("move", node) (leadership moves to ``node`` before this batch: this one and later ones sent to the old leader are
answered NOT_LEADER_OR_FOLLOWER)."""

from __future__ import annotations

import socket
import struct
import threading
from types import SimpleNamespace

import kafka.errors as Errors
import pytest
from kafka.protocol.producer import InitProducerIdRequest, ProduceResponse

from mirror_core.codec.batch_codec import parse_batch
from mirror_core.codec.kafka_primitives import API_VERSIONS, Reader
from mirror_core.kafka import produce_pipeline
from mirror_core.kafka.fast_connection import FastConnection
from mirror_core.kafka.produce_pipeline import next_sequence
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch, write_together
from tests.unit.kafka.test_kafka_wire_pure import make_batch
from tests.unit.kafka.test_wire_fastpath import _recv

pytestmark = pytest.mark.timeout(60)

NOT_LEADER = Errors.NotLeaderForPartitionError.errno


def _parse_produce(frame: bytes):
    r = Reader(memoryview(frame))
    api_key, version, correlation_id = r.i16(), r.i16(), r.i32()
    r.string(False)                       # client id
    if version >= 9:
        r.uvarint()                       # header tags
    flexible = version >= 9
    r.string(flexible)                    # transactional id
    r.i16(), r.i32()
    topics = []
    for _ in range(r.array(flexible)):
        name = r.string(flexible)
        for _ in range(r.array(flexible)):
            index = r.i32()
            records = bytes(r.bytes_view(flexible))
            if flexible:
                r.uvarint()
            topics.append(((name, index), records))
        if flexible:
            r.uvarint()
    return api_key, version, correlation_id, topics


class Cluster:
    def __init__(self, leaders: dict, script: dict | None = None, nodes=(1, 2)):
        self.lock = threading.Lock()
        self.leader = dict(leaders)         # the truth
        self.script = {tp: list(actions) for tp, actions in (script or {}).items()}
        self.log: dict = {}
        self.state: dict = {}
        self.received: list = []            # (node, tp, base sequence, source base offset)
        self.listeners = {}
        for node in nodes:
            sock = socket.create_server(("127.0.0.1", 0))
            self.listeners[node] = sock
            threading.Thread(target=self._accept, args=(node, sock), daemon=True).start()

    def port(self, node):
        return self.listeners[node].getsockname()[1]

    def close(self):
        for sock in self.listeners.values():
            sock.close()

    def _accept(self, node, listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(node, conn), daemon=True).start()

    def _serve(self, node, conn):
        with conn:
            while True:
                head = _recv(conn, 4)
                if head is None:
                    return
                frame = _recv(conn, struct.unpack(">i", head)[0])
                if frame is None:
                    return
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if api_key == API_VERSIONS:
                    body = struct.pack(">hi", 0, 2) + struct.pack(">hhh", 0, 3, 11) + struct.pack(">hhh", 1, 4, 17)
                    conn.sendall(struct.pack(">ii", len(body) + 4, correlation_id) + body)
                    continue
                _, version, correlation_id, topics = _parse_produce(frame)
                answers, close = [], None
                with self.lock:
                    for tp, records in topics:
                        code, base, action = self._answer(node, tp, records)
                        answers.append((tp, code, base))
                        if action in ("reset", "half"):
                            close = action
                R = ProduceResponse.TopicProduceResponse
                body = bytes(ProduceResponse(responses=[R(name=tp[0], partition_responses=[
                    R.PartitionProduceResponse(index=tp[1], error_code=code, base_offset=base)])
                    for tp, code, base in answers], throttle_time_ms=0).encode(version=version))
                out = struct.pack(">ii", len(body) + 5, correlation_id) + b"\x00" + body
                if close == "reset":
                    return
                if close == "half":
                    conn.sendall(out[:len(out) // 2])
                    return
                conn.sendall(out)

    def _answer(self, node, tp, data):
        view = parse_batch(data)
        self.received.append((node, tp, view.base_sequence, view.base_offset))
        if self.leader[tp] != node:
            return NOT_LEADER, -1, 0
        actions = self.script.get(tp)
        action = actions.pop(0) if actions else 0
        if action == "forget":                 # the broker lost our producer state (retention): this batch refused
            self.state.pop(tp, None)
            return Errors.UnknownProducerIdError.errno, -1, 0
        if isinstance(action, tuple):          # ("move", node): this broker stops leading before the batch
            self.leader[tp] = action[1]
            return NOT_LEADER, -1, 0
        if action not in (0, "reset", "half"):
            return action, -1, 0
        pid, expected, recent = self.state.get(tp, (None, 0, {}))
        if pid != view.producer_id:
            pid, expected, recent = view.producer_id, view.base_sequence, {}
        if view.base_sequence in recent:
            return 0, recent[view.base_sequence], action
        if view.base_sequence != expected:
            return Errors.OutOfOrderSequenceNumberError.errno, -1, 0
        entries = self.log.setdefault(tp, [])
        base = len(entries)
        entries.extend(view.base_offset + i for i in range(view.records_count))
        recent = dict(list({**recent, view.base_sequence: base}.items())[-5:])
        self.state[tp] = (pid, next_sequence(expected, view.records_count), recent)
        return 0, base, action


class FastClient:
    """The parts of WireClient the writer uses: metadata kept until invalidated, one FastConnection per broker."""

    cluster_name = "target"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.metadata = dict(cluster.leader)
        self.conns: dict = {}
        self.init_calls = 0
        self.invalidations = 0

    def leader_for(self, topic, partition, refresh=False):
        return self.metadata[(topic, partition)], 0

    def invalidate(self, topic):
        self.invalidations += 1
        with self.cluster.lock:
            self.metadata = dict(self.cluster.leader)

    def send(self, node, request, timeout_ms=None):
        assert isinstance(request, InitProducerIdRequest)
        self.init_calls += 1
        return SimpleNamespace(error_code=0, producer_id=900 + self.init_calls, producer_epoch=0)

    def fast_connection(self, node):
        conn = self.conns.get(node)
        if conn is None or conn.closed:
            conn = self.conns[node] = FastConnection("127.0.0.1", self.cluster.port(node), node_id=node,
                                                     request_timeout_s=5)
        return conn

    def close(self):
        for conn in self.conns.values():
            conn.close()


def _batches(tp, n):
    return [OutgoingBatch(tp[0], tp[1], make_batch(i), source_offset=i) for i in range(n)]


def _write(cluster, batches_by_tp):
    client = FastClient(cluster)
    writer = BatchWriter(client, retry_timeout_s=10)
    batches = [b for bs in batches_by_tp for b in bs]
    try:
        return writer.write(batches), client
    finally:
        client.close()


@pytest.mark.parametrize("script", [
    [],
    [0, 0, NOT_LEADER],
    [0, 0, 0, "reset"],
    [0, 0, 0, "half"],
    [0, "half", 0, 0, "reset"],
    [0, 0, 0, 0, 0, 0, Errors.NotEnoughReplicasError.errno, 0, "reset", 0, 0, Errors.RequestTimedOutError.errno],
], ids=["clean", "not-leader", "reset-after-append", "half-answer", "half-then-reset", "mixed"])
def test_one_partition_on_the_fast_route_lands_each_record_once_in_order(script):
    tp = ("t", 0)
    cluster = Cluster({tp: 1}, {tp: script})
    try:
        results, _ = _write(cluster, [_batches(tp, 30)])
        assert cluster.log[tp] == list(range(30))
        assert results == list(range(30))
    finally:
        cluster.close()


def test_a_leader_move_with_five_in_flight_keeps_order_and_goes_to_the_new_leader():
    tp = ("t", 0)
    cluster = Cluster({tp: 1}, {tp: [0, 0, 0, 0, ("move", 2)]})
    try:
        results, client = _write(cluster, [_batches(tp, 25)])
        assert cluster.log[tp] == list(range(25))
        assert results == list(range(25))
        assert any(node == 2 for node, *_ in cluster.received)
    finally:
        cluster.close()


def test_two_partitions_on_two_brokers_one_leader_moving_to_the_others_broker():
    a, b = ("t", 0), ("t", 1)
    cluster = Cluster({a: 1, b: 2}, {a: [0, 0, 0, ("move", 2)], b: [0, "reset", 0, 0, 0, NOT_LEADER]})
    try:
        results, _ = _write(cluster, [_batches(a, 20), _batches(b, 20)])
        assert cluster.log[a] == list(range(20)) and cluster.log[b] == list(range(20))
    finally:
        cluster.close()


def test_a_refused_first_batch_keeps_one_in_flight_on_the_fast_route():
    """First-acknowledgement rule on the fast route: until the broker acknowledged a batch of the producer id on
    the partition, one batch in flight (the fake accepts any first sequence of a producer id without state)."""
    tp = ("t", 0)
    cluster = Cluster({tp: 1}, {tp: [NOT_LEADER, NOT_LEADER]})
    try:
        results, _ = _write(cluster, [_batches(tp, 10)])
        assert cluster.log[tp] == list(range(10))
        first_acked = 2     # the third batch received is the first one written
        in_flight_before = [seq for _, _, seq, _ in cluster.received[:first_acked + 1]]
        assert in_flight_before == [0, 0, 0]
    finally:
        cluster.close()


@pytest.mark.parametrize("keep", [0, 1, 3, 4])
def test_keep_queued_values_never_reorder(monkeypatch, keep):
    monkeypatch.setattr(produce_pipeline, "KEEP_QUEUED", keep)
    tp = ("t", 0)
    cluster = Cluster({tp: 1}, {tp: [0, 0, NOT_LEADER, 0, 0, "half", 0, 0, 0, 0, "reset"]})
    try:
        results, _ = _write(cluster, [_batches(tp, 40)])
        assert cluster.log[tp] == list(range(40))
    finally:
        cluster.close()


def test_many_lanes_sharing_requests_on_the_fast_route():
    cluster = Cluster({("t", p): 1 + p % 2 for p in range(6)},
                      {("t", 1): [0, "reset"], ("t", 4): [0, 0, NOT_LEADER], ("t", 5): [0, "half"]})
    client = FastClient(cluster)
    try:
        writers = [BatchWriter(client, retry_timeout_s=10) for _ in range(6)]
        jobs = []
        for p, w in enumerate(writers):
            batches = _batches(("t", p), 15)
            jobs.append((w, batches, w.prepare_write(batches)))
        write_together(jobs)
        for p in range(6):
            assert cluster.log[("t", p)] == list(range(15)), p
    finally:
        client.close()
        cluster.close()


@pytest.mark.parametrize("seed", range(25))
def test_random_faults_on_the_fast_route(seed):
    import random
    rnd = random.Random(seed)
    tps = [("t", p) for p in range(rnd.choice([1, 1, 2, 3]))]
    leaders = {tp: rnd.choice([1, 2]) for tp in tps}
    script = {}
    for tp in tps:
        actions, where = [], leaders[tp]
        for _ in range(60):
            roll = rnd.random()
            if roll < 0.06:
                actions.append(NOT_LEADER)
            elif roll < 0.10:
                actions.append("reset")
            elif roll < 0.14:
                actions.append("half")
            elif roll < 0.17:
                actions.append(Errors.NotEnoughReplicasError.errno)
            elif roll < 0.20:
                where = 3 - where
                actions.append(("move", where))
            else:
                actions.append(0)
        script[tp] = actions
    n = rnd.choice([5, 12, 30])
    cluster = Cluster(leaders, script)
    try:
        _write(cluster, [_batches(tp, n) for tp in tps])
        for tp in tps:
            assert cluster.log[tp] == list(range(n)), (tp, cluster.log[tp])
    finally:
        cluster.close()


def test_state_lost_under_a_pipeline_halts_rather_than_reorders_on_the_fast_route():
    """The broker forgets our producer state while 5 are in flight: the head is refused, a later batch is accepted
    as a 'first' batch of the producer id. The writer must halt with WriteOrderError (not re-initialise and write
    the head after it)."""
    from mirror_core.errors import WriteOrderError
    tp = ("t", 0)
    cluster = Cluster({tp: 1}, {tp: [0, 0, "forget"]})
    try:
        with pytest.raises(WriteOrderError):
            _write(cluster, [_batches(tp, 12)])
        log = cluster.log[tp]
        assert log[:2] == [0, 1] and len(log) == len(set(log))
    finally:
        cluster.close()


def test_six_hundred_lanes_sharing_one_broker_write_on_the_fast_route():
    """SharedProduce / write_together puts every parked lane's batch for one broker in ONE Produce request (only
    max_request_bytes bounds it). 600 one-partition lanes of one small batch each: one request of 1202 buffers, which
    PlainChannel hands to a single sendmsg; Linux refuses > 1024 iovecs (EMSGSIZE), the connection fails, the same
    request is rebuilt on every retry, and the write ends in PartitionUnavailableError (pre-existing, not from the
    branch: _DEFER_MAX_PARTS bounds only what deferral adds up)."""
    n = 600
    cluster = Cluster({("t", p): 1 for p in range(n)})
    client = FastClient(cluster)
    try:
        writers = [BatchWriter(client, retry_timeout_s=2) for _ in range(n)]
        jobs = []
        for p, w in enumerate(writers):
            batches = _batches(("t", p), 1)
            jobs.append((w, batches, w.prepare_write(batches)))
        write_together(jobs)
        assert all(cluster.log.get(("t", p)) == [0] for p in range(n))
    finally:
        client.close()
        cluster.close()
