"""Token buckets: refill, burst, waits, and bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from field.contract.ratelimit import KeyedLimiter, Rate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_through_then_the_rate_holds() -> None:
    clock = Clock()
    limiter = KeyedLimiter(Rate(per_second=2.0, burst=3), clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)  # one token comes in half a second
    clock.now += 0.5
    assert limiter.take("a") == 0.0
    assert limiter.take("a") == pytest.approx(0.5)


def test_a_refusal_takes_nothing() -> None:
    clock = Clock()
    limiter = KeyedLimiter(Rate(per_second=1.0, burst=1), clock=clock)
    assert limiter.take("a") == 0.0
    for _ in range(5):
        assert limiter.take("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert limiter.take("a") == 0.0


def test_keys_are_independent_and_wait_takes_nothing() -> None:
    clock = Clock()
    limiter = KeyedLimiter(Rate(per_second=1.0, burst=1), clock=clock)
    assert limiter.take("a") == 0.0
    assert limiter.take("b") == 0.0
    assert limiter.wait("a") == pytest.approx(1.0)
    assert limiter.wait("c") == 0.0
    clock.now += 0.25
    assert limiter.wait("a") == pytest.approx(0.75)
    assert limiter.take("a") == pytest.approx(0.75)


def test_a_cost_above_the_burst_waits_for_a_full_bucket_at_most() -> None:
    clock = Clock()
    limiter = KeyedLimiter(Rate(per_second=10.0, burst=5), clock=clock)
    assert limiter.take("a", cost=50) == 0.0  # capped at the burst: a full bucket pays it
    assert limiter.take("a", cost=50) == pytest.approx(0.5)


def test_memory_is_bounded_and_refilled_buckets_go_first() -> None:
    clock = Clock()
    limiter = KeyedLimiter(Rate(per_second=1.0, burst=2), max_keys=3, clock=clock)
    limiter.take("old", cost=2)  # empty
    limiter.take("b")
    limiter.take("c")
    clock.now += 10  # every bucket has refilled
    limiter.take("d")
    assert len(limiter) <= 3
    # a hot key survives a flood of new keys: only the least recently used go
    limiter = KeyedLimiter(Rate(per_second=1.0, burst=2), max_keys=3, clock=clock)
    for i in range(100):
        limiter.take("hot", cost=0.001)
        limiter.take(f"k{i}", cost=2)
        assert len(limiter) <= 3
    assert limiter.wait("hot") == 0.0 and "hot" in limiter._buckets


def test_forget() -> None:
    limiter = KeyedLimiter(Rate(per_second=1.0, burst=1), clock=Clock())
    limiter.take("a")
    limiter.forget("a")
    assert limiter.take("a") == 0.0


@pytest.mark.parametrize("rate, burst", [(0, 1), (-1, 1), (float("inf"), 1), (1, 0.5)])
def test_bad_rates_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        Rate(per_second=rate, burst=burst)


@given(
    st.floats(0.5, 50),
    st.integers(1, 20),
    st.lists(st.floats(0, 2), min_size=1, max_size=60),
)
def test_never_more_than_burst_plus_rate_times_elapsed(
    per_second: float, burst: int, gaps: list[float]
) -> None:
    clock = Clock()
    start = clock.now
    limiter = KeyedLimiter(Rate(per_second=per_second, burst=burst), clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        while limiter.take("a") == 0.0:
            allowed += 1
    assert allowed <= burst + per_second * (clock.now - start) + 1e-6
    assert allowed >= burst  # the first burst always goes through
    assert limiter.take("a") > 0.0  # and the loop stopped at an empty bucket
