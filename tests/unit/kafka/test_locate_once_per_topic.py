"""Leader look-ups: one Metadata request per topic for all its partitions that need one, not one per partition
(issue 18: a daemon opening 2,000 lanes of 40 topics asked 2,031 times), and a recreated topic still caught.

The client is the real :class:`WireClient` metadata cache with its network replaced by a scripted Metadata answer
(the cluster's current topic id and leaders), counted per request."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from mirror_core.errors import TopicRecreatedError
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.kafka.wire_client import WireClient

pytestmark = pytest.mark.timeout(30)


class ScriptedCluster:
    """What the brokers answer to Metadata now: topic → (topic id, {partition: leader})."""

    def __init__(self, topics: dict[str, tuple[uuid.UUID, dict[int, int]]]):
        self.topics = topics
        self.requests: list[list[str]] = []

    def answer(self, request):
        names = [t.name for t in request.topics]
        self.requests.append(names)
        return SimpleNamespace(topics=[
            SimpleNamespace(name=name, topic_id=self.topics[name][0], error_code=0, partitions=[
                SimpleNamespace(partition_index=p, leader_id=leader, leader_epoch=5, replica_nodes=[leader],
                                isr_nodes=[leader], error_code=0)
                for p, leader in self.topics[name][1].items()])
            for name in names])


def scripted_client(cluster: ScriptedCluster) -> WireClient:
    client = WireClient.__new__(WireClient)  # the real cache and look-ups, no sockets
    client._topics, client._metadata_answers, client._topic_answer = {}, 0, {}
    client._rebootstrap_failed = False
    client._manager = SimpleNamespace(cluster=SimpleNamespace(update_metadata=lambda response: None))
    client.cluster_name = "source"
    client.send = lambda node, request, **kw: cluster.answer(request)
    return client


def test_many_partitions_of_a_few_topics_are_located_with_one_request_per_topic():
    topics = {f"t{i}": (uuid.uuid4(), {p: p % 3 for p in range(50)}) for i in range(4)}
    cluster = ScriptedCluster(topics)
    client = scripted_client(cluster)
    fetchers = [RawBatchFetcher(client, topic, p, 0) for topic in topics for p in range(50)]

    leaders = [f.locate() for f in fetchers]

    assert leaders == [(p % 3, 5) for _topic in topics for p in range(50)]
    assert sorted(name for names in cluster.requests for name in names) == sorted(topics)  # one each
    assert {f.topic_id for f in fetchers if f.topic == "t0"} == {topics["t0"][0]}


def test_cached_metadata_older_than_the_fetcher_is_not_trusted():
    """Metadata cached before a fetcher was made (an older answer) is asked again at its first look-up."""
    topic_id = uuid.uuid4()
    cluster = ScriptedCluster({"t": (topic_id, {0: 1, 1: 1})})
    client = scripted_client(cluster)
    client.topic_metadata("t", refresh=True)  # cached now, before the fetchers exist
    cluster.topics["t"] = (topic_id, {0: 2, 1: 2})  # the leaders moved since

    first, second = RawBatchFetcher(client, "t", 0, 0), RawBatchFetcher(client, "t", 1, 0)

    assert (first.locate(), second.locate()) == ((2, 5), (2, 5))
    assert len(cluster.requests) == 2  # the early answer, then one for both fetchers


def test_partitions_that_forgot_their_leader_share_one_new_look_up():
    cluster = ScriptedCluster({"t": (uuid.uuid4(), {p: 1 for p in range(10)})})
    client = scripted_client(cluster)
    fetchers = [RawBatchFetcher(client, "t", p, 0) for p in range(10)]
    for f in fetchers:
        f.locate()
    cluster.topics["t"] = (cluster.topics["t"][0], {p: 2 for p in range(10)})  # a broker went away

    for f in fetchers:  # each partition's fetch failed with NOT_LEADER in the same round
        f.forget_leader()

    assert [f.locate() for f in fetchers] == [(2, 5)] * 10
    assert len(cluster.requests) == 2


def test_a_recreated_topic_is_caught_by_every_partition_even_from_a_shared_answer():
    old, new = uuid.uuid4(), uuid.uuid4()
    cluster = ScriptedCluster({"t": (old, {0: 1, 1: 1, 2: 1})})
    client = scripted_client(cluster)
    fetchers = [RawBatchFetcher(client, "t", p, 0) for p in range(3)]
    for f in fetchers:
        f.locate()
    cluster.topics["t"] = (new, {0: 1, 1: 1, 2: 1})  # deleted and created again under the same name

    for f in fetchers:  # the round's answers said UNKNOWN_TOPIC_ID / a retriable error for each
        f.forget_leader()
    for f in fetchers:
        with pytest.raises(TopicRecreatedError) as caught:
            f.locate()
        assert str(old) in str(caught.value) and str(new) in str(caught.value)
        assert "t" in str(caught.value)
    assert len(cluster.requests) == 2  # the recreation was seen in one shared answer


def test_an_unknown_topic_id_answer_looks_the_topic_up_again_and_reports_the_recreation():
    """A partition's UNKNOWN_TOPIC_ID answer: the cached metadata (old id) is not trusted, a new answer is asked."""
    import kafka.errors as Errors

    old, new = uuid.uuid4(), uuid.uuid4()
    cluster = ScriptedCluster({"t": (old, {0: 1})})
    client = scripted_client(cluster)
    fetcher = RawBatchFetcher(client, "t", 0, 7)
    fetcher.locate()
    cluster.topics["t"] = (new, {0: 1})

    with pytest.raises(TopicRecreatedError):
        fetcher.handle(SimpleNamespace(error_code=Errors.UnknownTopicIdError.errno, diverging_epoch=None,
                                       tags=None, records=b"", aborted_transactions=None))
    assert len(cluster.requests) == 2
