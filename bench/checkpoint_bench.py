"""Checkpoint commit benchmark: per-round commit CPU against the number of runs the offset map already holds.

A lane of a source partition with one transaction per record adds a run of its offset map per record, for ever.
This measures what the lane's commit path costs per round — the CPU Shoal spends turning a round's new runs into
the records it writes to the checkpoint topic — as the map grows from a thousand runs to a million:

- ``segmented`` (format 4, today): the round's new runs are appended to the open tail, :meth:`LaneMap.commit`
  decides (seal the tail into segment records when it is full), the :class:`Checkpoint` is built and every record
  of the commit encoded (:meth:`CheckpointStore.checkpoint_batches`), then :meth:`LaneMap.apply`.
- ``whole map`` (format 3, before): the whole map rebuilt from every run and re-encoded into the checkpoint value,
  as every commit used to do (and the value size, which the broker's ``max.message.bytes`` bounds).

The map is built the way a long-running lane builds it (irregular runs: records and markers of concurrent
transactional producers interleaved at random), committed round by round, so the segment records are real. Pure
CPU: no brokers; ``time.process_time`` per round. Not a timed test: a figure to read.

    .venv/bin/python -m bench.checkpoint_bench [--sizes 1000,10000,100000,1000000] [--rounds 200]

Results go to ``bench/results/checkpoint-<time>.json`` and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from mirror_core.config.cluster import ClusterConfig
from mirror_core.model.map_segments import LaneMap
from mirror_core.model.offset_map import OffsetMap
from mirror_core.model.offset_runs import OffsetRun
from mirror_core.state.checkpoint import Checkpoint, CheckpointStore

RESULTS = Path(__file__).resolve().parent / "results"
RUNS_PER_ROUND = 20  # a commit interval of a lane with ~20 source transactions per second


class SyntheticLane:
    """A lane's map state and the source/target offsets a copy would have reached."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        self.lane_map = LaneMap(tail_start=0)
        self.position = self.target_next = 0
        self.store = CheckpointStore(ClusterConfig("target", {"bootstrap.servers": "unused:9092"}), None)
        self.all_runs: list[OffsetRun] = []  # the whole map, kept only for the "before" measurement

    def add_runs(self, n: int) -> None:
        for _ in range(n):
            length = self.random.choice((1, 1, 1, 2, 3))
            start = self.position + self.random.choice((1, 1, 2, 3))  # markers of interleaved transactions
            run = OffsetRun(start, start + length, self.target_next)
            self.lane_map.tail_runs.append(run)
            self.all_runs.append(run)
            self.position, self.target_next = start + length, self.target_next + length

    def commit(self) -> int:
        """One round's commit; returns the bytes of the records it writes."""
        commit = self.lane_map.commit(position=self.position, target_next=self.target_next)
        checkpoint = Checkpoint(pipeline="bench", topic="orders", partition=0, position=self.position,
                                target_topic="dr.orders", target_partition=0, target_next=self.target_next,
                                owner="daemon", owner_epoch=1, offset_map=commit.tail, map_segments=commit.chain)
        written = sum(len(b.data) for b in self.store.checkpoint_batches(checkpoint, commit))
        self.lane_map.apply(commit)
        return written


def _whole_map_commit(runs: list[OffsetRun], position: int, target_next: int) -> int:
    """What a commit cost before: the whole map rebuilt and encoded into the checkpoint value."""
    omap = OffsetMap.from_runs(runs, start=0, position=position, target_next=target_next)
    checkpoint = Checkpoint(pipeline="bench", topic="orders", partition=0, position=position,
                            target_topic="dr.orders", target_partition=0, target_next=target_next, owner="daemon",
                            owner_epoch=1, offset_map=omap)
    return len(checkpoint.to_value())


def measure(size: int, rounds: int, seed: int) -> dict:
    lane = SyntheticLane(seed)
    while len(lane.all_runs) < size:  # grown the way a lane grows it: committed round after round
        lane.add_runs(min(1000, size - len(lane.all_runs)))
        lane.commit()
    segmented, written = [], []
    for _ in range(rounds):
        lane.add_runs(RUNS_PER_ROUND)
        started = time.process_time()
        written.append(lane.commit())
        segmented.append(time.process_time() - started)
    whole, whole_bytes = [], 0
    merged = OffsetMap.from_runs(lane.all_runs, start=0, position=lane.position, target_next=lane.target_next).runs
    for _ in range(max(3, rounds // 20)):
        started = time.process_time()
        whole_bytes = _whole_map_commit(list(merged), lane.position, lane.target_next)
        whole.append(time.process_time() - started)
    return {"runs": len(merged), "segments": len(lane.lane_map.segments), "rounds": rounds,
            "segmented_us_median": statistics.median(segmented) * 1e6,
            "segmented_us_p99": sorted(segmented)[int(len(segmented) * 0.99) - 1] * 1e6,
            "segmented_bytes_per_round": statistics.mean(written),
            "whole_map_us_median": statistics.median(whole) * 1e6, "whole_map_value_bytes": whole_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="runs already in the map")
    parser.add_argument("--rounds", type=int, default=200, help="commit rounds measured per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", help="results file name (default checkpoint-<time>)")
    args = parser.parse_args(argv)
    rows = [measure(int(size), args.rounds, args.seed) for size in args.sizes.split(",")]
    print("| runs in map | segments | commit CPU µs/round (median, p99) | bytes written/round | "
          "before: whole-map commit µs | before: checkpoint value bytes |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['runs']:,} | {r['segments']:,} | {r['segmented_us_median']:.0f}, {r['segmented_us_p99']:.0f} "
              f"| {r['segmented_bytes_per_round']:.0f} | {r['whole_map_us_median']:.0f} "
              f"| {r['whole_map_value_bytes']:,} |")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{args.name or time.strftime('checkpoint-%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"machine": platform.platform(), "runs_per_round": RUNS_PER_ROUND, "rows": rows},
                               indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
