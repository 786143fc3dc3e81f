"""Fault tests: each drives one real failure against the mirror contract (DESIGN.md §3) on real brokers and
asserts the copy ends exact or halts naming cluster, topic, partition and offsets. Source and target are compared
with an independent READ_COMMITTED reader (:func:`tests.faults.reader.committed_records`), never Shoal's own code."""
