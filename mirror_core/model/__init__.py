"""Layer 3 — model: pure decisions, no I/O.

Each module decides from values its gatherer (in :mod:`mirror_core.kafka`) or its caller read: the offset map and
its segments, the retention model and its policy, preflight rules, the backfill planner and topic selection, the
consumer-group translation, the throttle, lane states as users see them, and the books the daemon keeps by events
(``held_positions``, ``lane_holders``). Sans-I/O: unit tests reach every decision without a broker.
"""
