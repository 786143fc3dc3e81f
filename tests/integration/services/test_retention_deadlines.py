"""Retention deadlines against real brokers: a paused mirror on a short-retention topic goes SAFE → AT_RISK → LOST
as the broker deletes segments, on time, and the LOST report names exactly the deleted offsets; and ``shoal
deadlines`` (table, JSON, charts, exit status) on real topics."""

from __future__ import annotations

import argparse
import io
import json
import threading
import time

from PIL import Image
from rich.console import Console

from mirror_core.cli import deadlines_command
from mirror_core.kafka.retention_inputs import gather_inputs
from mirror_core.model.copy_capacity import CopyCapacity
from mirror_core.model.retention import LossCause, Status, assess_partitions
from mirror_core.services.deadlines_report import CHART_WIDTH_PX, COLOURS, chart_height_px
from tests.unit.model.test_retention_report import _runs as colour_runs

RETENTION_MS = 12_000
SEGMENT_MS = 3_000
AT_RISK_BELOW_S = 6.0


class TickingProducer:
    """Produces one record every ``every_s`` with an explicit CreateTime, remembering each offset's timestamp."""

    def __init__(self, cluster, topic: str, every_s: float = 0.25):
        from confluent_kafka import Producer

        self.topic, self.every_s = topic, every_s
        self.stamps: dict[int, int] = {}
        self._producer = Producer(cluster.config.confluent(**{"enable.idempotence": True, "linger.ms": 0}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def send(self, count: int = 1) -> None:
        ts = int(time.time() * 1000)
        for i in range(count):
            self._producer.produce(self.topic, key=b"k%d" % i, value=b"x" * 200, partition=0, timestamp=ts,
                                   on_delivery=self._delivered)
        assert self._producer.flush(10) == 0

    def _delivered(self, err, msg) -> None:
        assert err is None, err
        self.stamps[msg.offset()] = msg.timestamp()[1]

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.send()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def test_paused_mirror_goes_safe_at_risk_lost_on_time(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 1, {"retention.ms": str(RETENTION_MS),
                                                           "segment.ms": str(SEGMENT_MS)})
    copy = CopyCapacity(10e6)   # the mirror would copy fast; it is paused at offset 0
    history = []
    producer = TickingProducer(source_cluster, topic)
    producer.send(10)                                     # offsets 0..9, one batch, the oldest unmirrored data

    def sample() -> Status:
        inputs = gather_inputs(source_cluster.config, {topic: [0]}, {(topic, 0): 0})
        (verdict,) = assess_partitions(inputs.snapshots, inputs.topics, copy, at_risk_below_s=AT_RISK_BELOW_S,
                                       check_interval_ms=inputs.check_interval_ms)
        history.append((time.time(), verdict, inputs.check_interval_ms))
        return verdict.status

    first_ts = producer.stamps[0]
    sample()                                              # before the ticks: the probe sees the first batch alone
    with producer:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and sample() is not Status.LOST:
            time.sleep(0.2)
    trace = [(round(at - first_ts / 1000, 2), v.status.value, round(v.time_to_loss_s, 2), v.log_start,
              v.deletion_window_s and tuple(round(x, 2) for x in v.deletion_window_s)) for at, v, _ in history]
    statuses = [v.status for _, v, _ in history]
    assert statuses[0] is Status.SAFE and Status.AT_RISK in statuses and statuses[-1] is Status.LOST, trace
    severities = [s.severity for s in statuses]
    assert severities == sorted(severities), trace          # never back to a milder verdict
    check_s = history[0][2] / 1000
    assert check_s == 1.0                                    # the sandbox's fast retention check

    # When: the first prediction is a lower bound, at most one retention check plus one segment roll early
    observed_at, lost, _ = history[-1]
    last_seen_at = history[-2][0]                            # the deletion happened between these two polls
    first = history[0][1]
    assert first.loss_cause is LossCause.TIME
    predicted = first.deletion_at_ms() / 1000
    assert predicted == (first_ts + RETENTION_MS) / 1000
    assert observed_at >= predicted, trace
    assert last_seen_at <= predicted + check_s + SEGMENT_MS / 1000, trace
    latest = first.observed_at_ms / 1000 + first.deletion_window_s[1]
    assert last_seen_at <= latest, trace
    # once the segment has rolled, the probe sees its end and the prediction is exact up to one retention check
    exact = [v for _, v, _ in history[:-1] if v.deletion_window_s and
             v.deletion_window_s[1] - v.deletion_window_s[0] <= check_s + 1e-6]
    assert exact, trace                                       # the probe saw the end of the oldest segment
    exact_at = exact[-1].deletion_at_ms() / 1000
    assert exact_at > predicted, trace                        # later records in the segment pushed it out
    # (slack for our polls and a busy broker's scheduler: other suites share the sandbox)
    assert exact_at - 0.01 <= observed_at and last_seen_at <= exact_at + check_s + 1.0, trace

    # What: exactly the first segment, i.e. every offset before the first record more than segment.ms after it
    first_kept = min(o for o, ts in producer.stamps.items() if ts - first_ts > SEGMENT_MS)
    assert lost.lost_range == (0, first_kept) and lost.log_start == first_kept, (trace, producer.stamps)
    assert lost.lost_records == first_kept and lost.time_to_loss_s == 0
    assert f"[0, {first_kept})" in lost.remedy.text
    readable = source_cluster.read_all(topic)
    assert readable[0].offset >= first_kept                  # nothing below the reported range is readable


def _deadlines(sandbox, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="shoal")
    deadlines_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["deadlines", *argv])
    console = Console(file=io.StringIO(), width=250, color_system=None)
    code = deadlines_command.run(args, sandbox, console)
    return code, console.file.getvalue()


def test_shoal_deadlines_json_table_and_charts(sandbox, source_cluster, unique_name, tmp_path):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    plain = source_cluster.create_topic(unique_name("plain"), 2, {"retention.ms": "3600000"})
    compacted = source_cluster.create_topic(unique_name("compact"), 1, {"cleanup.policy": "compact",
                                                                        "delete.retention.ms": "3600000"})
    for topic, partition in ((plain, 0), (plain, 1), (compacted, 0)):
        source_cluster.produce(topic, [(b"k%d" % i, b"v" * 100) for i in range(20)], partition=partition)
    # partition 1 of the plain topic: delete offsets below 5 behind a mirror paused at 0
    admin = AdminClient(source_cluster.config.confluent())
    futures = admin.delete_records([TopicPartition(plain, 1, 5)])
    for f in futures.values():
        f.result(30)
    positions = tmp_path / "positions.json"
    positions.write_text(json.dumps({plain: {"0": 3, "1": 0}}))
    png, html = tmp_path / "deadlines.png", tmp_path / "deadlines.html"

    code, out = _deadlines(sandbox, "--source", "source", "--topic", plain, "--topic", compacted,
                           "--positions", str(positions), "--sample-seconds", "0", "--at-risk-below", "10m",
                           "--throughput", "5", "--json", "--chart", str(png), "--chart", str(html),
                           "--fail-on", "LOST")
    assert code == deadlines_command.EXIT_DEADLINE, out
    report = json.loads(out)
    rows = {(r["topic"], r["partition"]): r for r in report["partitions"]}
    assert set(rows) == {(plain, 0), (plain, 1), (compacted, 0)}
    lost = report["partitions"][0]
    assert (lost["topic"], lost["partition"], lost["status"]) == (plain, 1, "LOST")
    assert lost["lost_range"] == [0, 5] and lost["log_start"] == 5
    assert rows[(plain, 0)]["status"] == "SAFE" and rows[(plain, 0)]["position"] == 3
    assert rows[(plain, 0)]["loss_cause"] == "retention.ms" and 3500 < rows[(plain, 0)]["time_to_loss_s"] <= 3600
    assert rows[(plain, 0)]["unmirrored_records"] == 17 and rows[(plain, 0)]["unmirrored_bytes"] > 0
    assert rows[(plain, 1)]["unmirrored_records"] == 15 and rows[(plain, 1)]["lost_records"] == 5
    # compacted, nothing mirrored (no position given): tombstones at risk after delete.retention.ms, SAFE for now
    assert rows[(compacted, 0)]["position"] == 0 and rows[(compacted, 0)]["loss_cause"] == "delete.retention.ms"
    assert rows[(compacted, 0)]["status"] == "SAFE" and 3500 < rows[(compacted, 0)]["time_to_loss_s"] <= 3600
    assert report["counts"] == {"SAFE": 2, "AT_RISK": 0, "LOSING": 0, "LOST": 1}

    img = Image.open(png)
    assert img.size == (CHART_WIDTH_PX, chart_height_px(3))
    bar_rows = {s: [y for y, n in colour_runs(img, COLOURS[s]).items() if n > 60] for s in Status}
    assert bar_rows[Status.LOST] and bar_rows[Status.SAFE] and not bar_rows[Status.AT_RISK]
    assert max(bar_rows[Status.LOST]) < min(bar_rows[Status.SAFE])       # LOST on top
    assert "LOST [0, 5)" in html.read_text()

    code, out = _deadlines(sandbox, "--source", "source", "--topic", plain, "--partitions", "0",
                           "--positions", str(positions), "--sample-seconds", "1", "--at-risk-below", "10m",
                           "--fail-on", "AT_RISK")
    assert code == 0, out
    assert f"{plain}-0" in out and "SAFE" in out and f"{plain}-1" not in out
    assert "1 SAFE, 0 AT_RISK, 0 LOSING, 0 LOST" in out
