"""Layer 8 — daemon: the continuous shallow mirror.

The loop (``loop``) and its entry point (``main``; ``python -m mirror_core.daemon``); membership through the source's
consumer group (``membership``, ``group_settings``, ``group_lanes``, ``eligibility``, ``compat_leases``); lane
openings, sessions and workers; the standing fetch round and the copy round; fences, lane failures and lane health;
rescans; the watches on threads of their own (``retention_watch``, ``prune_watch``, ``config_sync``); metrics and
structured events.
"""
