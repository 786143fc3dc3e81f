"""A lane opening right after the daemon's preflight created its target topic (issue #18's scale bench: 100 of 200
lanes halted "target topic ... does not exist" when they opened faster): a topic the lane never wrote that metadata
does not know yet is asked again for a few seconds before it is a config error; one it wrote is gone when a second
look a moment later agrees (one broker's answer can lag the cluster: a false "deleted" would halt the lane for good)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest

import mirror_core.engine.lane_session as C
from mirror_core.errors import ConfigError, TopicRecreatedError


class Target:
    """Target metadata that does not know the topic for the first ``unknown`` look-ups."""

    cluster_name = "target"

    def __init__(self, unknown: int):
        self.unknown, self.asked = unknown, 0

    def topic_metadata(self, topic, refresh=False):
        self.asked += 1
        if self.asked <= self.unknown:
            raise Errors.UnknownTopicOrPartitionError(topic)
        return NS(topic_id="abc")


def _session(target, checkpoint=None):
    return NS(owner=NS(target=target), target_topic="dr.orders", checkpoint=checkpoint)


class Flapping(Target):
    """Metadata that contradicts itself: unknown, known, unknown, known, ..."""

    def topic_metadata(self, topic, refresh=False):
        self.asked += 1
        if self.asked % 2:
            raise Errors.UnknownTopicOrPartitionError(topic)
        return NS(topic_id="abc")


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(C, "TARGET_TOPIC_RETRY_S", 0.01)
    monkeypatch.setattr(C, "TARGET_DELETION_CONFIRM_S", 0.01, raising=False)


@pytest.mark.timeout(10)
def test_a_target_topic_just_created_is_waited_for():
    target = Target(unknown=3)
    assert C.LaneSession._current_target_topic_id(_session(target)) == "abc" and target.asked == 4


@pytest.mark.timeout(10)
def test_a_target_topic_that_never_appears_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.setattr(C, "TARGET_TOPIC_APPEAR_S", 0.1)
    with pytest.raises(ConfigError, match="target topic 'dr.orders' does not exist on cluster 'target'"):
        C.LaneSession._current_target_topic_id(_session(Target(unknown=10**6)))


@pytest.mark.timeout(10)
def test_a_target_topic_the_lane_wrote_is_gone_when_a_second_look_agrees():
    target = Target(unknown=10**6)
    with pytest.raises(TopicRecreatedError):
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="old-id")))
    assert target.asked == 2


@pytest.mark.timeout(10)
def test_one_lagging_unknown_answer_does_not_halt_a_lane_that_wrote_the_topic():
    """A broker that has not caught up on metadata answers UNKNOWN_TOPIC_OR_PARTITION once; the next look finds
    the topic: no TopicRecreatedError (a halt that needs an operator), the id is read on."""
    target = Target(unknown=1)
    assert C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc"))) == "abc"
    assert target.asked == 3   # the unknown answer, the look that found it, the id read anew


@pytest.mark.timeout(10)
def test_metadata_that_keeps_contradicting_itself_is_a_retriable_unknown_topic_not_a_deletion():
    target = Flapping(unknown=0)
    with pytest.raises(Errors.UnknownTopicOrPartitionError):
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc")))
    assert target.asked == 2 * C.TARGET_DELETION_LOOKS


@pytest.mark.timeout(10)
def test_a_copy_opening_its_lanes_confirms_a_deleted_target_topic_the_same_way():
    from mirror_core.engine.checkpointed import CheckpointedCopier

    copier = NS(target=Target(unknown=1))
    assert CheckpointedCopier._target_topic_ids(copier, {"dr.orders": "abc"}) == {"dr.orders": "abc"}
    copier = NS(target=Target(unknown=10**6))
    with pytest.raises(TopicRecreatedError):
        CheckpointedCopier._target_topic_ids(copier, {"dr.orders": "abc"})
    assert copier.target.asked == 2
