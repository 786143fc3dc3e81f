"""Hole: data deleted between the retention assessment's two looks at a partition read as SAFE.

An assessment reads a partition's log start (ListOffsets) and then probes the mirror position (a Fetch) for the
timestamps that give the time deadline. When retention (or DeleteRecords) moved the log start past the position in
between, the probe's OFFSET_OUT_OF_RANGE was taken as "no timestamps": no deadline at all, so the verdict was
``SAFE`` with ``time_to_loss_s = inf`` — for a partition whose unmirrored records had just been deleted (seen in the
suite: a paused mirror's verdict went AT_RISK → LOSING → SAFE → LOST as its segment was deleted). The assessment now
reads the log start again and reports what is true: LOST, naming the deleted range.

Real source (the sandbox's): the deletion is a DeleteRecords sent at the one moment that matters, just before the
probe, so the race the broker's retention thread wins now and then is driven every time."""

from __future__ import annotations

import pytest

from mirror_core.kafka import retention_inputs
from mirror_core.model.copy_capacity import CopyCapacity
from mirror_core.model.retention import Status, assess_partitions


@pytest.mark.timeout(120)
def test_log_start_moving_past_the_position_before_the_probe_is_lost_not_safe(source_cluster, unique_name,
                                                                             monkeypatch):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = source_cluster.create_topic(unique_name(), 1, {"retention.ms": "600000"})
    for first in (0, 5, 10):
        source_cluster.produce(topic, [(b"k%d" % i, b"v" * 100) for i in range(first, first + 5)], partition=0)
    admin = AdminClient(source_cluster.config.confluent())
    real_probe = retention_inputs.probe_position
    deleted = []

    def delete_first(client, t, p, offset, max_bytes, **kw):
        if not deleted and t == topic and offset == 0:   # the probe at the mirror position, after ListOffsets
            for future in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
                future.result(30)
            deleted.append(offset)
        return real_probe(client, t, p, offset, max_bytes, **kw)

    monkeypatch.setattr(retention_inputs, "probe_position", delete_first)
    inputs = retention_inputs.gather_inputs(source_cluster.config, {topic: [0]}, {(topic, 0): 0})
    (verdict,) = assess_partitions(inputs.snapshots, inputs.topics, CopyCapacity(10e6), at_risk_below_s=60.0,
                                   check_interval_ms=inputs.check_interval_ms)

    assert deleted == [0]                       # the deletion did happen between the two looks
    assert verdict.status is Status.LOST, verdict
    assert verdict.lost_range == (0, 5) and verdict.log_start == 5, verdict
    assert verdict.time_to_loss_s == 0 and "[0, 5)" in verdict.remedy.text, verdict
