"""``shoal mirror status`` against real brokers: each lane's lag, and why a lag cannot be shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import yaml

from tests.copy_helpers import ROOT, shoal


def test_a_deleted_source_topic_shows_why_its_lag_is_unknown_and_the_other_lanes_lag(
        sandbox, source_cluster, target_cluster, unique_name, tmp_path):
    """A lane whose source topic is gone showed lag "-" with no word why, as a lane not yet measured does; the
    operator could not tell a deleted topic from a silent source. Now the source's answer is named, and the other
    lanes' lag is still shown."""
    kept, deleted = unique_name("kept"), unique_name("gone")
    pipeline = f"status-{kept.rsplit('.', 1)[-1]}"
    for topic, records in ((kept, 10), (deleted, 4)):
        source_cluster.create_topic(topic, partitions=1)
        source_cluster.produce(topic, [(b"k", b"v%d" % i) for i in range(records)])
        copied = shoal("copy", "--source", "source", "--target", "target", "--topic", topic,
                       "--target-topic", f"dr.{topic}", "--pipeline", pipeline)
        assert copied.returncode == 0, copied.stdout + copied.stderr
    source_cluster.produce(kept, [(b"k", b"late%d" % i) for i in range(5)])
    source_cluster.admin.delete(deleted)
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"pipeline": pipeline, "source": sandbox.client_config("source"),
                                      "target": sandbox.client_config("target"), "include": "status-none",
                                      "metrics_port": 0}))

    began = time.monotonic()
    rows = {r["topic"]: r for r in json.loads(shoal("mirror", "status", "--config", str(config), "--json").stdout)}
    took = time.monotonic() - began

    assert rows[kept]["lag"] == 5 and rows[kept]["lag_unknown"] is None, rows[kept]
    assert rows[deleted]["lag"] is None, rows[deleted]
    # the source's answer as librdkafka gives it: no leader for a topic it no longer knows (_NOENT), or the broker's
    # UNKNOWN_TOPIC_OR_PART while the deletion spreads
    reason = rows[deleted]["lag_unknown"]
    assert reason.startswith(f"cluster 'source' {deleted}-0: no such topic on the source now (") and \
        ("_NOENT" in reason or "UNKNOWN_TOPIC" in reason), rows[deleted]
    assert took < 30, f"status took {took:.1f} s"   # the deleted topic is asked again for seconds, not minutes
    table = subprocess.run([sys.executable, "-m", "mirror_core.cli", "mirror", "status", "--config", str(config)],
                           capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "1000"}, timeout=120)
    line = next(line for line in table.stdout.splitlines() if f"{deleted}-0 " in line)   # wide: one line a row
    assert f"lag unknown: cluster 'source' {deleted}-0: " in line and "│ unknown │" in line, table.stdout
