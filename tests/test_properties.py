"""Property tests: the Lamport clock and since_epoch polling under random loads."""

from __future__ import annotations

import contextlib
import math
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.clock import iso_timestamp
from field.contract.errors import FieldError

from .core_util import Harness

AGENTS = ("w1", "w2", "w3")

write = st.tuples(
    st.just("write"),
    st.sampled_from(AGENTS),
    st.integers(min_value=0, max_value=50),  # how far ahead of its last epoch the agent claims
    st.sampled_from(["finding", "decision", "observation"]),
)
poll = st.tuples(
    st.just("poll"),
    st.integers(min_value=1, max_value=4),  # max_units
    st.one_of(st.none(), st.integers(min_value=1, max_value=120)),  # max_tokens
    st.floats(min_value=0.0, max_value=1.0),  # recency_weight
)
bad = st.tuples(st.just("bad"), st.sampled_from(AGENTS), st.just(0), st.just(""))
actions = st.lists(st.one_of(write, poll, bad), min_size=1, max_size=60)


def _harness() -> Harness:
    h = Harness()
    for agent in AGENTS:
        h.register(agent, "writer")
    h.register("poller", "reader", interests=["market"])
    return h


@settings(max_examples=60, deadline=None)
@given(actions)
def test_epochs_strictly_increase_and_follow_received_epochs(steps: list[Any]) -> None:
    h = _harness()
    last = h.field.epoch
    unit_epochs: list[int] = []
    for step in steps:
        kind = step[0]
        if kind == "write":
            _, agent, ahead, memory_type = step
            sent = h.epochs[agent] + ahead
            response = h.record_at(agent, sent, memory_type)
            assert response["epoch"] == max(last, sent) + 1
            unit_epochs.append(response["epoch"])
        elif kind == "poll":
            response = h.attune("poller", max_units=step[1], since_epoch=last)
            assert response["epoch"] <= h.field.epoch
        else:
            before = h.field.epoch
            with contextlib.suppress(FieldError):
                h.send("RECORD", step[1], {"type": "finding"})
            assert h.field.epoch == before, "a failed operation must not consume an epoch"
            continue
        assert h.field.epoch > last
        last = h.field.epoch
    assert unit_epochs == sorted(set(unit_epochs))


@settings(max_examples=60, deadline=None)
@given(actions)
def test_polling_with_the_previous_epoch_sees_every_unit_exactly_once(steps: list[Any]) -> None:
    h = _harness()
    written: list[str] = []
    seen: list[str] = []
    cursor = 0

    def poll_once(max_units: int, max_tokens: int | None, recency: float) -> dict[str, Any]:
        scope: dict[str, Any] = {"since_epoch": cursor, "recency_weight": recency}
        if max_tokens is not None:
            scope["max_tokens"] = max_tokens
        response = h.attune("poller", max_units=max_units, **scope)
        seen.extend(r["memory_unit"]["id"] for r in response["record"])
        return response

    for step in steps:
        if step[0] == "write":
            _, agent, _, memory_type = step
            written.append(h.record_at(agent, 0, memory_type)["memory_unit_id"])
        elif step[0] == "poll":
            cursor = poll_once(step[1], step[2], step[3])["epoch"]
    for _ in range(len(written) + 1):  # drain: each poll returns at least one unit
        response = poll_once(3, None, 0.5)
        cursor = response["epoch"]
        if response["context_budget"]["units_returned"] == 0:
            break
    assert len(seen) == len(set(seen)), "a unit was delivered twice"
    assert set(seen) == set(written), "a unit was missed"


@settings(max_examples=30, deadline=None)
@given(actions)
def test_replay_reproduces_state_and_never_reuses_an_epoch(steps: list[Any]) -> None:
    h = _harness()
    handed_out = 0
    for step in steps:
        if step[0] == "write":
            handed_out = h.record_at(step[1], 0, step[3])["epoch"]
        elif step[0] == "poll":
            handed_out = h.attune("poller", max_units=step[1])["epoch"]
    rebuilt = h.replayed()
    assert rebuilt.state.units == h.field.state.units
    assert rebuilt.list_agents() == h.field.list_agents()
    assert rebuilt.state.clock.value >= handed_out


def _reference_timestamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# around "now" and the ends of seconds, where rounding to the microsecond carries over
_near_a_second = st.builds(
    lambda second, offset: math.nextafter(second + 1 - offset, math.inf),
    st.integers(0, 4_102_444_800),
    st.floats(0, 2e-6),
)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(0, 4_102_444_800), _near_a_second))
def test_wire_timestamps_are_what_datetime_writes(ts: float) -> None:
    assert iso_timestamp(ts) == _reference_timestamp(ts)
    assert iso_timestamp(ts) == _reference_timestamp(ts)  # the cached second gives the same


def test_wire_timestamps_at_the_edges_of_a_second() -> None:
    for ts in (0.0, 1.0, 0.9995, 0.9999994, 0.9999995, 0.9999996, 1_763_780_000.0005):
        assert iso_timestamp(ts) == _reference_timestamp(ts), ts
