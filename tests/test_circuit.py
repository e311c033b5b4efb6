"""An endpoint's circuit (``field/subscriptions/delivery.py``), without an event loop:
times and draws go in, what may be sent comes out."""

from __future__ import annotations

import pytest

from field.subscriptions.delivery import CIRCUIT, Circuit, Outcome, RetryPolicy

POLICY = RetryPolicy(base=1.0, cap=8.0, open_after=3)


def top() -> float:
    """A draw at the top of the range: each delay is its whole ceiling."""
    return 0.999999


def record(circuit: Circuit, outcome: Outcome, now: float, *, probe: bool = False) -> None:
    circuit.record(outcome, now, probe=probe, policy=POLICY, draw=top)


def test_timeouts_in_a_row_open_it_and_an_answer_between_resets_the_count() -> None:
    circuit = Circuit()
    for now in (1.0, 2.0):
        record(circuit, Outcome.TIMED_OUT, now)
    record(circuit, Outcome.ANSWERED, 3.0)
    assert circuit.fresh and circuit.timeouts == 0
    record(circuit, Outcome.TIMED_OUT, 4.0)
    record(circuit, Outcome.FAILED, 5.0)  # refused at once: neither counts nor resets
    record(circuit, Outcome.TIMED_OUT, 6.0)
    assert circuit.state == "closed" and circuit.admit(6.0) == (False, 0.0)
    record(circuit, Outcome.TIMED_OUT, 7.0)
    assert (circuit.state, circuit.timeouts, circuit.trips) == ("open", 3, 1)
    assert circuit.delay == pytest.approx(1.0, rel=1e-5)  # ceiling(1) = base


def test_open_it_defers_then_lets_one_probe_go_and_defers_the_rest() -> None:
    circuit = Circuit()
    for _ in range(3):
        record(circuit, Outcome.TIMED_OUT, 10.0)
    probe, wait = circuit.admit(10.4)
    assert not probe and wait == pytest.approx(0.6, rel=1e-3)
    assert circuit.admit(11.0) == (True, 0.0)
    assert circuit.state == "probing"
    probe, wait = circuit.admit(11.1)  # while the probe is under way
    assert not probe and wait == circuit.delay > 0


def test_a_probe_without_an_answer_opens_it_again_for_longer_up_to_the_cap() -> None:
    circuit = Circuit()
    for _ in range(3):
        record(circuit, Outcome.TIMED_OUT, 0.0)
    delays = [circuit.delay]
    now = 0.0
    for outcome in (Outcome.TIMED_OUT, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.TIMED_OUT):
        now = circuit.retry_at
        assert circuit.admit(now) == (True, 0.0)
        record(circuit, outcome, now + 1, probe=True)
        assert circuit.state == "open"
        delays.append(circuit.delay)
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 8.0], rel=1e-5)
    assert circuit.trips == 5


def test_equal_jitter_keeps_at_least_half_the_ceiling() -> None:
    circuit = Circuit()
    for _ in range(3):
        circuit.record(Outcome.TIMED_OUT, 0.0, probe=False, policy=POLICY, draw=lambda: 0.0)
    assert circuit.delay == 0.5 and circuit.retry_at == 0.5


def test_an_answer_closes_it_whichever_request_got_it() -> None:
    circuit = Circuit()
    for _ in range(3):
        record(circuit, Outcome.TIMED_OUT, 0.0)
    assert circuit.admit(circuit.retry_at) == (True, 0.0)
    # a request sent before it opened answers while the probe is under way
    record(circuit, Outcome.TIMED_OUT, 1.5)  # another straggler's timeout changes nothing
    assert circuit.state == "probing"
    record(circuit, Outcome.ANSWERED, 1.6)
    assert circuit.fresh and circuit.trips == 0
    record(circuit, Outcome.TIMED_OUT, 2.0, probe=True)  # the probe, late: counted, closed
    assert (circuit.state, circuit.timeouts) == ("closed", 1)


def test_a_probe_given_up_by_the_field_lets_the_next_request_probe_at_once() -> None:
    circuit = Circuit()
    for _ in range(3):
        record(circuit, Outcome.TIMED_OUT, 0.0)
    assert circuit.admit(5.0) == (True, 0.0)
    record(circuit, Outcome.ABANDONED, 5.5, probe=True)
    assert (circuit.state, circuit.trips) == ("open", 1)
    assert circuit.admit(5.5) == (True, 0.0)
    record(circuit, Outcome.ABANDONED, 6.0)  # not the probe: nothing changes
    assert circuit.state == "probing"


def test_the_table_is_the_only_way_between_states() -> None:
    assert set(CIRCUIT) == {"closed", "open", "probing"}
    assert all(after in CIRCUIT for moves in CIRCUIT.values() for after in moves.values())
    assert all(moves["answer"] == "closed" for moves in CIRCUIT.values())
    # only a probe leaves "probing" for "open", and only a trip leaves "closed"
    assert [s for s, moves in CIRCUIT.items() if "probe_fail" in moves] == ["probing"]
    assert [s for s, moves in CIRCUIT.items() if moves.get("trip") == "open"] == ["closed"]


def test_open_after_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="open_after"):
        RetryPolicy(open_after=0)
