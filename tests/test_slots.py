"""The delivery client's slots, without a network: at most the limit hold; FIFO
:class:`Slots`; :class:`FairSlots` serving the waiting agent that holds the fewest, in
turn among equals; and neither losing a slot to a cancelled waiter."""

from __future__ import annotations

import asyncio
import random

from field.engine.slots import FairSlots, Slots

#: Failure guard for what is awaited (a lost slot would hang the test), never a pacing delay.
GUARD = 5.0


async def hold(slots: Slots, name: str, order: list[str], release: asyncio.Event) -> None:
    async with slots:
        order.append(name)
        await release.wait()


async def test_at_most_the_limit_hold_and_waiters_are_served_in_order() -> None:
    slots = Slots(2)
    order: list[str] = []
    gates = {name: asyncio.Event() for name in "abcde"}
    tasks = [asyncio.create_task(hold(slots, name, order, gates[name])) for name in "abcde"]
    await asyncio.sleep(0)
    assert order == ["a", "b"] and slots.users == 5
    gates["b"].set()
    await tasks[1]
    await asyncio.sleep(0)
    assert order == ["a", "b", "c"]
    gates["a"].set()
    gates["c"].set()
    await asyncio.gather(tasks[0], tasks[2])
    await asyncio.sleep(0)
    assert order == ["a", "b", "c", "d", "e"]
    gates["d"].set()
    gates["e"].set()
    await asyncio.gather(*tasks)
    assert slots.users == 0
    # every slot is free again: two holders at once, at once
    again: list[str] = []
    done = asyncio.Event()
    done.set()
    both = asyncio.gather(hold(slots, "x", again, done), hold(slots, "y", again, done))
    await asyncio.wait_for(both, GUARD)
    assert again == ["x", "y"]


async def test_a_waiter_cancelled_while_waiting_gives_up_its_turn_not_a_slot() -> None:
    slots = Slots(1)
    order: list[str] = []
    first, later = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(slots, "a", order, first))
    cancelled = asyncio.create_task(hold(slots, "b", order, later))
    waiting = asyncio.create_task(hold(slots, "c", order, later))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert slots.users == 2
    first.set()
    later.set()
    await asyncio.wait_for(asyncio.gather(holder, waiting), GUARD)
    assert order == ["a", "c"] and slots.users == 0


async def test_a_waiter_handed_a_slot_then_cancelled_passes_it_on() -> None:
    slots = Slots(1)
    order: list[str] = []
    go = asyncio.Event()
    go.set()
    await slots.__aenter__()  # this test holds the slot
    handed = asyncio.create_task(hold(slots, "b", order, go))
    waiting = asyncio.create_task(hold(slots, "c", order, go))
    await asyncio.sleep(0)
    await slots.__aexit__(None, None, None)  # hands the slot to "b", which has not run yet
    handed.cancel()
    await asyncio.gather(handed, return_exceptions=True)
    await asyncio.wait_for(waiting, GUARD)
    assert order == ["c"] and slots.users == 0


# -- fair slots -----------------------------------------------------------------------------


async def take(
    slots: FairSlots, agent: str, name: str, order: list[str], release: asyncio.Event
) -> None:
    await slots.acquire(agent)
    try:
        order.append(name)
        await release.wait()
    finally:
        slots.release(agent)


async def settle() -> None:
    """Let every task that can run, run: a slot passed on through cancelled waiters takes
    a loop turn a hop, and twenty turns are more than any test here needs."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_agents_that_hold_as_many_take_turns() -> None:
    slots = FairSlots(1)
    order: list[str] = []
    go = asyncio.Event()
    tasks = [asyncio.create_task(take(slots, "x", "x", order, asyncio.Event()))]
    await settle()  # x holds the only slot; then a1 a2 a3 b1 b2 c1 queue, in this order
    for agent, name in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("b", "b2"),
                        ("c", "c1")]:  # fmt: skip
        tasks.append(asyncio.create_task(take(slots, agent, name, order, go)))
    await settle()
    assert slots.users == 7 and slots.waiting
    go.set()
    tasks[0].cancel()  # x lets go: the others pass the slot on as soon as each has it
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), GUARD)
    assert order == ["x", "a1", "b1", "c1", "a2", "b2", "a3"]
    assert slots.users == 0 and not slots.waiting and slots.free == 1


async def test_a_released_slot_goes_to_the_agent_that_holds_the_fewest() -> None:
    slots = FairSlots(3)
    order: list[str] = []
    held = {name: asyncio.Event() for name in ("a1", "a2", "b1")}
    tasks = [
        asyncio.create_task(take(slots, name[0], name, order, held[name]))
        for name in ("a1", "a2", "b1")
    ]
    await settle()
    assert (slots.held("a"), slots.held("b"), slots.free) == (2, 1, 0)
    go = asyncio.Event()
    # a queues first and much more; c, which holds nothing, queues last
    for n in range(3, 8):
        tasks.append(asyncio.create_task(take(slots, "a", f"a{n}", order, go)))
    tasks.append(asyncio.create_task(take(slots, "b", "b2", order, go)))
    tasks.append(asyncio.create_task(take(slots, "c", "c1", order, go)))
    await settle()
    held["a1"].set()  # a holds 1, b 1, c 0: c first
    await settle()
    assert order[3:] == ["c1"]
    held["b1"].set()  # b holds 0 now, a 1, c 1: b
    await settle()
    assert order[3:] == ["c1", "b2"]
    go.set()
    held["a2"].set()
    await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
    assert order[5:] == ["a3", "a4", "a5", "a6", "a7"]
    assert slots.users == 0 and not slots.waiting and slots.free == 3


async def test_fair_waiters_cancelled_lose_their_turn_and_never_a_slot() -> None:
    slots = FairSlots(1)
    order: list[str] = []
    first, later = asyncio.Event(), asyncio.Event()
    later.set()
    holder = asyncio.create_task(take(slots, "a", "a1", order, first))
    await settle()
    cancelled = asyncio.create_task(take(slots, "b", "b1", order, later))
    waiting = asyncio.create_task(take(slots, "c", "c1", order, later))
    await settle()
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert slots.users == 2
    # handed a slot, then cancelled before it ran: the slot goes on to the next
    handed = asyncio.create_task(take(slots, "d", "d1", order, later))
    await settle()
    first.set()
    await asyncio.sleep(0)  # a1 lets go: c1 is handed the slot and has not run yet
    waiting.cancel()
    await asyncio.wait_for(asyncio.gather(holder, waiting, handed, return_exceptions=True), GUARD)
    assert order == ["a1", "d1"]
    assert slots.users == 0 and not slots.waiting and slots.free == 1


async def test_fair_slots_keep_their_bounds_under_random_traffic() -> None:
    """Random holders of random agents come, go and are cancelled: once every task has
    run, never more than the limit hold, each agent holds what the slots say, a free
    slot and a waiter never coexist, and no slot is lost."""
    rng = random.Random(7)
    limit = 3
    slots = FairSlots(limit)
    holding: dict[str, int] = dict.fromkeys("abcde", 0)

    async def one(agent: str, release: asyncio.Event) -> None:
        await slots.acquire(agent)
        holding[agent] += 1
        try:
            await release.wait()
        finally:
            holding[agent] -= 1
            slots.release(agent)

    releases: list[asyncio.Event] = []
    tasks: list[asyncio.Task[None]] = []
    for _ in range(400):
        roll = rng.random()
        if roll < 0.5:
            releases.append(asyncio.Event())
            tasks.append(asyncio.create_task(one(rng.choice("abcde"), releases[-1])))
        elif roll < 0.85 and releases:
            releases.pop(rng.randrange(len(releases))).set()
        elif tasks:
            tasks[rng.randrange(len(tasks))].cancel()
        await settle()
        assert sum(holding.values()) <= limit
        assert all(slots.held(agent) == n for agent, n in holding.items())
        assert slots.free == 0 or not slots.waiting
        assert slots.free + sum(holding.values()) == limit
    for release in releases:
        release.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), GUARD)
    assert slots.users == 0 and slots.free == limit and not slots.waiting
