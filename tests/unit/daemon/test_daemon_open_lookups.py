"""The batched look-ups of a lane opening (coordinators, epoch ends) run on the daemon's main thread: a broker that
does not answer must not hold that thread for a whole request timeout, or the lease renewal it owes (every
``lease_ttl_s / 3``, the pool's tick) lapses while many lanes open — exactly when a member died or a broker is down.
The lone look-ups they replace ran on the lane workers while the main thread kept ticking."""
from __future__ import annotations

import time

import kafka.errors as Errors
import pytest

from mirror_core.config.names import DAEMON_OWNER
from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool
from mirror_core.kafka.wire_client import WireClient
from mirror_core.state.checkpoint import Checkpoint
from tests.unit.daemon.test_daemon_open_batch import LANES, Store, _daemon

REQUEST_TIMEOUT_MS = 8_000  # the wire client's request timeout (30 s by default): a silent broker holds send so long


class SilentBroker:
    """A wire client whose every request goes to a broker that never answers: ``send`` returns at its timeout."""

    cluster_name = "silent"
    request_timeout_ms = REQUEST_TIMEOUT_MS

    def __init__(self):
        self.timeouts: list[int | None] = []

    def send(self, node_id, request, *, timeout_ms=None):
        self.timeouts.append(timeout_ms)
        time.sleep((timeout_ms or self.request_timeout_ms) / 1000)
        raise Errors.KafkaTimeoutError(f"{type(request).__name__} to broker {node_id}")

    def leader_for(self, topic, partition, *, refresh=False):
        return 1, 0

    def api_version(self, request_or_class, max_version=float("inf")):
        return 4

    def hint_coordinator(self, *a, **k):
        pass

    find_coordinators = WireClient.find_coordinators  # the real batching over this send


def _resumable(partition: int) -> bytes:
    return Checkpoint(pipeline="p", topic="orders", partition=partition, position=100 + partition,
                      target_topic="orders", target_partition=partition, target_next=None, owner=DAEMON_OWNER,
                      owner_epoch=1, position_epoch=3, updated_ms=1_700_000_000_000).to_value()


@pytest.mark.timeout(60)
def test_a_silent_broker_holds_the_main_thread_less_than_a_lease_renewal_period(monkeypatch):
    """Failed on i18-open-batch (818b2a3): FindCoordinator (target) and OffsetsForLeaderEpoch (source) each waited
    the full request timeout on the main thread: 8 s each with no tick between, against a renewal every 5 s."""
    store = Store({p: _resumable(p) for p in range(LANES)})
    daemon = _daemon(monkeypatch, store)
    daemon.source, daemon.target = SilentBroker(), SilentBroker()
    daemon.workers = LaneWorkerPool(2, lambda: LaneClients(None, None, None))
    ticks: list[float] = []
    monkeypatch.setattr(daemon, "_leases_busy", lambda: ticks.append(time.monotonic()))
    renewal_s = daemon.config.lease_ttl_s / 3

    began = time.monotonic()
    try:
        ready = daemon._open_ready()
    finally:
        daemon.workers.close()
    took = time.monotonic() - began

    assert {state.lane: position for state, position in ready} == {f"orders-{p}": 100 + p for p in range(LANES)}, \
        "the look-ups are hints: every lane opens without them"
    waits = [b - a for a, b in zip([began, *ticks], [*ticks, time.monotonic()], strict=True)]
    assert max(waits) < renewal_s, (
        f"the main thread went {max(waits):.1f} s without a tick (lease renewal every {renewal_s:.1f} s) while "
        f"the batched look-ups waited for a silent broker (opening took {took:.1f} s; timeouts asked: "
        f"source {daemon.source.timeouts}, target {daemon.target.timeouts})")


@pytest.mark.timeout(10)
def test_a_few_lanes_reopening_ask_alone_and_many_ask_once(monkeypatch):
    """A lane reopening after a failure costs no request on the main thread (its worker asks, as it always did);
    a batch of lanes asks the coordinators once, and each lane gets its own entry."""
    daemon = _daemon(monkeypatch, Store({}))
    asked = []
    daemon.target = type("Target", (), {"find_coordinators": lambda self, keys, **_: asked.append(list(keys)) or {
        key: f"entry of {key}" for key in keys}})()
    lanes = [f"orders-{p}" for p in range(LANES)]
    assert daemon._find_coordinators(lanes[:3]) == {} and asked == []
    found = daemon._find_coordinators(lanes)
    assert len(asked) == 1 and len(asked[0]) == LANES
    assert set(found) == set(lanes) and all(found[lane].endswith(f".{lane}") for lane in lanes)
