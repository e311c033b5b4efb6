"""A new calibration checkpoint's interest scales are made in short steps, not in one go.

The first batch matched at a checkpoint the Field has not met before needs every
interest row's (scale, shift) at that checkpoint
(:meth:`field.subscriptions.registry.SubscriptionRegistry.scales`): at 100,000 agent
profiles that is seconds of work. :meth:`field.subscriptions.matcher.Matcher.prepare`
makes them ahead a few rows a step, and the router yields between the steps. These
tests hold that the steps are as short as :data:`SCALE_CELLS` says, that rows added
between two steps are made too, that what the steps make is what one go makes to the
bit, and that matching after them notifies exactly what matching without them does.
"""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import numpy as np
from hypothesis import given, settings

from field.subscriptions import registry as registry_module
from field.subscriptions.matcher import FEW_PROFILES, Matcher
from field.subscriptions.registry import SubscriptionRegistry

from .core_util import Harness
from .test_matcher import events_of, key, many_subscriptions, run, subscribe
from .test_router import Plain, Writer
from .test_service import envelope

INTERESTS = ["pricing churn", "market size", "risk", "hiring plans", "cloud costs", "latency"]


def one_row_a_step(registry: SubscriptionRegistry, rows: int = 1) -> Any:
    """Patch :data:`SCALE_CELLS` so that each step makes ``rows`` rows."""
    return mock.patch.object(registry_module, "SCALE_CELLS", rows * registry.embedder.dim**2)


def whole(registry: SubscriptionRegistry, calibration: Any, position: int) -> tuple[Any, Any]:
    """Every row's scales at ``position``, made in one go."""
    return calibration.scales(registry.vectors.view, registry.squares.view, position)


def check_steps(h: Harness) -> None:
    state = h.field.state
    registry, index = state.registry, state.index
    events = events_of(h)
    matcher = Matcher(registry, index, state.units)
    registry._scales.clear()
    unprepared = key(matcher.match(events))
    registry._scales.clear()
    scope = matcher.scope()
    rows = registry.squares.size
    with one_row_a_step(registry, 3):
        steps = sum(1 for _ in matcher.prepare(events, scope))
    units = [e for e in events if e.agent is None and e.topic is None and e.units]
    if len(scope.profiles) <= FEW_PROFILES or not units or not rows:
        assert steps == 0
    else:
        epochs = np.array([e.epoch for e in units])
        positions = set(index.calibration.at(index.count_at(epochs)).tolist())
        assert steps == len(positions) * math.ceil(rows / 3)
        for position in positions:
            kept = registry._scales[position]
            made = whole(registry, index.calibration, position)
            assert np.array_equal(kept[0].view, made[0])
            assert np.array_equal(kept[1].view, made[1])
    assert key(matcher.match(events, scope=scope)) == unprepared


@settings(max_examples=10, deadline=None)
@given(many_subscriptions)
def test_scales_made_in_steps_match_as_scales_made_at_once(
    prog: tuple[list[Any], list[Any], list[Any]],
) -> None:
    registrations, subscriptions, steps = prog
    check_steps(run(registrations + subscriptions + steps))


def test_rows_added_between_two_steps_are_made_too() -> None:
    h = Harness()
    for i, interest in enumerate(INTERESTS):
        h.register(f"a{i}", "analyst", interests=[interest, "budget"])
        subscribe(h, f"a{i}", ["memory.recorded"])
    for n in range(8):  # the checkpoint of 8 units
        h.record("a0", f"pricing churn market risk {n}", score=0.75)
    state = h.field.state
    registry, index = state.registry, state.index
    events = events_of(h)
    registry._scales.clear()
    matcher = Matcher(registry, index, state.units)
    index.flush()  # the units embedded: the checkpoint reached
    position = int(index.calibration.at(index.count_at(events[-1].epoch)))
    with one_row_a_step(registry, 2):
        steps = matcher.prepare(events[-1:], matcher.scope())  # at the checkpoint of 8
        next(steps)
        assert registry._scales[position][0].size == 2
        before = registry.squares.size
        h.register("late", "analyst", interests=["supply chain", "logistics"])
        subscribe(h, "late", ["memory.recorded"])
        assert registry.squares.size > before
        rest = sum(1 for _ in steps)
    assert rest == math.ceil((registry.squares.size - 2) / 2)
    kept = registry._scales[position]
    made = whole(registry, index.calibration, position)
    assert np.array_equal(kept[0].view, made[0]) and np.array_equal(kept[1].view, made[1])
    prepared = key(matcher.match(events))
    registry._scales.clear()
    assert key(matcher.match(events)) == prepared


def test_nothing_is_made_ahead_for_events_no_row_is_told_of() -> None:
    h = Harness()
    for i, interest in enumerate(INTERESTS):
        h.register(f"a{i}", "analyst", interests=[interest])
        subscribe(h, f"a{i}", ["task.assigned"])
    for n in range(8):
        h.record("a0", f"pricing churn {n}", score=0.75)
    state = h.field.state
    registry = state.registry
    registry._scales.clear()
    matcher = Matcher(registry, state.index, state.units)
    scope = matcher.scope()
    assert len(scope.profiles) > FEW_PROFILES
    assert list(matcher.prepare(events_of(h), scope)) == []
    assert registry._scales == {}


def test_the_router_yields_between_the_steps_before_it_queues_a_notification() -> None:
    """A batch at a new checkpoint: each of its first steps makes at most two rows' scales,
    no frame is queued until they are all made, then every stream is notified once."""
    writer = Writer()
    queues = []
    for i, interest in enumerate(INTERESTS):
        agent = f"a{i}"
        writer.call("REGISTER", agent, {"id": agent, "role": "analyst", "interests": [interest]})
        queue = Plain()
        connection = writer.router.connect(agent, "sse", queue)
        writer.router.attach(connection, writer.subscribe(agent), None)
        queue.take()
        queues.append(queue)
    writer.register("writer")
    for n in range(7):
        writer.record("writer", f"pricing churn {n}")
    for queue in queues:
        assert len(queue.take()) == 7
    registry = writer.field.state.registry
    payload = {
        "type": "finding",
        "content": "pricing churn at the eighth unit",
        "intent": {"purpose": "testing the router"},
        "confidence": {"score": 0.8, "reasoning": "a test"},
    }
    token = writer.tokens["writer"]
    outcome = writer.field.handle(envelope("RECORD", "writer", payload), token=token)
    stored = writer.append(list(outcome.entries))  # the 8th unit: a new checkpoint
    index = writer.field.state.index
    position = int(index.calibration.at(index.count_at(stored[-1].epoch)))
    assert position not in registry._scales
    made = []
    with one_row_a_step(registry, 2):
        for _ in writer.router.route(stored):
            kept = registry._scales.get(position)
            made.append(0 if kept is None else kept[0].size)
            if made[-1] < registry.squares.size:
                assert all(queue.frames == [] for queue in queues)
    rows = registry.squares.size
    steps = math.ceil(rows / 2)
    assert made[:steps] == [min(rows, 2 * (k + 1)) for k in range(steps)]
    for queue in queues:
        assert [kind for kind, _ in queue.take()] == ["memory.recorded"]
