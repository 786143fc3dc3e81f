"""A lane opening right after the daemon's preflight created its target topic (issue #18's scale bench: 100 of 200
lanes halted "target topic ... does not exist" when they opened faster): a topic the lane never wrote that metadata
does not know yet is asked again for a few seconds before it is a config error; one it wrote is gone at once."""

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


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(C, "TARGET_TOPIC_RETRY_S", 0.01)


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
def test_a_target_topic_the_lane_wrote_is_gone_at_once():
    target = Target(unknown=10**6)
    with pytest.raises(TopicRecreatedError):
        C.LaneSession._current_target_topic_id(_session(target, NS(target_topic_id="old-id")))
    assert target.asked == 1
