"""When a daemon writes a lane's health record (mirror_core.state.lane_health_records.plan_health_writes) and how
readers take it: on a change at once, while it lasts at most every refresh, cleared when it ends, left by a dead holder
only until it expires."""

from __future__ import annotations

import json

from mirror_core.model.lane_status import LaneHealth
from mirror_core.state.lane_health_records import (
    HealthRecord,
    health_key,
    live_health,
    parse_all_health_records,
    parse_health_records,
    plan_health_writes,
    record_body,
)

RETRYING = {"state": "retrying", "reason": "unavailable", "message": "down", "attempts": 1, "since_ms": 1}


def test_a_new_state_is_written_at_once_and_an_unchanged_one_only_at_the_refresh():
    assert plan_health_writes({"a": RETRYING}, {}, 1_000, refresh_s=30) == ({"a": RETRYING}, [])
    later = {**RETRYING, "attempts": 7, "message": "still down"}
    written = {"a": (RETRYING, 1_000)}
    assert plan_health_writes({"a": later}, written, 20_000, refresh_s=30) == ({}, [])
    assert plan_health_writes({"a": later}, written, 31_000, refresh_s=30) == ({"a": later}, [])
    stalled = {**later, "state": "stalled"}
    assert plan_health_writes({"a": stalled}, written, 2_000, refresh_s=30) == ({"a": stalled}, [])
    other = {**RETRYING, "reason": "transaction_timeout"}
    assert plan_health_writes({"a": other}, written, 2_000, refresh_s=30) == ({"a": other}, [])


def test_a_lane_that_copies_again_or_is_gone_is_cleared_and_copying_lanes_cost_nothing():
    assert plan_health_writes({}, {"a": (RETRYING, 1_000)}, 2_000) == ({}, ["a"])
    assert plan_health_writes({}, {}, 2_000) == ({}, [])
    copying = LaneHealth()
    assert live_health(copying) is None
    copying.failed("unavailable", "x" * 2_000, 5)
    assert live_health(copying)["state"] == "retrying" and len(live_health(copying)["message"]) == 500


def test_records_are_read_per_pipeline_and_live_only_until_they_expire():
    body = record_body(RETRYING, "daemon-a", 1_000, refresh_s=30)
    items = [(health_key("p", "dr.t-0", "daemon-a"), json.dumps(body).encode()),
             (health_key("other", "dr.t-0", "daemon-a"), json.dumps(body).encode()),
             (json.dumps({"lease": "dr.t-0", "pipeline": "p"}).encode(), b'{"holder": "x", "expires_ms": 1}'),
             (json.dumps(["p", "t", 0]).encode(), b"{}")]
    records = parse_health_records(items, "p")
    assert list(records) == ["dr.t-0"]
    record = records["dr.t-0"]
    assert isinstance(record, HealthRecord) and record.holder == "daemon-a" and record.state == "retrying"
    assert record.live(1_000 + 89_000) and not record.live(1_000 + 90_000)  # three refreshes
    assert "attempt 1" in record.detail(str) and "daemon-a" in record.detail(str)


def test_lease_readers_skip_health_records():
    """Health records share the checkpoint topic: a lease reader (this release's or the previous one's) must not
    take one for a lease — their key has no "pipeline" field, which is how lease readers pick their records."""
    key = json.loads(health_key("p", "dr.t-0", "daemon-a"))
    assert isinstance(key, dict) and "pipeline" not in key and "lease" not in key


def test_each_writer_has_its_own_key_and_the_first_releases_key_still_reads():
    """A former holder's clear (tombstone of its own key) cannot erase the next holder's record of the lane; a
    record under the first release's two-element key is still read."""
    a, b = record_body(RETRYING, "A", 1_000), record_body(RETRYING, "B", 2_000)
    assert health_key("p", "dr.t-0", "A") != health_key("p", "dr.t-0", "B")
    old_key = json.dumps({"lane_health": ["p", "dr.t-1"]}, separators=(",", ":")).encode()
    items = [(health_key("p", "dr.t-0", "A"), json.dumps(a).encode()),
             (health_key("p", "dr.t-0", "B"), json.dumps(b).encode()), (old_key, json.dumps(a).encode())]
    assert {lane: [r.holder for r in rs] for lane, rs in parse_all_health_records(items, "p").items()} == \
        {"dr.t-0": ["A", "B"], "dr.t-1": ["A"]}
    assert parse_health_records(items, "p")["dr.t-0"].holder == "B"  # the newest


def test_a_record_outlives_the_round_that_refreshes_it_whatever_lease_ttl_s():
    """The daemon writes health records once per group round (``lease_ttl_s / 3``). With the default 30 s refresh
    a record expired after 90 s, so a ``lease_ttl_s`` above 270 s let every record lapse between two rounds of a
    holder that was alive: its failing lane read as healthy to the Shoal page and ``shoal mirror status``. The
    refresh, and so the expiry, follow the round when it is longer."""
    from mirror_core.state.lane_health_records import LaneHealthWriter, health_refresh_s

    class Producer:
        def __init__(self):
            self.records = []

        def produce(self, records, **_kwargs):
            self.records += records

    for lease_ttl_s in (15, 270, 300, 900):
        round_s = lease_ttl_s / 3
        refresh_s = health_refresh_s(round_s)
        writer, producer = None, Producer()
        writer = LaneHealthWriter(producer, refresh_s=refresh_s)
        written, record, t = {}, None, 1_000
        for _ in range(20):  # twenty group rounds of a holder that is alive, its lane failing throughout
            if record is not None:
                assert record.live(t), f"lease_ttl_s={lease_ttl_s}: the record expired before the round at {t} ms"
            writes, _ = plan_health_writes({"dr.t-0": RETRYING}, written, t, refresh_s=refresh_s)
            if writes:
                producer.records.clear()
                writer.write("p", "daemon-a", writes, [], t)
                (record,) = parse_health_records([(k, v) for k, v, _lane in producer.records], "p").values()
                written = {"dr.t-0": (RETRYING, t)}
            t += int(round_s * 1000) - 1  # a round a hair early: the refresh waits for the one after
