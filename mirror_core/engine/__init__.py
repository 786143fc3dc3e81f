"""Layer 6 — engine: the copy path and the mirror contract (DESIGN §3).

Copy a bounded range as raw batches (``copier``); copies that survive restarts exactly once or at least once
(``checkpointed``, the lane session ``lane_session`` with its fence ``lane_fence``, its landing rule
``resume_landing`` and its ``checkpoint_committer``); several partitions at once (``concurrent_copy``); a backfill's
lanes (``backfill``); where a failed copy stopped (``copy_stopped``).
"""
