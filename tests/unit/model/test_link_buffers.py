"""Size for the link: preflight warns, with the numbers, when a source broker's socket buffer caps one fetch
connection below the link rate (window / round trip)."""

from __future__ import annotations

import pytest

from mirror_core.model.preflight_rules import Severity, SourceLink, check_link_buffers, connection_cap_bytes_per_s

LINK = 20e6  # 20 MB/s


def test_the_kafka_default_send_buffer_caps_a_200_ms_link_and_the_warning_says_by_how_much():
    findings = check_link_buffers("src", [SourceLink(1, 102_400, 0.2)], link_bytes_per_s=LINK)
    assert len(findings) == 1
    f = findings[0]
    assert f.severity is Severity.WARN and f.key == "socket.send.buffer.bytes"
    for number in ("broker 1", "102400 bytes", "200 ms", "0.51 MB/s", "20.00 MB/s", "4000000 bytes"):
        assert number in f.message, f.message


def test_a_buffer_that_holds_the_link_window_and_autotuned_buffers_pass():
    links = [SourceLink(1, 8_000_000, 0.2), SourceLink(2, -1, 0.2), SourceLink(3, None, 0.2)]
    assert check_link_buffers("src", links, link_bytes_per_s=LINK) == []


def test_a_near_broker_is_not_capped_by_the_default():
    assert check_link_buffers("src", [SourceLink(1, 102_400, 0.0005)], link_bytes_per_s=LINK) == []


def test_the_smaller_of_broker_and_client_buffers_decides():
    findings = check_link_buffers("src", [SourceLink(1, 8_000_000, 0.05)], link_bytes_per_s=LINK,
                                  client_receive_buffer_bytes=65_536)
    assert len(findings) == 1 and "the client's receive buffer is 65536 bytes" in findings[0].message


@pytest.mark.parametrize("links, rate", [([SourceLink(1, 102_400, None)], LINK), ([SourceLink(1, 102_400, 0.2)], None)])
def test_no_warning_without_a_round_trip_or_a_link_rate(links, rate):
    assert check_link_buffers("src", links, link_bytes_per_s=rate) == []


def test_one_window_per_round_trip():
    assert connection_cap_bytes_per_s(100_000, 0.1) == pytest.approx(1_000_000)
    assert connection_cap_bytes_per_s(100_000, 0.0) == float("inf")


def test_fetches_are_sized_to_keep_the_link_busy_at_the_round_trip():
    from mirror_core.model.preflight_rules import fetch_bytes_for_link

    sized = dict(link_bytes_per_s=20e6, rtt_s=0.2, floor=4_000_000, cap=64_000_000)
    # 80 %: 4 x bandwidth x RTT = 16 MB per round, shared by the round's partitions
    assert fetch_bytes_for_link(partitions=1, **sized) == 16_000_000
    assert fetch_bytes_for_link(partitions=4, **sized) == 4_000_000
    assert fetch_bytes_for_link(partitions=8, **sized) == 4_000_000  # never below the configured size
    assert fetch_bytes_for_link(partitions=1, **{**sized, "rtt_s": 2.0}) == 64_000_000  # memory cap
    assert fetch_bytes_for_link(partitions=1, **{**sized, "rtt_s": 0.0}) == 4_000_000
    with pytest.raises(ValueError):
        fetch_bytes_for_link(partitions=1, efficiency=1.0, **sized)
