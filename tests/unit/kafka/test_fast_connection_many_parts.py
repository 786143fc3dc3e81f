"""Review of i14-one-partition (deferred Produce requests, one sendmsg per connection): fast-connection cases."""

from __future__ import annotations

import pytest

from mirror_core.kafka.fast_connection import FastConnection
from tests.unit.kafka.test_wire_fastpath import _Broker, listener  # noqa: F401 - fixture


@pytest.mark.timeout(30)
def test_a_produce_request_of_many_partitions_leaves_whatever_its_buffer_count(listener):  # noqa: F811
    """One Produce request carries one batch per partition, and one writer's (or several lanes') partitions led by
    one broker share a request up to max_request_bytes (16 MiB): 600 one-record batches of ~100 bytes are one
    request of 1202 buffers (_encode_produce_general: a header chunk and the batch per partition). PlainChannel
    hands all of them to ONE sendmsg, and Linux refuses more than IOV_MAX (1024) iovecs with EMSGSIZE: the
    connection fails, the writer marks every batch ambiguous and resends the identical request until its retry
    window ends (PartitionUnavailableError). _DEFER_MAX_PARTS caps what several deferred requests add up to, not
    one request's own parts (pre-existing in PlainChannel.send, not introduced by the branch)."""
    broker = _Broker(listener)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    future = conn.produce(transactional_id=None, acks=-1, timeout_ms=1000,
                          topic_data=[("t", [(p, bytearray(b"x" * 100)) for p in range(600)])])
    conn.wait(future)
    assert not future.failed(), future.exception
    assert len(broker.requests) == 1
    conn.close()


@pytest.mark.timeout(30)
def test_a_re_authentication_due_while_requests_are_deferred_sends_and_drains_them_first(listener):  # noqa: F811
    """KIP-368 between requests: produce() re-authenticates first when due, which drains what is in flight. With
    deferred requests in flight (queued, not sent) the drain must send them first, read their answers, and only then
    run the exchange; the request that triggered it goes after. (The exchange is stood in for by one ApiVersions
    round trip, which _Broker answers.)"""
    broker = _Broker(listener)
    broker.start()
    conn = FastConnection(*listener.getsockname(), request_timeout_s=5)
    exchanges = []

    def authenticate(*, again=False):
        exchanges.append([f.is_done for f in deferred])
        conn._handshake()

    conn._authenticate = authenticate
    deferred = [conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, defer=True,
                             topic_data=[("t", [(0, bytearray(b"d%d" % i))])]) for i in range(3)]
    conn._reauth_at = 0.0     # due now
    last = conn.produce(transactional_id=None, acks=-1, timeout_ms=1000, defer=True,
                        topic_data=[("t", [(0, bytearray(b"last"))])])
    conn.flush()
    conn.wait(last)
    assert exchanges == [[True, True, True]]
    assert [f.value.responses[0].partition_responses[0].base_offset for f in deferred + [last]] == [1, 2, 3, 4]
    conn.close()
