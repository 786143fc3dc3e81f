"""How the pipeline's Produce requests reach the target (:class:`ProduceTransport`): several requests in flight on
one target client, by the fastest route the client offers.

A client with ``fast_connection(node)`` (:class:`~mirror_core.kafka.wire_client.WireClient`, any security protocol)
sends hand-encoded Produce requests on its own socket to the broker (:mod:`mirror_core.kafka.fast_connection`);
one offering ``send_async`` / ``wait`` is used through them; any other client (test fakes) synchronously through
``send``. Produce is capped at v11 (``PRODUCE_MAX_VERSION``) so a Kafka 4 broker never takes us for a
"transaction version 2" client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import kafka.errors as Errors
from kafka.future import Future

if TYPE_CHECKING:
    from mirror_core.kafka.produce_pipeline import PendingBatch
    from mirror_core.kafka.writer import BatchWriter

PRODUCE_MAX_VERSION = 11


class ProduceTransport:
    """Several requests in flight on one target client: ``send`` returns a kafka-python Future at once, ``wait``
    drives the network until a given one is answered.

    A client with ``fast_connection(node)`` (:class:`WireClient`, any security protocol) sends hand-encoded Produce
    requests on its own socket to the broker (:mod:`mirror_core.kafka.fast_connection`: the batches go to ``sendmsg``
    without a copy, no event-loop turns); one offering ``send_async(node, request, timeout_ms)`` / ``wait(future)``
    is used through them; any other client (test fakes) synchronously through ``send``, its futures coming back
    resolved. All requests of one write to one broker take the same route, so their order is the send order.

    On the fast route the requests of one turn of the pipeline are deferred and leave together at :meth:`flush`
    (one ``sendmsg`` per connection; a wait or any other request on the connection sends them first, see
    :meth:`FastConnection.send`); :meth:`answered` takes answers that already arrived without waiting.
    """

    def __init__(self, client):
        self.client = client
        self._fast = getattr(client, "fast_connection", None)
        self._native = hasattr(client, "send_async") and hasattr(client, "wait")
        self._deferred: list = []  # fast connections holding deferred requests until flush()

    def send(self, node: int, writer: BatchWriter, items: dict[tuple[str, int], PendingBatch], timeout_ms: int,
             produce_timeout_ms: int) -> Future:
        """Send one Produce request; ``timeout_ms`` bounds the wait for its answer, ``produce_timeout_ms`` is the
        request's own timeout field (the writer's :attr:`BatchWriter.produce_timeout_ms`, computed once per send)."""
        if self._fast is not None:
            try:
                conn = self._fast(node)
                if conn is not None:
                    if len(items) == 1:
                        ((topic, partition), p), = items.items()
                        topic_data = [(topic, [(partition, p.batch.data)])]
                    else:
                        by_topic: dict[str, list] = {}
                        for (topic, partition), p in items.items():
                            by_topic.setdefault(topic, []).append((partition, p.batch.data))
                        topic_data = list(by_topic.items())
                    future = conn.produce(transactional_id=writer.transactional_id if writer._in_txn else None,
                                          acks=writer.acks, timeout_ms=produce_timeout_ms,
                                          topic_data=topic_data, max_version=PRODUCE_MAX_VERSION,
                                          request_timeout_ms=timeout_ms, defer=True)
                    if conn not in self._deferred:
                        self._deferred.append(conn)
                    return future
            except Errors.KafkaError as exc:
                return Future().failure(exc)
        request = writer._produce_request(items)
        if self._native:
            return self.client.send_async(node, request, timeout_ms)
        future = Future()
        try:
            future.success(self.client.send(node, request, timeout_ms=timeout_ms))
        except Errors.KafkaError as exc:
            future.failure(exc)
        return future

    def fast_connection(self, node: int):
        """The fast connection :meth:`send` would use for ``node``, or None (no fast route, or it cannot be opened
        now: :meth:`send` then meets the same error and fails the request with it)."""
        if self._fast is None:
            return None
        try:
            return self._fast(node)
        except Errors.KafkaError:
            return None

    def flush(self) -> None:
        """Hand every deferred request to its connection's socket."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for conn in deferred:
                conn.flush()

    def answered(self, future: Future) -> bool:
        """Whether ``future`` is resolved already, reading (never waiting for) answers that arrived."""
        conn = getattr(future, "conn", None)
        return future.is_done if conn is None else conn.answered(future)

    def wait(self, future: Future) -> None:
        conn = getattr(future, "conn", None)
        if conn is not None:
            conn.wait(future)
        elif self._native:
            self.client.wait(future)
