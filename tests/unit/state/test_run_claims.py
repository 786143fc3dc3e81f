"""One active backfill per pipeline (mirror_core.state.run_claims)."""

from __future__ import annotations

import threading

import pytest

from mirror_core.errors import ConfigError
from mirror_core.state.run_claims import PipelineClaims


def test_a_second_run_is_refused_while_the_first_is_active(tmp_path):
    claims = PipelineClaims(tmp_path)
    assert claims.claim("orders", "run-1", is_active=lambda r: True).run_id == "run-1"
    assert claims.claim("orders", "run-2", is_active=lambda r: True).run_id == "run-1"
    assert claims.claim("orders", "run-1", is_active=lambda r: True).run_id == "run-1"   # idempotent
    assert claims.claim("payments", "run-2", is_active=lambda r: True).run_id == "run-2"  # per pipeline


def test_an_inactive_holder_is_taken_over_and_only_the_holder_releases(tmp_path):
    claims = PipelineClaims(tmp_path)
    claims.claim("orders", "crashed", is_active=lambda r: True)
    assert claims.claim("orders", "next", is_active=lambda r: r != "crashed").run_id == "next"
    assert not claims.release("orders", "crashed")
    assert claims.release("orders", "next") and claims.holder("orders") is None


def test_concurrent_claimants_of_a_stale_claim_elect_one(tmp_path):
    claims = PipelineClaims(tmp_path)
    claims.claim("orders", "dead", is_active=lambda r: True)
    winners, start = [], threading.Barrier(8)

    def contend(i):
        start.wait()
        winners.append(claims.claim("orders", f"r{i}", is_active=lambda r: r != "dead").run_id)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(winners)) == 1 and winners[0] != "dead"


def test_a_pipeline_name_that_is_not_a_file_name_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot name a claim file"):
        PipelineClaims(tmp_path).claim("../etc", "r", is_active=lambda r: True)
