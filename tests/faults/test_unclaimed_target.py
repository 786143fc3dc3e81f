"""Hole: a lane with no checkpoint took its target partition as it found it. Rename a pipeline (or seed a topic
with ``shoal copy`` under another name, or lose ``__shoal_checkpoints``) and exactly-once copied everything again
after what the old name had copied, exit 0; a daemon starting "latest" skipped what lay in between. Now a lane's
first write refuses a target partition that already holds committed records (``TargetNotEmptyError``): ``shoal
copy`` fails naming cluster, partition and pipeline with nothing written, the daemon halts the lane, and ``shoal
lanes resume`` is the operator's recorded choice to append after what is there."""

from __future__ import annotations

import re
import time

import pytest

from tests.copy_helpers import shoal
from tests.integration.daemon.test_daemon import checkpoints, daemon_factory, free_port, write_pipeline

__all__ = ["daemon_factory"]  # the fixture, imported for pytest


def _copy(topic: str, pipeline: str, mode: str, *extra: str):
    return shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                 f"dr.{topic}", "--pipeline", pipeline, "--mode", mode, *extra)


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_a_renamed_pipeline_refuses_a_target_its_old_name_filled(source_cluster, target_cluster, unique_name, mode):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(60)])
    first = _copy(topic, f"old.{topic}", mode)
    assert first.returncode == 0, first.stderr
    copied = [r.value for r in target_cluster.read_all(f"dr.{topic}")]
    assert copied == [b"v%d" % i for i in range(60)]

    renamed = _copy(topic, f"new.{topic}", mode)
    assert renamed.returncode != 0, "a copy under a new name appended the source again after the old name's copy"
    said = renamed.stderr + renamed.stdout
    for fact in ("'target'", f"dr.{topic}-0", f"new.{topic}", "no checkpoint", "already holds committed records"):
        assert fact in said, f"{fact!r} missing from: {said}"
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == copied, "the refused copy wrote something"
    assert (topic, 0) not in checkpoints(target_cluster, f"new.{topic}")

    again = _copy(topic, f"old.{topic}", mode)  # the name that wrote them goes on as before
    assert again.returncode == 0, again.stderr
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == copied


def test_a_mode_none_copy_still_resumes_into_its_own_partial_target(source_cluster, target_cluster, unique_name):
    """``--mode none`` keeps no checkpoint: its printed ``--from N`` resume writes into a non-empty target on
    purpose, and is not refused."""
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(20)])  # two batches: 20 is a
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(20, 50)])  # batch boundary
    assert _copy(topic, f"p.{topic}", "none", "--to", "20").returncode == 0
    rest = _copy(topic, f"p.{topic}", "none", "--from", "20")
    assert rest.returncode == 0, rest.stderr
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == [b"v%d" % i for i in range(50)]


@pytest.mark.parametrize("new_partitions", ["earliest", "latest"])
def test_a_daemon_lane_without_checkpoint_halts_on_a_filled_target_and_resume_appends(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path, daemon_factory, new_partitions):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(40)])
    seeded = _copy(topic, f"seed.{topic}", "exactly-once")  # the target filled under another pipeline name
    assert seeded.returncode == 0, seeded.stderr
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(40, 55)])

    pipeline = f"daemon.{topic}"
    port = free_port()
    config = write_pipeline(tmp_path / "pipeline.yaml", sandbox, pipeline, re.escape(topic), metrics_port=port,
                            new_partitions=new_partitions)
    daemon = daemon_factory(config, "w1", port).start()
    deadline = time.monotonic() + 60
    while "event=lane_halted" not in daemon.log_text():
        assert daemon.alive and time.monotonic() < deadline, f"the lane never halted:\n{daemon.tail()}"
        time.sleep(0.5)
    line = next(line for line in daemon.log_text().splitlines() if "event=lane_halted" in line)
    assert "reason=foreign_write" in line and f"dr.{topic}-0" in line and "no checkpoint" in line, line
    status, body = daemon.get("/readyz")
    assert status == 503 and "foreign_write" in body, body
    time.sleep(2)  # halted for good: nothing written
    assert [r.value for r in target_cluster.read_all(f"dr.{topic}")] == [b"v%d" % i for i in range(40)]
    expected_start = 55 if new_partitions == "latest" else 0  # "latest": the source's end at first sight
    assert checkpoints(target_cluster, pipeline)[(topic, 0)].position == expected_start

    resumed = shoal("lanes", "resume", "--target", "target", "--pipeline", pipeline, "--topic", topic,
                    "--partition", "0", "--ledger-dir", str(tmp_path / "ledger"))
    assert resumed.returncode == 0, resumed.stderr
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(55, 60)])
    deadline = time.monotonic() + 60
    want = [b"v%d" % i for i in range(40)] + [b"v%d" % i for i in range(expected_start, 60)]
    while [r.value for r in target_cluster.read_all(f"dr.{topic}")] != want:
        assert daemon.alive and time.monotonic() < deadline, f"the resumed lane did not append:\n{daemon.tail()}"
        time.sleep(1)
    assert any((tmp_path / "ledger").iterdir()), "the operator's choice is in the ledger"
