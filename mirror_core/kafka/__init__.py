"""Layer 4 — kafka: the only code that talks to brokers.

The wire client (``wire_client``, on kafka-python's protocol classes, with its ``cluster_metadata``; ``retries``),
the fast connection and its channel (``fast_connection``, ``fast_login``, ``response_frames``, ``wire_channel``:
hand-encoded Produce/Fetch over plain TCP or TLS, SASL, KIP-368), fetch sessions (KIP-227), fetching (``fetcher``,
``broker_fetch``), producing raw batches (``writer``, its ``producer_transactions``, ``produce_pipeline``,
``produce_retry``, ``produce_transport``, ``produce_errors``; ``shared_produce``), leader-epoch truncation checks
(``epochs``), topic administration (``topics``), readers used by verification (``verify``), and the gatherers that
read what a model decides on (``plan_inputs``, ``retention_inputs``, ``prune_inputs``, ``topic_counts``, ``ranges``,
``topic_config_sync``).
"""
