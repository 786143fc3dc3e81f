"""Preflight rules: can this target topic take a raw-batch copy of that source topic? Pure decisions, no I/O.

Raw batches reach the target byte for byte, so the target topic's configs decide whether the broker accepts them
unchanged (DESIGN.md §4): too small a ``max.message.bytes`` → MESSAGE_TOO_LARGE; timestamps outside
``message.timestamp.before/after.max.ms`` → INVALID_TIMESTAMP; a ``compression.type`` other than the batch codec or
``producer`` → the broker re-compresses; ``LogAppendTime`` → the broker overwrites every timestamp; a
``retention.ms`` shorter than the data's age → the target deletes the copy at once. Partitions map one to one
(source partition p → target partition p), so the target needs at least the source's partition count.

:func:`decide` turns two described topics and :class:`DataFacts` into a :class:`PreflightReport`; when the target
is missing the report carries the configs to create it with. The caller (``mirror_core.services.preflight``) does the
I/O and writes nothing to the target unless the report is ``ok``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from mirror_core.errors import PreflightError

INTERNAL_PREFIX = "__"
SHOAL_INTERNAL_PREFIX = "__shoal"
# Kafka's own state logs: the broker refuses client Produce requests to them, so they are never a valid target.
KAFKA_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
# Copied from the source when the target topic is created (timestamp type excluded: the target is always CreateTime)
# and kept in sync afterwards by ``mirror_core.kafka.topic_config_sync``: one list, so creation and sync agree.
MIRRORED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "compression.type", "max.message.bytes",
                    "delete.retention.ms", "min.compaction.lag.ms", "message.timestamp.before.max.ms",
                    "message.timestamp.after.max.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio")
# Set on a new target to at least what the data needs (plan_target_configs): may exceed the source, never lowered.
WIDENED_CONFIGS = ("max.message.bytes", "message.timestamp.before.max.ms", "message.timestamp.after.max.ms")
UNBOUNDED_MS = 2**63 - 1
# Headroom on top of the oldest record's age: it keeps ageing while the copy runs.
TIMESTAMP_MARGIN_MS = 24 * 3600 * 1000


class Severity(str, Enum):
    REFUSE = "REFUSE"
    WARN = "WARN"
    INFO = "INFO"


@dataclass(frozen=True)
class Finding:
    """One thing preflight noticed; ``message`` names cluster and topic and says what to change, by how much."""

    severity: Severity
    key: str
    source_value: str | None
    target_value: str | None
    message: str


@dataclass(frozen=True)
class TopicState:
    """A topic as described on one cluster: partition count and effective configs (DescribeConfigs values)."""

    cluster: str
    topic: str
    partitions: int
    configs: Mapping[str, str]


@dataclass(frozen=True)
class DataFacts:
    """What will be copied, as far as preflight can tell: timestamps as consumers see them (ms since the epoch,
    ``None`` when unknown or empty) and the largest batch observed (``None``: assume the source's
    ``max.message.bytes``)."""

    now_ms: int
    oldest_timestamp_ms: int | None = None
    newest_timestamp_ms: int | None = None
    max_batch_bytes: int | None = None
    coalesce_bytes: int = 0  # the copy merges small batches into batches of up to this many bytes (0: it does not)

    @property
    def oldest_age_ms(self) -> int | None:
        return None if self.oldest_timestamp_ms is None else max(0, self.now_ms - self.oldest_timestamp_ms)

    @property
    def newest_ahead_ms(self) -> int | None:
        return None if self.newest_timestamp_ms is None else max(0, self.newest_timestamp_ms - self.now_ms)


@dataclass(frozen=True)
class PreflightReport:
    """The verdict for one source topic → target topic copy. ``ok`` means nothing refuses the copy."""

    source_cluster: str
    source_topic: str
    target_cluster: str
    target_topic: str
    findings: tuple[Finding, ...]
    partitions: int = 0
    create_config: Mapping[str, str] | None = None  # set when the target is missing: what it is created with
    created: bool = False

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def refusals(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.REFUSE)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.WARN)

    @property
    def partition_map(self) -> dict[int, int]:
        """Source partition → target partition (identity)."""
        return {p: p for p in range(self.partitions)}

    def raise_if_refused(self) -> None:
        if not self.ok:
            raise PreflightError(self)


def is_internal_topic(name: str) -> bool:
    """Kafka's internal topics and Shoal's own (``__shoal…``): anything starting with ``__``."""
    return name.startswith(INTERNAL_PREFIX)


def target_topic_name(topic: str, prefix: str = "") -> str:
    """The naming policy: the source name, optionally prefixed (``dr.`` + ``orders`` → ``dr.orders``)."""
    return prefix + topic


def decide(source: TopicState | None, target: TopicState | None, facts: DataFacts, *, source_cluster: str,
           source_topic: str, target_cluster: str, target_topic: str, allow_internal: bool = False) -> PreflightReport:
    """All findings for copying ``source`` to ``target`` (``None``: the topic does not exist)."""
    report = PreflightReport(source_cluster, source_topic, target_cluster, target_topic, findings=())
    findings = check_internal(source_cluster, source_topic, target_cluster, target_topic, allow_internal)
    if any(f.severity is Severity.REFUSE for f in findings):  # decided on the names alone, before any I/O
        return dataclasses.replace(report, findings=tuple(findings))
    if source is None:
        findings.append(Finding(Severity.REFUSE, "topic", None, None,
                                f"{_where(source_cluster, source_topic)}: the source topic does not exist; "
                                "check the topic name and the cluster"))
        return dataclasses.replace(report, findings=tuple(findings))
    create_config = None
    if target is None:
        create_config, planned = plan_target_configs(source, facts)
        findings += planned
        target = TopicState(target_cluster, target_topic, source.partitions, create_config)
    findings += evaluate_target(source, target, facts)
    return dataclasses.replace(report, findings=tuple(findings), partitions=source.partitions,
                               create_config=create_config)


def check_internal(source_cluster: str, source_topic: str, target_cluster: str, target_topic: str,
                   allow_internal: bool) -> list[Finding]:
    out = []
    if target_topic in KAFKA_INTERNAL_TOPICS:
        out.append(Finding(Severity.REFUSE, "topic", source_topic, target_topic,
                           f"{_where(target_cluster, target_topic)}: is one of Kafka's own state logs and the broker "
                           "refuses client writes to it; map the copy to another name (e.g. a prefix like 'dr.')"))
    if is_internal_topic(source_topic):
        severity = Severity.INFO if allow_internal else Severity.REFUSE
        action = "copying it because it was named explicitly" if allow_internal else \
            "internal topics are never copied unless named explicitly (allow_internal=True)"
        out.append(Finding(severity, "topic", source_topic, target_topic,
                           f"{_where(source_cluster, source_topic)}: is an internal topic; {action}"))
    return out


def plan_target_configs(source: TopicState, facts: DataFacts) -> tuple[dict[str, str], list[Finding]]:
    """Configs for a new target topic: the source's, always CreateTime, bounds wide enough for the data."""
    config = {k: source.configs[k] for k in MIRRORED_CONFIGS if source.configs.get(k) is not None}
    config["message.timestamp.type"] = "CreateTime"
    notes = []
    if _text(source.configs, "message.timestamp.type") == "LogAppendTime":
        notes.append(Finding(Severity.INFO, "message.timestamp.type", "LogAppendTime", "CreateTime",
                             f"{_where(source.cluster, source.topic)}: is LogAppendTime; the target is created as "
                             "CreateTime and the copy carries the append times consumers see on the source"))
    largest = max(_int(source.configs, "max.message.bytes") or 0, facts.max_batch_bytes or 0, facts.coalesce_bytes)
    if largest:
        config["max.message.bytes"] = str(largest)
    widen = {"message.timestamp.before.max.ms": None if facts.oldest_age_ms is None
             else facts.oldest_age_ms + TIMESTAMP_MARGIN_MS,
             "message.timestamp.after.max.ms": facts.newest_ahead_ms or None}
    for key, needed in widen.items():
        current = _int(config, key)
        if needed is not None and current is not None and current < needed:
            config[key] = str(needed)
            notes.append(Finding(Severity.INFO, key, str(current), str(needed),
                                 f"{_where(source.cluster, source.topic)}: {key} widened from {_ms(current)} to "
                                 f"{_ms(needed)} on the new target so the data to copy is accepted"))
    return config, notes


def evaluate_target(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    return [f for rule in RULES for f in rule(source, target, facts)]


def check_partitions(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    s, t = source.partitions, target.partitions
    where = _where(target.cluster, target.topic)
    if t < s:
        return [Finding(Severity.REFUSE, "partitions", str(s), str(t),
                        f"{where}: has {t} partitions but the source has {s} and partitions map one to one; "
                        f"add {s - t} partition(s) (--partitions {s})")]
    if t > s:
        return [Finding(Severity.INFO, "partitions", str(s), str(t),
                        f"{where}: has {t - s} more partition(s) than the source ({t} vs {s}); they stay empty")]
    return []


def check_max_message_bytes(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    src_limit, t = _int(source.configs, "max.message.bytes"), _int(target.configs, "max.message.bytes")
    needed = facts.max_batch_bytes if facts.max_batch_bytes is not None else src_limit
    basis = "the largest batch observed" if facts.max_batch_bytes is not None else "the source's max.message.bytes"
    if facts.coalesce_bytes > (needed or 0):
        needed, basis = facts.coalesce_bytes, "small batches coalesced up to that size"
    if needed is None or t is None:
        return []
    where = _where(target.cluster, target.topic)
    if t < needed:
        return [Finding(Severity.REFUSE, "max.message.bytes", str(needed), str(t),
                        f"{where}: max.message.bytes is {t} but batches of up to {needed} bytes ({basis}) will be "
                        f"copied and be rejected as too large; raise it by {needed - t} to at least {needed}")]
    if src_limit is not None and t < src_limit:
        return [Finding(Severity.WARN, "max.message.bytes", str(src_limit), str(t),
                        f"{where}: max.message.bytes is {t}, below the source's {src_limit}: later batches up to "
                        f"{src_limit} bytes would be rejected; raise it by {src_limit - t} to {src_limit}")]
    return []


def check_compression(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    s, t = _text(source.configs, "compression.type"), _text(target.configs, "compression.type")
    if t is None or t in ("producer", s):
        return []
    kept = "whatever codec each producer chose" if s in (None, "producer") else f"the source's codec {s}"
    fix = "compression.type=producer" if s in (None, "producer") else f"compression.type={s} (or producer)"
    return [Finding(Severity.WARN, "compression.type", s, t,
                    f"{_where(target.cluster, target.topic)}: compression.type is {t} but the batches keep {kept}, "
                    "so the broker would re-compress them and the copy is no longer byte-identical; "
                    f"set {fix}")]


def check_timestamp_type(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    if _text(target.configs, "message.timestamp.type") != "LogAppendTime":
        return []
    return [Finding(Severity.REFUSE, "message.timestamp.type", _text(source.configs, "message.timestamp.type"),
                    "LogAppendTime",
                    f"{_where(target.cluster, target.topic)}: message.timestamp.type is LogAppendTime, so the broker "
                    "would overwrite every copied timestamp with the time of the copy; set it to CreateTime")]


def check_timestamp_bounds(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    # Evaluated on a LogAppendTime target too: it must become CreateTime, and then the bounds apply.
    out, where = [], _where(target.cluster, target.topic)
    before, age = _int(target.configs, "message.timestamp.before.max.ms"), facts.oldest_age_ms
    if before is not None and age is not None:
        wanted = age + TIMESTAMP_MARGIN_MS
        if before < age:
            out.append(Finding(Severity.REFUSE, "message.timestamp.before.max.ms", str(age), str(before),
                               f"{where}: message.timestamp.before.max.ms is {_ms(before)} but the oldest record to "
                               f"copy is {_ms(age)} old and would be rejected (INVALID_TIMESTAMP); raise it by "
                               f"{_ms(wanted - before)} to at least {wanted}"))
        elif before < wanted:
            out.append(Finding(Severity.WARN, "message.timestamp.before.max.ms", str(age), str(before),
                               f"{where}: message.timestamp.before.max.ms is {_ms(before)} and the oldest record is "
                               f"{_ms(age)} old: a copy running longer than {_ms(before - age)} will be rejected; "
                               f"raise it by {_ms(wanted - before)} to {wanted}"))
    after, ahead = _int(target.configs, "message.timestamp.after.max.ms"), facts.newest_ahead_ms
    if after is not None and ahead is not None and after < ahead:
        out.append(Finding(Severity.REFUSE, "message.timestamp.after.max.ms", str(ahead), str(after),
                           f"{where}: message.timestamp.after.max.ms is {_ms(after)} but the newest record to copy "
                           f"is {_ms(ahead)} in the future and would be rejected (INVALID_TIMESTAMP); raise it by "
                           f"{_ms(ahead - after)} to at least {ahead}"))
    return out


def check_retention(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    retention, age = _int(target.configs, "retention.ms"), facts.oldest_age_ms
    if retention is None or retention < 0 or age is None or age <= retention:
        return []
    if "delete" not in _policy(target.configs):
        return []
    return [Finding(Severity.WARN, "retention.ms", _text(source.configs, "retention.ms"), str(retention),
                    f"{_where(target.cluster, target.topic)}: retention.ms is {_ms(retention)} but the oldest data "
                    f"to copy is {_ms(age)} old, so the target would delete it as soon as it is written; raise "
                    f"retention.ms by {_ms(age - retention)} to more than {age} (or -1) to keep it")]


def check_cleanup_policy(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    s, t = _policy(source.configs), _policy(target.configs)
    if not s or not t or s == t:
        return []
    s_text, t_text = ",".join(sorted(s)), ",".join(sorted(t))
    return [Finding(Severity.WARN, "cleanup.policy", s_text, t_text,
                    f"{_where(target.cluster, target.topic)}: cleanup.policy is {t_text} but the source's is "
                    f"{s_text}, so the target keeps or removes different records than the source; set "
                    f"cleanup.policy={s_text}")]


def check_other_configs(source: TopicState, target: TopicState, facts: DataFacts) -> list[Finding]:
    keys = ("retention.bytes", "delete.retention.ms", "min.compaction.lag.ms")
    return [Finding(Severity.INFO, k, _text(source.configs, k), _text(target.configs, k),
                    f"{_where(target.cluster, target.topic)}: {k} is {_text(target.configs, k)} but the source's "
                    f"is {_text(source.configs, k)}; set {k}={_text(source.configs, k)} to mirror it")
            for k in keys if None not in (_text(source.configs, k), _text(target.configs, k))
            and _text(source.configs, k) != _text(target.configs, k)]


RULES = (check_partitions, check_max_message_bytes, check_compression, check_timestamp_type, check_timestamp_bounds,
         check_retention, check_cleanup_policy, check_other_configs)


def _where(cluster: str, topic: str) -> str:
    return f"cluster {cluster!r} topic {topic!r}"


def _text(configs: Mapping[str, str], key: str) -> str | None:
    value = configs.get(key)
    return None if value is None else str(value)


def _int(configs: Mapping[str, str], key: str) -> int | None:
    value = _text(configs, key)
    return None if value is None or value == "" else int(value)


def _policy(configs: Mapping[str, str]) -> frozenset[str]:
    return frozenset(p.strip() for p in (_text(configs, "cleanup.policy") or "").split(",") if p.strip())


def _ms(value: int) -> str:
    """A duration in ms with a human unit: ``864000000 ms (10.0 d)``."""
    if value >= UNBOUNDED_MS:
        return f"{value} ms (unbounded)"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if abs(value) >= size:
            return f"{value} ms ({value / size:.1f} {unit})"
    return f"{value} ms"


# -- the link to the source (size for the link) ------------------------------------------------------------------

@dataclass(frozen=True)
class SourceLink:
    """What preflight measured of the way to one source broker."""

    broker: int
    send_buffer_bytes: int | None  # the broker's socket.send.buffer.bytes (-1: the OS autotunes it; None: unknown)
    rtt_s: float | None            # a measured round trip (None: unknown)


def connection_cap_bytes_per_s(window_bytes: int, rtt_s: float) -> float:
    """TCP carries at most one window per round trip: the ceiling of one connection (pure)."""
    return window_bytes / rtt_s if rtt_s > 0 else float("inf")


def check_link_buffers(cluster: str, links: list[SourceLink], *, link_bytes_per_s: float | None,
                       client_receive_buffer_bytes: int | None = None) -> list[Finding]:
    """WARN for each source broker whose socket buffers cap one fetch connection below the link's rate.

    A fixed ``socket.send.buffer.bytes`` on the broker (Kafka's default is 102400) or a fixed receive buffer on our
    side (``client_receive_buffer_bytes``; None or -1: autotuned) bounds the bytes in flight on a connection, so
    one connection carries at most window / RTT (the MirrorMaker wiki's advice to raise the source brokers' send
    buffer is the same fact). The message gives the cap, the link rate and the window the link needs
    (bandwidth × RTT)."""
    if not link_bytes_per_s or link_bytes_per_s <= 0:
        return []
    findings = []
    for link in links:
        windows = [(w, what) for w, what in ((link.send_buffer_bytes, "the broker's socket.send.buffer.bytes"),
                                             (client_receive_buffer_bytes, "the client's receive buffer"))
                   if w is not None and w > 0]
        if not windows or link.rtt_s is None or link.rtt_s <= 0:
            continue
        window, what = min(windows)
        cap = connection_cap_bytes_per_s(window, link.rtt_s)
        if cap >= link_bytes_per_s:
            continue
        needed = int(link_bytes_per_s * link.rtt_s)
        findings.append(Finding(
            Severity.WARN, "socket.send.buffer.bytes", str(link.send_buffer_bytes), None,
            f"cluster {cluster!r} broker {link.broker}: {what} is {window} bytes; at a round trip of "
            f"{link.rtt_s * 1000:.0f} ms one connection carries at most {cap / 1e6:.2f} MB/s, below the link's "
            f"{link_bytes_per_s / 1e6:.2f} MB/s ({cap / link_bytes_per_s:.0%}). Raise it to at least {needed} bytes "
            "(bandwidth × round trip), or -1 to let the OS size it"))
    return findings


LINK_ROUND_CAP = 64 * 1024 * 1024  # one daemon fetch request sized for a link: at most this (memory)
# How busy a copy sized for a link keeps it: one round of fetches in flight at a time (the broker answers one
# connection's requests in turn), so a round of D bytes gives B·D / (B·RTT + D); 0.9 needs D = 9·B·RTT. The
# daemon, ``shoal copy`` and the retention ETA of a copy use the same figure. (0.8 — 4·B·RTT — measured 74-78 % of a
# 200 ms, 20 MB/s link: the rounds' own overhead comes on top of the model.)
LINK_EFFICIENCY = 0.9


def round_bytes_for_link(*, link_bytes_per_s: float, rtt_s: float, floor: int,
                         cap: int = LINK_ROUND_CAP) -> int:
    """One fetch request per source broker per round, one round in flight (the daemon): bytes per request so the
    link stays ~90 % busy (pure). TP = B·D / (B·RTT + D) ≥ 0.9·B needs D ≥ 9·B·RTT; never below ``floor`` (the
    configured size) nor above ``cap``: the daemon holds about two rounds (one in flight, one being written)."""
    return fetch_bytes_for_link(link_bytes_per_s=link_bytes_per_s, rtt_s=rtt_s, partitions=1, floor=floor,
                                cap=max(floor, cap), efficiency=LINK_EFFICIENCY)


def fetch_bytes_for_link(*, link_bytes_per_s: float, rtt_s: float, partitions: int, floor: int, cap: int,
                         efficiency: float = 0.8) -> int:
    """Per-partition fetch size so one round of ``partitions`` keeps the link ``efficiency`` busy (pure).

    One round trip per round gives TP = B·D / (B·RTT + D) for D bytes per round at link rate B, so TP ≥ e·B needs
    D ≥ e/(1−e) · B · RTT (4 × bandwidth × RTT for 80 %). Shared by the round's partitions, never below ``floor``
    (the configured size) nor above ``cap`` (memory: a copy holds about two rounds)."""
    if not 0 < efficiency < 1:
        raise ValueError("efficiency must be between 0 and 1")
    needed = efficiency / (1 - efficiency) * link_bytes_per_s * max(rtt_s, 0.0)
    return int(min(cap, max(floor, needed / max(1, partitions))))
