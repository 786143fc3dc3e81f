"""The writer's one-partition loop (``ProducePipeline._run_one_partition``) against the general turns: a write of one
writer to one partition on the fast route sends the same requests, byte for byte and in the same order, and keeps
every invariant of the general path (first-acknowledgement rule, sequences, in-flight limits, refusals handed back).

The broker is the scripted cluster of ``test_writer_fast_route_faults`` (real sockets, Kafka's idempotence rules);
here it also records every Produce frame it receives. Only scripts whose request sequence does not depend on timing
are compared frame by frame: clean answers, and refusals of a partition's first batch (one batch in flight until
the first acknowledgement, so nothing else is sent meanwhile)."""

from __future__ import annotations

import struct

import kafka.errors as Errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirror_core.codec.batch_codec import parse_batch
from mirror_core.kafka import produce_pipeline
from mirror_core.kafka.writer import BatchWriter, OutgoingBatch, _check_ready
from tests.unit.kafka import test_writer_fast_route_faults as faults
from tests.unit.kafka.test_kafka_wire_pure import make_batch

pytestmark = pytest.mark.timeout(120)

NOT_LEADER = Errors.NotLeaderForPartitionError.errno
_PARSE_PRODUCE = faults._parse_produce
_RUN_ONE_PARTITION = produce_pipeline.ProducePipeline._run_one_partition


def _write_recorded(monkeypatch, *, loop: bool, counts: list[int], script: list, max_inflight_bytes: int,
                    keep_queued: int, topic: str = "t"):
    """Write one partition's batches (``counts`` records each) with the one-partition loop on or off; returns the
    Produce frames the broker received, the base offsets, what the broker holds and how many turns the loop ran."""
    frames: list[bytes] = []

    def recording(frame):
        frames.append(bytes(frame))
        return _PARSE_PRODUCE(frame)

    turns = []

    def counted(self):
        ran = _RUN_ONE_PARTITION(self)
        turns.append(ran)
        return ran

    monkeypatch.setattr(faults, "_parse_produce", recording)
    monkeypatch.setattr(produce_pipeline, "ONE_PARTITION_LOOP", loop)
    monkeypatch.setattr(produce_pipeline, "KEEP_QUEUED", keep_queued)
    monkeypatch.setattr(produce_pipeline.ProducePipeline, "_run_one_partition", counted)
    tp = (topic, 0)
    offset, batches = 0, []
    for count in counts:
        batches.append(OutgoingBatch(topic, 0, make_batch(offset, count), source_offset=offset))
        offset += count
    cluster = faults.Cluster({tp: 1}, {tp: list(script)})
    client = faults.FastClient(cluster)
    try:
        writer = BatchWriter(client, retry_timeout_s=10, max_inflight_bytes=max_inflight_bytes)
        results = writer.write(batches)
        return frames, results, list(cluster.log.get(tp, [])), sum(turns)
    finally:
        client.close()
        cluster.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=24),
       refused_first=st.integers(0, 2),
       max_inflight_bytes=st.sampled_from([1, 200, 500, 8 * 1024 * 1024]),
       keep_queued=st.sampled_from([0, 3, 4]),
       topic=st.sampled_from(["t", "a-topic.name_" + "x" * 120]))
def test_the_one_partition_loop_sends_the_general_paths_requests_byte_for_byte(
        monkeypatch, counts, refused_first, max_inflight_bytes, keep_queued, topic):
    script = [NOT_LEADER] * refused_first
    general = _write_recorded(monkeypatch, loop=False, counts=counts, script=script,
                              max_inflight_bytes=max_inflight_bytes, keep_queued=keep_queued, topic=topic)
    loop = _write_recorded(monkeypatch, loop=True, counts=counts, script=script,
                           max_inflight_bytes=max_inflight_bytes, keep_queued=keep_queued, topic=topic)
    assert loop[0] == general[0]                       # every Produce frame, in order
    assert loop[1] == general[1]                       # the base offsets the write returns
    assert loop[2] == general[2] == list(range(sum(counts)))
    assert general[3] == 0
    if len(counts) > 1:
        assert loop[3] > 0                             # the loop really took the write


def test_the_loop_keeps_one_batch_in_flight_until_the_first_acknowledgement(monkeypatch):
    frames, results, log, turns = _write_recorded(monkeypatch, loop=True, counts=[1] * 12,
                                                  script=[NOT_LEADER, NOT_LEADER], max_inflight_bytes=8 << 20,
                                                  keep_queued=3)
    assert log == list(range(12)) and results == list(range(12))
    sequences = [parse_batch(_PARSE_PRODUCE(f)[3][0][1]).base_sequence for f in frames]
    assert sequences[:3] == [0, 0, 0]                  # refused twice, written the third time, alone
    assert sequences[3:] == list(range(1, 12))
    assert turns > 0


def test_the_loop_hands_a_refusal_to_the_general_path_and_keeps_order(monkeypatch):
    frames, results, log, turns = _write_recorded(
        monkeypatch, loop=True, counts=[1] * 40, max_inflight_bytes=8 << 20, keep_queued=3,
        script=[0, 0, NOT_LEADER, 0, 0, Errors.NotEnoughReplicasError.errno, 0, 0, 0, 0, 0, 0, NOT_LEADER])
    assert log == list(range(40)) and results == list(range(40))
    assert turns > 1                                   # back in the loop after each retry


def test_the_loop_halts_with_write_order_error_when_the_broker_lost_our_state(monkeypatch):
    from mirror_core.errors import WriteOrderError
    with pytest.raises(WriteOrderError):
        _write_recorded(monkeypatch, loop=True, counts=[1] * 12, script=[0, 0, "forget"],
                        max_inflight_bytes=8 << 20, keep_queued=3)


def _mutated(raw: bytes, field: str, value: int) -> bytearray:
    data = bytearray(raw)
    if field == "magic":
        data[16] = value % 256
    elif field == "count":
        struct.pack_into(">i", data, 57, value)
    elif field == "delta":
        struct.pack_into(">i", data, 23, value)
    elif field == "length":
        struct.pack_into(">i", data, 8, value)
    elif field == "cut":
        del data[value % len(data):]
    return data


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 4), field=st.sampled_from(["none", "magic", "count", "delta", "length", "cut"]),
       value=st.integers(-3, 200))
def test_check_ready_takes_and_refuses_exactly_what_the_batch_parse_does(count, field, value):
    data = _mutated(make_batch(7, count), field, value)
    batch = OutgoingBatch("t", 0, data, source_offset=7)
    try:
        view = parse_batch(data)
        expected = view.records_count if (view.magic == 2 and view.records_count > 0
                                          and not view.has_offset_holes) else None
    except Exception:  # noqa: BLE001 - any parse failure means "not writable as it is"
        expected = None
    if expected is None:
        with pytest.raises(ValueError, match="t-0 source offset 7"):
            _check_ready(batch)
    else:
        assert _check_ready(batch) == expected


@pytest.mark.parametrize("script", [[0, 0, "forget"], [0, 0, NOT_LEADER]], ids=["state-lost", "not-leader"])
def test_answers_arriving_together_behind_a_refused_batch_are_not_acknowledged_out_of_order(monkeypatch, script):
    """The client waits a moment before each read, so a refused batch's answer and the clean answers of the
    batches behind it are all in the socket when it is read, and taken in one go (KEEP_QUEUED 0): those behind it
    must go to the general rule (resend after it, or halt when one landed ahead of it), never be acknowledged."""
    import time

    from mirror_core.errors import WriteOrderError
    from mirror_core.kafka.fast_connection import FastConnection

    wait = FastConnection.wait

    def slow_wait(self, future, **kwargs):
        time.sleep(0.02)
        return wait(self, future, **kwargs)

    monkeypatch.setattr(FastConnection, "wait", slow_wait)
    if script[-1] == "forget":
        with pytest.raises(WriteOrderError):
            _write_recorded(monkeypatch, loop=True, counts=[1] * 12, script=script, max_inflight_bytes=8 << 20,
                            keep_queued=0)
    else:
        _, results, log, _ = _write_recorded(monkeypatch, loop=True, counts=[1] * 12, script=script,
                                             max_inflight_bytes=8 << 20, keep_queued=0)
        assert log == list(range(12)) and results == list(range(12))
