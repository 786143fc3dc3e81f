"""Layer 6 — engine: the copy path and the mirror contract (DESIGN §3).

Copy a bounded range as raw batches (``copier``), with checkpoints that survive restarts exactly once or at least
once (``checkpointed``), several partitions at once (``concurrent_copy``), a backfill's lanes (``backfill``), where a
failed copy stopped (``copy_stopped``), and the handoff from a backfill to the daemon with the proof the seam is
clean (``handoff``).
"""
