"""``shoal lanes status|resume`` and ``shoal mirror status``: the daemon's lanes as stored (state, reason, offsets),
resuming a halted lane, and the daemon group's members with who holds which lane and each lane's lag.

Exit code 1 when a lane is halted or stalled, so scripts can alert.
"""

from __future__ import annotations

import argparse
import json

from mirror_core.cli.clusters import resolve_cluster


def run_lanes(args: argparse.Namespace, sandbox, console) -> int:
    from mirror_core.state.lane_control import lane_states, resume_lane

    target = resolve_cluster(args.target, sandbox, role="target")
    if args.action == "status":
        return _print_lanes(console, lane_states(target, args.pipeline), args.json)
    source = resolve_cluster(args.source, sandbox, role="source") if args.source else None
    decision = resume_lane(target, args.pipeline, args.topic, args.partition, ledger_dir=args.ledger_dir,
                           accept_loss=args.accept_loss, source=source,
                           transactional=args.mode == "exactly-once")
    cp, halt = decision.checkpoint, decision.previous
    what = (f"offsets [{decision.lost_range[0]}, {decision.lost_range[1]}) recorded as lost"
            if decision.lost_range else "resumed")
    console.print(f"{args.topic}-{args.partition}: {what}; it had halted ({halt.reason}): {halt.message}; the daemon "
                  f"continues at {cp.position}" + (" (lane retired)" if cp.lane_state else "") +
                  f"; ledger: {decision.ledger_path}", highlight=False, soft_wrap=True)
    return 0


def run_mirror_status(args: argparse.Namespace, console) -> int:
    """The daemon group's members and who holds which lane (from the source), each lane's state and lag (from the
    checkpoints and the source), merged with the live states of a daemon whose /readyz answers on this machine."""
    import urllib.error
    import urllib.request

    from mirror_core.config.pipeline_file import load_pipeline_config
    from mirror_core.services.mirror_status import gather_mirror_status

    config = load_pipeline_config(args.config)
    status = gather_mirror_status(config)
    rows = {row["lane"]: row for row in status.lanes}
    if config.metrics_port:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{config.metrics_port}/readyz", timeout=5) as resp:
                live = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            live = json.loads(exc.read())
        except OSError:
            live = {"lanes": []}
        for lane in live["lanes"]:
            row = rows.setdefault(lane["lane"], {"lane": lane["lane"]})
            row.update({k: lane[k] for k in ("topic", "partition", "state", "reason", "message", "since_ms",
                                              "position", "range_end", "attempts")})
    if not args.json:
        _print_group(console, config, status)
    return _print_lanes(console, sorted(rows.values(), key=lambda r: r["lane"]), args.json, extra=not args.json)


def _print_group(console, config, status) -> None:
    group = status.group
    if group is None:
        console.print(f"daemon group of pipeline {config.pipeline!r}: not readable: {status.group_error}",
                      highlight=False, soft_wrap=True)
        return
    console.print(f"daemon group {group.group} on cluster {config.source.name!r}: protocol {group.protocol}, "
                  f"state {group.state}, {len(group.members)} member(s)", highlight=False, soft_wrap=True)
    for member in group.members:
        console.print(f"  {member.worker} ({member.host}): {len(member.partitions)} partition(s) "
                      f"{', '.join(f'{t}-{p}' for t, p in member.partitions) or '-'}", highlight=False,
                      soft_wrap=True)


def _print_lanes(console, rows: list[dict], as_json: bool, *, extra: bool = False) -> int:
    """Exit code 1 when a lane is halted or stalled, so scripts can alert. ``extra``: holder and lag columns."""
    from rich.table import Table

    from mirror_core.model.lane_status import NOT_READY

    if as_json:
        console.print_json(json.dumps(rows))
    else:
        table = Table(title="Shoal lanes")
        columns = ["lane", "source partition", "state", "reason", "position", "range end", "attempts", "detail"]
        if extra:
            columns[3:3] = ["holder", "lag"]
        for col in columns:
            table.add_column(col)
        for r in rows:
            cells = [r["lane"], f"{r.get('topic')}-{r.get('partition')}", r.get("state", "-"), r.get("reason", "-"),
                     str(r.get("position")), str(r.get("range_end") or "-"), str(r.get("attempts", "-")),
                     r.get("message") or ""]
            if extra:
                unknown = r.get("lag_unknown")
                cells[3:3] = [r.get("holder") or "-",
                              ("unknown" if unknown else "-") if r.get("lag") is None else str(r["lag"])]
                if unknown:   # the source's answer for the partition (a deleted topic, a silent broker)
                    cells[-1] = "; ".join(filter(None, [cells[-1], f"lag unknown: {unknown}"]))
            table.add_row(*cells)
        console.print(table)
    return 1 if any(r.get("state") in NOT_READY for r in rows) else 0
