"""``shoal deadlines`` names the link rate, round trip and fetch size its ETA assumed (real brokers, the CLI in its
own process), and with ``--link-mbps`` uses the copy's declared link rate."""

from __future__ import annotations

import json
import re

import pytest

from tests.copy_helpers import shoal


@pytest.mark.timeout(120)
def test_the_deadlines_report_names_the_link_and_round_trip_it_assumed(source_cluster, unique_name):
    topic = source_cluster.create_topic(unique_name(), 1, {"retention.ms": "3600000"})
    source_cluster.produce(topic, [(b"k%d" % i, b"v" * 200) for i in range(50)])

    declared = shoal("deadlines", "--source", "source", "--target", "target", "--topic", topic, "--link-mbps", "20")
    assert declared.returncode == 0, declared.stdout + declared.stderr
    out = " ".join(declared.stdout.split())
    assumed = re.search(r"ETA assumes: link 20 MB/s, round trip ([\d.]+) ms, fetch ([\d.]+) MB", out)
    assert assumed is not None, out
    assert float(assumed.group(1)) > 0, "a measured round trip, not a constant"
    assert "(declared for the copy)" in out and "measured: source broker" in out and "target" in out

    default = shoal("deadlines", "--source", "source", "--topic", topic, "--json")
    assert default.returncode == 0, default.stdout + default.stderr
    figures = json.loads(default.stdout)["copy_figures"]
    assert figures["link_bytes_per_s"] == 100e6 and figures["rtt_ms"] > 0 and figures["fetch_bytes"] == 4194304
    assert "link 100MB/s (assumed)" in figures["how"]
