"""Hole: a resume whose start lies past the checkpoint (retention deleted ``[checkpoint, log start)`` between two
runs) used to jump the gap silently, move the checkpoint past it, and later translate offsets in it as if they were
marker gaps. Now it halts naming the lost range; ``--accept-loss`` records it, and translation declines inside it."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.group_translation import translation_refusal
from mirror_core.state.checkpoint import CheckpointStore
from tests.copy_helpers import shoal


def _copy(topic: str, pipeline: str, *extra: str):
    return shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                 f"dr.{topic}", "--pipeline", pipeline, *extra)


def _delete_records_below(cluster, topic: str, offset: int) -> None:
    admin = AdminClient(cluster.config.confluent())
    for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
        future.result(30)


def test_resume_past_records_deleted_since_the_checkpoint_halts_then_accept_loss_records_it(
        source_cluster, target_cluster, unique_name):
    topic = unique_name()
    pipeline = f"p.{topic}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(120)], **{"linger.ms": 0,
                                                                                       "batch.size": 200})
    first = _copy(topic, pipeline, "--to", "50")
    assert first.returncode == 0, first.stderr
    with WireClient.for_cluster(target_cluster.config) as client:
        position = CheckpointStore(target_cluster.config, client).read(pipeline, topic, 0).position
    assert 50 <= position < 80

    _delete_records_below(source_cluster, topic, 80)  # retention ran between the two runs
    resumed = _copy(topic, pipeline)  # --from earliest: now the log start, past the checkpoint
    assert resumed.returncode != 0, "the copy skipped deleted data silently:\n" + resumed.stdout
    message = " ".join(resumed.stderr.split())
    assert "Traceback" not in resumed.stderr
    assert f"[{position}, 80)" in message and "cluster 'source'" in message and f"{topic}-0" in message
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == [b"v%d" % i for i in range(position)]

    accepted = _copy(topic, pipeline, "--accept-loss")
    assert accepted.returncode == 0, accepted.stderr
    assert f"offsets [{position}, 80) were never copied" in " ".join(accepted.stdout.split())
    expected = [b"v%d" % i for i in range(position)] + [b"v%d" % i for i in range(80, 120)]
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == expected
    assert [r.value for r in source_cluster.read_all(topic)] == [b"v%d" % i for i in range(80, 120)]
    with WireClient.for_cluster(target_cluster.config) as client:
        checkpoint = CheckpointStore(target_cluster.config, client).read(pipeline, topic, 0)
    assert checkpoint.lost_ranges == ((position, 80),)
    assert checkpoint.offset_map.translate(position - 1) == position - 1
    for inside in (position, 79):  # a consumer group there would be moved past data never copied
        assert checkpoint.offset_map.translate(inside) is None
        assert "lost before they were copied" in translation_refusal(checkpoint, inside)
    assert checkpoint.offset_map.translate(80) is not None


def test_an_explicit_start_past_the_checkpoint_is_refused_while_the_data_still_exists(
        source_cluster, target_cluster, unique_name):
    topic = unique_name()
    pipeline = f"p.{topic}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(20)])
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(20, 60)])
    assert _copy(topic, pipeline, "--to", "20").returncode == 0
    skipped = _copy(topic, pipeline, "--from", "40")
    assert skipped.returncode != 0
    message = " ".join(skipped.stderr.split())
    assert "[20, 40)" in message and "--accept-loss" in message and "Traceback" not in skipped.stderr
    assert len(target_cluster.read_all(f"dr.{topic}")) == 20


def test_accept_loss_with_the_log_start_inside_a_batch_copies_exactly_the_rest(source_cluster, target_cluster,
                                                                              unique_name):
    """delete_records (or a time start) can put the new start inside a batch: the batch's head below it was
    accepted as lost, so only its tail is copied (trimmed, a deep batch), and the offset map stays consistent."""
    topic = unique_name()
    pipeline = f"p.{topic}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(100)])
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(100, 200)])
    assert _copy(topic, pipeline, "--to", "100").returncode == 0
    _delete_records_below(source_cluster, topic, 150)  # inside the batch [100, 200)
    accepted = _copy(topic, pipeline, "--accept-loss")
    assert accepted.returncode == 0, accepted.stderr
    expected = [b"v%d" % i for i in range(100)] + [b"v%d" % i for i in range(150, 200)]
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == expected
    with WireClient.for_cluster(target_cluster.config) as client:
        checkpoint = CheckpointStore(target_cluster.config, client).read(pipeline, topic, 0)
    assert checkpoint.lost_ranges == ((100, 150),) and checkpoint.position == 200
    omap = checkpoint.offset_map
    assert omap.translate(199) - omap.translate(150) == 49  # the trimmed tail landed densely
    assert omap.translate(100) is None and omap.translate(149) is None
