"""Backfill planning against real brokers: what :func:`mirror_core.services.plan_inputs.build_plan` makes of the
source's offsets (log start, last stable offset with an open transaction, timestamps, deleted records), the pipeline's
checkpoints on the target, partition sizes, and the topics it refuses or leaves out."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.config.plan_request import PlanRequest
from mirror_core.errors import ConfigError, PlanDataLossError
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.plan import Plan
from mirror_core.model.planner import select_topics
from mirror_core.services.plan_inputs import build_plan, dry_run, list_topics
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore

pytestmark = pytest.mark.integration


def plan_for(source_cluster, target_cluster, include: str, **kw) -> Plan:
    req = PlanRequest.parse(pipeline=kw.pop("pipeline", "plan-test"), source_cluster=source_cluster.name,
                            target_cluster=target_cluster.name, include=include, **kw)
    return build_plan(source_cluster.config, target_cluster.config, req)


def ranges(plan: Plan) -> dict[int, tuple[int, int]]:
    return {u.partition: (u.start, u.end) for u in plan.units}


def test_earliest_to_latest_stops_at_the_last_stable_offset_of_an_open_transaction(source_cluster, target_cluster,
                                                                                    unique_name, tmp_path):
    topic = source_cluster.create_topic(unique_name(), partitions=2)
    source_cluster.produce(topic, [(None, b"x" * 100)] * 10, partition=0)
    source_cluster.produce(topic, [(None, b"y" * 100)] * 5, partition=1)
    producer = Producer(source_cluster.config.confluent(**{"transactional.id": f"plan-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    try:
        plan = plan_for(source_cluster, target_cluster, topic, naming="prefix:dr.")
    finally:
        producer.abort_transaction(30)
    assert ranges(plan) == {0: (0, 10), 1: (0, 5)}
    assert {u.lane for u in plan.units} == {f"dr.{topic}-0", f"dr.{topic}-1"}
    by_partition = {u.partition: u for u in plan.units}
    assert by_partition[0].bytes_estimate > by_partition[1].bytes_estimate > 5 * 100  # DescribeLogDirs sizes
    assert [u.partition for u in plan.units] == [0, 1]  # no deadlines: larger first
    out = dry_run(plan, tmp_path / "plan.json")
    assert Plan.from_json(out.read_text()) == plan


def test_times_resolve_to_offsets(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name())
    base = int(time.time() * 1000) - 3_600_000
    source_cluster.produce(topic, [(None, b"v%d" % i, None, base + i * 1000) for i in range(20)], partition=0)
    iso = lambda ms: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + "Z"  # noqa: E731

    plan = plan_for(source_cluster, target_cluster, topic, start=iso(base + 5_000), end=iso(base + 15_000))
    assert ranges(plan) == {0: (5, 15)}
    later = plan_for(source_cluster, target_cluster, topic, start=iso(base + 60_000))
    assert later.units == () and [(e.partition, e.offset) for e in later.empty] == [(0, 20)]


def test_checkpoint_start_reads_the_pipelines_positions(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), partitions=2)
    for p in (0, 1):
        source_cluster.produce(topic, [(None, b"v")] * 12, partition=p)
    pipeline = unique_name("pipeline")
    with WireClient.for_cluster(target_cluster.config) as target:
        store = CheckpointStore(target_cluster.config, target)
        store.ensure_topic()
        checkpoint = Checkpoint(pipeline, topic, 0, position=7, target_topic=f"dr.{topic}", target_partition=0,
                                target_next=7, owner="copy", owner_epoch=0)
        BatchWriter(target).write([store.checkpoint_batch(checkpoint)])

    plan = plan_for(source_cluster, target_cluster, topic, start="checkpoint", naming="prefix:dr.",
                    pipeline=pipeline)
    assert ranges(plan) == {0: (7, 12), 1: (0, 12)}
    assert {u.partition: u.start_from for u in plan.units} == {0: "checkpoint", 1: "earliest (no checkpoint)"}

    with pytest.raises(ConfigError, match=r"pipeline 'no-such-pipeline' has no checkpoints"):
        plan_for(source_cluster, target_cluster, topic, start="checkpoint", pipeline="no-such-pipeline")
    with pytest.raises(ConfigError, match=rf"checkpointed a copy to dr.{topic}-0, but this plan targets {topic}-0"):
        plan_for(source_cluster, target_cluster, topic, start="checkpoint", pipeline=pipeline)


def test_start_below_the_log_start_after_delete_records(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name())
    source_cluster.produce(topic, [(None, b"v%d" % i) for i in range(10)], partition=0)
    admin = AdminClient(source_cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        future.result(30)

    with pytest.raises(PlanDataLossError, match=rf"{topic}-0: start {topic}:0=2 = offset 2 is below the log start 6"):
        plan_for(source_cluster, target_cluster, topic, start=f"{topic}:0=2")
    plan = plan_for(source_cluster, target_cluster, topic, start=f"{topic}:0=2", accept_loss=True)
    assert ranges(plan) == {0: (6, 10)}
    assert [(x.lost_start, x.lost_end) for x in plan.losses] == [(2, 6)]
    assert ranges(plan_for(source_cluster, target_cluster, topic)) == {0: (6, 10)}  # earliest is the log start


def test_unknown_topics_are_refused_by_name(source_cluster, target_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name())
    missing = unique_name("missing")
    with pytest.raises(ConfigError, match=rf"topic '{missing}' \(named in include .*\) does not exist on cluster "
                                          "'source'"):
        plan_for(source_cluster, target_cluster, f"{topic},{missing}")
    with pytest.raises(ConfigError, match=rf"start {missing}:0: topic '{missing}' does not exist"):
        plan_for(source_cluster, target_cluster, topic, start=f"{missing}:0=0")


def test_internal_topics_are_left_out_unless_named(source_cluster, target_cluster, unique_name):
    tag = uuid.uuid4().hex[:10]
    plain = source_cluster.create_topic(f"plan-{tag}")
    internal = source_cluster.create_topic(f"__plan-{tag}")
    source_cluster.produce(internal, [(None, b"v")] * 3)
    with WireClient.for_cluster(source_cluster.config) as client:
        topics = list_topics(client)
    pattern = f".*plan-{tag}"
    req = PlanRequest.parse(pipeline="p", source_cluster="source", target_cluster="target", include=pattern)
    assert select_topics(req, topics) == [plain]

    plan = plan_for(source_cluster, target_cluster, f"{pattern},{internal}", naming="prefix:dr.")
    assert {u.topic for u in plan.units} == {internal}
    assert [(e.topic, e.offset) for e in plan.empty] == [(plain, 0)]
    assert ranges(plan) == {0: (0, 3)}
