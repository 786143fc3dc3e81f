"""Several lanes' writes in shared Produce requests (modes none / at-least-once): the writer pipeline over several
writers, and SharedProduce's one-task-at-a-time hand-off."""

from __future__ import annotations

import threading

import kafka.errors as Errors
import pytest

from mirror_core.batch_codec import parse_batch
from mirror_core.errors import BatchRejectedError, MirrorError
from mirror_core.shared_produce import SharedProduce
from mirror_core.writer import BatchWriter, OutgoingBatch, ProduceStats, write_together
from tests.unit.test_kafka_wire_pure import PipelinedBroker, ScriptedTarget, make_batch


def _batches(topic, partition, n, count=1):
    return [OutgoingBatch(topic, partition, make_batch(i * count, count), source_offset=i * count) for i in range(n)]


def _writer(client) -> BatchWriter:
    writer = BatchWriter(client, retry_timeout_s=5)
    writer.init_producer_id()
    return writer


def test_two_writers_share_requests_each_with_its_own_producer_id_and_sequences():
    broker = PipelinedBroker()
    a, b = _writer(broker), _writer(broker)
    stats = ProduceStats()
    out = write_together([(a, _batches("t", 0, 6), [1] * 6), (b, _batches("t", 1, 6), [1] * 6)], stats=stats)
    assert out == [list(range(6)), list(range(6))]
    assert stats.requests < stats.batches == 12
    assert any(len(request) == 2 for request in broker.received), "no request carried both lanes"
    for tp, writer in ((("t", 0), a), (("t", 1), b)):
        sent = [parse_batch(r[tp]) for r in broker.received if tp in r]
        assert {v.producer_id for v in sent} == {writer.producer_id}
        assert [v.base_sequence for v in sent] == list(range(6))
    assert broker.log[("t", 0)] == broker.log[("t", 1)] == list(range(6))
    assert broker.max_in_flight <= 5


def test_two_writers_of_one_partition_never_put_two_batches_of_it_in_one_request():
    target = ScriptedTarget()
    a, b = _writer(target), _writer(target)
    write_together([(a, _batches("cp", 0, 3), [1] * 3), (b, _batches("cp", 0, 3), [1] * 3),
                    (b, [], [])])
    assert len(target.sent) == 6  # the fake keys a request's batches by partition: a second one would vanish
    assert sorted(parse_batch(p[("cp", 0)]).producer_id for _, p in target.sent) == \
        [a.producer_id] * 3 + [b.producer_id] * 3


def test_a_writer_inside_a_transaction_never_shares_a_request():
    target = ScriptedTarget()
    writer = BatchWriter(target, transactional_id="shoal.p.0")
    writer.producer_id, writer.producer_epoch, writer._in_txn = 9, 0, True
    with pytest.raises(MirrorError, match="inside a transaction"):
        write_together([(_writer(target), _batches("t", 0, 1), [1]), (writer, _batches("t", 1, 1), [1])])


def test_shared_produce_runs_one_lane_at_a_time_and_sends_their_writes_together():
    broker = PipelinedBroker()
    shared = SharedProduce()
    writers = [_writer(broker) for _ in range(3)]
    for writer in writers:
        shared.attach(writer)
    running, most = [0], [0]
    lock = threading.Lock()

    def lane(p):
        def run():
            results = []
            for round_ in range(2):  # two writes per lane: data, then (say) its checkpoint
                with lock:
                    running[0] += 1
                    most[0] = max(most[0], running[0])
                batches = _batches("t", p, 4) if round_ == 0 else [OutgoingBatch("t", p, make_batch(4), 4)]
                with lock:
                    running[0] -= 1
                results.append(writers[p].write(batches))
            return results
        return run

    done = shared.run([lane(p) for p in range(3)])
    assert [error for _, error in done] == [None] * 3
    assert [result for result, _ in done] == [[[0, 1, 2, 3], [4]]] * 3
    assert most[0] == 1, "two lanes ran at once"
    assert shared.rounds == 2 and shared.shared_writes == 6
    assert shared.stats.requests < shared.stats.batches == 15


def test_a_failed_shared_write_fails_every_lane_in_it_and_names_the_batch():
    broker = PipelinedBroker(script={("t", 1): [Errors.CorruptRecordError.errno]})
    shared = SharedProduce()
    writers = [_writer(broker) for _ in range(2)]
    for writer in writers:
        shared.attach(writer)
    done = shared.run([lambda p=p: writers[p].write(_batches("t", p, 3)) for p in range(2)])
    errors = [error for _, error in done]
    assert all(isinstance(error, BatchRejectedError) for error in errors)
    assert "t-1" in str(errors[0]) or "partition 1" in str(errors[0])


def test_a_write_outside_a_lane_task_goes_alone():
    broker = PipelinedBroker()
    shared = SharedProduce()
    writer = _writer(broker)
    shared.attach(writer)
    assert writer.write(_batches("t", 0, 3)) == [0, 1, 2]
    assert shared.rounds == 0


def test_a_refused_first_batch_of_one_lane_keeps_both_lanes_in_order():
    """The first-acknowledgement rule holds per writer in a shared write: lane b's fresh partition refuses its
    first batch twice (a new topic's leader not ready); b keeps one batch in flight until acknowledged, so nothing
    of b lands ahead of its first batch, and lane a is pipelined meanwhile."""
    broker = PipelinedBroker(script={("t", 1): [Errors.NotLeaderForPartitionError.errno] * 2})
    a, b = _writer(broker), _writer(broker)
    out = write_together([(a, _batches("t", 0, 8), [1] * 8), (b, _batches("t", 1, 8), [1] * 8)])
    assert out == [list(range(8)), list(range(8))]
    assert broker.log[("t", 0)] == broker.log[("t", 1)] == list(range(8))
    b_sent = [parse_batch(r[("t", 1)]).base_offset for r in broker.received if ("t", 1) in r]
    assert b_sent[:3] == [0, 0, 0]
    assert broker.init_calls == 2  # one producer id per writer, none re-initialised
