"""Where each partition of a failed ``shoal copy --mode none`` got, and how to resume each one exactly.

Mode ``none`` keeps no checkpoint, so after a failure the copy's own results are the only record. Per lane
(:class:`~mirror_core.engine.concurrent_copy.ConcurrentCopy` lanes): ``CopyResult.source_end`` is the next source offset
after everything the target acknowledged (a share's batches count only once its write returned), and the round in
flight was dropped unread, so for a lane that was not writing when the copy failed it is exact. The lane that was
writing (``writing``: partition → the share's ``[start, end)`` and its batches' target spans) may have had a
prefix of that share's batches acknowledged by the broker before the error (the writer sends them in order): its
target end offset, read now, against the end its acknowledged writes account for (``target_before`` plus what it
copied) gives how many target offsets landed, and the share's batch spans turn that into the source offset to
resume at. When they do not add up to whole batches, the row says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mirror_core.kafka.list_offsets import list_offsets


def share_spans(batches: Sequence, start: int) -> list[tuple[int, int]] | None:
    """``(source next offset, target offsets it takes)`` of each data batch of a share, in order (pure); None when
    a batch's target span is not known from its header (legacy batches are re-encoded)."""
    from mirror_core.codec.batch_codec import BatchKind

    spans = []
    for view in batches:
        if view.next_offset <= start:
            continue
        kind = view.classify()
        if kind is BatchKind.LEGACY:
            return None
        if kind is not BatchKind.DATA:
            continue
        # copied whole, a batch takes lastOffsetDelta + 1 target offsets; one with compaction holes lands densely
        spans.append((view.next_offset, view.records_count if view.has_offset_holes else view.last_offset_delta + 1))
    return spans


def landed_position(spans: list[tuple[int, int]] | None, landed: int) -> int | None:
    """The source offset after the share's batches that account for exactly ``landed`` target offsets (pure);
    None when no prefix of whole batches does (or the spans are unknown)."""
    if spans is None:
        return None
    total = 0
    for next_offset, span in spans:
        total += span
        if total == landed:
            return next_offset
        if total > landed:
            return None
    return None


def lane_rows(lanes: Sequence, writing: Mapping[int, tuple], target_before: Mapping[int, int],
              target_now: Mapping[int, int | None]) -> list[dict]:
    """One row per lane: partition, planned range, next offset, records copied, state and a note (pure).

    ``next`` is where that partition's copy resumes exactly; None when it cannot be known (the note says why)."""
    rows = []
    for lane in lanes:
        rng, result = lane.range, lane.result
        p = rng.partition
        state, note, nxt = "complete", "", result.source_end
        if result.source_end < rng.end:
            state = "stopped"
            if p in writing:
                state = "FAILED"
                start, end, spans = writing[p]
                accounted = result.next_target_offset if result.next_target_offset is not None \
                    else target_before.get(rng.target_partition)
                now = target_now.get(rng.target_partition)
                where = f"writing [{start}, {end}) when it failed"
                if now is None or accounted is None:
                    nxt, note = None, f"{where}; the target's end could not be read: compare it before resuming"
                elif now == accounted:
                    note = f"{where}; nothing of it landed on the target"
                else:
                    nxt = landed_position(spans, now - accounted)
                    note = (f"{where}; {now - accounted} target offset(s) of it landed after "
                            f"{rng.target_topic}-{rng.target_partition} offset {accounted}")
                    if nxt is None:
                        note += f": not a whole number of its batches, compare the target before resuming at {start}"
                    elif nxt >= rng.end:  # all of it landed: the error was another partition's in the same
                        state = "complete"  # shared Produce request (mirror_core.kafka.shared_produce)
                        note = (f"all of [{start}, {end}) landed; the failed write it was part of carried "
                                "another partition's rejected batch")
        rows.append({"partition": p, "start": rng.start, "end": rng.end, "next": nxt,
                     "records": result.records, "state": state, "note": note})
    return rows


def resume_command(cmd, row: Mapping) -> str:
    """The ``shoal copy`` that copies exactly what this partition has left."""
    parts = ["shoal copy", f"--source {cmd.source.name}", f"--target {cmd.target.name}", f"--topic {cmd.topic}"]
    if cmd.target_topic != cmd.topic:
        parts.append(f"--target-topic {cmd.target_topic}")
    parts += [f"--partitions {row['partition']}", f"--from {row['next']}", f"--to {row['end']}", "--mode none"]
    if cmd.options.exact_bounds:
        parts.append("--exact-bounds")
    return " ".join(parts)


def print_stopped_copy(console, cmd, lanes: Sequence, writing: Mapping[int, tuple[int, int]], target,
                       target_before: Mapping[int, int]) -> None:
    """Print each partition's state and a resume command per unfinished partition (I/O: the target's ends)."""
    from rich.table import Table

    target_now: dict[int, int | None] = {}
    for lane in lanes:
        if lane.range.partition in writing:
            try:
                target_now[lane.range.target_partition] = list_offsets(target, lane.range.target_topic,
                                                                       lane.range.target_partition, "latest")
            except Exception:  # noqa: BLE001 - the target may be what failed; the row says it was not read
                target_now[lane.range.target_partition] = None
    rows = lane_rows(lanes, writing, target_before, target_now)
    table = Table(title=f"copy stopped: where each partition of {cmd.topic} got (--mode none keeps no checkpoint)")
    for col in ("partition", "planned range", "next offset", "records", "state", "note"):
        table.add_column(col, justify="right" if col in ("partition", "next offset", "records") else "left")
    for r in rows:
        table.add_row(str(r["partition"]), f"[{r['start']}, {r['end']})", "?" if r["next"] is None else str(r["next"]),
                      str(r["records"]),
                      r["state"], r["note"])
    console.print(table)
    for r in rows:
        if r["state"] != "complete" and r["next"] is not None:
            console.print(f"resume {cmd.topic}-{r['partition']}: {resume_command(cmd, r)}", highlight=False,
                          soft_wrap=True)
