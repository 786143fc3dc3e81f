"""The daemon's pipeline file is validated at the edge."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirror_core.config.pipeline_file import load_pipeline_config, pipeline_config_from_mapping
from mirror_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
BASE = {"pipeline": "p", "source": {"bootstrap.servers": "a:9092"}, "target": {"bootstrap.servers": "b:9092"},
        "include": "orders.*"}


def test_the_compose_pipeline_file_loads():
    config = load_pipeline_config(ROOT / "docker" / "config" / "pipeline.yaml")
    assert config.pipeline == "compose-orders" and config.source.bootstrap == "kafka-source:9092"
    assert config.mode == "exactly-once"
    assert config.metrics_host == "0.0.0.0", "in a container the metrics must be reachable from outside it"


def test_metrics_bind_to_loopback_unless_configured():
    assert pipeline_config_from_mapping(BASE).metrics_host == "127.0.0.1"
    with pytest.raises(ConfigError, match="metrics_host"):
        pipeline_config_from_mapping({**BASE, "metrics_host": "0.0.0.0/8"})


def test_unknown_keys_are_refused_by_name():
    with pytest.raises(ConfigError, match="commit_intervall_ms"):
        pipeline_config_from_mapping({**BASE, "commit_intervall_ms": 5})


def test_missing_keys_and_bad_values_are_named():
    with pytest.raises(ConfigError, match="include"):
        pipeline_config_from_mapping({k: v for k, v in BASE.items() if k != "include"})
    with pytest.raises(ConfigError, match="mode"):
        pipeline_config_from_mapping({**BASE, "mode": "maybe-once"})
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        pipeline_config_from_mapping({**BASE, "lease_ttl_s": 0})
    for key in ("fetch_max_bytes", "partition_fetch_max_bytes", "shutdown_grace_s", "config_sync_interval_s",
                "retention_interval_s", "commit_workers"):
        with pytest.raises(ConfigError, match=key):
            pipeline_config_from_mapping({**BASE, key: -1})


def test_cluster_settings_may_live_in_their_own_file(tmp_path):
    (tmp_path / "dr.yaml").write_text("bootstrap.servers: dr:9093\nsecurity.protocol: SASL_SSL\n"
                                      "sasl.mechanism: SCRAM-SHA-512\nsasl.username: u\nsasl.password: s3cret\n")
    config = pipeline_config_from_mapping({**BASE, "target": "dr.yaml"}, base=tmp_path)
    assert config.target.settings["sasl.password"] == "s3cret" and "s3cret" not in repr(config)


def test_the_checkpoint_topic_and_prune_interval_are_configurable_and_checked():
    config = pipeline_config_from_mapping({**BASE, "checkpoint_topic": "team-a.checkpoints", "prune_interval_s": 30})
    assert (config.checkpoint_topic, config.prune_interval_s) == ("team-a.checkpoints", 30)
    assert pipeline_config_from_mapping(BASE).checkpoint_topic == "__shoal_checkpoints"
    with pytest.raises(ConfigError, match="checkpoint_topic"):
        pipeline_config_from_mapping({**BASE, "checkpoint_topic": "a b"})
    with pytest.raises(ConfigError, match="prune_interval_s"):
        pipeline_config_from_mapping({**BASE, "prune_interval_s": 0})


def test_write_retries_must_fit_well_inside_the_transaction_timeout():
    config = pipeline_config_from_mapping({**BASE, "transaction_timeout_ms": 4000, "write_retry_s": 1.5,
                                           "commit_interval_ms": 200})
    assert (config.transaction_timeout_ms, config.write_retry_s) == (4000, 1.5)
    with pytest.raises(ConfigError, match="write_retry_s .* transaction_timeout_ms"):
        pipeline_config_from_mapping({**BASE, "transaction_timeout_ms": 60_000, "write_retry_s": 120})
    with pytest.raises(ConfigError, match="transaction_timeout_ms"):
        pipeline_config_from_mapping({**BASE, "transaction_timeout_ms": 0})


def test_coalescing_is_off_unless_the_pipeline_file_sets_a_size_in_range():
    assert pipeline_config_from_mapping(BASE).coalesce_bytes == 0
    assert pipeline_config_from_mapping({**BASE, "coalesce_bytes": 65536}).coalesce_bytes == 65536
    for bad in (512, 2 << 20, "64k", True):
        with pytest.raises(ConfigError, match=r"pipeline 'p': coalesce_bytes must be 0 \(off\) or between 1024"):
            pipeline_config_from_mapping({**BASE, "coalesce_bytes": bad})
