"""The one retention verdict's settings (mirror_core.model.retention_policy) and the truthful cause of a LOST
partition."""

from __future__ import annotations

import pytest

from mirror_core.config.pipeline_file import pipeline_config_from_mapping
from mirror_core.errors import ConfigError
from mirror_core.model.retention import LossCause, Status, TopicRetention
from mirror_core.model.retention_policy import RetentionPolicy
from tests.unit.model.test_retention_model import DELETE_1H, MB, assess, snap


def test_defaults_are_one_hour_and_a_100_mb_link():
    policy = RetentionPolicy()
    assert policy.at_risk_below_s == 3600 and policy.link_bytes_per_s == 100e6
    assert policy.capacity(0.002).ceiling_bytes_per_s == 100e6


def test_a_pipeline_file_sets_the_policy_and_refuses_unknown_keys():
    base = {"pipeline": "p", "source": {"bootstrap.servers": "a:1"}, "target": {"bootstrap.servers": "b:1"},
            "include": "t"}
    cfg = pipeline_config_from_mapping({**base, "retention": {"at_risk_below": "15m", "throughput_mb_s": 20}})
    assert cfg.retention.at_risk_below_s == 900 and cfg.retention.throughput_bytes_per_s == 20e6
    assert pipeline_config_from_mapping(base).retention == RetentionPolicy()
    with pytest.raises(ConfigError, match="unknown key.*at_risk_bellow"):
        pipeline_config_from_mapping({**base, "retention": {"at_risk_bellow": "1h"}})
    with pytest.raises(ConfigError, match="at_risk_below 'soon' is not a duration"):
        RetentionPolicy.from_mapping({"at_risk_below": "soon"})


def test_the_throttle_is_part_of_the_eta():
    policy = RetentionPolicy(throughput_bytes_per_s=50 * MB)
    free, throttled = policy.capacity(0.0), policy.capacity(0.0, throttle_bytes_per_s=4 * MB, streams=2)
    assert free.bytes_per_s == 50 * MB
    assert throttled.bytes_per_s == 2 * MB and throttled.ceiling_bytes_per_s == 4 * MB
    assert throttled.with_streams(10) == 4 * MB            # more streams never beat the throttle
    s = snap(size_bytes=10 * MB)
    quick = assess(s, copy=free.bytes_per_s, threshold=3600)
    slow = assess(s, copy=throttled.bytes_per_s, threshold=3600)
    assert quick.eta_s == pytest.approx(0.2) and slow.eta_s == pytest.approx(5.0)
    assert slow.margin_s == pytest.approx(quick.margin_s - 4.8)


@pytest.mark.parametrize("topic, mid_batch, cause", [
    (DELETE_1H, False, LossCause.TIME),
    (TopicRetention(retention_ms=None, retention_bytes=5 * MB), False, LossCause.SIZE),
    (DELETE_1H, True, LossCause.DELETE_RECORDS),                          # retention never cuts a batch
    (TopicRetention(retention_ms=None), False, LossCause.DELETE_RECORDS),  # nothing else deletes here
    (TopicRetention(cleanup_policy=frozenset({"compact"})), False, LossCause.DELETE_RECORDS),
])
def test_a_lost_partition_names_what_deleted_its_data(topic, mid_batch, cause):
    lost = assess(snap(position=100, log_start=400, log_start_mid_batch=mid_batch), topic)
    assert lost.status is Status.LOST and lost.lost_range == (100, 400)
    assert lost.loss_cause is cause
    assert f"deleted by {cause.value}" in lost.remedy.text


def test_a_position_past_the_log_end_is_lost_to_a_truncated_log():
    lost = assess(snap(position=1200, log_start=0, log_end=1000))
    assert lost.status is Status.LOST and lost.loss_cause is LossCause.TRUNCATED
    assert lost.lost_range == (1000, 1200) and "now ends at 1000" in lost.remedy.text
