"""A lane opening right after the daemon's preflight created its target topic (issue #18's scale bench: 100 of 200
lanes halted "target topic ... does not exist" when they opened faster): a topic the lane never wrote that metadata
does not know yet is asked again for a few seconds before it is a config error; one it wrote is gone when, a moment
later, every broker that answers agrees, asked one by one (one broker's answer can lag the cluster: a false
"deleted" would halt the lane for good)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import kafka.errors as Errors
import pytest

import mirror_core.engine.lane_session as C
from mirror_core.errors import ConfigError, TargetTopicUnsettledError, TopicRecreatedError
from mirror_core.model.lane_status import classify_failure


class Target:
    """Target metadata that does not know the topic for the first ``unknown`` look-ups (whichever broker answers);
    asked broker by broker (the confirmation), broker ``b`` knows it when ``knows[b]`` (an exception class: it
    cannot be reached)."""

    cluster_name = "target"

    def __init__(self, unknown: int, knows: dict | None = None):
        self.unknown, self.asked = unknown, 0
        self.knows = {1: False, 2: False, 3: False} if knows is None else knows
        self.asked_brokers: list[int] = []

    def topic_metadata(self, topic, refresh=False):
        self.asked += 1
        if self.asked <= self.unknown:
            raise Errors.UnknownTopicOrPartitionError(topic)
        return NS(topic_id="abc")

    def broker_ids(self):
        return sorted(self.knows)

    def topic_known_by(self, node, topic):
        self.asked_brokers.append(node)
        answer = self.knows[node]
        if isinstance(answer, type):
            raise answer()
        return "abc" if answer else None


def _session(target, checkpoint=None):
    return NS(owner=NS(target=target), target_topic="dr.orders", checkpoint=checkpoint)


class Flapping(Target):
    """Metadata that contradicts itself: the least loaded broker never knows the topic, another always does."""

    def __init__(self):
        super().__init__(10**6, {1: False, 2: True})


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
def test_a_target_topic_the_lane_wrote_is_gone_when_every_broker_agrees():
    target = Target(unknown=10**6)
    with pytest.raises(TopicRecreatedError):
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="old-id")))
    assert target.asked == 1 and target.asked_brokers == [1, 2, 3]


@pytest.mark.timeout(10)
def test_one_lagging_broker_does_not_halt_a_lane_that_wrote_the_topic():
    """The least loaded broker has not caught up on metadata and answers UNKNOWN_TOPIC_OR_PARTITION; asked one by
    one, another broker knows the topic: no TopicRecreatedError (a halt that needs an operator), the id is read on."""
    target = Target(unknown=1, knows={1: False, 2: True, 3: False})
    assert C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc"))) == "abc"
    assert target.asked == 2 and target.asked_brokers == [1, 2]


@pytest.mark.timeout(10)
def test_unreachable_brokers_have_no_say_and_none_answering_confirms_nothing():
    target = Target(unknown=10**6, knows={1: Errors.KafkaConnectionError, 2: False})
    with pytest.raises(TopicRecreatedError):      # broker 2 answered "unknown", broker 1 had no say
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc")))
    target = Target(unknown=10**6, knows={1: Errors.KafkaConnectionError, 2: Errors.RequestTimedOutError})
    with pytest.raises(TargetTopicUnsettledError):   # nobody confirmed: retriable, not a deletion
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc")))


@pytest.mark.timeout(10)
def test_metadata_that_keeps_contradicting_itself_is_a_retriable_error_naming_the_topic_not_a_deletion():
    """Raised as a named error (before: the bare UnknownTopicOrPartitionError('dr.orders'), which `shoal copy`
    printed as "Kafka error not handled more specifically"): retriable, a daemon lane's reason "unavailable"."""
    target = Flapping()
    with pytest.raises(TargetTopicUnsettledError) as raised:
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="abc")))
    assert target.asked == C.TARGET_DELETION_LOOKS
    message = str(raised.value)
    assert "target topic 'dr.orders' on cluster 'target'" in message and "retry" in message
    assert classify_failure(raised.value) == (True, "unavailable")


@pytest.mark.timeout(10)
def test_a_copy_opening_its_lanes_names_a_topic_its_brokers_disagree_on():
    from mirror_core.engine.checkpointed import CheckpointedCopier

    copier = NS(target=Flapping())
    with pytest.raises(TargetTopicUnsettledError, match="target topic 'dr.orders' on cluster 'target'"):
        CheckpointedCopier._target_topic_ids(copier, {"dr.orders": "abc"})
    assert copier.target.asked == C.TARGET_DELETION_LOOKS


@pytest.mark.timeout(10)
def test_a_copy_opening_its_lanes_confirms_a_deleted_target_topic_the_same_way():
    from mirror_core.engine.checkpointed import CheckpointedCopier

    copier = NS(target=Target(unknown=1, knows={1: False, 2: True}))
    assert CheckpointedCopier._target_topic_ids(copier, {"dr.orders": "abc"}) == {"dr.orders": "abc"}
    copier = NS(target=Target(unknown=10**6))
    with pytest.raises(TopicRecreatedError):
        CheckpointedCopier._target_topic_ids(copier, {"dr.orders": "abc"})
    assert copier.target.asked == 1 and copier.target.asked_brokers == [1, 2, 3]
