"""ShoalKafkaHook, the clusters file, the error mapping and the lag trigger's serialization (no brokers)."""

from __future__ import annotations

import json
import stat

import pytest

from mirror_core.errors import ConfigError, DataLossError, PartitionUnavailableError

SECURE = {"bootstrap.servers": "localhost:19094", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
          "sasl.username": "shoal", "sasl.password": "s3cr3t-Pa55w0rd-xyz", "ssl.ca.location": "/tmp/ca.pem"}


def set_conn(monkeypatch, conn_id: str, body: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def test_hook_turns_a_kafka_connection_into_a_masked_cluster(monkeypatch):
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    from shoal_airflow.hooks import ShoalKafkaHook

    set_conn(monkeypatch, "hook_secure", {"conn_type": "kafka", "extra": {**SECURE, "group.id": "ignored"}})
    cluster = ShoalKafkaHook("hook_secure").get_cluster()
    assert cluster.name == "hook_secure"
    assert cluster.settings["sasl.username"] == "shoal" and "group.id" not in cluster.settings
    assert SECURE["sasl.password"] not in repr(cluster)
    assert SECURE["sasl.password"] not in str(redact(f"pw={SECURE['sasl.password']}"))


@pytest.mark.parametrize(("body", "message"), [
    ({"conn_type": "kafka", "extra": {"bootstrap.servers": "h:1", "bootstrap.server": "typo"}}, "bootstrap.server"),
    ({"conn_type": "kafka", "extra": {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                      "sasl.mechanism": "PLAIN", "sasl.username": "u"}}, "sasl.password"),
    ({"conn_type": "kafka", "extra": {}}, "no extras"),
    ({"conn_type": "postgres", "host": "db", "extra": {"bootstrap.servers": "h:1"}}, "postgres"),
])
def test_hook_refuses_invalid_connections_by_name(monkeypatch, body, message):
    from shoal_airflow.hooks import ShoalKafkaHook

    set_conn(monkeypatch, "hook_bad", body)
    with pytest.raises(ConfigError, match=message):
        ShoalKafkaHook("hook_bad").get_cluster()


def test_clusters_file_is_private_and_holds_every_cluster(tmp_path, monkeypatch):
    from shoal_airflow.hooks import clusters_of, write_clusters_file

    set_conn(monkeypatch, "hook_a", {"conn_type": "kafka", "extra": SECURE})
    set_conn(monkeypatch, "hook_b", {"conn_type": "kafka", "extra": {"bootstrap.servers": "b:9092"}})
    path = write_clusters_file(clusters_of(["hook_a", "hook_b"]), tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    body = json.loads(path.read_text())
    assert body["hook_a"]["sasl.password"] == SECURE["sasl.password"]
    assert body["hook_b"] == {"bootstrap.servers": "b:9092"}


def test_mirror_errors_map_to_airflow_retry_semantics():
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from shoal_airflow.errors import airflow_errors

    with pytest.raises(AirflowFailException, match="data loss"), airflow_errors():
        raise DataLossError("src", "t", 0, 5, 10)
    with pytest.raises(AirflowFailException, match="bad"), airflow_errors():
        raise ConfigError("bad")
    with pytest.raises(AirflowException) as info, airflow_errors():
        raise PartitionUnavailableError("src", "t", 0, "no leader")
    assert not isinstance(info.value, AirflowFailException)


def test_lag_trigger_serializes_ids_and_numbers_only():
    from shoal_airflow.triggers import ShoalLagTrigger

    trigger = ShoalLagTrigger(source_conn_id="s", target_conn_id="t", pipeline="p", include="a.*", max_lag=3)
    path, kwargs = trigger.serialize()
    assert path == "shoal_airflow.triggers.ShoalLagTrigger"
    assert set(kwargs) == {"source_conn_id", "target_conn_id", "pipeline", "include", "exclude", "max_lag",
                           "poll_interval_s", "timeout_s"}
    assert all(isinstance(v, (str, int, float, type(None))) for v in kwargs.values())
    assert ShoalLagTrigger(**kwargs).serialize() == (path, kwargs)


def test_spark_operator_ships_code_as_a_zip_for_remote_masters(tmp_path):
    import zipfile

    from shoal_airflow.operators import ShoalSparkBackfillOperator

    op = ShoalSparkBackfillOperator(task_id="b", source_conn_id="s", target_conn_id="t", plan_path="p.json",
                                    ledger_dir=str(tmp_path))
    assert op.application.endswith("spark_apps/backfill_job.py")
    assert op.conf["spark.speculation"] == "false"
    names = zipfile.ZipFile(op._code_zip(tmp_path)).namelist()
    assert "mirror_core/__init__.py" in names and "spark_apps/backfill_job.py" in names
