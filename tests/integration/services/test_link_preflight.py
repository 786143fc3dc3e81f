"""Size for the link, against the real source broker: preflight reads its ``socket.send.buffer.bytes`` (the
sandbox keeps Kafka's default, 102400) and measures the round trip, and warns with the numbers when a link faster
than one window per round trip is declared."""

from __future__ import annotations

import pytest

from mirror_core.services.preflight import link_findings
from tests.copy_helpers import shoal


@pytest.mark.timeout(60)
def test_the_brokers_send_buffer_and_round_trip_are_read_and_judged(source_cluster):
    # a loopback round trip is tens of microseconds: 102400 bytes per round trip is GB/s, so only an absurd link
    # rate is capped — which is what proves the broker's figure and the measured round trip were used
    assert link_findings(source_cluster.config, 10e6) == []
    findings = link_findings(source_cluster.config, 1e12)
    assert len(findings) == 1, findings
    message = findings[0].message
    assert "broker 1" in message and "socket.send.buffer.bytes is 102400 bytes" in message
    assert "1000000.00 MB/s" in message and "Raise it to at least" in message


@pytest.mark.timeout(120)
def test_shoal_copy_prints_the_warning_and_copies_anyway(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(10)])
    done = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                 f"lk.{topic}", "--mode", "none", "--link-mbps", "1000000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight WARN" in done.stdout and "socket.send.buffer.bytes is 102400 bytes" in done.stdout, done.stdout
    assert len(target_cluster.read_all(f"lk.{topic}")) == 10


@pytest.mark.timeout(60)
def test_a_tls_listener_is_measured_too(secure_source_cluster):
    """Over SASL_SSL the probe speaks TLS (ApiVersions comes before SASL): before, it sent plaintext to the TLS
    listener, every broker was left out, and a copy over SASL_SSL declared for a link silently kept its 4 MiB
    fetches (76-78 % of a 200 ms link where PLAINTEXT reached 93 %)."""
    from mirror_core.kafka.round_trips import measure_links

    links = measure_links(secure_source_cluster.config, timeout_s=20)
    assert links and all(link.rtt_s is not None and 0 < link.rtt_s < 5 for link in links), links
