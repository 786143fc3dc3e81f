"""Hole: an at-least-once lane wrote through an idempotent producer without a transactional.id, so nothing but the
membership kept a former holder from writing. A daemon paused past its membership (GC, SIGSTOP, a VM freeze) and
resumed kept writing the lane next to the daemon that had taken it over: both wrote the target partition,
interleaved. Now at-least-once lanes hold the lane's transactional.id and fence the lane's partitions at open, so the
broker refuses the resumed holder's writes (INVALID_PRODUCER_EPOCH) and it drops the lane as fenced.

The contention is real: two daemon processes share the pipeline through its daemon group; the one holding the lane
is stopped with SIGSTOP mid-stream until the group's session timeout expires it and the other takes over, then
continued with SIGCONT — twice, each way round.
"""

from __future__ import annotations

import re
import signal
import time

from tests.integration.daemon.test_daemon import (  # noqa: F401 - daemon_factory is a fixture
    QUICK_GROUP,
    LoadProducer,
    contents,
    daemon_factory,
    held_lanes,
    include_prefix,
    quick_group_source,
    wait_caught_up,
    wait_for,
    write_pipeline,
)

COMMIT_BYTES = 64 * 1024
# a resumed holder's write refused by the broker: the lane dropped as fenced, or — when the group round dropped the
# lane (its assignment lost) while the write was on its way — the refused write reported with the discarded result
FENCED_WRITE = re.compile(r"reason=fenced: writer|event=lane_result_discarded .*error=ProducerFencedError: writer")


def _contiguous_runs(target: list, source: list) -> list[tuple[int, int]]:
    """The target as [start, end) slices of the source, each continuing the previous one or restarting earlier.
    Raises if a target record is not where the source continues or a slice skips ahead (a gap)."""
    index = {record: i for i, record in enumerate(source)}
    runs: list[list[int]] = []
    for record in target:
        i = index[record]
        if runs and i == runs[-1][1]:
            runs[-1][1] += 1
            continue
        assert not runs or i < runs[-1][1], f"gap: the target jumps from source {runs[-1][1]} to {i}"
        runs.append([i, i + 1])
    return [tuple(run) for run in runs]


def _copying(log: str, lane: str) -> bool:
    """Whether the daemon's log shows it holding ``lane`` now and having copied since it took it."""
    acquired = log.rfind(f"event=lane_acquired lane={lane} ")
    return acquired > log.rfind(f"event=lane_dropped lane={lane} ") and log.find("event=copied", acquired) > 0


def _pause_holder_until_taken_over(daemons: dict, source_cluster, pipeline: str, lane: str) -> str:
    """SIGSTOP the lane's holder until the other daemon holds the lane and copied, then SIGCONT it. The holder is
    the member the group assigned the lane to *and* whose own log shows it copying the lane: a member assigned the
    lane a moment ago may not have taken it yet, and pausing that one pauses no writer (it then never drops a lane
    it never held, and the assertions below would blame it)."""
    def copying_holder():
        holder = (held_lanes(source_cluster, pipeline) or {}).get(lane)
        return holder if holder is not None and _copying(daemons[holder].log_text(), lane) else None

    holder = wait_for(copying_holder, 30, "a holder copying the lane", daemons=tuple(daemons.values()))
    other = next(d for name, d in daemons.items() if name != holder)
    copied_before = other.log_text().count("event=copied")
    daemons[holder].proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: other.log_text().count("event=copied") > copied_before + 2, 30,
                 "the other daemon taking the lane over and copying", daemons=(other,))
    finally:
        daemons[holder].proc.send_signal(signal.SIGCONT)
    return holder


def test_two_at_least_once_daemons_contending_for_a_lane_never_interleave(
        sandbox, quick_group_source, target_cluster, unique_name, tmp_path, daemon_factory):  # noqa: F811
    source_cluster = quick_group_source
    prefix = unique_name()
    topic, target_topic = f"{prefix}.t", f"dr.{prefix}.t"
    source_cluster.create_topic(topic)
    pipeline = f"alo-{prefix.rsplit('.', 1)[-1]}"
    config = write_pipeline(tmp_path / "p.yaml", sandbox, pipeline, include_prefix(prefix), mode="at-least-once",
                            commit_bytes=COMMIT_BYTES, **QUICK_GROUP)  # paused past the session
    load = LoadProducer(source_cluster, [topic], rate=400, txn_every_s=1.0, seed=44, value_bytes=(50, 200))
    load.start()
    # both daemons start together: their first runs race before the lane has any checkpoint (each writes a
    # first checkpoint before its first batch, so whichever loses is judged by the landing rule like any other)
    lane = f"{target_topic}-0"
    try:
        daemons = {name: daemon_factory(config, name).start() for name in ("alo-a", "alo-b")}
        # a resumed holder either writes first (and the broker fences it) or learns first that the group took its
        # assignment (its poll thread runs beside the copy): which comes first is timing; pause again (at most 5
        # times) until the broker fence has been exercised, or the last assertion below fails
        paused = []
        while len(paused) < 2 or (len(paused) < 5 and not any(
                FENCED_WRITE.search(daemons[name].log_text()) for name in paused)):
            paused.append(_pause_holder_until_taken_over(daemons, source_cluster, pipeline, lane))
            time.sleep(3)  # the resumed daemon runs on: it either writes (and is fenced) or sees its assignment lost
    finally:
        load.stop()
    wait_caught_up(source_cluster, target_cluster, pipeline, {topic: 1}, daemons=tuple(daemons.values()))

    source = [c for _p, c in contents(source_cluster, topic)]
    target = [c for _p, c in contents(target_cluster, target_topic)]
    runs = _contiguous_runs(target, source)
    assert runs[0][0] == 0 and max(end for _s, end in runs) == len(source), "everything copied, from the start"
    rewinds = [previous_end - start for (_s, previous_end), (start, _e) in zip(runs, runs[1:], strict=False)]
    logs = {name: d.log_text() for name, d in daemons.items()}
    reported = sum(int(n) for text in logs.values()
                   for n in re.findall(r"at-least-once resume found (\d+) record", text))
    assert len(rewinds) <= len(paused), f"interleaved writers: the target restarts {len(rewinds)} times: {runs}"
    assert sum(rewinds) == reported, f"duplicates {rewinds} not all reported ({reported})"
    per_window = COMMIT_BYTES // 50 + 64  # smallest record plus the flush that crossed the window
    assert all(r <= per_window for r in rewinds), f"more than one commit window re-copied: {rewinds}"
    for name in set(paused):
        dropped = rf"event=lane_dropped lane={re.escape(lane)} reason=(fenced|revoked by the group|not assigned)"
        assert re.search(dropped, logs[name]), \
            f"{name} resumed as a former holder without dropping the lane:\n{daemons[name].tail()}"
    fenced_by_broker = [name for name in paused if FENCED_WRITE.search(logs[name])]
    print(f"paused {paused}; fenced by the broker: {fenced_by_broker}; rewinds {rewinds}, reported {reported}")
    assert fenced_by_broker, "no resumed holder tried to write (the broker fence was not exercised)"
    assert all(d.alive for d in daemons.values())
