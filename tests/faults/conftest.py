"""Fault tests: each drives one real failure against the mirror contract (DESIGN.md §3) on real brokers and
asserts the copy ends exact or halts naming cluster, topic, partition and offsets. Source and target are compared
with an independent READ_COMMITTED reader (:meth:`tests.kafka_helpers.KafkaTestCluster.read_all`, confluent-kafka),
never with Shoal's own fetch path."""
