"""One retention verdict: the same partition assessed by ``shoal deadlines``, the retention sensor (the guard's
path) and the Shoal page's code path gets the same status and margin, and a LOST partition names what deleted its
data. Real brokers; before the shared policy the sensor said SAFE (600 s threshold, 50 MB/s) where the CLI and the
page said AT_RISK (1 h)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.integration.services.test_retention_deadlines import _deadlines

pytestmark = pytest.mark.timeout(120)


def _cli(sandbox, *argv: str) -> list[dict]:
    code, out = _deadlines(sandbox, *argv, "--json")
    assert code == 0, out
    return json.loads(out)["partitions"]


def test_cli_sensor_and_page_agree_on_status_and_margin(airflow_connections, sandbox, source_cluster, unique_name):
    from shoal_airflow.sensors import ShoalRetentionDeadlineSensor
    from shoal_airflow.shoal_ui import PipelineSpec, collect_pipeline

    topic = unique_name("verdict")
    source_cluster.create_topic(topic, partitions=1, config={"retention.ms": str(30 * 60_000)})  # 30 min
    source_cluster.produce(topic, [(b"k", b"v" * 100, [])] * 20)
    sensor = ShoalRetentionDeadlineSensor(task_id="deadline", source_conn_id="shoal_source",
                                          target_conn_id="shoal_target", pipeline=unique_name("none"),
                                          include=re.escape(topic))
    started = time.monotonic()
    [by_cli] = _cli(sandbox, "--source", "source", "--target", "target", "--topic", topic)
    [by_sensor] = sensor.assess()
    view = collect_pipeline(PipelineSpec(unique_name("none"), "shoal_source", "shoal_target", (topic,)))
    assert view.error is None, view.error
    [by_page] = view.retention
    elapsed = time.monotonic() - started

    assert by_cli["status"] == by_sensor.status.value == by_page["status"] == "AT_RISK"
    assert sensor.poke({}) is False                     # the guard's path waits / alarms as the page shows
    margins = [by_cli["margin_s"], by_sensor.margin_s, by_page["margin_s"]]
    assert min(margins) > 1700 and max(margins) - min(margins) <= elapsed + 2, margins   # same verdict, a moment apart
    assert by_cli["loss_cause"] == by_sensor.loss_cause.value == by_page["loss_cause"] == "retention.ms"


def test_a_lost_partition_names_delete_records_or_a_truncated_log(sandbox, source_cluster, unique_name, tmp_path):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = unique_name("lost")
    source_cluster.create_topic(topic, partitions=1, config={"retention.ms": "3600000"})
    source_cluster.produce(topic, [(b"k", b"v", [])] * 50)       # one producer batch
    admin = AdminClient(source_cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(timeout=30)
    positions = tmp_path / "positions.json"
    positions.write_text(json.dumps({topic: {"0": 5}}))
    [deleted] = _cli(sandbox, "--source", "source", "--positions", str(positions))
    assert deleted["status"] == "LOST" and deleted["lost_range"] == [5, 20]
    assert deleted["loss_cause"] == "DeleteRecords", deleted       # not retention.ms: the log start is mid-batch
    positions.write_text(json.dumps({topic: {"0": 70}}))
    [truncated] = _cli(sandbox, "--source", "source", "--positions", str(positions))
    assert truncated["status"] == "LOST" and truncated["loss_cause"] == "truncated log", truncated
    assert truncated["lost_range"] == [50, 70]
