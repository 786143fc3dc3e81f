"""What the edges ask of a cluster directly: does it answer (an Airflow connection's test), and dropping a DR
rehearsal's scratch topics (the guard on which names may go stays with the caller). Through the admin facade
(:mod:`mirror_core.kafka.admin`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mirror_core.config.cluster import ClusterConfig
from mirror_core.kafka.topics import TopicAdmin


def count_topics(cluster: ClusterConfig, *, timeout_s: float = 10.0) -> int:
    """How many topics ``cluster`` lists: it answers, and these credentials may describe it."""
    return len(TopicAdmin(cluster, timeout_s=timeout_s).list_topics())


def drop_topics(cluster: ClusterConfig, topics: Iterable[str]) -> Iterator[str]:
    """Delete each of ``topics`` (one already gone is fine), yielding each name once it is deleted."""
    admin = TopicAdmin(cluster)
    for topic in topics:
        admin.delete(topic, missing_ok=True)
        yield topic
