"""The Lamport clock's bounds: no client can run it out, and it serves reads when frozen."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.clock import RESERVATION_BLOCK, LamportClock
from field.contract.errors import Code, FieldError, LogUnavailable
from field.contract.model import MAX_EPOCH, Limits

from .core_util import Harness

SKEW, RATE = 1000, 100


def clock(value: int = 0, origin: float = 0.0) -> LamportClock:
    return LamportClock(value=value, max_skew=SKEW, rate=RATE, origin=origin)


def refused(c: LamportClock, received: int, now: float) -> bool:
    try:
        c.next(received, now)
    except FieldError as error:
        assert error.code == Code.INVALID_EPOCH and error.recoverable
        return True
    return False


def test_one_request_moves_the_clock_at_most_max_skew() -> None:
    c = clock(value=50_000, origin=0.0)  # old enough that the age bound is far away
    assert c.next(50_000 + SKEW, now=10_000.0) == 50_000 + SKEW + 1
    assert refused(c, 50_000 + SKEW + 1, now=10_000.0)
    assert refused(c, MAX_EPOCH, now=10_000.0)


def test_jumps_never_pass_the_ceiling_that_grows_with_the_fields_age() -> None:
    c = clock(value=0, origin=100.0)
    assert c.ceiling(100.0) == SKEW
    assert c.ceiling(90.0) == SKEW, "a wall clock that went back does not lower it below skew"
    assert c.ceiling(110.0) == SKEW + 10 * RATE
    # the first request may jump the skew; then the ceiling holds until time passes
    assert c.next(SKEW, now=100.0) == SKEW + 1
    c.advance(SKEW + 1)
    assert refused(c, SKEW + 2 + RATE, now=100.5)
    assert c.next(SKEW + 50, now=100.5) == SKEW + 51  # within ceiling(100.5) = SKEW + 50
    assert refused(c, SKEW + 51, now=100.5)


def test_epochs_behind_the_clock_are_never_refused() -> None:
    c = clock(value=MAX_EPOCH - 5, origin=0.0)  # far above any ceiling (an old log)
    assert c.next(0, now=0.0) == MAX_EPOCH - 4
    assert c.next(MAX_EPOCH - 5, now=0.0) == MAX_EPOCH - 4


def test_a_clock_at_its_limit_hands_out_its_current_epoch() -> None:
    c = clock(value=10)
    c.reserved = 12
    assert c.next(0, now=0.0, limit=12) == 11
    c.advance(12)
    assert c.next(0, now=0.0, limit=12) == 12 and c.frozen(12)
    full = clock(value=MAX_EPOCH)
    assert full.next(0, now=0.0) == MAX_EPOCH and full.frozen(MAX_EPOCH)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**40), st.floats(0.0, 5.0, allow_nan=False)),
        min_size=1,
        max_size=200,
    )
)
def test_no_sequence_of_requests_passes_the_ceiling_plus_one_per_request(
    requests: list[tuple[int, float]],
) -> None:
    """Whatever clients send, and however fast: epoch <= ceiling(now) + requests served."""
    c = clock(value=0, origin=0.0)
    now, served = 0.0, 0
    for received, elapsed in requests:
        now += elapsed
        try:
            epoch = c.next(received, now)
        except FieldError:
            continue
        c.advance(epoch)
        served += 1
        assert c.value <= c.ceiling(now) + served


def test_the_default_bounds_take_centuries_to_exhaust() -> None:
    """The arithmetic of protocol/README.md "Epochs", at a rate no server here reaches."""
    limits = Limits()
    requests_per_second = 100_000
    per_second = limits.max_epoch_rate + requests_per_second
    years = (MAX_EPOCH - limits.max_epoch_skew) / per_second / (365.25 * 24 * 3600)
    assert years > 1000


# -- the Field ---------------------------------------------------------------------


def test_the_field_refuses_a_jump_past_its_age_and_changes_nothing() -> None:
    h = Harness(limits=Limits(max_epoch_skew=1000, max_epoch_rate=10))
    h.register("alice", "analyst")
    before = h.field.epoch
    assert before > 0
    detect = {"mode": "list"}  # a read, answered with its own epoch
    # within one request's skew of the clock, but past the ceiling of a new Field (1000)
    with pytest.raises(FieldError) as info:
        h.send("DETECT", "alice", detect, epoch=1001)
    assert info.value.code == Code.INVALID_EPOCH
    assert "epochs per second" in info.value.message
    assert h.field.epoch == before
    h.time += 100  # 100 s later the ceiling is 1000 + 10 * 100
    assert h.send("DETECT", "alice", detect, epoch=1000 + before)["epoch"] == 1001 + before
    assert h.send("DETECT", "alice", detect, epoch=2000)["epoch"] == 2001
    with pytest.raises(FieldError):
        h.send("DETECT", "alice", detect, epoch=2002)


def test_while_writes_are_refused_reads_stay_within_the_reservation() -> None:
    h = Harness()
    h.register("alice", "analyst")
    h.record("alice", "A finding.")
    h.field.writes_refused = lambda: LogUnavailable("the log is locked")
    reserved = h.field.state.clock.reserved
    epochs = [
        h.send("DETECT", "alice", {"mode": "list"})["epoch"] for _ in range(RESERVATION_BLOCK + 10)
    ]
    assert epochs == sorted(epochs) and max(epochs) == reserved
    entries = len(h.entries)
    with pytest.raises(FieldError) as info:
        h.record("alice", "Refused.")
    assert info.value.code == Code.LOG_UNAVAILABLE and info.value.recoverable
    assert len(h.entries) == entries and h.field.epoch == reserved
    h.field.writes_refused = None
    assert h.record("alice", "Accepted.")["epoch"] == reserved + 1
