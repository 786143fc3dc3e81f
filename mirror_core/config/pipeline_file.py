"""The daemon's pipeline file (YAML), validated at the edge: unknown keys are refused by name.

    pipeline: orders-dr
    source: {bootstrap.servers: "src:9092", ...}      # librdkafka settings, or a path to a settings file
    target: {bootstrap.servers: "dr:9092", ...}
    include: "orders\\..*,payments"                     # regex; a comma also means "or"
    exclude: null
    naming: identity                                   # identity | prefix:dr. | map:src=dst,...
    mode: exactly-once                                 # or at-least-once
    commit_interval_ms: 1000
    commit_bytes: 4194304
    transaction_timeout_ms: 60000                      # a lane transaction's timeout (the coordinator aborts later)
    write_retry_s: 25                                  # a failing write retries this long, then the lane reopens;
                                                       # commit_interval_ms + write_retry_s <= transaction timeout / 2
    poll_interval_ms: 200                              # how often an idle lane looks for new data
    rescan_interval_s: 10                              # topic regex re-evaluated this often
    config_sync_interval_s: 60                         # topic configs that matter synced to the target this often
    retention_interval_s: 60                           # retention margin of the held partitions assessed this often
    membership: group                                  # the only value: a consumer group on the source assigns
                                                       # lanes (mirror_core/daemon/membership.py); the old
                                                       # `leases` mode was removed (an error names the upgrade)
    group_protocol: auto                               # auto | consumer (KIP-848, Kafka 4) | classic (older)
    group_session_timeout_ms: null                     # a dead daemon's lanes move after this; null: the
                                                       # broker's default (KIP-848: set as a group config,
                                                       # within the broker's group.consumer.min/max bounds)
    revoke_timeout_s: 30                               # a revocation waits this long for the lane's last commit
    lease_compat: auto                                 # lease records for the lanes this daemon holds, so a
                                                       # lease-based daemon of an older release keeps off them:
                                                       # auto = only while one is seen (a live lease or member
                                                       # heartbeat of it in the checkpoint topic); always; off.
                                                       # Live leases of old daemons are honoured in every mode
                                                       # (docs/daemon-membership.md, "Upgrading")
    lease_ttl_s: 15
    metrics_port: 9308                                 # 0: no HTTP endpoint
    metrics_host: 127.0.0.1                            # 0.0.0.0 in a container, so probes and Prometheus reach it
    new_partitions: earliest                           # where a partition without checkpoint starts: earliest,
                                                       # or latest (its last stable offset when first seen)
    fetch_max_bytes: 16777216                          # per Fetch request (one per source broker per round)
    partition_fetch_max_bytes: 4194304                 # per partition in that request
    link_mbps: null                                    # the source link's rate (MB/s): the daemon measures each
                                                       # source broker's round trip at start and sizes a round to
                                                       # keep that link ~90 % busy (never below the two sizes
                                                       # above, a request at most 64 MiB); null: the sizes above
    coalesce_bytes: 0                                  # > 0 (1024..1048576): runs of small batches (one record
                                                       # each, say) merged into batches of up to this size, a
                                                       # counted deep case (mirror_core/codec/batch_coalesce.py);
                                                       # 0: shallow only
    shutdown_grace_s: 20                               # SIGTERM: finish the round within this, else just stop
    commit_workers: 8                                  # lanes opened and committed side by side (1: in turn)
    stall_after_s: 300                                 # a lane failing (retriable) this long is `stalled`: /readyz 503
    open_transaction_alert_s: 900                      # a lane caught up to a source last stable offset that has not
                                                       # moved for this long (a transaction open there, high
                                                       # watermark past it) is `stalled` too; 900 s is the brokers'
                                                       # default transaction.max.timeout.ms, past which a
                                                       # transaction is hanging, not slow
    prune_interval_s: 300                              # offset maps pruned below groups and log start this often
    checkpoint_topic: __shoal_checkpoints              # on the target; one per Shoal installation, usually
    retention:                                         # the retention verdict (mirror_core/model/retention_policy.py),
      at_risk_below: 1h                                #   shared by the daemon, `shoal deadlines --config`, the
      link_mb_s: 100                                   #   Airflow checks and the Shoal page; every key optional
      fetch_bytes: 4194304
      throughput_mb_s: null                            #   measured per-stream copy rate; null: estimate from RTT
      ingest_sample_s: 0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.config.coalescing import checked_coalesce_bytes
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.errors import ConfigError
from mirror_core.model.retention_policy import RetentionPolicy

LEASE_COMPAT_MODES = ("auto", "always", "off")


@dataclass(frozen=True)
class PipelineConfig:
    pipeline: str
    source: ClusterConfig
    target: ClusterConfig
    include: str
    exclude: str | None = None
    naming: str = "identity"
    mode: str = "exactly-once"
    commit_interval_ms: int = 1000
    commit_bytes: int = 4 * 1024 * 1024
    transaction_timeout_ms: int = 60_000
    write_retry_s: float = 25.0
    poll_interval_ms: int = 200
    rescan_interval_s: float = 10.0
    config_sync_interval_s: float = 60.0
    retention_interval_s: float = 60.0
    membership: str = "group"
    group_protocol: str = "auto"
    group_session_timeout_ms: int | None = None
    revoke_timeout_s: float = 30.0
    lease_compat: str = "auto"
    lease_ttl_s: float = 15.0
    metrics_port: int = 9308
    metrics_host: str = "127.0.0.1"
    new_partitions: str = "earliest"
    fetch_max_bytes: int = 16 * 1024 * 1024
    partition_fetch_max_bytes: int = 4 * 1024 * 1024
    link_mbps: float | None = None
    coalesce_bytes: int = 0
    shutdown_grace_s: float = 20.0
    commit_workers: int = 8
    stall_after_s: float = 300.0
    open_transaction_alert_s: float = 900.0
    prune_interval_s: float = 300.0
    checkpoint_topic: str = CHECKPOINT_TOPIC
    retention: RetentionPolicy = RetentionPolicy()

    def __post_init__(self) -> None:
        if self.mode not in ("exactly-once", "at-least-once"):
            raise ConfigError(f"pipeline {self.pipeline!r}: mode {self.mode!r} is not exactly-once or at-least-once")
        if self.membership != "group":
            raise ConfigError(f"pipeline {self.pipeline!r}: membership {self.membership!r} is not group (the only "
                              "membership since the lease-based mode was removed)")
        if self.lease_compat not in LEASE_COMPAT_MODES:
            raise ConfigError(f"pipeline {self.pipeline!r}: lease_compat {self.lease_compat!r} is not one of "
                              f"{', '.join(LEASE_COMPAT_MODES)}")
        if self.group_protocol not in ("auto", "consumer", "classic"):
            raise ConfigError(f"pipeline {self.pipeline!r}: group_protocol {self.group_protocol!r} is not auto, "
                              "consumer or classic")
        if self.group_session_timeout_ms is not None and self.group_session_timeout_ms <= 0:
            raise ConfigError(f"pipeline {self.pipeline!r}: group_session_timeout_ms must be positive")
        if not 0 < self.revoke_timeout_s <= 120:
            raise ConfigError(f"pipeline {self.pipeline!r}: revoke_timeout_s must be in (0, 120] (a revocation "
                              "must end well within the group's rebalance timeout of 300 s)")
        if self.new_partitions not in ("earliest", "latest"):
            raise ConfigError(f"pipeline {self.pipeline!r}: new_partitions must be earliest or latest")
        for name in ("commit_interval_ms", "commit_bytes", "poll_interval_ms", "rescan_interval_s", "lease_ttl_s",
                     "fetch_max_bytes", "partition_fetch_max_bytes", "shutdown_grace_s", "config_sync_interval_s",
                     "retention_interval_s", "stall_after_s", "open_transaction_alert_s", "prune_interval_s",
                     "commit_workers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"pipeline {self.pipeline!r}: {name} must be positive")
        if self.link_mbps is not None and not (isinstance(self.link_mbps, int | float) and self.link_mbps > 0):
            raise ConfigError(f"pipeline {self.pipeline!r}: link_mbps must be a positive number of MB/s (or null)")
        checked_coalesce_bytes(self.coalesce_bytes, f"pipeline {self.pipeline!r}: coalesce_bytes")
        if not self.metrics_host or any(c in self.metrics_host for c in " /"):
            raise ConfigError(f"pipeline {self.pipeline!r}: metrics_host {self.metrics_host!r} is not an address")
        if not self.checkpoint_topic or any(c in self.checkpoint_topic for c in " /\\"):
            raise ConfigError(f"pipeline {self.pipeline!r}: checkpoint_topic {self.checkpoint_topic!r} is not a "
                              "topic name")
        from mirror_core.config.commit_policy import CommitPolicy

        try:
            CommitPolicy(self.commit_bytes, self.commit_interval_ms, self.transaction_timeout_ms, self.write_retry_s)
        except ConfigError as exc:
            raise ConfigError(f"pipeline {self.pipeline!r}: {exc}") from None


def load_pipeline_config(path: Path) -> PipelineConfig:
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"pipeline file {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"pipeline file {path}: expected a mapping")
    return pipeline_config_from_mapping(raw, base=Path(path).parent, where=f"pipeline file {path}")


def pipeline_config_from_mapping(raw: Mapping, *, base: Path = Path("."), where: str = "pipeline file"
                                 ) -> PipelineConfig:
    _refuse_removed_settings(raw, where)
    known = {f.name for f in fields(PipelineConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"pipeline file: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    missing = [k for k in ("pipeline", "source", "target", "include") if k not in raw]
    if missing:
        raise ConfigError(f"pipeline file: missing {', '.join(missing)}")
    values = dict(raw)
    for role in ("source", "target"):
        values[role] = _cluster(role, raw[role], base)
    if isinstance(raw.get("lease_compat"), bool):  # YAML reads `off` as false; true/false of earlier releases
        values["lease_compat"] = "always" if raw["lease_compat"] else "off"  # kept their meaning
    values["retention"] = RetentionPolicy.from_mapping(raw.get("retention"), where="pipeline file: retention")
    return PipelineConfig(**values)


def _refuse_removed_settings(raw: Mapping, where: str) -> None:
    """Settings of earlier releases that no longer exist, refused with what to do instead."""
    if raw.get("membership") == "leases":
        raise ConfigError(
            f"{where}: pipeline {raw.get('pipeline')!r} says `membership: leases`, the lease-based mode, which was "
            "removed: daemons now share lanes through a consumer group on the source. To upgrade, delete the "
            "`membership` line (or write `membership: group`) and start the new daemon next to the old ones; it "
            "reads their lease records and keeps off every lane an old daemon still holds until that process "
            "stops (docs/daemon-membership.md, \"Upgrading from the lease-based daemon\")")


def _cluster(role: str, spec, base: Path) -> ClusterConfig:
    import yaml

    if isinstance(spec, str):
        path = (base / spec) if not Path(spec).is_absolute() else Path(spec)
        try:
            settings = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"pipeline file: {role} settings file {path}: {exc}") from None
        return ClusterConfig(role, {str(k): str(v) for k, v in settings.items()})
    if isinstance(spec, Mapping):
        return ClusterConfig(role, {str(k): str(v) for k, v in spec.items()})
    raise ConfigError(f"pipeline file: {role} must be a mapping of settings or a settings file path")
