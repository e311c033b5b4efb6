"""The writer's listeners: called stage by stage, then in the order added (no event loop)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from field.engine.listeners import Listener, Listeners, Stage


def recorder(calls: list[str], name: str) -> Listener:
    def listener(entries: list[Any]) -> None:
        calls.append(name)

    return listener


def publish(listeners: Listeners, entries: list[Any]) -> None:
    """What the writer does with a batch (without its slices)."""
    for listener in listeners.ordered:
        for _ in listener(entries) or ():
            pass


@given(st.lists(st.sampled_from(list(Stage)), max_size=12))
def test_listeners_are_called_stage_by_stage_then_in_the_order_added(stages: list[Stage]) -> None:
    listeners, calls = Listeners(), []
    for i, stage in enumerate(stages):
        listeners.add(recorder(calls, f"{stage.value}:{i}"), stage)
    publish(listeners, [])
    expected = [f"{s.value}:{i}" for i, s in sorted(enumerate(stages), key=lambda p: (p[1], p[0]))]
    assert calls == expected
    assert len(listeners) == len(stages)


def test_deliveries_hear_of_a_batch_before_the_hub_routes_it_whoever_came_first() -> None:
    listeners, calls = Listeners(), []
    follower, hub, deliveries = (recorder(calls, n) for n in ("follower", "hub", "deliveries"))
    listeners.add(follower)
    listeners.add(hub, Stage.ROUTING)
    listeners.add(deliveries, Stage.DELIVERIES)
    publish(listeners, [])
    assert calls == ["deliveries", "hub", "follower"]


def test_a_wrapped_listener_keeps_its_place_and_its_steps() -> None:
    listeners, calls = Listeners(), []
    first, last = recorder(calls, "first"), recorder(calls, "last")

    def routing(entries: list[Any]) -> Iterator[None]:
        for entry in entries:
            calls.append(f"route {entry}")
            yield

    def timed(listener: Listener) -> Listener:
        def wrapper(entries: list[Any]) -> Iterator[None]:
            calls.append("timer on")
            yield from listener(entries) or ()
            calls.append("timer off")

        return wrapper

    listeners.add(last)
    listeners.add(routing, Stage.ROUTING)
    listeners.add(first, Stage.DELIVERIES)
    listeners.wrap(routing, timed)
    publish(listeners, [1, 2])
    assert calls == ["first", "timer on", "route 1", "route 2", "timer off", "last"]
    assert routing not in listeners and len(listeners) == 3


def test_a_listener_removed_while_a_batch_is_published_still_hears_of_that_batch() -> None:
    listeners, calls = Listeners(), []
    later = recorder(calls, "later")

    def leaving(entries: list[Any]) -> None:
        calls.append("leaving")
        listeners.remove(leaving)
        listeners.remove(later)
        listeners.remove(recorder(calls, "never added"))  # nothing happens

    listeners.add(leaving, Stage.DELIVERIES)
    listeners.add(later)
    publish(listeners, [])
    assert calls == ["leaving", "later"]
    publish(listeners, [])  # the next batch: both are gone
    assert calls == ["leaving", "later"] and len(listeners) == 0 and leaving not in listeners
