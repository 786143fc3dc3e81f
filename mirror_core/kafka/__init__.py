"""Layer 4 — kafka: the only code that talks to brokers.

The wire client (``wire_client`` on kafka-python's protocol classes, ``cluster_metadata``, ``retries``), the fast
connection (``fast_connection``, ``fast_login``, ``response_frames``, ``wire_channel``: hand-encoded Produce/Fetch over
plain TCP or TLS, SASL, KIP-368), fetch sessions (KIP-227, ``fetch_session``), fetching (``fetcher``,
``fetch_requests``, ``broker_fetch``), producing raw batches (``writer``, ``producer_transactions``,
``produce_pipeline``, ``produce_retry``, ``produce_transport``, ``produce_errors``, ``shared_produce``), leader-epoch
truncation checks (``epochs``), the one ListOffsets (``list_offsets``), the one admin facade (``admin`` with
``topics``, ``group_admin``; ``daemon_group`` reads the daemons' group), round trips (``round_trips``), the source's
reachability, readers used by verification (``verify``), and the gatherers that read what a model decides on
(``retention_inputs``, ``prune_inputs``, ``topic_counts``, ``resolve_positions``, ``topic_config_sync``).
"""
