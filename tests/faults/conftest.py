"""Fault tests: each drives one real failure against the mirror contract (DESIGN.md §3) on real brokers and
asserts the copy ends exact or halts naming cluster, topic, partition and offsets. Source and target are compared
with an independent READ_COMMITTED reader (:meth:`tests.kafka_helpers.KafkaTestCluster.read_all`, confluent-kafka),
never with Shoal's own fetch path."""

import pytest

from tests.kafka_helpers import private_broker


@pytest.fixture(scope="module")
def no_coordinator_target(session_sandbox, tmp_path_factory):
    """A private target broker (one per test module) whose transaction coordinator never answers: its
    ``__transaction_state`` topic needs three replicas it will never have. The sandbox's source runs beside it."""
    session_sandbox.ensure("source")
    with private_broker("no-coordinator", tmp_path_factory,
                        extra_properties="transaction.state.log.replication.factor=3\n") as cluster:
        yield cluster
