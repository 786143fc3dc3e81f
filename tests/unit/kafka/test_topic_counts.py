"""The rescan's Metadata decoder (mirror_core.kafka.topic_counts) reads what kafka-python's full decoder reads.

kafka-python encodes a generated MetadataResponse of every version we speak (brokers, racks, topics with errors,
null names, partitions with broker-id lists long enough for multi-byte compact lengths); our decoder must give each
error-free topic's partition count exactly as kafka-python's decoder does, and the top-level error. Tagged fields
kafka-python never writes are skipped (a frame with tags at every level), a cut frame fails instead of answering
with fewer topics, and the request is kafka-python's own encoding at the version asked.
"""

from __future__ import annotations

import struct
import uuid

import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from mirror_core.codec.kafka_primitives import uvarint
from mirror_core.kafka import topic_counts as tc

T = MetadataResponse.MetadataResponseTopic
P = T.MetadataResponsePartition
B = MetadataResponse.MetadataResponseBroker

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
long_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=120, max_size=260)
i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
node_ids = st.lists(st.integers(0, 2**31 - 1), max_size=3) | st.lists(st.integers(0, 9), min_size=127, max_size=140)
partitions = st.lists(st.builds(lambda e, i, leader, ep, r, isr, off: P(
    error_code=e, partition_index=i, leader_id=leader, leader_epoch=ep, replica_nodes=r, isr_nodes=isr,
    offline_replicas=off), i16, i32, i32, i32, node_ids, node_ids, node_ids), max_size=5)
topics = st.lists(st.tuples(st.sampled_from([0, 0, 0, 3, 5, 29]), names | long_names, st.booleans(), partitions),
                  max_size=6, unique_by=lambda t: t[1])
brokers = st.lists(st.builds(lambda n, h, p, r: B(node_id=n, host=h, port=p, rack=r), i32, names, i32,
                             st.none() | names), max_size=3)


def _response(throttle, broker_list, cluster_id, topic_list, error_code, *, null_error_names=False):
    return MetadataResponse(
        throttle_time_ms=throttle, brokers=broker_list, cluster_id=cluster_id, controller_id=1,
        topics=[T(error_code=e, name=None if (e and null_error_names) else n, topic_id=uuid.uuid4(), is_internal=i,
                  partitions=ps, authorized_operations=None) for e, n, i, ps in topic_list],
        authorized_operations=None, error_code=error_code)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(*tc.METADATA_VERSIONS), throttle=i32, broker_list=brokers,
       cluster_id=st.none() | names, topic_list=topics, error_code=st.sampled_from([0, 0, 58]),
       null_error_names=st.booleans())
def test_topic_counts_decode_like_kafka_python(version, throttle, broker_list, cluster_id, topic_list, error_code,
                                               null_error_names):
    response = _response(throttle, broker_list, cluster_id, topic_list, error_code,
                         null_error_names=null_error_names and version >= 12)
    encoded = bytes(response.encode(version=version))
    expected = MetadataResponse.decode(encoded, version=version)
    ours = tc.decode_topic_counts(version, memoryview(encoded))
    assert ours.counts == {t.name: len(t.partitions) for t in expected.topics if not t.error_code}
    assert ours.errors == {t.name: t.error_code for t in expected.topics if t.error_code and t.name is not None}
    assert ours.throttle_time_ms == (expected.throttle_time_ms if version >= 3 else 0)
    assert ours.error_code == (expected.error_code if version >= 13 else 0)


@settings(max_examples=200, deadline=None)
@given(version=st.integers(*tc.METADATA_VERSIONS), topic_list=topics.filter(bool), cut=st.floats(0, 1,
                                                                                              exclude_max=True))
def test_a_cut_answer_fails_instead_of_listing_fewer_topics(version, topic_list, cut):
    """A frame cut anywhere (a broken connection would close, but a bug must not read as "fewer topics": the
    rescan would then find nothing new) raises what FastConnection turns into a protocol error."""
    encoded = bytes(_response(0, [], None, topic_list, 0).encode(version=version))
    with pytest.raises((ValueError, IndexError, struct.error)):
        tc.decode_topic_counts(version, memoryview(encoded[:int(len(encoded) * cut)]))


def _uv(n: int) -> bytes:
    return uvarint(n)


def _cstr(s: str) -> bytes:
    raw = s.encode()
    return _uv(len(raw) + 1) + raw


def _tags(*fields: tuple[int, bytes]) -> bytes:
    return _uv(len(fields)) + b"".join(_uv(tag) + _uv(len(data)) + data for tag, data in fields)


@pytest.mark.parametrize("version", [9, 10, 11, 12, 13])
def test_tagged_fields_at_every_level_are_skipped(version):
    """Tags kafka-python's encoder never writes (a newer broker's additions): skipped by their sizes, at the
    broker, partition, topic and response level, one of them longer than 127 bytes (a two-byte size)."""
    ids = b"".join(struct.pack(">i", i) for i in (1, 2, 3))
    partition = struct.pack(">hiii", 0, 0, 1, 7) + _uv(4) + ids + _uv(4) + ids + _uv(1) + _tags((3, b"x" * 200))
    frame = (struct.pack(">i", 0) + _uv(2) + struct.pack(">i", 1) + _cstr("host") + struct.pack(">i", 9092)
             + _uv(0) + _tags((1, b"rack?")) + _cstr("cluster") + struct.pack(">i", 1)
             + _uv(3)
             + struct.pack(">h", 0) + _cstr("orders") + (uuid.uuid4().bytes if version >= 10 else b"") + b"\x00"
             + _uv(3) + partition + partition + struct.pack(">i", 0) + _tags((0, b"abc"), (9, b""))
             + struct.pack(">h", 3) + _cstr("gone") + (bytes(16) if version >= 10 else b"") + b"\x00"
             + _uv(1) + struct.pack(">i", 0) + _tags()
             + (struct.pack(">i", 0) if version <= 10 else b"") + (struct.pack(">h", 0) if version >= 13 else b"")
             + _tags((2, b"later")))
    assert tc.decode_topic_counts(version, memoryview(frame)).counts == {"orders": 2}


@pytest.mark.parametrize("version", range(tc.METADATA_VERSIONS[0], tc.METADATA_VERSIONS[1] + 1))
def test_the_request_is_kafka_pythons_asking_for_every_topic_without_creating_any(version):
    request = tc.metadata_request()
    request.API_VERSION = version
    decoded = MetadataRequest.decode(bytes(request.encode(version=version)), version=version)
    assert decoded.topics is None
    if version >= 4:
        assert decoded.allow_auto_topic_creation is False


class _Conn:
    """A FastConnection stand-in answering Metadata with kafka-python's encoding of ``answer`` at the version the
    caller negotiated (the real decoder runs), or failing like a dead socket."""

    def __init__(self, answer, *, fail: BaseException | None = None, max_version: int = 13):
        self.answer, self.fail, self.max_version, self.asked, self.closed = answer, fail, max_version, [], False

    def version(self, api_key, low, high):
        assert api_key == tc.API_METADATA
        return min(high, self.max_version)

    def send_encoded(self, request, version, decoder, *, flexible_response):
        from kafka.future import Future

        self.asked.append(version)
        future = Future()
        if self.fail is not None:
            self.closed = True
            return future.failure(self.fail)
        return future.success(decoder(memoryview(bytes(self.answer.encode(version=version)))))

    def wait(self, future):
        pass


class _Client:
    cluster_name = "source"

    def __init__(self, *conns):
        self.conns = list(conns)
        self.handed = []

    def metadata_connection(self):
        conn = self.conns.pop(0) if len(self.conns) > 1 else self.conns[0]
        fresh = conn not in self.handed
        self.handed.append(conn)
        return conn, fresh


def _answer(counts: dict[str, int], *, errors: dict[str, int] | None = None, error_code: int = 0):
    errors = errors or {}
    return _response(0, [], "c", [(errors.get(n, 0), n, False, [
        P(error_code=0, partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=[1], isr_nodes=[1],
          offline_replicas=[]) for i in range(k)]) for n, k in counts.items()], error_code)


@pytest.mark.parametrize("max_version", [1, 8, 12, 13])
def test_list_topic_counts_leaves_out_topics_answered_with_an_error(max_version):
    client = _Client(_Conn(_answer({"orders": 3, "new": 0, "creating": 2}, errors={"creating": 5}),
                           max_version=max_version))
    assert tc.list_topic_counts(client) == {"orders": 3, "new": 0}


def test_a_top_level_error_is_raised_not_read_as_no_topics():
    client = _Client(_Conn(_answer({"orders": 3}, error_code=Errors.RebootstrapRequiredError.errno
                                   if hasattr(Errors, "RebootstrapRequiredError") else 58)))
    with pytest.raises(Errors.KafkaError):
        tc.list_topic_counts(client)


def test_a_reused_connection_that_died_idle_is_asked_again_once_on_a_new_one():
    dead = _Conn(None, fail=Errors.KafkaConnectionError("closed by the broker while idle"))
    client = _Client(dead, _Conn(_answer({"orders": 2})))
    client.handed.append(dead)                              # used before: not fresh
    assert tc.list_topic_counts(client) == {"orders": 2}


def test_a_new_connection_that_fails_is_the_answer_no_retry():
    failing = _Conn(None, fail=Errors.KafkaConnectionError("refused"))
    spare = _Conn(_answer({"orders": 2}))
    client = _Client(failing, spare)
    with pytest.raises(Errors.KafkaConnectionError):
        tc.list_topic_counts(client)
    assert spare.asked == []
