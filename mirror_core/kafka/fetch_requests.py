"""The Fetch request on the wire, for every fetcher: built (kafka-python's classes, the fallback route and the
reference the hand-encoded request is tested against), sent without waiting (:func:`send_fetch`, on the client's
hand-encoded fast path when it offers one), waited for (:func:`wait_fetch`), and a partition answer's DivergingEpoch
read (:func:`diverging_epoch`). One partition's fetcher is :mod:`mirror_core.kafka.fetcher`; several partitions per
broker round, :mod:`mirror_core.kafka.broker_fetch`.

Transport failures come back on the returned future as kafka-python's (retriable) errors, so callers asking several
brokers at once handle each answer the same way; a request is sessionless unless a fetch session
(:mod:`mirror_core.kafka.fetch_session`) is given.
"""

from __future__ import annotations

from collections.abc import Sequence

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.consumer import FetchRequest, IsolationLevel

from mirror_core.codec.fetch_messages import FetchTopicSpec
from mirror_core.kafka.fetch_session import FINAL_EPOCH, INVALID_SESSION_ID, SessionRequest
from mirror_core.kafka.retries import is_retriable
from mirror_core.kafka.wire_client import WireClient


def diverging_epoch(data) -> tuple[int, int] | None:
    """(epoch, end offset) of a Fetch response partition's DivergingEpoch (v12+, tagged field 0), or None when
    the leader found no divergence (field absent, or its defaults -1/-1). Works on kafka-python's PartitionData
    and on :class:`mirror_core.codec.fetch_messages.FetchPartitionData`."""
    value = getattr(data, "diverging_epoch", None)
    if value is None:
        return None
    epoch, end_offset = (value.epoch, value.end_offset) if hasattr(value, "end_offset") else value
    if epoch < 0 and end_offset < 0:
        return None
    return epoch, end_offset


def kafka_python_fetch_request(topics: Sequence[FetchTopicSpec], *, max_wait_ms: int, max_bytes: int,
                               isolation: IsolationLevel, session: SessionRequest | None = None) -> FetchRequest:
    """kafka-python's FetchRequest for ``topics`` (the fallback route, clusters reached through a proxy; and the
    reference the hand-encoded request is tested against). With ``session`` (:mod:`mirror_core.kafka.fetch_session`)
    the request carries its id, epoch, named partitions (``topics`` is then ignored) and forgotten ones; without
    it the request is sessionless."""
    if session is not None:
        topics = session.topics
    by_id = session.by_id if session is not None else all(spec.topic_id is not None for spec in topics)
    Topic = FetchRequest.FetchTopic
    return FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=int(isolation),
        session_id=session.session_id if session is not None else INVALID_SESSION_ID,
        session_epoch=session.epoch if session is not None else FINAL_EPOCH,
        topics=[Topic(topic=spec.topic, topic_id=spec.topic_id, partitions=[
            Topic.FetchPartition(partition=p.partition, current_leader_epoch=p.current_leader_epoch,
                                 fetch_offset=p.fetch_offset, last_fetched_epoch=p.last_fetched_epoch,
                                 log_start_offset=p.log_start_offset, partition_max_bytes=p.partition_max_bytes)
            for p in spec.partitions]) for spec in topics],
        forgotten_topics_data=[FetchRequest.ForgottenTopic(topic=gone.topic, topic_id=gone.topic_id,
                                                           partitions=list(gone.partitions))
                               for gone in (session.forgotten if session is not None else ())],
        rack_id="",
        min_version=FetchRequest.min_version_for_isolation_level(isolation),
        max_version=18 if by_id else 12)


def send_fetch(client: WireClient, leader: int, topics: Sequence[FetchTopicSpec], *, max_wait_ms: int,
               max_bytes: int, isolation: IsolationLevel, session: SessionRequest | None = None,
               slot: int = 0, request_timeout_ms: int | None = None) -> Future:
    """Send one FetchRequest for ``topics`` to ``leader`` and return its future at once (several brokers can be
    asked at the same time); :func:`wait_fetch` reads the answer. Topic ids are used (v13+) when every topic has
    one. With ``session`` (a :class:`~mirror_core.kafka.fetch_session.SessionRequest`) the request is that session's
    (its named partitions replace ``topics``). ``slot``: which of the client's connections to the leader (fast
    path only). The hand-encoded route (:mod:`mirror_core.kafka.fast_connection`) is taken when the client offers it;
    transport failures come back on the future as kafka-python's (retriable) errors. ``request_timeout_ms``: how
    long the broker may stay silent (default: the client's request timeout plus ``max_wait_ms``)."""
    by_id = session.by_id if session is not None else all(spec.topic_id is not None for spec in topics)
    timeout_ms = client.request_timeout_ms + max_wait_ms if request_timeout_ms is None else request_timeout_ms
    try:
        fast = (client.fast_connection(leader, slot) if slot else client.fast_connection(leader)) \
            if hasattr(client, "fast_connection") else None
        if fast is not None:   # hand-encoded, records as views into the response frame
            fields = {} if session is None else {
                "session_id": session.session_id, "session_epoch": session.epoch, "forgotten": session.forgotten}
            return fast.fetch_async(
                min_version=FetchRequest.min_version_for_isolation_level(isolation),
                max_version=18 if by_id else 12, request_timeout_ms=timeout_ms, max_wait_ms=max_wait_ms,
                min_bytes=1, max_bytes=max_bytes, isolation_level=int(isolation),
                topics=session.topics if session is not None else topics, **fields)
        request = kafka_python_fetch_request(topics, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                             isolation=isolation, session=session)
        if hasattr(client, "send_async"):
            return client.send_async(leader, request, timeout_ms)
        return Future().success(client.send(leader, request))
    except Errors.KafkaError as exc:
        if not is_retriable(type(exc)):
            raise
        return Future().failure(exc)


def wait_fetch(client: WireClient, future: Future, *, timeout_s: float | None = None) -> None:
    """Read until ``future`` (from :func:`send_fetch`) is answered; errors stay on the future. ``timeout_s``
    bounds the wait: past it the future is failed (hand-encoded route, whose connection is closed then) or left
    unresolved (kafka-python's)."""
    conn = getattr(future, "conn", None)
    if conn is not None:
        conn.wait(future) if timeout_s is None else conn.wait(future, timeout_s=timeout_s)
    elif not future.is_done:
        client.wait(future) if timeout_s is None else client.wait(future, timeout_s=timeout_s)
