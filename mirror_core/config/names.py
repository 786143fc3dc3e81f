"""The names Shoal gives things on the clusters, in one place: every component derives them the same way, which is
what makes a backfill task, ``shoal copy``, a handoff and the daemon fence each other.

- ``CHECKPOINT_TOPIC``: the target topic holding checkpoints, lane states, health records (and the lease records of
  the older lease-based daemon).
- :func:`default_lane`: a target partition's lane when lanes hold one partition (the default).
- :func:`lane_transactional_id`: the transactional.id a lane writes with, whoever copies it: a second writer of the
  same lane fences the first at the broker.
- ``DAEMON_OWNER``: the owner name of every daemon worker's checkpoints; :func:`new_worker_id` one daemon process.
- :func:`daemon_group_id`: the consumer group the pipeline's daemons share (on the source cluster).

Changing any of these strands what older releases wrote: they are part of the stored format.
"""

from __future__ import annotations

import uuid

CHECKPOINT_TOPIC = "__shoal_checkpoints"
DAEMON_OWNER = "daemon"


def lane_transactional_id(pipeline: str, lane: int | str) -> str:
    return f"shoal.{pipeline}.{lane}"


def default_lane(target_topic: str, target_partition: int) -> str:
    """The lane of a target partition when lanes hold one partition (the default): the same name the planner,
    a backfill task, ``shoal copy``, a handoff and the daemon all derive, so they fence each other."""
    return f"{target_topic}-{target_partition}"


def new_worker_id() -> str:
    return f"daemon-{uuid.uuid4().hex[:8]}"


def daemon_group_id(pipeline: str) -> str:
    """The consumer group of a pipeline's daemons (on the source cluster)."""
    return f"shoal.{pipeline}.daemons"
