"""Layer 3 — model: pure decisions, no I/O.

Each module decides from values its gatherer or its caller read: the offset map (``offset_map``, ``offset_runs``)
and its segments (``map_segments``), the one range value (``ranges``), the retention model (``retention``,
``copy_capacity``) and its policy, preflight rules, the backfill planner and its plan document (``planner``,
``plan``), consumer-group translation, the throttle, lane states as users see them, and the books the daemon keeps by
events (``held_positions``, ``lane_holders``). Sans-I/O: unit tests reach every decision without a broker.
"""
