"""Layer 2 — codec: pure bytes, no sockets, no clocks.

The raw record-batch codec (``batch_codec``: walk, check, re-stamp batches without touching records), the named
deep cases that do rewrite records (``batch_deep``), and the SASL exchanges as message computations (``sasl``).
Property-tested with hypothesis; everything above trusts these to be byte-exact.
"""
