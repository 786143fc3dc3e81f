"""The checkpoint topic itself (``__shoal_checkpoints`` on the target): its settings, explicit so a cluster's
defaults cannot change what the checkpoints rely on (compaction keeps the last value per key; nothing deletes by
retention; records up to :data:`LARGEST_RECORD_BYTES` are accepted), the check of an existing topic whose settings
would break it, and creating it (:func:`ensure_checkpoint_topic`). Its partition count never changes once created: a
key's partition is fixed by its CRC (:func:`mirror_core.state.checkpoint.checkpoint_partition`).
"""

from __future__ import annotations

import time

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError

# The largest batch Shoal writes to the checkpoint topic: a checkpoint with a full open tail (SEGMENT_BYTES of map,
# base64) and its fields, or a sealed segment; what the topic's max.message.bytes must allow at least.
LARGEST_RECORD_BYTES = 12 * 1024
CHECKPOINT_TOPIC_CONFIG = {  # explicit, so a cluster's defaults cannot change what the checkpoints rely on
    "cleanup.policy": "compact",  # last value per key; "delete" would let retention erase the checkpoints
    "max.message.bytes": str(1024 * 1024),
    "min.insync.replicas": "1",  # raised with the replication factor at creation (checkpoint_topic_settings)
    "min.compaction.lag.ms": "0",
    "segment.ms": "3600000",
}


def checkpoint_topic_settings(brokers: int) -> tuple[int, dict[str, str]]:
    """Replication factor and configs for a new checkpoint topic on a cluster of ``brokers`` brokers: it follows
    the cluster (up to 3 replicas, ``min.insync.replicas`` one below that), so a replicated target keeps its
    checkpoints through a broker loss; a single broker gets 1 and 1."""
    replicas = max(1, min(3, brokers))
    return replicas, {**CHECKPOINT_TOPIC_CONFIG, "min.insync.replicas": str(max(1, replicas - 1))}


def checkpoint_topic_problems(configs: dict[str, str], replication_factor: int | None = None) -> list[str]:
    """What in an existing checkpoint topic's settings would break it (empty: nothing), each naming the config,
    its value and why."""
    problems = []
    min_isr = configs.get("min.insync.replicas")
    if replication_factor is not None and min_isr is not None and int(min_isr) > replication_factor:
        problems.append(f"min.insync.replicas={min_isr} is above its replication factor ({replication_factor}): "
                        "every checkpoint write would be refused (NOT_ENOUGH_REPLICAS) for ever; lower it")
    cleanup = configs.get("cleanup.policy", "")
    if "delete" in cleanup.split(",") or "compact" not in cleanup.split(","):
        problems.append(f"cleanup.policy={cleanup} would let retention delete checkpoints (or keep every old "
                        "value): set it to compact")
    max_bytes = configs.get("max.message.bytes")
    if max_bytes is not None and int(max_bytes) < LARGEST_RECORD_BYTES:
        problems.append(f"max.message.bytes={max_bytes} is smaller than Shoal's largest checkpoint record "
                        f"({LARGEST_RECORD_BYTES} bytes): raise it to at least that")
    return problems


def ensure_checkpoint_topic(cluster: ClusterConfig, topic: str, partitions: int, *, catch_up_s: float) -> None:
    """Create the compacted checkpoint topic if it is missing (its partition count then stays fixed), with its
    settings explicit (:data:`CHECKPOINT_TOPIC_CONFIG`); refuse an existing one whose settings would break it
    (:func:`checkpoint_topic_problems`). ``catch_up_s``: how long a topic the cluster said exists may stay missing
    from its metadata."""
    from mirror_core.kafka.topics import TopicAdmin

    admin = TopicAdmin(cluster)
    existing = admin.list_topics().get(topic)
    if existing is None:
        replicas, config = checkpoint_topic_settings(admin.broker_count())
        if admin.create(topic, partitions, config, exist_ok=True, replication_factor=replicas):
            return  # created with our settings (DescribeConfigs may not know it yet: nothing to check)
        # it existed after all: the metadata that answered did not know it yet, or another process created it
        # a moment ago, with settings of its own. Those are checked like any existing topic's.
        existing = _once_known(cluster, topic, lambda: admin.list_topics().get(topic), "its metadata did not list it",
                               catch_up_s)
    if existing != partitions:
        raise MirrorError(f"cluster {cluster.name!r}: checkpoint topic {topic!r} has {existing} "
                          f"partitions, Shoal expects {partitions}; keys would land in the wrong place")
    # asked until known: the broker that answers may not know a topic created a moment ago, and an unknown
    # replication factor would skip the min.insync.replicas check (writes refused for ever)
    replicas = _once_known(cluster, topic, lambda: admin.replication_factor(topic),
                           "no broker asked named its replication factor", catch_up_s)
    problems = checkpoint_topic_problems(admin.configs(topic), replicas)
    if problems:
        raise ConfigError(f"cluster {cluster.name!r}: checkpoint topic {topic!r}: " + "; ".join(problems))


def _once_known(cluster: ClusterConfig, topic: str, ask, missing: str, wait_s: float) -> int:
    """``ask()`` about the checkpoint topic, which the cluster said exists while the broker that answered may not
    know it yet (metadata reaches the brokers one after another): asked again for up to ``wait_s`` while it
    answers None."""
    deadline = time.monotonic() + wait_s
    while (known := ask()) is None:
        if time.monotonic() > deadline:
            raise MirrorError(f"cluster {cluster.name!r}: checkpoint topic {topic!r} exists (creating "
                              f"it was refused, or it was listed) but {missing} within {wait_s:g} s")
        time.sleep(0.2)
    return known
