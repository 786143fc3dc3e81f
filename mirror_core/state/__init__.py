"""Layer 5 — state: what Shoal keeps, and where it lives.

Checkpoints and the offset map on the target's checkpoint topic (``checkpoint``: the store; ``checkpoint_cache``: its
incremental reader; ``checkpoint_format``: the value's formats and migrations; ``checkpoint_topic``: the topic's
settings), lane halts and accepted losses (``lane_control``), lane health records, the lease records of the older
lease-based daemon (read for the upgrade), the backfill ledger (Parquet) and the one-backfill-per-pipeline claims. The
invariants of each record's layout are written in its module.
"""
