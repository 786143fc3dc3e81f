"""Pure parts of the wire layer: config translation, the fetcher's batch handling and aborted-transaction filter,
and the writer's stamping and retry/sequence logic against a scripted fake broker."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import crc32c
import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import InitProducerIdRequest
from kafka.record.default_records import DefaultRecordBatch

from mirror_core.codec.batch_codec import CONTROL_ABORT, control_type, parse_batch, walk_batches
from mirror_core.config.cluster import kafka_python_kwargs
from mirror_core.errors import AmbiguousWriteError, BatchRejectedError, ConfigError, CorruptBatchError, WriteOrderError
from mirror_core.kafka.fetcher import AbortedTransaction, RawBatchFetcher, select_committed
from mirror_core.kafka.produce_pipeline import next_sequence
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch

pytestmark = pytest.mark.unit


# -- a minimal RecordBatch v2 encoder for tests -------------------------------------------------------------

def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _record(offset_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = bytes([0]) + _varint(0) + _varint(offset_delta)
    body += _varint(-1) if key is None else _varint(len(key)) + key
    body += _varint(-1) if value is None else _varint(len(value)) + value
    body += _varint(0)
    return _varint(len(body)) + body


def make_batch(base_offset: int, count: int = 1, *, producer_id: int = -1, transactional: bool = False,
               control: int | None = None) -> bytes:
    """A valid uncompressed v2 batch; ``control`` = 0 (abort) or 1 (commit) makes it a control batch."""
    if control is not None:
        records = _record(0, struct.pack(">hh", 0, control), struct.pack(">hi", 0, 0))
        count, transactional = 1, True
    else:
        records = b"".join(_record(i, b"k%d" % i, b"v%d" % (base_offset + i)) for i in range(count))
    attributes = (0x10 if transactional else 0) | (0x20 if control is not None else 0)
    after_crc = struct.pack(">hiqqqhii", attributes, count - 1, 1000, 1000, producer_id, 0 if producer_id >= 0
                            else -1, 0 if producer_id >= 0 else -1, count) + records
    crc = crc32c.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, 0, 2, crc) + after_crc


def batches_of(*raw: bytes):
    batches, tail = walk_batches(b"".join(raw))
    assert tail == 0
    return batches


def offsets(batches) -> list[int]:
    return [b.base_offset for b in batches]


# -- config translation -------------------------------------------------------------------------------------

def test_plaintext_config_translates_with_a_receive_limit_fit_for_fetch():
    kwargs = kafka_python_kwargs("cluster", {"bootstrap.servers": "127.0.0.1:9092", "client.id": "shoal-test"},
                                 data_plane=True)
    assert kwargs["bootstrap_servers"] == ["127.0.0.1:9092"]
    assert kwargs["client_id"] == "shoal-test"
    assert kwargs["receive_message_max_bytes"] == 100_000_000      # kafka-python's 1 MB default breaks Fetch


def test_sasl_ssl_scram_config_translates_every_key():
    kwargs = kafka_python_kwargs("cluster", {
        "bootstrap.servers": "a:9093,b:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "mirror",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }, data_plane=True)
    assert kwargs["bootstrap_servers"] == ["a:9093", "b:9093"]
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("mirror", "s3cret")
    assert kwargs["ssl_cafile"] == "/etc/ca.pem"
    assert kwargs["ssl_check_hostname"] is False


@pytest.mark.parametrize("key", ["group.id", "isolation.level", "sasl.oauthbearer.config", "bootstrap_servers",
                                 "enable.ssl.certificate.verification"])
def test_unknown_keys_are_rejected_by_name(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        kafka_python_kwargs("source", {"bootstrap.servers": "h:1", key: "x"}, data_plane=True)


@pytest.mark.parametrize("config, fragment", [
    ({}, "bootstrap.servers"),
    ({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
      "sasl.username": "u"}, "sasl.password"),
    ({"bootstrap.servers": "h:1", "security.protocol": "TLS"}, "security.protocol"),
    ({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI",
      "sasl.username": "u", "sasl.password": "p"}, "sasl.mechanism"),
])
def test_invalid_configs_name_the_key_and_the_cluster(config, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")) as info:
        kafka_python_kwargs("source", config, data_plane=True)
    assert "'source'" in str(info.value)


def test_config_errors_never_echo_a_password():
    with pytest.raises(ConfigError) as info:
        kafka_python_kwargs("cluster", {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "OAUTHBEARER", "sasl.username": "u",
                                        "sasl.password": "hunter22"}, data_plane=True)
    assert "hunter22" not in str(info.value)


# -- aborted-transaction filter -----------------------------------------------------------------------------

def test_without_transactions_data_is_kept_and_markers_dropped():
    batches = batches_of(make_batch(0, 2), make_batch(2, control=1, producer_id=3), make_batch(3, 1))
    assert offsets(select_committed(batches, None)) == [0, 3]


def test_aborted_transaction_is_dropped_until_its_abort_marker():
    batches = batches_of(
        make_batch(0, 2, producer_id=7, transactional=True),     # aborted txn, first offset 0
        make_batch(2, 2, producer_id=7, transactional=True),
        make_batch(4, control=0, producer_id=7),                  # ABORT
        make_batch(5, 2, producer_id=7, transactional=True),     # next txn of the same producer: committed
        make_batch(7, control=1, producer_id=7),                  # COMMIT
    )
    kept = select_committed(batches, [AbortedTransaction(7, 0)])
    assert offsets(kept) == [5]


def test_interleaved_producers_only_the_aborted_one_is_dropped():
    batches = batches_of(
        make_batch(0, 1, producer_id=8, transactional=True),     # committed producer 8
        make_batch(1, 1, producer_id=7, transactional=True),     # aborted producer 7
        make_batch(2, 1, producer_id=8, transactional=True),
        make_batch(3, 1, producer_id=7, transactional=True),
        make_batch(4, control=1, producer_id=8),
        make_batch(5, control=0, producer_id=7),
        make_batch(6, 1),                                         # plain, non-transactional
    )
    kept = select_committed(batches, [AbortedTransaction(7, 1)])
    assert offsets(kept) == [0, 2, 6]


def test_committed_batches_before_the_aborted_first_offset_are_kept():
    batches = batches_of(
        make_batch(0, 1, producer_id=7, transactional=True),
        make_batch(1, control=1, producer_id=7),                  # first txn committed
        make_batch(2, 1, producer_id=7, transactional=True),     # second txn aborted, first offset 2
        make_batch(3, control=0, producer_id=7),
    )
    assert offsets(select_committed(batches, [AbortedTransaction(7, 2)])) == [0]


def _committed_by_the_rules(batches, aborted):
    """The READ_COMMITTED rules written plainly with BatchView's properties (what select_committed reads inline)."""
    pending = sorted(aborted, key=lambda txn: txn.first_offset)
    aborted_ids, kept = set(), []
    for batch in batches:
        if not batch.legacy and batch.producer_id >= 0:
            while pending and pending[0].first_offset <= batch.next_offset - 1:
                aborted_ids.add(pending.pop(0).producer_id)
            if batch.control:
                if control_type(batch) == CONTROL_ABORT:
                    aborted_ids.discard(batch.producer_id)
                continue
            if batch.transactional and batch.producer_id in aborted_ids:
                continue
        elif batch.control:
            continue
        kept.append(batch)
    return kept


_BATCH_SHAPES = st.tuples(st.integers(1, 3), st.sampled_from([-1, 7, 8]), st.booleans(), st.sampled_from([None, 0, 1]))


@settings(max_examples=300, deadline=None)
@given(shapes=st.lists(_BATCH_SHAPES, max_size=12),
       aborted=st.lists(st.tuples(st.sampled_from([7, 8, 9]), st.integers(0, 30)), max_size=4))
def test_select_committed_keeps_what_the_rules_keep(shapes, aborted):
    """Any mix of plain, idempotent, transactional batches and markers against any aborted list: the batches kept
    are exactly those the rules keep (select_committed reads the header fields inline, once per batch)."""
    raw, offset = [], 0
    for count, producer_id, transactional, control in shapes:
        if control is not None and producer_id < 0:
            producer_id = 7                                     # a marker belongs to a transactional producer
        raw.append(make_batch(offset, count, producer_id=producer_id, transactional=transactional and producer_id >= 0,
                              control=control))
        offset += 1 if control is not None else count
    batches = batches_of(*raw) if raw else []
    txns = [AbortedTransaction(pid, first) for pid, first in aborted]
    assert offsets(select_committed(batches, txns)) == offsets(_committed_by_the_rules(batches, txns))


def test_two_aborted_transactions_of_one_producer_in_one_response():
    batches = batches_of(
        make_batch(0, 1, producer_id=7, transactional=True),
        make_batch(1, control=0, producer_id=7),
        make_batch(2, 1, producer_id=7, transactional=True),
        make_batch(3, control=0, producer_id=7),
        make_batch(4, 1, producer_id=7, transactional=True),
        make_batch(5, control=1, producer_id=7),
    )
    aborted = [AbortedTransaction(7, 2), AbortedTransaction(7, 0)]      # order in the response does not matter
    assert offsets(select_committed(batches, aborted)) == [4]


def test_aborted_transaction_continuing_from_an_earlier_fetch():
    # The fetch starts mid-transaction: the broker lists it again with its original first offset.
    batches = batches_of(make_batch(40, 2, producer_id=7, transactional=True), make_batch(42, control=0,
                                                                                           producer_id=7))
    assert select_committed(batches, [AbortedTransaction(7, 10)]) == []


def test_idempotent_batches_of_an_aborted_producer_id_are_kept():
    batches = batches_of(make_batch(0, 1, producer_id=7, transactional=False))
    assert offsets(select_committed(batches, [AbortedTransaction(7, 0)])) == [0]


# -- fetcher bookkeeping on a response ----------------------------------------------------------------------

def _fetcher(start: int, end: int | None = None) -> RawBatchFetcher:
    return RawBatchFetcher(SimpleNamespace(cluster_name="source"), "t", 0, start, end)


def _response(*raw: bytes, aborted=None):
    return SimpleNamespace(records=b"".join(raw), aborted_transactions=aborted, high_watermark=99,
                           last_stable_offset=99, log_start_offset=0)


def test_fetch_drops_batches_wholly_before_the_position_and_keeps_a_straddling_one():
    fetcher = _fetcher(4)
    result = fetcher._accept(_response(make_batch(0, 2), make_batch(2, 3), make_batch(5, 1)))
    assert offsets(result.batches) == [2, 5]
    assert fetcher.position == result.next_offset == 6


def test_fetch_keeps_the_position_at_the_last_whole_batch_when_the_tail_is_cut():
    fetcher = _fetcher(0)
    result = fetcher._accept(_response(make_batch(0, 2), make_batch(2, 3)[:30]))
    assert offsets(result.batches) == [0]
    assert fetcher.position == 2


def test_fetch_yields_zero_copy_views_of_the_response():
    first, second = make_batch(0, 3), make_batch(3, 2)
    response = _response(first, second, make_batch(5, 4)[:40])
    result = _fetcher(0)._accept(response)
    assert [(b.base_offset, b.next_offset, b.records_count) for b in result.batches] == [(0, 3, 3), (3, 5, 2)]
    assert bytes(result.batches[1].buffer) == second
    assert result.batches[1].buffer.obj is response.records


def test_fetch_rejects_an_impossible_length_naming_the_offset():
    bad = bytearray(make_batch(7))
    struct.pack_into(">i", bad, 8, 10)
    with pytest.raises(CorruptBatchError, match="offset 7"):
        _fetcher(7)._accept(_response(bytes(bad)))


def test_fetch_moves_past_markers_and_aborted_batches_and_stops_at_the_end():
    fetcher = _fetcher(0, end=5)
    result = fetcher._accept(_response(
        make_batch(0, 2, producer_id=7, transactional=True), make_batch(2, control=0, producer_id=7),
        make_batch(3, 2), make_batch(5, 2), aborted=[SimpleNamespace(producer_id=7, first_offset=0)]))
    assert offsets(result.batches) == [3]
    # the batch at 5 belongs to the next range: stopping at 5, not 7, is what keeps it from being skipped
    assert fetcher.position == 5 and fetcher.done


# -- writer ------------------------------------------------------------------------------------------------

def test_sequences_wrap_like_kafka():
    assert next_sequence(10, 5) == 15
    assert next_sequence(2**31 - 2, 3) == 1


# -- writer against a scripted broker -----------------------------------------------------------------------

class ScriptedTarget:
    """Fake WireClient: partition leaders, and per-partition queues of error codes the broker answers with."""

    cluster_name = "target"

    def __init__(self, script: dict | None = None, leaders: dict | None = None, transport_failures: int = 0):
        self.script = script or {}
        self.leaders = leaders or {}
        self.transport_failures = transport_failures
        self.sent: list[tuple[int, dict]] = []          # (node, {tp: stamped bytes})
        self.next_offset: dict = {}
        self.init_calls = 0

    def leader_for(self, topic, partition, refresh=False):
        return self.leaders.get((topic, partition), 1), 0

    def invalidate(self, topic):
        pass

    def send(self, node, request, timeout_ms=None):
        if isinstance(request, InitProducerIdRequest):
            self.init_calls += 1
            return SimpleNamespace(error_code=0, producer_id=500 + self.init_calls, producer_epoch=0)
        payload = {(t.name, p.index): bytes(p.records) for t in request.topic_data for p in t.partition_data}
        self.sent.append((node, payload))
        if self.transport_failures:
            self.transport_failures -= 1
            raise Errors.KafkaConnectionError("dropped")
        responses = []
        for (topic, partition), data in payload.items():
            queue = self.script.get((topic, partition), [])
            code = queue.pop(0) if queue else 0
            base = -1
            if code == 0:
                base = self.next_offset.get((topic, partition), 0)
                self.next_offset[(topic, partition)] = base + parse_batch(data).records_count
            responses.append(SimpleNamespace(name=topic, partition_responses=[SimpleNamespace(
                index=partition, error_code=code, base_offset=base, error_message=None)]))
        return SimpleNamespace(responses=responses)


def _out(topic, partition, base, count=2):
    return OutgoingBatch(topic, partition, make_batch(base, count), source_offset=base)


def _writer(target) -> BatchWriter:
    writer = BatchWriter(target, retry_timeout_s=5)
    return writer


def test_writer_sends_one_batch_per_partition_per_request_with_growing_sequences():
    target = ScriptedTarget()
    offsets_ = _writer(target).write([_out("t", 0, 0), _out("t", 1, 0), _out("t", 0, 2, 3), _out("t", 1, 2)])
    assert offsets_ == [0, 0, 2, 2]
    assert len(target.sent) == 2
    for _, payload in target.sent:
        assert sorted(payload) == [("t", 0), ("t", 1)]
    seqs = [parse_batch(target.sent[i][1][("t", 0)]).base_sequence for i in range(2)]
    assert seqs == [0, 2]


def test_writer_groups_partitions_by_leader():
    target = ScriptedTarget(leaders={("t", 0): 1, ("t", 1): 2})
    _writer(target).write([_out("t", 0, 0), _out("t", 1, 0)])
    assert sorted(node for node, _ in target.sent) == [1, 2]


def test_writer_retries_resend_identical_bytes():
    target = ScriptedTarget(script={("t", 0): [Errors.NotLeaderForPartitionError.errno,
                                               Errors.NotEnoughReplicasError.errno]})
    assert _writer(target).write([_out("t", 0, 10)]) == [0]
    assert len(target.sent) == 3
    assert len({payload[("t", 0)] for _, payload in target.sent}) == 1


def test_writer_reinitialises_the_producer_on_lost_state():
    target = ScriptedTarget(script={("t", 0): [0, Errors.UnknownProducerIdError.errno]})
    writer = _writer(target)
    writer.write([_out("t", 0, 0), _out("t", 0, 2)])
    assert target.init_calls == 2
    last = parse_batch(target.sent[-1][1][("t", 0)])
    assert (last.producer_id, last.producer_epoch, last.base_sequence) == (502, 0, 0)


def test_writer_stamps_the_batch_it_owns_in_place():
    data = bytearray(make_batch(0, 2))
    batch = OutgoingBatch("t", 0, data, source_offset=0)
    assert batch.data is data                                     # a bytearray is taken over, not copied
    target = ScriptedTarget()
    _writer(target).write([batch])
    stamped = parse_batch(data)
    assert (stamped.producer_id, stamped.producer_epoch, stamped.base_sequence) == (501, 0, 0)
    assert target.sent[0][1][("t", 0)] == bytes(data)
    assert DefaultRecordBatch(bytes(data)).validate_crc()


def test_outgoing_batch_copies_anything_but_a_bytearray_once():
    source = make_batch(0, 2)
    batch = OutgoingBatch("t", 0, memoryview(source), source_offset=0)
    assert isinstance(batch.data, bytearray) and batch.data == source
    _writer(ScriptedTarget()).write([batch])
    assert parse_batch(source).producer_id == -1                  # the caller's bytes are left alone


def test_writer_refuses_to_guess_after_an_unanswered_send_and_lost_state():
    target = ScriptedTarget(script={("t", 0): [Errors.OutOfOrderSequenceNumberError.errno]}, transport_failures=1)
    with pytest.raises(AmbiguousWriteError, match="source offset 7"):
        _writer(target).write([_out("t", 0, 7)])


@pytest.mark.parametrize("error", [Errors.MessageSizeTooLargeError, Errors.CorruptRecordError,
                                   Errors.InvalidRecordError, Errors.InvalidTimestampError,
                                   Errors.TopicAuthorizationFailedError])
def test_writer_surfaces_rejections_with_partition_and_source_offset(error):
    target = ScriptedTarget(script={("t", 3): [error.errno]})
    with pytest.raises(BatchRejectedError) as info:
        _writer(target).write([_out("t", 3, 4242)])
    assert (info.value.topic, info.value.partition, info.value.source_offset) == ("t", 3, 4242)
    assert "target" in str(info.value) and "4242" in str(info.value)
    assert not info.value.retriable


def test_writer_refuses_batches_with_offset_holes():
    holed = bytearray(make_batch(0, 3))
    struct.pack_into(">i", holed, 23, 5)
    with pytest.raises(ValueError, match="re-encode"):
        _writer(ScriptedTarget()).write([OutgoingBatch("t", 0, bytes(holed), 0)])


# -- pipelined writer against an idempotent fake broker -----------------------------------------------------

class PipelinedBroker:
    """Fake target with requests in flight: ``send_async`` queues, ``wait`` answers in send order.

    Each partition keeps Kafka's idempotence state for the current producer id: the next expected sequence and
    the base offsets of its last 5 batches (a resent one of those is acknowledged again with its first offset; any
    other sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER). Like Kafka, a partition with no state for a producer id
    accepts that producer's first batch whatever its sequence. ``script[tp]`` lists, per batch received, 0 (normal),
    an error code (answered without appending) or ``"drop"`` (appended, then the connection dies: the requests
    still queued are processed too, but every one of them is answered with a connection error).
    """

    cluster_name = "target"

    def __init__(self, script: dict | None = None):
        self.script = script or {}
        self.queue: list = []
        self.received: list[dict] = []             # every request's {tp: bytes}, in send order
        self.log: dict = {}                         # tp -> [(base offset, source-like first offset key)]
        self.state: dict = {}                       # tp -> (producer id, next sequence, {sequence: base offset})
        self.max_in_flight = 0
        self.max_in_flight_bytes = 0
        self.init_calls = 0

    def leader_for(self, topic, partition, refresh=False):
        return 1, 0

    def invalidate(self, topic):
        pass

    def send(self, node, request, timeout_ms=None):
        assert isinstance(request, InitProducerIdRequest)
        self.init_calls += 1
        return SimpleNamespace(error_code=0, producer_id=700 + self.init_calls, producer_epoch=0)

    def send_async(self, node, request, timeout_ms):
        from kafka.future import Future

        payload = {(t.name, p.index): bytes(p.records) for t in request.topic_data for p in t.partition_data}
        self.received.append(payload)
        future = Future()
        self.queue.append((payload, future))
        self.max_in_flight = max(self.max_in_flight, len(self.queue))
        self.max_in_flight_bytes = max(self.max_in_flight_bytes,
                                       sum(len(b) for pl, _ in self.queue for b in pl.values()))
        return future

    def wait(self, future):
        while not future.is_done:
            payload, head = self.queue.pop(0)
            codes = {tp: self._answer(tp, data) for tp, data in payload.items()}
            if "drop" in codes.values():
                for payload_, fut in [(payload, head)] + self.queue:
                    if fut is not head:
                        for tp, data in payload_.items():
                            self._answer(tp, data)
                    fut.failure(Errors.KafkaConnectionError("connection reset"))
                self.queue.clear()
                continue
            head.success(SimpleNamespace(responses=[SimpleNamespace(name=tp[0], partition_responses=[
                SimpleNamespace(index=tp[1], error_code=code, base_offset=base, error_message=None)])
                for tp, (code, base) in codes.items()]))

    def _answer(self, tp, data):
        view = parse_batch(data)
        action = self.script.get(tp, []).pop(0) if self.script.get(tp) else 0
        if action not in (0, "drop"):
            return action, -1
        pid, expected, recent = self.state.get(tp, (None, 0, {}))
        if pid != view.producer_id:   # Kafka (ProducerAppendInfo.checkSequence): a producer id without state on
            pid, expected, recent = view.producer_id, view.base_sequence, {}   # the partition may start anywhere
        if view.base_sequence in recent:
            return (0, recent[view.base_sequence]) if action == 0 else "drop"
        if view.base_sequence != expected:
            return Errors.OutOfOrderSequenceNumberError.errno, -1
        entries = self.log.setdefault(tp, [])
        base = len(entries)
        entries.extend(view.base_offset + i for i in range(view.records_count))  # fake "source" identity per record
        recent = dict(list({**recent, view.base_sequence: base}.items())[-5:])
        self.state[tp] = (pid, next_sequence(expected, view.records_count), recent)
        return (0, base) if action == 0 else "drop"


def _batches(tp, n, count=2):
    return [OutgoingBatch(tp[0], tp[1], make_batch(i * count, count), source_offset=i * count) for i in range(n)]


def test_pipelined_writer_keeps_five_requests_in_flight_and_sequences_in_order():
    broker = PipelinedBroker()
    batches = _batches(("t", 0), 12)
    offsets_ = _writer(broker).write(batches)
    assert offsets_ == [2 * i for i in range(12)]
    assert broker.max_in_flight == 5
    assert [parse_batch(r[("t", 0)]).base_sequence for r in broker.received] == [2 * i for i in range(12)]
    assert broker.log[("t", 0)] == list(range(24))


def test_a_failed_batch_and_the_ones_in_flight_behind_it_are_resent_in_order_with_identical_bytes():
    broker = PipelinedBroker(script={("t", 0): [0, Errors.NotLeaderForPartitionError.errno]})
    batches = _batches(("t", 0), 8)
    offsets_ = _writer(broker).write(batches)
    assert offsets_ == [2 * i for i in range(8)]
    assert broker.log[("t", 0)] == list(range(16))                   # each record once, in order
    assert broker.init_calls == 1                                     # out-of-sequence behind a failure is expected
    sent = [r[("t", 0)] for r in broker.received]
    first = {parse_batch(b).base_offset: b for b in reversed(sent)}
    assert all(b == first[parse_batch(b).base_offset] for b in sent)  # every resend is byte-identical
    # batch 1 failed while 2..5 were in flight: they are resent after it, in order
    assert [parse_batch(b).base_offset for b in sent] == [0, 2, 4, 6, 8, 10, 2, 4, 6, 8, 10, 12, 14]


def test_a_new_producer_id_sends_one_batch_per_partition_until_the_broker_has_its_state():
    """A fresh topic's partition answers NOT_LEADER_OR_FOLLOWER until its leader is ready. A broker with no state
    for our producer id accepts any sequence, so a later batch in flight behind the refused first one would be
    written first (then the first one is out of sequence, the producer id re-initialised and everything resent:
    the target held batches 2, 3, 4, 0, 1, 2, ...). Until the broker acknowledged one batch of a producer id on a
    partition, that partition has one batch in flight."""
    broker = PipelinedBroker(script={("t", 0): [Errors.NotLeaderForPartitionError.errno,
                                               Errors.NotLeaderForPartitionError.errno]})
    offsets_ = _writer(broker).write(_batches(("t", 0), 6))
    assert broker.log[("t", 0)] == list(range(12))                    # each record once, in order
    assert offsets_ == [2 * i for i in range(6)]
    assert broker.init_calls == 1
    assert [parse_batch(r[("t", 0)]).base_offset for r in broker.received] == [0, 0, 0, 2, 4, 6, 8, 10]
    assert broker.max_in_flight == 5                                 # pipelined once the first one landed


def test_a_batch_written_ahead_of_a_missing_one_halts_instead_of_reinitialising():
    """Should the broker lose our state on a partition later (retention deleted all our batches), a batch behind a
    refused one can land first; re-initialising would then write the refused one after it and the later one twice.
    The writer halts naming both batches instead."""
    broker = PipelinedBroker(script={("t", 0): [0]})
    writer = _writer(broker)
    writer.write(_batches(("t", 0), 1))
    broker.state.clear()                                              # the broker forgot our producer id
    broker.script[("t", 0)] = [Errors.NotLeaderForPartitionError.errno]
    more = [OutgoingBatch("t", 0, make_batch(2 + 2 * i, 2), source_offset=2 + 2 * i) for i in range(3)]
    with pytest.raises(WriteOrderError, match="source offset 4 .* before .* source offset 2"):
        writer.write(more)


def test_batches_that_landed_behind_an_unanswered_request_are_acknowledged_not_duplicated():
    broker = PipelinedBroker(script={("t", 0): [0, "drop"]})
    offsets_ = _writer(broker).write(_batches(("t", 0), 7))
    assert offsets_ == [2 * i for i in range(7)]
    assert broker.log[("t", 0)] == list(range(14))
    assert broker.init_calls == 1


def test_out_of_sequence_on_the_first_unacknowledged_batch_reinitialises_the_producer():
    broker = PipelinedBroker(script={("t", 0): [0, Errors.UnknownProducerIdError.errno]})
    writer = _writer(broker)
    writer.write(_batches(("t", 0), 4))
    assert broker.init_calls == 2
    last = parse_batch(broker.received[-1][("t", 0)])
    assert (last.producer_id, last.base_sequence) == (702, 4)          # batches 1..3 restamped from sequence 0


def test_partitions_are_pipelined_independently_and_a_failure_in_one_keeps_the_others_in_order():
    broker = PipelinedBroker(script={("t", 1): [0, 0, Errors.NotEnoughReplicasError.errno]})
    batches = [b for pair in zip(_batches(("t", 0), 6), _batches(("t", 1), 6), strict=True) for b in pair]
    offsets_ = _writer(broker).write(batches)
    assert offsets_ == [2 * (i // 2) for i in range(12)]
    assert broker.log[("t", 0)] == list(range(12)) and broker.log[("t", 1)] == list(range(12))
    assert all(len(r) <= 2 for r in broker.received)                  # one batch per partition per request


def test_pipelined_writer_bounds_the_bytes_in_flight():
    broker = PipelinedBroker()
    batches = _batches(("t", 0), 10)
    size = len(batches[0].data)
    writer = BatchWriter(broker, retry_timeout_s=5, max_inflight_bytes=2 * size)
    writer.write(batches)
    assert broker.max_in_flight == 2 and broker.max_in_flight_bytes <= 2 * size


def test_a_rejection_behind_requests_in_flight_names_its_batch_and_lets_the_others_finish():
    broker = PipelinedBroker(script={("t", 0): [0, 0, Errors.InvalidRecordError.errno]})
    with pytest.raises(BatchRejectedError) as info:
        _writer(broker).write(_batches(("t", 0), 6))
    assert info.value.source_offset == 4
    assert broker.queue == []                                         # nothing left unanswered behind our back
