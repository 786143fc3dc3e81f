"""The versioned checkpoint format: today's values round-trip, older ones migrate, newer ones are refused."""

from __future__ import annotations

import json

import pytest

from mirror_core.errors import MirrorError
from mirror_core.model.lane_status import PersistedLaneState
from mirror_core.model.map_segments import SegmentChain
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.state.checkpoint import Checkpoint
from mirror_core.state.checkpoint_format import FORMAT_VERSION
from mirror_core.state.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG, checkpoint_topic_problems


def _checkpoint(**overrides) -> Checkpoint:
    omap = OffsetMap(120, 95, [OffsetRun(0, 50, 0), OffsetRun(60, 100, 51)], start=0)
    base = dict(pipeline="p", topic="orders", partition=3, position=120, target_topic="dr.orders",
                target_partition=3, target_next=95, owner="daemon", owner_epoch=2, offset_map=omap,
                source_topic_id="abc", handoff_position=60, updated_ms=1, position_epoch=7,
                target_topic_id="def", lost_ranges=((100, 120),))
    return Checkpoint(**{**base, **overrides})


def test_a_checkpoint_round_trips_with_every_format_3_field():
    cp = _checkpoint()
    again = Checkpoint.from_value(cp.to_value())
    assert again == cp
    assert json.loads(cp.to_value())["v"] == FORMAT_VERSION == 4
    assert (again.position_epoch, again.target_topic_id, again.lost_ranges) == (7, "def", ((100, 120),))


def test_lost_ranges_travel_with_the_offset_map_so_translation_declines_inside_them():
    cp = Checkpoint.from_value(_checkpoint().to_value())
    assert cp.offset_map.lost == ((100, 120),)
    assert cp.offset_map.translate(99) == 99 - 60 + 51
    assert cp.offset_map.translate(100) is None
    assert cp.offset_map.translate(119) is None
    assert cp.offset_map.translate(120) == 95


def test_a_format_2_checkpoint_written_by_the_previous_release_still_reads():
    body = json.loads(_checkpoint().to_value())
    for name in ("position_epoch", "target_topic_id", "lost_ranges", "lane_state", "map_segments",
                 "map_pruned_below"):
        body.pop(name)
    body["v"] = 2
    old = Checkpoint.from_value(json.dumps(body).encode())
    assert (old.position, old.target_next, old.owner_epoch) == (120, 95, 2)
    assert (old.position_epoch, old.target_topic_id, old.lost_ranges) == (None, None, ())
    assert old.offset_map.translate(60) == 51


def test_a_halted_lane_state_round_trips_and_format_3_reads_as_healthy():
    halted = PersistedLaneState("halted", "batch_rejected", "cluster 'target' rejected ...", 1234, 40, None)
    cp = _checkpoint(lane_state=halted)
    assert Checkpoint.from_value(cp.to_value()).lane_state == halted
    body = json.loads(_checkpoint().to_value())
    body.pop("lane_state")
    body["v"] = 3
    assert Checkpoint.from_value(json.dumps(body).encode()).lane_state is None


def test_a_format_3_checkpoint_reads_with_its_whole_map_and_no_segments():
    body = json.loads(_checkpoint().to_value())
    for name in ("map_segments", "map_pruned_below"):
        body.pop(name)
    body["v"] = 3
    old = Checkpoint.from_value(json.dumps(body).encode())
    assert (old.map_segments, old.map_pruned_below) == (None, None)
    assert old.offset_map == _checkpoint().offset_map


def test_a_format_4_checkpoint_value_carries_only_the_open_tail_and_the_chain():
    chain = SegmentChain(0, 60, 1, (0,))
    cp = _checkpoint(map_segments=chain, map_pruned_below=0)
    body = json.loads(cp.to_value())
    assert body["map_segments"] == [0, 60, 1]
    again = Checkpoint.from_value(cp.to_value())
    assert again.offset_map.start == 60 and again.offset_map.as_tuples() == [(60, 100, 51)]
    assert again.map_segments == chain and again.map_pruned_below == 0


@pytest.mark.parametrize("version", [1, 5, None, "3"])
def test_an_unknown_format_is_refused_by_name(version):
    body = json.loads(_checkpoint().to_value())
    body["v"] = version
    with pytest.raises(MirrorError, match="checkpoint format"):
        Checkpoint.from_value(json.dumps(body).encode())


def test_an_unknown_field_is_refused_by_name():
    body = json.loads(_checkpoint().to_value())
    body["surprise"] = 1
    with pytest.raises(MirrorError, match="surprise"):
        Checkpoint.from_value(json.dumps(body).encode())


@pytest.mark.parametrize(("configs", "named"), [
    ({"cleanup.policy": "delete", "max.message.bytes": "1048588"}, "cleanup.policy=delete"),
    ({"cleanup.policy": "compact,delete", "max.message.bytes": "1048588"}, "cleanup.policy=compact,delete"),
    ({"cleanup.policy": "compact", "max.message.bytes": "8192"}, "max.message.bytes=8192"),
])
def test_checkpoint_topic_settings_that_would_break_it_are_named(configs, named):
    (problem,) = checkpoint_topic_problems(configs)
    assert problem.startswith(named)


def test_min_insync_replicas_above_the_replication_factor_is_named():
    (problem,) = checkpoint_topic_problems({**CHECKPOINT_TOPIC_CONFIG, "min.insync.replicas": "2"}, 1)
    assert problem.startswith("min.insync.replicas=2 is above its replication factor (1)")
    assert checkpoint_topic_problems({**CHECKPOINT_TOPIC_CONFIG, "min.insync.replicas": "2"}, 3) == []


@pytest.mark.parametrize(("brokers", "replicas", "min_isr"), [(1, 1, "1"), (2, 2, "1"), (3, 3, "2"), (9, 3, "2")])
def test_a_new_checkpoint_topic_follows_the_cluster(brokers, replicas, min_isr):
    from mirror_core.state.checkpoint_topic import checkpoint_topic_settings

    rf, config = checkpoint_topic_settings(brokers)
    assert (rf, config["min.insync.replicas"]) == (replicas, min_isr)
    assert checkpoint_topic_problems(config, rf) == []


def test_the_settings_shoal_creates_the_topic_with_are_fine_and_its_records_fit_them():
    assert checkpoint_topic_problems(CHECKPOINT_TOPIC_CONFIG) == []
    assert checkpoint_topic_problems({**CHECKPOINT_TOPIC_CONFIG, "max.message.bytes": "16384"}) == []
    # a checkpoint with the largest open tail the segmenting allows stays below LARGEST_RECORD_BYTES
    import random

    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.model.map_segments import SEGMENT_RUNS, LaneMap
    from mirror_core.state.checkpoint import CheckpointStore

    rnd, lane_map, position, target = random.Random(3), LaneMap(tail_start=0), 0, 0
    store = CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "x:9092"}), None)
    for _ in range(20):
        for _ in range(rnd.randint(1, SEGMENT_RUNS)):
            start = position + rnd.randint(1, 1000)
            lane_map.tail_runs.append(OffsetRun(start, start + rnd.randint(1, 1000), target + rnd.randint(0, 9)))
            position, target = lane_map.tail_runs[-1].source_end, lane_map.tail_runs[-1].target_end
        commit = lane_map.commit(position=position, target_next=target)
        cp = _checkpoint(position=position, target_next=target, offset_map=commit.tail, map_segments=commit.chain,
                         lost_ranges=(), handoff_position=None)
        store.checkpoint_batches(cp, commit)  # raises if any record is above LARGEST_RECORD_BYTES
        lane_map.apply(commit)
