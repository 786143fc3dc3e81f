"""Keep a target topic's configs in step with its source topic while the mirror runs.

Preflight creates a missing target with :func:`~mirror_core.model.preflight_rules.plan_target_configs`: the source's
effective values of ``MIRRORED_CONFIGS``, ``message.timestamp.type=CreateTime``, and bounds wide enough for the data.
This module keeps that same picture true afterwards. :func:`plan_config_sync` (pure, no I/O) computes the target
configs from the source with ``plan_target_configs`` itself, so creation and sync can never disagree, and returns
the :class:`ConfigChange` list that brings the target there; :func:`sync_topic_configs` describes both topics and
applies the list with one IncrementalAlterConfigs request (atomic per topic on the broker).

Which configs, and why (one list, ``preflight_rules.MIRRORED_CONFIGS``, shared with creation):

- **Mirrored exactly** (the source's value, lowering included: it is what the source says):
  ``retention.ms``, ``retention.bytes``, ``cleanup.policy``, ``delete.retention.ms``, ``min.compaction.lag.ms``,
  ``max.compaction.lag.ms``, ``min.cleanable.dirty.ratio`` (they decide which records the target keeps, for how
  long, and how soon the cleaner acts: a mirror should keep what the source keeps, and a "compact within a day"
  promise made on the source must hold on the copy), and ``compression.type`` (creation copies it; a target codec
  other than the batches' or ``producer`` makes the broker re-compress, see DESIGN §4). ``cleanup.policy``
  compares as a set, numbers as numbers (``0.5`` = ``0.50``).
- **Raise only** (``preflight_rules.WIDENED_CONFIGS``): ``max.message.bytes``,
  ``message.timestamp.before.max.ms``, ``message.timestamp.after.max.ms``. Creation sets them to at least what the
  data needs, possibly above the source. Raising them is always safe. Lowering them never is: batches written under
  the source's old limit are still to be copied (MESSAGE_TOO_LARGE), and a record the source accepted at append time
  a is copied at a later time a' ≥ a, so the target needs ``before.max.ms`` ≥ the source's plus the lag
  (INVALID_TIMESTAMP). So the target follows the source up, never down.
- **Pinned by the mirror**: ``message.timestamp.type`` is always ``CreateTime`` on the target (DESIGN §4: a
  LogAppendTime target would overwrite every copied timestamp). The source's value is never synced; a target found
  as LogAppendTime is set back to CreateTime.
- **Not synced**: everything else. Replication and durability settings (``min.insync.replicas``,
  ``unclean.leader.election.enable``, throttled replicas) belong to the target cluster's operators, as in
  MirrorMaker 2; tiered-storage settings need target-side support; ``message.timestamp.difference.max.ms`` is gone
  in Kafka 4. Segment layout (``segment.ms``, ``segment.bytes``, index sizes) is not mirrored at creation, so not
  here either: it only decides how soon retention or the cleaner may act on the newest data, and a target on the
  broker default (7 days) errs towards keeping more, never less; ``segment.bytes`` also has version-dependent bounds
  (Kafka 4.x refuses under 1 MiB). Mirroring ``segment.ms`` would make the target's cleaner rewrite freshly copied
  batches within a second on topics with a tiny ``segment.ms`` (tests/integration/engine/test_copy_compacted.py relies
  on it not doing so); adding it is one entry in ``MIRRORED_CONFIGS`` once that is wanted.

Set or delete: values are compared as the brokers apply them (effective values), so a target created by preflight
(every mirrored config an explicit override holding the source's value) is already in sync. When they differ:

- the source has an explicit override → SET the target to that value;
- the source uses its broker default → DELETE the target's override when the target would then fall back to exactly
  the source's value (the target's broker-level value, read from the DescribeConfigs synonyms), so both topics
  follow their defaults again; otherwise SET the source's effective value. Brokers do not always report the
  fallback (``retention.ms`` hides an hours-based broker default), and deleting blindly could
  briefly give the target a shorter retention than the source, so an unknown fallback means SET.

Effective values are what is compared, so a later change of the source broker's defaults is followed too.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum

from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import TopicConfigSyncError
from mirror_core.kafka.admin import ClusterAdmin
from mirror_core.model.preflight_rules import (
    MIRRORED_CONFIGS,
    WIDENED_CONFIGS,
    DataFacts,
    TopicState,
    plan_target_configs,
)

__all__ = ["ConfigOp", "ConfigChange", "ConfigValue", "TopicConfigs", "TopicConfigSyncError", "SYNCED_CONFIGS",
           "plan_config_sync", "describe_topic_configs", "describe_many_topic_configs", "apply_config_changes",
           "sync_topic_configs", "sync_many_topic_configs"]

# What plan_target_configs sets on a new target that is not the source's value: never synced from the source.
PINNED_CONFIGS: Mapping[str, str] = {"message.timestamp.type": "CreateTime"}
SYNCED_CONFIGS = tuple(MIRRORED_CONFIGS) + tuple(k for k in PINNED_CONFIGS if k not in MIRRORED_CONFIGS)

_DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs source of a per-topic override (ConfigSource.DYNAMIC_TOPIC_CONFIG)


class ConfigOp(str, Enum):
    SET = "SET"
    DELETE = "DELETE"  # remove the topic's override: it returns to its broker's default


@dataclass(frozen=True)
class ConfigChange:
    """One change to the target topic. For DELETE, ``new_value`` is the broker default the topic falls back to."""

    key: str
    old_value: str | None
    new_value: str | None
    op: ConfigOp = ConfigOp.SET

    def __str__(self) -> str:
        old = "(unset)" if self.old_value is None else self.old_value
        if self.op is ConfigOp.DELETE:
            return f"{self.key}: {old} -> {self.new_value} (override removed, broker default)"
        return f"{self.key}: {old} -> {self.new_value}"


@dataclass(frozen=True)
class ConfigValue:
    """One config of one topic as DescribeConfigs reports it.

    ``override``: set on the topic itself. ``fallback``: the value the topic takes when that override is deleted
    (its broker's value), ``None`` when the topic has no override or the broker did not say.
    """

    value: str | None
    override: bool = False
    fallback: str | None = None


@dataclass(frozen=True)
class TopicConfigs:
    """A topic's configs on one cluster, with enough to tell explicit overrides from defaults."""

    cluster: str
    topic: str
    entries: Mapping[str, ConfigValue] = field(default_factory=dict)

    @classmethod
    def of(cls, cluster: str, topic: str, values: Mapping[str, str], *, overrides: Collection[str] = (),
           fallbacks: Mapping[str, str] | None = None) -> TopicConfigs:
        """Build from plain values: ``overrides`` names the explicit ones, ``fallbacks`` their broker defaults."""
        fallbacks = fallbacks or {}
        return cls(cluster, topic, {k: ConfigValue(v, k in overrides, fallbacks.get(k) if k in overrides else None)
                                    for k, v in values.items()})

    @property
    def values(self) -> dict[str, str]:
        """Effective values (what ``preflight.describe_topic`` reports in ``TopicState.configs``)."""
        return {k: e.value for k, e in self.entries.items() if e.value is not None}

    @property
    def overrides(self) -> frozenset[str]:
        return frozenset(k for k, e in self.entries.items() if e.override)


def plan_config_sync(source: TopicConfigs, target: TopicConfigs, *, facts: DataFacts | None = None,
                     exclude: Collection[str] = ()) -> list[ConfigChange]:
    """The changes that make ``target`` carry what preflight would create it with from ``source`` (pure).

    ``facts`` (optional) lets observed data widen the raise-only bounds exactly as at creation (e.g. a batch larger
    than the source's ``max.message.bytes``). ``exclude`` names configs the caller wants left alone.
    """
    desired, _notes = plan_target_configs(TopicState(source.cluster, source.topic, 0, source.values),
                                          facts or DataFacts(now_ms=0))
    changes = []
    for key, wanted in desired.items():
        current = target.entries.get(key)
        if key in exclude or current is None or current.value is None:
            continue  # excluded, or a config the target's broker does not know: nothing we could set
        if key in WIDENED_CONFIGS:
            if _below(current.value, wanted):
                changes.append(ConfigChange(key, current.value, wanted))
            continue
        if _same(key, current.value, wanted):
            continue
        src = source.entries.get(key)
        source_uses_default = key not in PINNED_CONFIGS and src is not None and not src.override
        if source_uses_default and current.override and current.fallback is not None \
                and _same(key, current.fallback, wanted):
            changes.append(ConfigChange(key, current.value, current.fallback, ConfigOp.DELETE))
        else:
            changes.append(ConfigChange(key, current.value, wanted))
    return changes


def describe_topic_configs(cluster: ClusterConfig, topic: str, *, timeout_s: float = 30.0) -> TopicConfigs | None:
    """Every config of ``topic`` with its override flag and fallback; ``None`` when the topic does not exist."""
    found = describe_many_topic_configs(cluster, [topic], timeout_s=timeout_s)[topic]
    if isinstance(found, TopicConfigSyncError):
        raise found
    return found


def describe_many_topic_configs(cluster: ClusterConfig, topics: Collection[str], *, timeout_s: float = 30.0,
                                admin: ClusterAdmin | None = None
                                ) -> dict[str, TopicConfigs | None | TopicConfigSyncError]:
    """:func:`describe_topic_configs` of every topic in ``topics`` through one admin client (``admin``, else one
    made here) and one DescribeConfigs call: per topic its configs, ``None`` (no such topic) or the error naming
    it — one topic's failure is not the others'. Within ``timeout_s`` in all."""
    import time

    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource

    if not topics:
        return {}
    admin = admin or ClusterAdmin(cluster, timeout_s=timeout_s)
    resources = {topic: ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics}
    deadline = time.monotonic() + timeout_s
    out: dict[str, TopicConfigs | None | TopicConfigSyncError] = {}
    try:
        futures = admin.describe_configs(list(resources.values()), request_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - refused before any request: every topic's answer
        return {topic: TopicConfigSyncError(cluster.name, topic, f"DescribeConfigs failed: {_reason(exc)}",
                                            retriable=_retriable(exc)) for topic in resources}
    for topic, resource in resources.items():
        try:
            entries = futures[resource].result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - KafkaException wrapping KafkaError, or a future timeout
            out[topic] = None if _code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART else TopicConfigSyncError(
                cluster.name, topic, f"DescribeConfigs failed: {_reason(exc)}", retriable=_retriable(exc))
            continue
        out[topic] = TopicConfigs(cluster.name, topic, {name: _config_value(entry) for name, entry in entries.items()})
    return out


def apply_config_changes(cluster: ClusterConfig, topic: str, changes: Collection[ConfigChange], *,
                         timeout_s: float = 30.0, admin: ClusterAdmin | None = None) -> None:
    """Apply ``changes`` to ``topic`` in one IncrementalAlterConfigs request (all or nothing), through ``admin``
    (else an admin client made here)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    if not changes:
        return
    ops = {ConfigOp.SET: AlterConfigOpType.SET, ConfigOp.DELETE: AlterConfigOpType.DELETE}
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(c.key, c.new_value if c.op is ConfigOp.SET else None, incremental_operation=ops[c.op])
        for c in changes])
    admin = admin or ClusterAdmin(cluster, timeout_s=timeout_s)
    try:
        admin.incremental_alter_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001
        raise TopicConfigSyncError(cluster.name, topic, f"could not apply {'; '.join(map(str, changes))}: "
                                   f"{_reason(exc)}", retriable=_retriable(exc)) from None


def sync_topic_configs(source: ClusterConfig, target: ClusterConfig, topic: str, target_topic: str, *,
                       facts: DataFacts | None = None, exclude: Collection[str] = (),
                       timeout_s: float = 30.0) -> list[ConfigChange]:
    """Bring ``target``/``target_topic``'s mirrored configs in line with ``source``/``topic``; returns what changed.

    An empty list means the two were already in sync. Raises :class:`TopicConfigSyncError` (naming cluster and
    topic) when either topic is missing or a describe or the alter fails; nothing is changed then.
    """
    source_configs = describe_topic_configs(source, topic, timeout_s=timeout_s)
    _require_topic(source_configs, source, topic)
    target_configs = describe_topic_configs(target, target_topic, timeout_s=timeout_s)
    _require_topic(target_configs, target, target_topic, of=f"{source.name}/{topic}")
    changes = plan_config_sync(source_configs, target_configs, facts=facts, exclude=exclude)
    apply_config_changes(target, target_topic, changes, timeout_s=timeout_s)
    return changes


def _require_topic(found: TopicConfigs | None | TopicConfigSyncError, cluster: ClusterConfig, topic: str, *,
                   of: str | None = None) -> TopicConfigs:
    """A describe's answer for ``topic``, or the error that ends its sync: the describe's own, or a missing topic
    (``of``: the source topic whose target it is)."""
    if isinstance(found, TopicConfigSyncError):
        raise found
    if found is None:
        raise TopicConfigSyncError(cluster.name, topic, "the source topic does not exist" if of is None else
                                   f"the target topic of {of} does not exist; run preflight to create it")
    return found


def sync_many_topic_configs(source: ClusterConfig, target: ClusterConfig, pairs: Collection[tuple[str, str]], *,
                            timeout_s: float = 30.0, guard=None
                            ) -> dict[str, list[ConfigChange] | TopicConfigSyncError]:
    """:func:`sync_topic_configs` for every ``(topic, target_topic)`` of ``pairs`` — one admin client per
    cluster and one DescribeConfigs call per cluster for all of them (a daemon's periodic sync of 40 topics made
    80 admin clients, one after the other, on its main thread); the changes, rare, are applied topic by topic (all
    or nothing per topic, as before). Per source topic: its changes (empty: in sync) or the error naming cluster
    and topic; one topic's failure leaves the others' sync alone.

    ``guard`` (optional): ``guard(target_topic)`` is a context manager held around each topic's plan and apply; it
    yields an object whose ``current`` is False when the topic was synced elsewhere since these describes (its plan
    is stale: skipped, no change) and whose ``changes`` is then set to what was applied."""
    import contextlib

    if not pairs:
        return {}
    sources = describe_many_topic_configs(source, [topic for topic, _ in pairs], timeout_s=timeout_s)
    target_admin = ClusterAdmin(target, timeout_s=timeout_s)
    targets = describe_many_topic_configs(target, [target_topic for _, target_topic in pairs], timeout_s=timeout_s,
                                          admin=target_admin)
    out: dict[str, list[ConfigChange] | TopicConfigSyncError] = {}
    for topic, target_topic in pairs:
        try:  # checked in sync_topic_configs' order
            source_configs = _require_topic(sources[topic], source, topic)
            target_configs = _require_topic(targets[target_topic], target, target_topic, of=f"{source.name}/{topic}")
            with guard(target_topic) if guard else contextlib.nullcontext() as slot:
                changes = plan_config_sync(source_configs, target_configs) if slot is None or slot.current else []
                apply_config_changes(target, target_topic, changes, timeout_s=timeout_s, admin=target_admin)
                if slot is not None:
                    slot.changes = changes
        except TopicConfigSyncError as exc:
            out[topic] = exc
            continue
        out[topic] = changes
    return out


def _config_value(entry) -> ConfigValue:
    override = _source_id(entry.source) == _DYNAMIC_TOPIC_CONFIG
    fallback = None
    if override:
        # Synonyms come highest precedence first: the override itself, then broker-level values (dynamic per broker,
        # dynamic cluster default, static, built-in). The first broker-level one is what deleting the override gives.
        fallback = next((s.value for s in (entry.synonyms or {}).values()
                         if _source_id(s.source) != _DYNAMIC_TOPIC_CONFIG and s.value is not None), None)
    return ConfigValue(entry.value, override, fallback)


def _source_id(source) -> int:
    return int(getattr(source, "value", source))


def _same(key: str, a: str, b: str) -> bool:
    if key == "cleanup.policy":
        return _policy(a) == _policy(b)
    if a == b:
        return True
    for number in (int, float):
        try:
            return number(a) == number(b)
        except ValueError:
            continue
    return False


def _below(current: str, wanted: str) -> bool:
    """``current`` is a smaller bound than ``wanted`` (unparsable values: different counts as below)."""
    try:
        return int(current) < int(wanted)
    except ValueError:
        return current != wanted


def _policy(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def _code(exc: BaseException):
    err = exc.args[0] if exc.args else None
    return getattr(err, "code", lambda: None)()


def _retriable(exc: BaseException) -> bool:
    from confluent_kafka import KafkaError

    if isinstance(exc, (concurrent.futures.TimeoutError, TimeoutError)):
        return True
    err = exc.args[0] if exc.args else None
    if getattr(err, "retriable", lambda: False)():
        return True
    return _code(exc) in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError.REQUEST_TIMED_OUT)


def _reason(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    text = getattr(err, "str", None)
    return text() if callable(text) else (str(exc) or type(exc).__name__)
