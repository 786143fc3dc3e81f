"""Lane states and the one classification of lane errors (mirror_core/model/lane_status.py), and how the daemon's HTTP
endpoint shows them: /readyz is 503 while a lane is halted or stalled, /healthz stays liveness."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
import uuid

import kafka.errors as Errors
import pytest

from mirror_core.daemon.metrics import DaemonMetrics, serve_metrics
from mirror_core.errors import (
    AmbiguousWriteError,
    BatchRejectedError,
    CheckpointReadStalledError,
    CorruptBatchError,
    DataLossError,
    FetchError,
    ForeignWriteError,
    MirrorError,
    PartitionUnavailableError,
    SourceTopicDeletedError,
    SourceTruncatedError,
    TopicRecreatedError,
)
from mirror_core.model.lane_status import REASONS, LaneHealth, PersistedLaneState, classify_failure


@pytest.mark.parametrize(("error", "expected"), [
    (DataLossError("source", "t", 0, 5, 9), (False, "data_loss")),
    (TopicRecreatedError("source", "t", uuid.uuid4(), uuid.uuid4()), (False, "topic_recreated")),
    (SourceTruncatedError("source", "t", 0, 3, 9, 1), (False, "source_truncated")),
    (CorruptBatchError(4, "crc"), (False, "corrupt_batch")),
    (ForeignWriteError("target", "t", 0, 5, 7, "x"), (False, "foreign_write")),
    (BatchRejectedError("target", "t", 0, 5, "MESSAGE_SIZE_TOO_LARGE"), (False, "batch_rejected")),
    (FetchError("source", "t", 0, 5, "TOPIC_AUTHORIZATION_FAILED"), (False, "fetch_refused")),
    (SourceTopicDeletedError("source", "t", 0, 5, 9), (False, "source_deleted")),
    (PartitionUnavailableError("source", "t", 0, "NotLeader"), (True, "unavailable")),
    (AmbiguousWriteError("target", "t", 0, 5, "UNKNOWN_PRODUCER_ID"), (True, "ambiguous_write")),
    (CheckpointReadStalledError("target", "__shoal_checkpoints", 0, 5, 9, 3), (True, "checkpoint")),
    (MirrorError("something Shoal did not name"), (True, "unknown")),
    (Errors.NotLeaderForPartitionError(), (True, "kafka_retriable")),
    (Errors.KafkaConnectionError(), (True, "kafka_retriable")),
    (Errors.TopicAuthorizationFailedError(), (False, "kafka_refused")),
    (Errors.IllegalStateError("client side"), (True, "unknown")),
    (RuntimeError("a bug"), (True, "unknown")),
])
def test_every_lane_error_is_classified_once_from_the_error_itself(error, expected):
    assert classify_failure(error) == expected
    assert expected[1] in REASONS


def test_a_lane_retrying_longer_than_the_bound_is_stalled_and_one_success_clears_it():
    health = LaneHealth(stall_after_s=10)
    health.failed("unavailable", "x", 1_000, position=7)
    health.failed("unavailable", "x", 5_000, position=7)
    assert (health.state, health.attempts, health.since_ms) == ("retrying", 2, 1_000)
    health.refresh(11_001)
    assert health.state == "stalled"
    health.succeeded()
    assert (health.state, health.attempts, health.since_ms, health.reason) == ("copying", 0, None, "none")


def test_a_halted_lane_stays_halted_until_resumed():
    health = LaneHealth()
    health.stop(PersistedLaneState("halted", "batch_rejected", "refused", 123, 40, 45))
    health.succeeded()
    health.failed("unavailable", "x", 200)
    assert (health.state, health.reason, health.position, health.range_end) == ("halted", "batch_rejected", 40, 45)
    health.resumed()
    assert health.state == "copying"


def test_only_states_that_outlive_the_process_are_persisted():
    with pytest.raises(ValueError):
        PersistedLaneState("retrying", "unavailable", "x", 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("host, reachable", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_metrics_are_reachable_from_other_hosts_only_when_bound_to_all_interfaces(host, reachable):
    address = "127.0.0.2"  # another address of this host (Linux routes 127/8 to lo): a socket on 127.0.0.1 misses it
    port = _free_port()
    server = serve_metrics(DaemonMetrics(), port, host=host)
    try:
        try:
            with urllib.request.urlopen(f"http://{address}:{port}/healthz", timeout=5) as resp:
                answered = resp.status
        except urllib.error.HTTPError as exc:
            answered = exc.code
        except OSError:
            answered = None
        assert (answered is not None) is reachable, f"{host}: {address}:{port} answered {answered}"
    finally:
        server.shutdown()


def _lane(topic: str, partition: int, **health) -> dict:
    return {"topic": topic, "partition": partition, **LaneHealth(**health).as_dict()}


def test_readyz_is_503_while_a_lane_is_halted_or_stalled_and_healthz_stays_200():
    metrics = DaemonMetrics()
    port = _free_port()
    server = serve_metrics(metrics, port)
    try:
        metrics.publish_lanes("p", {"a-0": _lane("a", 0), "a-1": _lane("a", 1, state="retrying", attempts=2,
                                                                       reason="unavailable", since_ms=5)})
        assert _get(port, "/readyz")[0] == 200
        metrics.publish_lanes("p", {"a-0": _lane("a", 0, state="halted", reason="batch_rejected", position=4,
                                                 range_end=9, message="refused"), "a-1": _lane("a", 1)})
        status, body = _get(port, "/readyz")
        report = json.loads(body)
        assert status == 503 and report["not_ready_lanes"] == ["a-0"]
        assert {lane["lane"]: lane["state"] for lane in report["lanes"]} == {"a-0": "halted", "a-1": "copying"}
        assert _get(port, "/healthz")[0] == 200
        text = _get(port, "/metrics")[1]
        assert 'shoal_lane_state{partition="0",pipeline="p",reason="batch_rejected",state="halted",topic="a"} 1.0' \
            in text
        assert 'shoal_lane_halt_offset{bound="range_end",partition="0",pipeline="p",topic="a"} 9.0' in text
        metrics.publish_lanes("p", {"a-0": _lane("a", 0, state="stalled", reason="unknown"), "a-1": _lane("a", 1)})
        assert _get(port, "/readyz")[0] == 503
        text = _get(port, "/metrics")[1]
        assert 'state="halted"' not in text  # one state series per lane: the old one is gone
    finally:
        server.shutdown()


def test_a_long_halt_message_is_cut_so_the_checkpoint_record_stays_small():
    from mirror_core.model.lane_status import MAX_MESSAGE_CHARS, PersistedLaneState

    state = PersistedLaneState("halted", "batch_rejected", "x" * 50_000, 1, 0, None)
    assert len(state.message) == MAX_MESSAGE_CHARS and state.message.endswith("…")
    assert PersistedLaneState.from_dict(state.to_dict()) == state
