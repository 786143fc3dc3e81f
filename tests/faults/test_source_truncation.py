"""Hole 4: a source log truncated below the copy position (unclean leader election) went unnoticed. Fetch sent no
LastFetchedEpoch and nothing validated a resumed position, so after the stale follower became leader and the log
regrew, the copy went on from the old position: the target kept records the source had lost, and the source's new
records below the position were never copied. Now a resumed lane checks its (position, epoch) with
OffsetsForLeaderEpoch, a running lane's Fetch answers with DivergingEpoch, and both halt naming the diverged range;
``groups sync`` refuses to translate offsets in it.

The source is the replicated sandbox cluster (a controller-only node and brokers 2 and 3), started for this module
only and stopped at its end. One truncation serves every test: the topic (RF 2, leader 2) is copied while both
replicas have it, the follower is stopped, more is produced and copied (the target now holds records only broker 2
had), broker 2 is stopped, the stale broker 3 is started and forced leader with an unclean election, and the log
regrows past the copy position with other records.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core.config.cluster import ClusterConfig
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.errors import SourceTruncatedError
from mirror_core.kafka.epochs import epoch_end_offset, epoch_ends_many, validate_position
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.group_translation import translation_refusal
from mirror_core.services.group_sync import diverged_ranges
from mirror_core.state.checkpoint import CheckpointStore
from tests.copy_helpers import shoal
from tests.kafka_helpers import KafkaTestCluster

LEADER, FOLLOWER = 2, 3
SHARED, ONLY_ON_LEADER = 20, 20  # records on both replicas, then on the leader only (the target has them all)
POSITION = SHARED + ONLY_ON_LEADER  # the copy position when the log is truncated back to SHARED


@pytest.fixture(scope="module")
def replicated(sandbox):
    """The replicated source cluster, fresh for this module and stopped at its end."""
    cluster = sandbox.replicated()
    cluster.wipe()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _records(prefix: str, start: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(b"k%d" % i, b"%s%d" % (prefix.encode(), i)) for i in range(start, start + count)]


def _leader(admin: AdminClient, topic: str) -> int:
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
    return -1 if partition is None else partition.leader


def _wait_for_leader(admin: AdminClient, topic: str, broker: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _leader(admin, topic) != broker:
        assert time.monotonic() < deadline, f"broker {broker} did not become leader of {topic}-0"
        time.sleep(0.2)


class Truncation:
    """The scenario's handles: the source, the copy arguments, and a lane session left open across the truncation."""

    def __init__(self, replicated, target_cluster, topic: str):
        self.cluster = replicated
        self.source = KafkaTestCluster(ClusterConfig("replicated", replicated.client_config()))
        self.target = target_cluster
        self.topic = topic
        self.admin = AdminClient({"bootstrap.servers": replicated.bootstrap, "log_level": 0})
        self.copy_args = ("copy", "--source", replicated.bootstrap, "--target", "target", "--topic", topic,
                          "--target-topic", f"dr.{topic}", "--pipeline", f"p.{topic}")

    def produce(self, records) -> None:
        self.source.produce(self.topic, records, acks="all")

    def copy(self):
        return shoal(*self.copy_args)


@pytest.fixture(scope="module")
def truncation(replicated, target_cluster):
    """Run the scenario once (module docstring); yields after the log regrew on the stale leader."""
    topic = f"shoal-test.truncation.{int(time.time() * 1000)}"
    t = Truncation(replicated, target_cluster, topic)
    t.admin.create_topics([NewTopic(topic, 1, replica_assignment=[[LEADER, FOLLOWER]])])[topic].result(30)
    _wait_for_leader(t.admin, topic, LEADER)
    t.produce(_records("a", 0, SHARED))
    first = t.copy()
    assert first.returncode == 0, first.stderr

    # the running lane: a second pipeline into its own target topic, open before the truncation
    target_cluster.create_topic(f"live.{topic}")
    source_client = WireClient.for_cluster(t.source.config)
    target_client = WireClient.for_cluster(target_cluster.config)
    store = CheckpointStore(target_cluster.config, target_client)
    lane = CheckpointedCopier(source_client, target_client, store, pipeline=f"live.{topic}",
                              mode=DeliveryMode.EXACTLY_ONCE).open_lane(topic, 0, f"live.{topic}", 0)
    lane.copy(0, SHARED)

    replicated.broker(FOLLOWER).stop()
    t.produce(_records("b", SHARED, ONLY_ON_LEADER))
    second = t.copy()
    assert second.returncode == 0, second.stderr
    lane.copy(SHARED, POSITION)
    t.copied = target_cluster.read_all(f"dr.{topic}")
    t.live_copied = target_cluster.read_all(f"live.{topic}")
    assert len(t.copied) == len(t.live_copied) == POSITION

    replicated.broker(LEADER).stop()
    replicated.broker(FOLLOWER).start()
    t.admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(topic, 0)]).result(30)
    _wait_for_leader(t.admin, topic, FOLLOWER)
    # other records regrow the log past the copy position, the second batch starting right at it: a copy that
    # resumes there without checking goes on silently, and the new [SHARED, POSITION) is never copied
    t.produce(_records("c", SHARED, ONLY_ON_LEADER))
    t.produce(_records("c", POSITION, 20))
    t.lane = lane
    try:
        yield t
    finally:
        source_client.close()
        target_client.close()


def test_a_resumed_copy_halts_naming_the_range_the_source_lost(truncation):
    t = truncation
    third = t.copy()
    assert third.returncode != 0, "the copy went on past a truncated source log:\n" + third.stdout
    said = " ".join((third.stderr + third.stdout).split())
    assert "source log truncation" in said and t.topic in said
    assert f"[{SHARED}, {POSITION})" in said, said
    assert t.target.read_all(f"dr.{t.topic}") == t.copied  # nothing new written


def test_a_running_lane_halts_on_the_diverging_epoch_of_its_next_fetch(truncation):
    t = truncation
    with pytest.raises(SourceTruncatedError) as info:
        t.lane.copy(POSITION, POSITION + 20)
    error = info.value
    assert (error.cluster, error.topic, error.partition) == ("replicated", t.topic, 0)
    assert error.diverged_range == (SHARED, POSITION)
    if t.lane.writer.in_transaction:
        t.lane.writer.abort_transaction()
    assert t.target.read_all(f"live.{t.topic}") == t.live_copied


def test_a_batched_epoch_answer_judges_a_resumed_position_as_its_own_request_does(truncation):
    """A daemon opening many lanes asks the leaders' epoch ends in one request per broker (epoch_ends_many) and
    hands each lane its answer: over the truncated log that answer must halt the lane naming the same range."""
    t = truncation
    epoch = t.lane.position_epoch
    assert epoch is not None and epoch >= 0
    with WireClient.for_cluster(t.source.config) as client:
        batched = epoch_ends_many(client, [(t.topic, 0, epoch), (t.topic, 7, epoch)])  # no partition 7: left out
        assert batched == {(t.topic, 0, epoch): epoch_end_offset(client, t.topic, 0, epoch)}
        for answer in (batched[(t.topic, 0, epoch)], None):
            with pytest.raises(SourceTruncatedError) as info:
                validate_position(client, t.topic, 0, POSITION, epoch, answer=answer)
            assert info.value.diverged_range == (SHARED, POSITION)


def test_groups_sync_does_not_translate_offsets_in_the_diverged_range(truncation):
    t = truncation
    with WireClient.for_cluster(t.target.config) as client:
        checkpoint = CheckpointStore(t.target.config, client).read(f"p.{t.topic}", t.topic, 0)
    assert checkpoint.position == POSITION and checkpoint.position_epoch is not None
    diverged = diverged_ranges(t.source.config, [checkpoint])
    assert diverged == {(t.topic, 0): (SHARED, POSITION)}
    assert translation_refusal(checkpoint, SHARED - 1, diverged[(t.topic, 0)]) is None
    for offset in (SHARED, POSITION - 1):
        assert "truncated" in translation_refusal(checkpoint, offset, diverged[(t.topic, 0)])
