"""Hole: one damaged batch in one partition of the checkpoint topic stopped the whole daemon, silently.

The checkpoint reader checks every batch's CRC (a checkpoint changed on disk must not move a lane), so a damaged
batch stops every read of its partition: no value stored there can be trusted past it. But the daemon's group
round reads the whole topic (which lanes are handed off, halted, resumed), and that read failed as a whole: every
round ended in ``leases_failed``, a restarted daemon held no lane at all — the lanes whose checkpoints live in the
seven intact partitions copied nothing — and ``/readyz`` said nothing. Now the round reads what it can: the lanes
stored in the damaged partition halt (reason ``corrupt_batch``, the message naming the checkpoint topic, partition
and offset; ``/readyz`` 503), every other lane copies on. When the partition reads again (the operator restored the
replica), those lanes resume by themselves.

The target is a private broker, so the checkpoint topic's segment can be damaged in place; the daemon is restarted
after the damage (a running daemon's cache has already read past it and would only read what is appended)."""

from __future__ import annotations

import json
import urllib.error
from collections import Counter

import pytest

from mirror_core.codec.batch_codec import walk_batches
from mirror_core.config.names import CHECKPOINT_TOPIC
from mirror_core.state.checkpoint import CHECKPOINT_PARTITIONS, checkpoint_key, checkpoint_partition
from tests.faults.disk_edits import first_segment, overwrite
from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    daemon_factory,
    free_port,
    include_prefix,
    source_ends,
    wait_for,
    write_pipeline,
)
from tests.kafka_helpers import private_broker

PARTITIONS = 4


@pytest.fixture(scope="module")
def disk_target(session_sandbox, tmp_path_factory):
    session_sandbox.ensure("source")
    with private_broker("damaged-checkpoint-target", tmp_path_factory) as cluster:
        yield cluster


def _stored_in(pipeline: str, topic: str) -> dict[int, int]:
    """source partition → the checkpoint topic partition its lane's checkpoint lives in."""
    return {p: checkpoint_partition(checkpoint_key(pipeline, topic, p), CHECKPOINT_PARTITIONS)
            for p in range(PARTITIONS)}


def _damage_first_batch(cluster, partition: int) -> int:
    """Flip one bit in the last byte of the first batch of the checkpoint topic's ``partition`` (inside its
    records, under the CRC, which is left as it was); returns that batch's base offset."""
    segment = first_segment(cluster, CHECKPOINT_TOPIC, partition)
    data = segment.read_bytes()
    first = walk_batches(data)[0][0]
    overwrite(segment, first.size - 1, bytes([data[first.size - 1] ^ 0x01]))
    return first.base_offset


def _lanes(daemon) -> tuple[int, dict]:
    try:
        status, body = daemon.get("/readyz")
    except urllib.error.URLError:  # not listening yet
        return 0, {}
    return status, {(lane["topic"], lane["partition"]): lane for lane in json.loads(body)["lanes"]}


@pytest.mark.timeout(300)
def test_a_damaged_checkpoint_partition_halts_its_lanes_and_not_the_others(
        sandbox, source_cluster, disk_target, unique_name, tmp_path, daemon_factory):  # noqa: F811
    prefix = unique_name()
    topic = f"{prefix}.orders"
    # a pipeline name whose lanes do not all share one checkpoint partition (8 partitions, 4 lanes: almost any)
    pipeline = next(name for name in (f"dcp-{prefix.rsplit('.', 1)[-1]}-{i}" for i in range(100))
                    if len(set(_stored_in(name, topic).values())) >= 3)
    stored = _stored_in(pipeline, topic)
    damaged = stored[0]
    hit = sorted(p for p, part in stored.items() if part == damaged)      # lane 0 and any sharing its partition
    intact = sorted(p for p in range(PARTITIONS) if p not in hit)
    source_cluster.create_topic(topic, partitions=PARTITIONS)

    def produce(tag: bytes, count: int) -> None:
        for p in range(PARTITIONS):
            source_cluster.produce(topic, [(b"%s%d-%d" % (tag, p, i), b"v" * 100) for i in range(count)],
                                   partition=p)

    def copied() -> Counter:
        return Counter(r.partition for r in disk_target.read_all(f"dr.{topic}", timeout_s=30))

    produce(b"a", 20)
    port = free_port()
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), metrics_port=port,
                            target={"bootstrap.servers": disk_target.config.settings["bootstrap.servers"]},
                            config_sync_interval_s=3600, stall_after_s=30)
    daemon = daemon_factory(config, "dcp-1", port).start()
    wait_for(lambda: copied() == Counter({p: 20 for p in range(PARTITIONS)}), 90, "the first copy",
             daemons=(daemon,))
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()

    bad_offset = _damage_first_batch(disk_target, damaged)
    produce(b"b", 15)
    daemon.start()

    # every lane stored in an intact partition copies on
    want = {p: 35 if p in intact else 20 for p in range(PARTITIONS)}
    wait_for(lambda: {p: n for p, n in copied().items() if p in intact} == {p: 35 for p in intact}, 90,
             f"the lanes stored in intact checkpoint partitions ({intact}) to copy on", daemons=(daemon,))
    # the lanes stored in the damaged one halt, saying where and why
    status, lanes = wait_for(lambda: (lambda s, found: (s, found) if all(
        found.get((topic, p), {}).get("state") == "halted" for p in hit) else None)(*_lanes(daemon)), 60,
        f"lanes {hit} to halt", daemons=(daemon,))
    assert status == 503
    for p in hit:
        lane = lanes[(topic, p)]
        assert lane["reason"] == "corrupt_batch", lane
        assert f"{CHECKPOINT_TOPIC}-{damaged}" in lane["message"] and f"offset {bad_offset}" in lane["message"], lane
    for p in intact:
        assert lanes[(topic, p)]["state"] == "copying", lanes[(topic, p)]
    log = daemon.log_text()
    assert "event=lane_halted" in log and f"topic={topic} partition=0" in log and "reason=corrupt_batch" in log
    assert copied() == Counter(want), "nothing more and nothing less: the halted lanes copied nothing past the damage"

    # the replica restored (the bit flipped back): the halted lanes resume by themselves, exactly where they were
    _damage_first_batch(disk_target, damaged)
    wait_for(lambda: copied() == Counter({p: 35 for p in range(PARTITIONS)}), 90,
             f"lanes {hit} to resume once their checkpoint partition reads again", daemons=(daemon,))
    assert source_ends(source_cluster, topic, PARTITIONS) == {p: 35 for p in range(PARTITIONS)}
    assert f"event=lane_resumed topic={topic} partition=0" in daemon.log_text()
    rc, _ = daemon.terminate()
    assert rc == 0, daemon.tail()
