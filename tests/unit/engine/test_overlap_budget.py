"""The overlap budget: a copy sends the next fetch only while what it holds plus one more full answer fits in the
configured buffer budget (DESIGN §3.8)."""

from __future__ import annotations

import pytest

from mirror_core.engine.copier import CopyOptions, may_prefetch
from mirror_core.errors import ConfigError


def test_the_default_budget_holds_two_answers_and_one_write_window():
    options = CopyOptions(fetch_max_bytes=4_000_000, max_inflight_bytes=1_000_000)
    assert options.budget_bytes == 9_000_000


def test_an_explicit_budget_wins():
    assert CopyOptions(buffer_budget_bytes=123).budget_bytes == 123
    with pytest.raises(ConfigError, match="buffer_budget_bytes"):
        CopyOptions(buffer_budget_bytes=0)


@pytest.mark.parametrize(("held", "allowed"), [(0, True), (5_000_000, True), (5_000_001, False)])
def test_a_prefetch_is_sent_only_while_one_more_answer_fits(held, allowed):
    assert may_prefetch(held_bytes=held, fetch_max_bytes=4_000_000, budget_bytes=9_000_000) is allowed


def test_a_full_write_window_and_a_full_answer_still_leave_room_for_the_next_fetch_by_default():
    """The default must not switch overlap off in the common case: an answer of fetch_max_bytes being processed
    while a write window of max_inflight_bytes waits."""
    options = CopyOptions(fetch_max_bytes=4_000_000, max_inflight_bytes=4_000_000)
    assert may_prefetch(held_bytes=options.fetch_max_bytes + options.max_inflight_bytes,
                        fetch_max_bytes=options.fetch_max_bytes, budget_bytes=options.budget_bytes)


def test_overlap_can_be_switched_off():
    assert CopyOptions(overlap=False).overlap is False
