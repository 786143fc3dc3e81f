"""Rescans: the topics the pipeline selects, found on the source, their targets prepared and their configs synced.

Every ``rescan_interval_s``: new topics and partitions get their lanes (their target topics created or grown by the
preflight of a copy first), and every ``config_sync_interval_s`` the known topics' configs are synced on the
config-sync watch's thread (:mod:`mirror_core.daemon.config_sync`). A rescan that finds nothing new costs per topic
of the source, not per lane; a failed rescan is logged and retried on the next round, never the end of the process.
"""

from __future__ import annotations

import itertools
import logging
import time

import kafka.errors as Errors

from mirror_core.config.names import default_lane
from mirror_core.daemon.events import event
from mirror_core.daemon.lane_state import LaneState
from mirror_core.errors import MirrorError
from mirror_core.model.preflight_rules import is_internal_topic
from mirror_core.services.preflight import run_preflight

PREFLIGHT_WORKERS = 4  # target preparations (preflights) of new topics run this many at a time


class Rescans:
    """Part of :class:`~mirror_core.daemon.loop.ShallowMirrorDaemon` (its state is declared there): lanes
    discovered, targets prepared, the group's subscription kept to the selected topics."""

    def _rescan(self) -> None:
        """New topics and partitions get their lanes (their targets prepared first); every
        ``config_sync_interval_s`` the known topics' configs are synced. The source's Metadata is decoded only down
        to partition counts (:mod:`mirror_core.kafka.topic_counts`) and the lanes known per topic are kept between
        rescans (:meth:`_lanes_per_topic`): a rescan that finds nothing new costs per topic of the source, not per
        lane."""
        import kafka.errors as errors

        from mirror_core.kafka.topic_counts import topic_answers

        answer = topic_answers(self.source)
        topics = answer.counts
        now = time.monotonic()
        sync_configs = now >= self._next_config_sync
        if sync_configs:
            self._next_config_sync = now + self.config.config_sync_interval_s
        known = self._lanes_per_topic()
        unprepared = []  # (topic, target topic, partitions) whose target is prepared (preflight) now
        in_step = []  # (topic, target topic) with every partition's lane: their configs are synced when due
        for topic, partitions in sorted(topics.items()):
            if not self._selected(topic):
                continue
            target_topic = self.naming.target_for(topic)
            have = known.get(topic, frozenset())
            # in step when partitions 0..n-1 all have lanes: a count alone is fooled by lanes of partitions past n
            # (adopted from a deleted incarnation's halted checkpoints, or a re-creation with fewer partitions)
            if len(have) >= partitions and have.issuperset(range(partitions)):
                in_step.append((topic, target_topic))
                continue
            unprepared.append((topic, target_topic, partitions))
        if sync_configs:
            self._sync_configs(in_step)
        prepared, unexpected = self._prepare_targets(unprepared)
        discovered = []
        for topic, target_topic, partitions in prepared:
            for p in range(partitions):
                lane = default_lane(target_topic, p)
                if lane not in self.lanes:
                    self.lanes[lane] = state = LaneState(topic, p, target_topic, lane, health=self._new_health())
                    discovered.append(state)
                    event("lane_discovered", topic=topic, partition=p, lane=lane)
        if discovered and self.config.new_partitions == "latest":
            self._fix_latest_starts(discovered)
        if self.membership is not None:  # the names Shoal's selection chose, never a broker-side regex
            # a topic answered with an error other than "unknown" (leader not available on an older broker, not
            # authorized for a moment, being created) is not gone: unsubscribing it would revoke its partitions
            unknown = errors.UnknownTopicOrPartitionError.errno
            listed = topics.keys() | {t for t, code in answer.errors.items() if code != unknown}
            self._group_topics = sorted(topic for topic in self._lanes_per_topic() if topic in listed)
            self.membership.subscribe(self._group_topics)
        if unexpected is not None:  # the rescan fails (logged, retried) after the topics that passed got lanes
            raise unexpected

    def _lanes_per_topic(self) -> dict[str, set[int]]:
        """Source topic → the partitions it has lanes for (held or not). Lanes are only ever added to
        ``self.lanes`` (a dict keeps its insertion order), so the answer is kept and extended by the lanes added
        since it was made — the walk of every lane happens once, not once per rescan."""
        book, seen = self._topic_lanes
        lanes = self.lanes
        if seen != len(lanes):
            for state in itertools.islice(lanes.values(), seen, None):
                book.setdefault(state.topic, set()).add(state.partition)
            self._topic_lanes = (book, len(lanes))
        return book

    def _fix_latest_starts(self, states: list[LaneState]) -> None:
        """``new_partitions: latest``: a partition without checkpoint starts at its last stable offset *at first
        sight* — fixed here, when its lane is discovered, not when the lane first opens, which may be much later (the
        target down, the group slow to assign, a fence refused, an older daemon's lease) and would skip, recorded
        nowhere, what the partition received in between. A lane with a checkpoint resumes there and never uses it;
        the start is stored as the lane's first checkpoint at its open (:meth:`_open`). One ListOffsets per source
        leader; if it fails, the start is fixed at the open, as before, and the event says so."""
        from mirror_core.kafka.list_offsets import lookup_offsets

        try:
            found = lookup_offsets(self.source, [(s.topic, s.partition) for s in states], "last_stable")
        except (MirrorError, Errors.KafkaError, OSError) as exc:  # the open fixes it then, as before
            event("start_lookup_failed", logging.WARNING, lanes=len(states), first=states[0].lane,
                  error=f"{type(exc).__name__}: {exc}", note="new_partitions latest: the start is fixed at the open")
            return
        for state in states:
            if state.start is None:
                state.start = found.get((state.topic, state.partition))

    def _sync_configs(self, pairs: list[tuple[str, str]]) -> None:
        """Bring each target topic's mirrored configs (retention, cleanup policy, compaction, size and timestamp
        bounds: :mod:`mirror_core.kafka.topic_config_sync`) in step with its source topic's — all of ``pairs``
        (topic, target topic), on the config-sync watch's thread (:mod:`mirror_core.daemon.config_sync`): the
        rounds never wait for it. A topic's failure is logged and counted, naming it; the next sync tries again."""
        self.config_sync.submit(pairs)

    def _selected(self, topic: str) -> bool:
        if is_internal_topic(topic) and topic not in self.include.named:
            return False
        return self.include.matches(topic) and not (self.exclude and self.exclude.matches(topic))

    def _prepare_targets(self, unprepared: list[tuple[str, str, int]]
                         ) -> tuple[list[tuple[str, str, int]], BaseException | None]:
        """Prepare the target of every topic in ``unprepared`` (:meth:`_prepare_target`); returns those whose
        preflight passed, in the given order, and the first unexpected error (not a refusal), if any. The
        target's topics are listed once for all of them, and the preflights (several admin round trips each,
        mostly waiting) run ``PREFLIGHT_WORKERS`` at a time: a daemon starting on 40 topics paid 40 target topic
        lists and 40 preflights one after the other. They share one source admin client (thread-safe): each
        preflight made its own before, one more connection set-up (TCP, TLS, SASL) to the far source per topic.
        Each topic keeps its own checks and its own ``preflight_refused`` event naming it."""
        if not unprepared:
            return [], None
        from concurrent.futures import ThreadPoolExecutor

        from mirror_core.kafka.admin import ClusterAdmin
        from mirror_core.kafka.topics import TopicAdmin

        admin = TopicAdmin(self.config.target)
        existing = admin.list_topics()
        source_admin = ClusterAdmin(self.config.source)
        with ThreadPoolExecutor(max_workers=min(PREFLIGHT_WORKERS, len(unprepared)),
                                thread_name_prefix="shoal-preflight") as pool:
            futures = [pool.submit(self._prepare_target, topic, target_topic, partitions,
                                   existing.get(target_topic), admin, source_admin)
                       for topic, target_topic, partitions in unprepared]
        passed, unexpected = [], None
        for (topic, target_topic, partitions), future in zip(unprepared, futures, strict=True):
            exc = future.exception()
            if exc is None:
                passed.append((topic, target_topic, partitions))
            elif isinstance(exc, MirrorError):
                self.metrics.errors.labels("preflight").inc()
                event("preflight_refused", logging.ERROR, topic=topic, target_topic=target_topic, error=exc)
            else:  # each named here: the rescan's own failure event carries only the first one
                event("preflight_failed", logging.WARNING, topic=topic, target_topic=target_topic,
                      error=f"{type(exc).__name__}: {exc}", note="no lanes for this topic yet; retried next rescan")
                unexpected = exc if unexpected is None else unexpected
        return passed, unexpected

    def _prepare_target(self, topic: str, target_topic: str, partitions: int, existing: int | None,
                        admin, source_admin=None) -> None:
        """Add partitions the source gained to the target topic (``existing``: its partition count as listed by
        the caller, None: missing), then the preflight of a copy, which creates a missing target topic
        (``source_admin``: the source's admin client to describe and observe the topic through)."""
        if existing is not None and existing < partitions:
            admin.add_partitions(target_topic, partitions)
            event("partitions_added", target_topic=target_topic, partitions=partitions, were=existing)
        report = run_preflight(self.config.source, self.config.target, topic, target_topic=target_topic,
                               coalesce_bytes=self.config.coalesce_bytes, source_admin=source_admin)
        report.raise_if_refused()
        if report.created:
            event("target_created", topic=topic, target_topic=target_topic, partitions=partitions)
