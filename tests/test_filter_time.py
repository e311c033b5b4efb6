"""Each agent's share of filter time: its filters cannot take everyone's.

The time each evaluation takes is charged to the agent whose subscription needed it. An
agent past its share has its filtered streams set aside for new events while everyone
else's are served as usual: each reads what it missed from the log on the same
connection, at the pace its share allows, and gets every notification it is owed, once
and in order, then takes live notifications again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson
import pytest

from field.core.field import Field
from field.engine.push import Connection, PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.filtering import FilterTime
from field.subscriptions.stream import format_cursor

from .conftest import UNLOADED_POLICY, ThreadedServer
from .test_push_hub import Hub, units
from .test_webhooks import FAST_RETRIES, Receiver, agents, in_order_without_loss, note

FILTER = 'event.unit.type == "finding" && subscriber.interests.exists(i, i != "")'
SEALED = 'event.unit.type == "finding" && parameters.task_id.all(t, size(t) > 0)'


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_spent_is_paid_back_at_the_agents_share() -> None:
    clock = Clock()
    share = FilterTime(0.05, 0.02, clock=clock)
    assert share.available("a") and share.wait("a") == 0.0
    share.spend("a", 0.5)  # far past its burst: in debt
    assert not share.available("a")
    # until a microsecond is there again
    assert share.wait("a") == pytest.approx((0.5 - 0.02 + 1e-6) / 0.05, rel=1e-9)
    assert share.available("b")  # another agent's share is its own
    clock.now += 9.0
    assert not share.available("a")
    clock.now += 0.7
    assert share.available("a")


@pytest.fixture
async def shared() -> AsyncIterator[tuple[Hub, FilterTime, Clock]]:
    clock = Clock()
    share = FilterTime(0.05, 0.02, clock=clock)
    service = FieldService(
        MemoryEventLog(), lambda: Field(filter_time=share), admission=UNLOADED_POLICY
    )
    hub = Hub(PushHub(service), service, {})
    await service.start()
    for agent_id in ("writer", "a", "b"):
        await hub.register(agent_id)
    yield hub, share, clock
    await service.stop()


async def subscribe(hub: Hub, agent_id: str) -> str:
    subscription = {"events": ["memory.recorded"], "filter": FILTER}
    response = await hub.call(
        "SUBSCRIBE", agent_id, {"action": "subscribe", "subscription": subscription}
    )
    return str(response["subscription_id"])


async def notified(connection: Connection, count: int) -> list[str]:
    """The next ``count`` notifications' units, awaited (control frames skipped)."""
    found: list[str] = []
    async with asyncio.timeout(10):
        while len(found) < count:
            frame = await connection.outbox.get()
            assert frame is not None, connection.ended
            if frame.cursor is not None:
                found.append(orjson.loads(frame.body)["memory_unit_id"])
    return found


async def test_an_agent_out_of_filter_time_catches_up_from_the_log_with_all_it_is_owed(
    shared: tuple[Hub, FilterTime, Clock],
) -> None:
    hub, share, clock = shared
    a_sub, b_sub = await subscribe(hub, "a"), await subscribe(hub, "b")
    a, b = hub.stream("a", a_sub), hub.stream("b", b_sub)
    first = await hub.record("writer", "pricing one")
    assert (units(a), units(b)) == ([first], [first])

    share.spend("a", 1.0)  # a's filters took a second: twenty of its share
    second = await hub.record("writer", "pricing two")
    third = await hub.record("writer", "pricing three")
    assert units(b) == [second, third]  # the other agent is served as ever
    # a's stream is set aside, not ended: it waits on the same connection
    assert units(a) == [] and a.ended is None
    (binding,) = a.streams.values()
    assert binding.lagging

    # its share paid back, it reads what it missed from the log, in order, then goes live
    clock.now += 20.0
    assert await notified(a, 2) == [second, third]
    fourth = await hub.record("writer", "pricing four")
    assert await notified(a, 1) == [fourth]
    assert units(b) == [fourth]
    async with asyncio.timeout(10):  # it caught up with the fourth too: then it is live
        while binding.lagging:
            await asyncio.sleep(0)
    assert a.ended is None
    fifth = await hub.record("writer", "pricing five")
    assert units(a) == [fifth] and units(b) == [fifth]  # live: at once, with the writer


async def test_a_stream_set_aside_while_it_replays_catches_up_after_its_replay(
    shared: tuple[Hub, FilterTime, Clock],
) -> None:
    hub, share, clock = shared
    a_sub = await subscribe(hub, "a")
    before = [await hub.record("writer", f"pricing {n}") for n in range(3)]
    share.spend("a", 1.0)
    connection = hub.hub.connect("a", "sse")
    hub.hub.attach(connection, a_sub, format_cursor(hub.hub.tag, 0))  # replaying, held
    after = [await hub.record("writer", f"pricing later {n}") for n in range(2)]
    clock.now += 20.0
    assert await notified(connection, 5) == before + after
    last = await hub.record("writer", "pricing live")
    assert await notified(connection, 1) == [last]


async def test_a_resumed_stream_waits_for_the_agents_share(
    shared: tuple[Hub, FilterTime, Clock],
) -> None:
    hub, share, clock = shared
    a_sub = await subscribe(hub, "a")
    written = [await hub.record("writer", f"pricing {n}") for n in range(3)]
    share.spend("a", 1.0)
    told_to_wait = asyncio.Event()
    wait = share.wait

    def waiting_for(agent_id: str) -> float:
        delay = wait(agent_id)
        if delay > 0:
            told_to_wait.set()
        return delay

    share.wait = waiting_for  # type: ignore[method-assign]
    connection = hub.hub.connect("a", "sse")
    hub.hub.attach(connection, a_sub, format_cursor(hub.hub.tag, 0))  # from the log's start
    # nothing is replayed while the agent is in debt (the replay waits on its share) ...
    waiting = asyncio.ensure_future(notified(connection, 3))
    async with asyncio.timeout(10):
        await told_to_wait.wait()
    assert not waiting.done() and connection.outbox.drain_now(100) == []
    # ... and all of it once the debt is paid
    clock.now += 20.0
    assert await waiting == written


async def test_a_stream_opened_while_another_catches_up_misses_nothing(
    shared: tuple[Hub, FilterTime, Clock],
) -> None:
    hub, share, clock = shared
    a_sub = await subscribe(hub, "a")
    first = hub.stream("a", a_sub)
    share.spend("a", 1.0)
    missed = await hub.record("writer", "pricing while set aside")
    second = hub.stream("a", a_sub)  # live from here, beside one catching up
    later = await hub.record("writer", "pricing later")
    clock.now += 20.0
    assert await notified(first, 2) == [missed, later]
    assert await notified(second, 1) == [later]
    last = await hub.record("writer", "pricing live")
    assert (await notified(first, 1), await notified(second, 1)) == ([last], [last])


async def test_a_webhook_out_of_filter_time_gets_everything_in_order(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    """On a real server whose burst of filter time is tiny (1 ms; 5% of a core on average,
    the default), a reader's filtered webhook runs out of filter time under a burst of 60
    units: it is set aside, catches up from the log, and its receiver gets every unit once,
    in order."""
    server = server_factory(
        webhook_allow_net=("127.0.0.0/8",),
        filter_share=0.05,
        filter_burst=0.001,
        delivery_rate=10_000.0,  # the webhook's own pace out of the way
        delivery_burst=10_000,
        **FAST_RETRIES,
    )
    receiver = await Receiver().start()
    field_client, writer, reader = await agents(server.url)
    async with field_client, contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(receiver.stop)
        subscribed = await reader.send(
            "SUBSCRIBE",
            {
                "action": "subscribe",
                "subscription": {
                    "events": ["memory.recorded"],
                    "filter": SEALED,  # about 0.1 ms an evaluation: converting the list
                    "bindings": {"task_id": [f"{n:0256d}" for n in range(100)]},
                    "delivery": {"type": "webhook", "url": receiver.url},
                },
            },
        )
        written = await asyncio.gather(*(note(writer, f"market note {n}") for n in range(60)))
        await receiver.until(lambda: len(receiver.delivered) >= len(written), "every unit")
        cursors = list(dict.fromkeys(r.cursor for r in receiver.delivered))
        in_order_without_loss(receiver, cursors)
        positions = [int(cursor.rpartition("-")[2]) for cursor in cursors]
        assert positions == sorted(positions)  # the log's order
        units = [orjson.loads(r.body)["memory_unit_id"] for r in receiver.delivered]
        assert sorted(units) == sorted(w["memory_unit_id"] for w in written)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{server.url}/metrics") as reply,
        ):
            exposition = await reply.text()
        set_aside = [
            line
            for line in exposition.splitlines()
            if line.startswith('field_streams_set_aside_total{transport="webhook"}')
        ]
        assert set_aside and float(set_aside[0].rpartition(" ")[2]) >= 1, set_aside
        # set aside is not failing: no evaluation was counted as an error
        listed = await reader.send("SUBSCRIBE", {"action": "list"})
        (shown,) = [s for s in listed["subscriptions"] if s["id"] == subscribed["subscription_id"]]
        assert shown["filter"] == {"expression": SEALED, "errors": 0, "last_error": None}
