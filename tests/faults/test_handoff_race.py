"""Hole 3: ``hand_off`` read the checkpoint and only then opened the lane's transactional.id. A backfill commit
landing between the two was overwritten by the older position (owner ``daemon``), and the daemon copied that range
a second time. Now the handoff fences first, then reads, then writes the handoff in a transaction of that same id.

The race is real: an exactly-once backfill keeps committing on the real brokers while ``hand_off`` runs; the test
only widens the gap before the fence (it waits there until the backfill has committed once more) so that the
interleaving that loses happens on every run instead of by chance.
"""

from __future__ import annotations

import threading
import time
import traceback

import mirror_core.services.handoff as handoff
from mirror_core.config.commit_policy import CommitPolicy
from mirror_core.config.names import default_lane, lane_transactional_id
from mirror_core.engine.checkpointed import CheckpointedCopier
from mirror_core.engine.copier import CopyOptions
from mirror_core.errors import ProducerFencedError
from mirror_core.kafka.list_offsets import list_offsets
from mirror_core.kafka.wire_client import WireClient
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.ranges import PartitionRange
from mirror_core.services.preflight import run_preflight
from mirror_core.state.checkpoint import CheckpointStore
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    assert_exact,
    checkpoints,
    daemon_factory,
    include_prefix,
    write_pipeline,
)

RECORDS = 3000


class _Backfill(threading.Thread):
    """An exactly-once backfill of ``[0, end)``, throttled so it commits many times over ~15 seconds: the handoff
    fences it within the first second or two, so the window stays wide even on a loaded CI machine."""

    def __init__(self, source_cluster, target_cluster, pipeline: str, rng: PartitionRange):
        super().__init__(name="backfill", daemon=True)
        self.clusters, self.pipeline, self.rng = (source_cluster, target_cluster), pipeline, rng
        self.opened = threading.Event()
        self.error: BaseException | None = None
        self.trace = ""

    def run(self) -> None:
        source_cluster, target_cluster = self.clusters
        try:
            with WireClient.for_cluster(source_cluster.config) as source, \
                    WireClient.for_cluster(target_cluster.config) as target:
                store = CheckpointStore(target_cluster.config, target)
                copier = CheckpointedCopier(
                    source, target, store, pipeline=self.pipeline, owner="backfill:run-1", owner_epoch=0,
                    options=CopyOptions(fetch_max_bytes=32 * 1024, max_inflight_bytes=16 * 1024,
                                        throttle_bytes_per_s=45_000),
                    policy=CommitPolicy(commit_bytes=16 * 1024, commit_interval_ms=50))
                session = copier.open_lane(self.rng.topic, self.rng.partition, self.rng.target_topic,
                                           self.rng.target_partition)
                self.opened.set()
                session.copy(self.rng.start, self.rng.end)
        except BaseException as exc:  # noqa: BLE001 - the test inspects how the backfill ended
            self.error = exc
            self.trace = traceback.format_exc()
        finally:
            self.opened.set()


def _committed_position(target_cluster, pipeline: str, topic: str) -> int:
    with WireClient.for_cluster(target_cluster.config) as client:
        cp = CheckpointStore(target_cluster.config, client).read(pipeline, topic, 0)
    return -1 if cp is None else cp.position


def _wait_for_commit_past(target_cluster, pipeline: str, topic: str, position: int, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = _committed_position(target_cluster, pipeline, topic)
        if now > position:
            return now
        time.sleep(0.02)
    raise AssertionError(f"the backfill committed nothing past {position} within {timeout_s}s")


def test_a_handoff_racing_a_committing_backfill_hands_off_its_last_commit(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory, monkeypatch):  # noqa: F811
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    pipeline = f"race-{prefix.rsplit('.', 1)[-1]}"
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"%d:" % i + bytes(200)) for i in range(RECORDS)],
                           **{"batch.size": 4096, "linger.ms": 0})
    run_preflight(source_cluster.config, target_cluster.config, topic, target_topic=target_topic).raise_if_refused()
    with WireClient.for_cluster(source_cluster.config) as source:
        end = list_offsets(source, topic, 0, "last_stable")
    with WireClient.for_cluster(target_cluster.config) as client:
        CheckpointStore(target_cluster.config, client).ensure_topic()

    lane_id = lane_transactional_id(pipeline, default_lane(target_topic, 0))
    gap = {}

    class WriterThatLetsTheBackfillCommitFirst(BatchWriter):
        """The handoff's writer: before fencing, wait until the backfill has committed once more."""

        def init_producer_id(self):
            if self.transactional_id == lane_id:
                before = _committed_position(target_cluster, pipeline, topic)
                gap["commit_landed"] = _wait_for_commit_past(target_cluster, pipeline, topic, before)
            return super().init_producer_id()

    monkeypatch.setattr(handoff, "BatchWriter", WriterThatLetsTheBackfillCommitFirst)
    backfill = _Backfill(source_cluster, target_cluster, pipeline, PartitionRange(topic, 0, 0, end, target_topic, 0))
    backfill.start()
    assert backfill.opened.wait(30) and backfill.error is None, backfill.error
    _wait_for_commit_past(target_cluster, pipeline, topic, -1)  # the backfill has a checkpoint to hand off

    [handed] = handoff.hand_off(target_cluster.config, pipeline, topic, [0])
    backfill.join(60)
    assert not backfill.is_alive(), "the backfill did not stop after the handoff"
    assert isinstance(backfill.error, ProducerFencedError), \
        f"the backfill must end fenced by the handoff (handed off at {handed.position} of {end}, the backfill had " \
        f"committed {gap.get('commit_landed')}), not {backfill.error!r}:\n{backfill.trace}"
    assert handed.position < end, "the race happened while the backfill was still copying"

    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix))
    daemon = daemon_factory(config, "race-1").start()
    deadline = time.monotonic() + 120
    while checkpoints(target_cluster, pipeline)[(topic, 0)].position < end:
        assert "event=lane_halted" not in daemon.log_text(), \
            f"handed off at {handed.position}, the backfill had committed {gap['commit_landed']}:\n{daemon.tail()}"
        assert time.monotonic() < deadline, f"the daemon did not catch up:\n{daemon.tail()}"
        time.sleep(0.3)
    assert_exact(source_cluster, target_cluster, topic, target_topic)
    assert handed.position >= gap["commit_landed"], \
        f"the handoff wrote position {handed.position}, older than the backfill commit at {gap['commit_landed']}"
    rc, _ = daemon.terminate()
    assert rc == 0
