"""Layer 8 — daemon: the continuous shallow mirror.

The loop (``loop``; ``python -m mirror_core.daemon``), its membership through the source's consumer group, lane
openings and workers, the standing fetch round, and the watches on threads of their own (retention, prune, config
sync), its metrics endpoint and its structured events.
"""
