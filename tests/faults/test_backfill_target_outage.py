"""A backfill unit whose target broker goes down mid-copy for longer than the writer's own retries.

Until 25ada24 a backfill unit failed on the first retriable error out of its copy: a target restart longer than the
writer's retry window (25 s by default) failed the unit and stopped its lane, although nothing was wrong once the
broker was back. Now ``copy_unit`` tries again after ``UNIT_RETRY_BACKOFF_S``, each try reopening the lane (fenced)
from its checkpoint. That was unit-tested with a scripted copier only; here it is driven on real brokers: the
target is a private broker of this module (the shared sandbox brokers are never stopped), stopped while the unit
copies (throttled so the outage lands mid-copy) and started again; the writer's retry window and the lane's
transaction timeout are lowered so the outage outlasts them. What a user must see: the unit completes, the target
holds every source record exactly once (an independent READ_COMMITTED reader), no transaction is left open, and
the log says the unit was retried from its checkpoint. With the unit's retries off (``backoff_s=()``) the same
outage fails the unit (checked when this test was written: the copy raised a retriable error).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.engine.backfill import copy_unit
from mirror_core.engine.checkpointed import CheckpointedCopier, DeliveryMode
from mirror_core.engine.copier import CopyOptions
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.model.ranges import PartitionRange
from mirror_core.state.checkpoint import CheckpointStore
from tests.integration.daemon.test_daemon import assert_exact, no_hanging_transaction, wait_for
from tests.kafka_helpers import private_broker

pytestmark = [pytest.mark.timeout(240), pytest.mark.faults]

RECORDS = 3000
VALUE = 1000                 # bytes per record: ~3 MB in all
THROTTLE = 150_000           # bytes/s: the copy takes ~20 s, the outage lands inside it
OUTAGE_S = 8.0               # past the lowered write retry window, inside the unit's retries (2 + 5 + 10 s)


@pytest.fixture(scope="module")
def outage_target(session_sandbox, tmp_path_factory):
    """A private Kafka 4 target broker this module may stop and start again; the sandbox's source beside it."""
    session_sandbox.ensure("source")
    with private_broker("backfill-outage-target", tmp_path_factory) as cluster:
        yield cluster


def _target_records(cluster, topic: str) -> int:
    try:
        with WireClient.for_cluster(cluster.config) as client:
            return list_offsets(client, topic, 0, "last_stable")
    except Exception:  # noqa: BLE001 - the broker may be restarting: no answer is "not yet"
        return 0


def test_backfill_unit_survives_a_target_outage_longer_than_the_writers_retries(source_cluster, outage_target,
                                                                                 unique_name, caplog):
    topic = unique_name()
    target_topic = f"dr.{topic}"
    source_cluster.create_topic(topic, partitions=1)
    outage_target.create_topic(target_topic, partitions=1)
    source_cluster.produce(topic, [(b"k%d" % i, b"%06d" % i + b"v" * VALUE) for i in range(RECORDS)], partition=0)
    with WireClient.for_cluster(source_cluster.config) as client:
        end = list_offsets(client, topic, 0, "last_stable")
    rng = PartitionRange(topic, 0, 0, end, target_topic, 0)
    with WireClient.for_cluster(outage_target.config) as target:
        CheckpointStore(outage_target.config, target).ensure_topic()   # what `shoal` preflight does on a target

    outcome: dict = {}
    policy = CommitPolicy(commit_bytes=256 * 1024, write_retry_s=3.0, transaction_timeout_ms=10_000)
    options = CopyOptions(throttle_bytes_per_s=THROTTLE, fetch_max_bytes=64 * 1024, max_inflight_bytes=64 * 1024)

    def backfill_unit():
        try:
            with WireClient.for_cluster(source_cluster.config) as source, \
                    WireClient.for_cluster(outage_target.config) as target:
                copier = CheckpointedCopier(source, target, CheckpointStore(outage_target.config, target),
                                            pipeline=f"outage-{topic.rsplit('.', 1)[-1]}",
                                            mode=DeliveryMode.EXACTLY_ONCE, owner="backfill:outage-test",
                                            options=options, policy=policy)
                outcome["result"] = copy_unit(copier, rng, "lane-0")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc

    caplog.set_level(logging.WARNING, logger="mirror_core.engine.backfill")
    worker = threading.Thread(target=backfill_unit, daemon=True)
    worker.start()
    wait_for(lambda: _target_records(outage_target, target_topic) > 0 or not worker.is_alive(), 60,
             "the unit's first commit on the target")
    assert worker.is_alive(), f"the unit ended before the outage: {outcome}"
    copied_before = _target_records(outage_target, target_topic)
    assert copied_before < end, "the copy finished before the outage: raise RECORDS or lower THROTTLE"

    broker = outage_target.broker
    down_at = time.monotonic()
    try:
        assert broker.stop(timeout=20)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    finally:
        broker.start(timeout=90)
    outage_s = time.monotonic() - down_at

    worker.join(150)
    assert not worker.is_alive(), "the unit did not end within 150 s of the target coming back"
    assert "error" not in outcome, f"the unit failed after a {outage_s:.0f} s target outage: {outcome['error']!r}"
    result = outcome["result"]
    assert result.source_end == end
    assert assert_exact(source_cluster, outage_target, topic, target_topic) == RECORDS
    assert no_hanging_transaction(outage_target, target_topic, 1)
    retried = [r.getMessage() for r in caplog.records if "retrying from the lane's checkpoint" in r.getMessage()]
    assert retried, f"the {outage_s:.0f} s outage never reached the unit's retries (the writer waited it out)"
    assert topic in retried[0] and "attempt 2 of" in retried[0]
    print(f"target down {outage_s:.1f} s after {copied_before} of {end} records; unit retried "
          f"{len(retried)} time(s): {retried[0]}")
