"""The handoff's wait for a daemon (mirror_core.services.handoff._wait_for_daemon): it reads the daemon group, and a
group that cannot be described is "unknown" — retried, and named when the wait times out — never "no daemon"."""

from __future__ import annotations

import pytest

import mirror_core.services.handoff as handoff
from mirror_core.config.cluster import ClusterConfig
from mirror_core.errors import ConfigError, MirrorError

SOURCE = ClusterConfig("source", {"bootstrap.servers": "a:1"})
LANES = {"dr.t-0": ("t", 0), "dr.t-1": ("t", 1)}


class Checkpoints:
    """The checkpoint store as the wait reads it (lane states only)."""

    def __init__(self, checkpoints=None):
        self.checkpoints = checkpoints or {}

    def read_all(self, pipeline, whole_maps=True):
        return dict(self.checkpoints)


@pytest.mark.timeout(20)
def test_an_unreadable_group_times_out_naming_the_error_not_no_daemon(monkeypatch):
    def unreadable(*_a, **_k):
        error = MirrorError("cluster 'source': could not describe the daemon group 'shoal.p.daemons'")
        error.retriable = True
        raise error

    monkeypatch.setattr(handoff, "lanes_without_daemon", unreadable)
    with pytest.raises(MirrorError) as raised:
        handoff._wait_for_daemon(Checkpoints(), SOURCE, "p", LANES, 0.6)
    message = str(raised.value)
    assert "could not tell whether a daemon holds" in message and "could not describe" in message
    assert "no daemon took" not in message and raised.value.retriable


@pytest.mark.timeout(20)
def test_lanes_no_member_holds_time_out_naming_the_group(monkeypatch):
    looks = []
    monkeypatch.setattr(handoff, "lanes_without_daemon", lambda *_a, **_k: looks.append(1) or ["dr.t-1"])
    with pytest.raises(MirrorError) as raised:
        handoff._wait_for_daemon(Checkpoints(), SOURCE, "p", LANES, 0.6)
    assert "no daemon took lanes dr.t-1" in str(raised.value) and "shoal.p.daemons" in str(raised.value)
    assert len(looks) >= 2, "looked once only"


@pytest.mark.timeout(20)
def test_the_wait_ends_once_every_lane_is_held(monkeypatch):
    answers = iter([["dr.t-0"], []])
    monkeypatch.setattr(handoff, "lanes_without_daemon", lambda *_a, **_k: next(answers))
    handoff._wait_for_daemon(Checkpoints(), SOURCE, "p", LANES, 10)


@pytest.mark.timeout(20)
def test_a_lane_halted_in_its_checkpoint_times_out_naming_the_halt(monkeypatch):
    from mirror_core.model.lane_status import HALTED, PersistedLaneState
    from mirror_core.state.checkpoint import Checkpoint

    halted = Checkpoint("p", "t", 1, 10, "dr.t", 1, 10, "daemon", 2,
                        lane_state=PersistedLaneState(HALTED, "data_loss", "records deleted before copied", 1, 10, 20))
    monkeypatch.setattr(handoff, "lanes_without_daemon", lambda *_a, **_k: ["dr.t-1"])
    with pytest.raises(MirrorError) as raised:
        handoff._wait_for_daemon(Checkpoints({("p", "t", 1): halted}), SOURCE, "p", LANES, 0.6)
    message = str(raised.value)
    assert "dr.t-1 halted (data_loss: records deleted before copied)" in message and "resume" in message


def test_waiting_needs_the_source_cluster():
    with pytest.raises(ConfigError, match="source cluster"):
        handoff.hand_off(ClusterConfig("target", {"bootstrap.servers": "b:1"}), "p", "t", [0], wait_for_daemon_s=5)
