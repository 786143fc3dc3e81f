"""mirror_core.kafka.source_reachability: when the daemon says the source cluster is unreachable, and when it takes it
back (pure: the clock is passed in)."""

from __future__ import annotations

import kafka.errors as Errors

from mirror_core.errors import ClusterUnavailableError
from mirror_core.kafka.source_reachability import SourceReachability, is_transport_failure

REFUSED = Errors.KafkaConnectionError("connecting to 127.0.0.1:9092: Connection refused")


def test_failures_for_the_bound_with_no_answer_are_reported_once_then_the_first_answer_takes_it_back():
    seen = SourceReachability("source", after_s=5)
    seen.unanswered(100.0, REFUSED)
    assert seen.check(104.9) is None, "not yet: a refused connection during a leader move is no outage"
    seen.observe_round(106.0, [REFUSED, Errors.NodeNotReadyError("broker 1")])
    down = seen.check(106.0)
    assert down.unreachable and down.cluster == "source" and down.since_s == 6.0
    assert "Connection refused" in down.error and "'source' unreachable" in down.problem
    assert seen.check(107.0) is None, "said once"
    assert "unreachable for 10s" in seen.problem(110.0), "the /readyz sentence keeps its duration fresh"
    assert SourceReachability("s", after_s=5).problem(110.0) is None
    seen.observe_round(112.0, [REFUSED, None])        # one partition served: the source answers
    up = seen.check(112.0)
    assert not up.unreachable and up.since_s == 12.0 and up.problem is None
    assert seen.problem(112.0) is None and seen.check(120.0) is None


def test_an_answer_within_the_bound_resets_the_count():
    seen = SourceReachability("source", after_s=5)
    seen.unanswered(100.0, REFUSED)
    seen.answered(103.0)
    seen.unanswered(104.0, REFUSED)
    assert seen.check(108.0) is None
    assert seen.check(109.0).unreachable


def test_an_answer_to_a_request_sent_before_the_failure_does_not_take_it_back():
    """The fetch round in flight when the source went down is answered (its request began before), then nothing
    is: that answer must not clear the failure the group's consumer saw meanwhile (CI on 949fc51: /readyz never
    named the source through a 10 s outage)."""
    seen = SourceReachability("source", after_s=5)
    seen.unanswered(100.0, "every broker of the group's consumer is down")
    seen.observe_round(99.9, [None])                  # asked at 99.9, answered after the failure was seen
    assert seen.failing and "unreachable for 6s" in seen.problem(106.0)
    assert seen.check(106.0).unreachable
    seen.answered(100.0)                              # a request that began at or after the failure: it answers
    assert not seen.failing and seen.problem(106.5) is None


def test_a_broker_refusing_something_is_not_an_unreachable_source():
    seen = SourceReachability("source", after_s=1)
    seen.observe_round(100.0, [Errors.TopicAuthorizationFailedError(), REFUSED])
    seen.observe_round(105.0, [])
    assert seen.check(110.0) is None, "a refusal is an answer of sorts: it says nothing about reachability"
    assert is_transport_failure(ClusterUnavailableError("source", "127.0.0.1:9092", "no bootstrap broker answered"))
    assert not is_transport_failure(Errors.NotLeaderForPartitionError())


def test_the_group_consumers_repeated_connection_errors_are_logged_once_and_all_brokers_down_counts(caplog):
    import logging
    import time

    from confluent_kafka import KafkaError

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.daemon.membership import GroupMembership

    seen = SourceReachability("source", after_s=5)
    member = GroupMembership(ClusterConfig("source", {"bootstrap.servers": "127.0.0.1:1"}), "p1", "w1",
                             protocol="consumer", reachability=seen)
    with caplog.at_level(logging.WARNING, logger="shoal.daemon.membership"):
        for ms in range(60):     # what librdkafka sends while the source is down: ~20 a second, texts varying
            member._on_error(KafkaError(KafkaError._TRANSPORT, f"127.0.0.1:1/bootstrap: Connect failed: Connection "
                                                               f"refused (after {ms}ms in state CONNECT)"))
        member._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    logged = [r.getMessage() for r in caplog.records if "event=membership_error" in r.getMessage()]
    assert len(logged) == 2 and "_TRANSPORT" in logged[0] and "_ALL_BROKERS_DOWN" in logged[1], logged
    assert "brokers are down" in member.error, "the latest error is kept (the group_not_joined sentence shows it)"
    assert "every broker" in seen.problem(time.monotonic() + 6)


def test_the_daemon_reports_an_unreachable_source_in_readiness_metrics_and_one_event(caplog):
    import logging
    import time

    from tests.unit.daemon.test_daemon_membership import group_daemon

    daemon = group_daemon()
    metric = daemon.metrics.registry.get_sample_value
    assert daemon.metrics.readiness()[0] and metric("shoal_source_reachable") == 1
    daemon.source_reachability.unanswered(time.monotonic() - 6, REFUSED)
    ready, body = daemon.metrics.readiness()
    assert not ready and "'source' unreachable" in body["source"], "/readyz says it without the loop's help"
    with caplog.at_level(logging.INFO, logger="shoal.daemon"):
        daemon._report_source_reachability()
        daemon._report_source_reachability()
        assert metric("shoal_source_reachable") == 0
        daemon.source_reachability.answered(time.monotonic())
        daemon._report_source_reachability()
    events = [r.getMessage().split()[0] for r in caplog.records if r.getMessage().startswith("event=source_")]
    assert events == ["event=source_unreachable", "event=source_reachable"]
    assert daemon.metrics.readiness()[0] and metric("shoal_source_reachable") == 1


def test_a_round_with_the_source_down_looks_leaders_up_once_not_once_per_partition():
    """Each leader look-up of a cluster that is down waits for a re-bootstrap (seconds): a round over 2,000 lanes
    that asked for each would keep the daemon loop away for hours. One look-up fails the round's other unlocated
    partitions with the same error; partitions whose leader is known are still sent."""
    from mirror_core.kafka.broker_fetch import RoundSessions, send_round

    class _Client:
        request_timeout_ms = 1000

    class _Fetcher:
        def __init__(self, partition, known):
            self.topic, self.partition, self.leader_known, self.lookups = "t", partition, known, 0

        def locate(self):
            self.lookups += 1
            if self.leader_known:
                raise Errors.NotLeaderForPartitionError("t")   # a broker's answer: says nothing of the others
            raise Errors.KafkaConnectionError("connecting to the bootstrap brokers: Connection refused")

        def forget_leader(self):
            self.leader_known = False

    fetchers = [_Fetcher(p, known=p == 3) for p in range(6)]
    outcomes = send_round(_Client(), fetchers, max_bytes=1 << 20, max_wait_ms=10,
                          sessions=RoundSessions(enabled=False)).collect()
    assert sum(f.lookups for f in fetchers) == 2, "one look-up of the cluster, plus the partition with a leader"
    assert all(isinstance(o.error, Errors.KafkaConnectionError) for i, o in enumerate(outcomes) if i != 3)
    assert isinstance(outcomes[3].error, Errors.NotLeaderForPartitionError)
