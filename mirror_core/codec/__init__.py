"""Layer 2 — codec: pure bytes, no sockets, no clocks.

The raw record-batch codec (``batch_codec``: walk and check batches; ``batch_prepare``: re-stamp them for the target
without touching records), the named deep cases that do rewrite records (``batch_deep``), the digest that proves a
copied range identical (``records_digest``), the SASL exchanges as message computations (``sasl``), and the Kafka
messages the hot path hand-encodes (``kafka_primitives``, ``produce_messages``, ``fetch_messages``,
``sasl_messages``). Property-tested with hypothesis; everything above trusts these to be byte-exact.
"""
