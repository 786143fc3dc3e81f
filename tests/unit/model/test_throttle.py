"""The byte-rate limit, on a fake clock."""

from __future__ import annotations

import pytest

from mirror_core.model.throttle import Throttle


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_average_rate_never_exceeds_the_limit_beyond_one_burst():
    clock = FakeClock()
    throttle = Throttle(1_000_000, clock=clock, sleep=clock.sleep)
    total = 0
    for _ in range(200):
        throttle.consume(64_000)
        total += 64_000
        assert total <= 1_000_000 * clock.now + 1e-6, "no burst at the start: the bucket starts empty"
    assert clock.now == pytest.approx(total / 1_000_000)


def test_idle_time_refills_at_most_one_second_of_burst():
    clock = FakeClock()
    throttle = Throttle(1000, clock=clock, sleep=clock.sleep)
    clock.now = 100.0  # long idle
    assert throttle.consume(1000) == 0.0
    assert throttle.consume(500) == pytest.approx(0.5)


def test_rate_must_be_positive():
    with pytest.raises(ValueError):
        Throttle(0)
