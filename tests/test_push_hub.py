"""The push hub's bookkeeping, in the core (no sockets): what a publish looks at.

A publish must cost what its events need, not what the number of open
streams is: it reuses the matcher's scope of the bound subscriptions
until bindings or the registry change, and flushes only the streams that
hold a debounce window open. These tests check that the shortcuts give
the same deliveries as the long way, through every change that must
invalidate them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from field.core.field import Field
from field.engine import push, router
from field.engine.push import Connection, PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.transports import sse

from .conftest import UNLOADED_POLICY
from .test_service import envelope


@dataclass
class Hub:
    hub: PushHub
    service: FieldService
    tokens: dict[str, str]

    async def call(self, operation: str, agent_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        token = self.tokens.get(agent_id)
        outcome = await self.service.execute(
            lambda field: field.handle(envelope(operation, agent_id, payload), token=token),
            operation=operation,
        )
        if operation == "REGISTER":
            self.tokens[agent_id] = outcome.response["token"]
        return outcome.response

    async def register(self, agent_id: str) -> None:
        payload = {"id": agent_id, "role": "analyst", "interests": ["pricing"]}
        await self.call("REGISTER", agent_id, payload)

    async def subscribe(self, agent_id: str, events: list[str], debounce_ms: int = 0) -> str:
        subscription = {"events": events, "debounce_ms": debounce_ms}
        response = await self.call(
            "SUBSCRIBE", agent_id, {"action": "subscribe", "subscription": subscription}
        )
        return str(response["subscription_id"])

    def stream(self, agent_id: str, subscription_id: str) -> Connection:
        """A live stream of the subscription, as the SSE endpoint opens one."""
        connection = self.hub.connect(agent_id, "sse")
        self.hub.attach(connection, subscription_id, None)
        return connection

    async def record(self, agent_id: str, content: str) -> str:
        payload = {
            "type": "finding",
            "content": content,
            "intent": {"purpose": "testing the hub"},
            "confidence": {"score": 0.8, "reasoning": "a test"},
        }
        return str((await self.call("RECORD", agent_id, payload))["memory_unit_id"])


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
    push = PushHub(service)
    await service.start()
    h = Hub(push, service, {})
    for agent_id in ("writer", "a", "b"):
        await h.register(agent_id)
    yield h
    await service.stop()


def units(connection: Connection) -> list[str]:
    """The memory units of the notifications queued on a connection (control frames dropped)."""
    frames = connection.outbox.drain_now(10_000)
    return [orjson.loads(f.body)["memory_unit_id"] for f in frames if f.cursor is not None]


async def test_the_bound_set_and_the_registry_changing_refresh_what_a_publish_matches(
    hub: Hub,
) -> None:
    a_sub = await hub.subscribe("a", ["memory.recorded"])
    a = hub.stream("a", a_sub)
    first = await hub.record("writer", "pricing first")
    assert units(a) == [first]
    scope = hub.hub.router.scope
    assert scope is not None
    second = await hub.record("writer", "pricing second")
    assert units(a) == [second]
    assert hub.hub.router.scope is scope  # nothing changed: the same scope served
    # a subscription that is created but not streamed changes the registry
    await hub.subscribe("writer", ["agent.joined"])
    b_sub = await hub.subscribe("b", ["memory.recorded"])
    b = hub.stream("b", b_sub)  # a new binding
    third = await hub.record("writer", "pricing third")
    assert (units(a), units(b)) == ([third], [third])
    # a cancelled subscription stops at once, the other goes on
    await hub.call("SUBSCRIBE", "a", {"action": "unsubscribe", "subscription": {"id": a_sub}})
    fourth = await hub.record("writer", "pricing fourth")
    assert (units(a), units(b)) == ([], [fourth])
    # the last stream of a subscription closing unbinds it
    hub.hub.disconnect(b)
    await hub.record("writer", "pricing fifth")
    assert units(b) == []
    assert hub.hub.router.by_subscription == {}


async def test_only_streams_with_an_open_window_are_flushed_and_then_let_go(hub: Hub) -> None:
    debounced = hub.stream("a", await hub.subscribe("a", ["memory.recorded"], debounce_ms=50))
    prompt = hub.stream("b", await hub.subscribe("b", ["memory.recorded"]))
    unit = await hub.record("writer", "pricing under debounce")
    assert units(prompt) == [unit]  # undebounced: at once, never a window
    (binding,) = debounced.streams.values()
    assert hub.hub.router.windowed == {binding}
    assert units(debounced) == []
    hub.hub.flush_due(time.time() + 1)  # as the hub's timer will once the window has ended
    assert units(debounced) == [unit]
    assert hub.hub.router.windowed == set()


async def test_a_stream_that_goes_away_with_an_open_window_is_let_go(hub: Hub) -> None:
    debounced = hub.stream("a", await hub.subscribe("a", ["memory.recorded"], debounce_ms=60_000))
    await hub.record("writer", "pricing held for a minute")
    assert len(hub.hub.router.windowed) == 1
    hub.hub.disconnect(debounced)
    assert hub.hub.router.windowed == set()


async def test_deregistering_ends_only_that_agents_connections(hub: Hub) -> None:
    a = hub.stream("a", await hub.subscribe("a", ["memory.recorded"]))
    a_again = hub.stream("a", await hub.subscribe("a", ["memory.recorded"]))
    b = hub.stream("b", await hub.subscribe("b", ["memory.recorded"]))
    await hub.call("DEREGISTER", "a", {"agent_id": "a"})
    for connection in (a, a_again):  # the hub ends them after the response: await their end
        async with asyncio.timeout(10):
            while await connection.outbox.get() is not None:
                pass
    assert a.ended == a_again.ended == (4409, "agent deregistered")
    assert a.streams == a_again.streams == {}
    assert b.ended is None and len(b.streams) == 1
    unit = await hub.record("writer", "pricing after a left")
    assert units(b) == [unit]


async def test_an_sse_response_that_never_streams_lets_go_of_its_connection(hub: Hub) -> None:
    """The client is gone before the first byte (the server's send fails at once): the
    response still releases the hub connection."""
    connection = hub.stream("a", await hub.subscribe("a", ["memory.recorded"]))
    response = sse.HubEventStream(hub.hub, connection, "s")
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client went away")

    with pytest.raises((OSError, ExceptionGroup)):
        await response(scope, receive, send)
    assert connection not in hub.hub.connections
    assert hub.hub.router.by_subscription == {} and hub.hub.router.by_agent == {}


async def test_a_replayed_page_is_offered_in_steps_with_the_loop_running_between(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page read from the log is matched a slice at a time and its frames queued a few
    at a time: every other connection runs between two steps, and the stream gets the
    same notifications, each once and in order."""
    monkeypatch.setattr(push, "REPLAY_SLICE", 4)
    monkeypatch.setattr(router, "OFFER_SLICE", 2)
    subscription_id = await hub.subscribe("a", ["memory.recorded"])
    recorded = [await hub.record("writer", f"finding {i}") for i in range(10)]
    seen: list[object] = []  # in order: the steps' work, and the other task's turns
    offer_steps = hub.hub.router.offer_steps

    def stepped(binding: Any, entries: list[Any], *args: Any, **kwargs: Any) -> Any:
        steps = offer_steps(binding, entries, *args, **kwargs)
        matched = sum(e.kind == "memory.recorded" for e in entries)
        first = True
        for queued in steps:
            seen.append(("matched", matched) if first else ("queued", queued))
            first = False
            yield queued

    async def other_connection() -> None:
        while True:
            seen.append("turn")
            await asyncio.sleep(0)

    monkeypatch.setattr(hub.hub.router, "offer_steps", stepped)
    connection = hub.hub.connect("a", "sse")
    hub.hub.attach_at(connection, subscription_id, 0)
    other = asyncio.ensure_future(other_connection())
    frames = [await connection.outbox.get()]
    while frames[-1] is not None and frames[-1].kind != "live":
        frames.append(await connection.outbox.get())
    other.cancel()
    assert [orjson.loads(f.body)["memory_unit_id"] for f in frames if f and f.cursor] == recorded
    steps = [k for k, s in enumerate(seen) if s != "turn"]
    work = [seen[k] for k in steps]
    assert sum(n for kind, n in work if kind == "queued") == len(recorded)  # type: ignore[misc]
    assert max(n for kind, n in work if kind == "matched") <= 4  # type: ignore[misc]
    assert max(n for kind, n in work if kind == "queued") <= 2  # type: ignore[misc]
    # the other connection ran between every two steps
    assert all("turn" in seen[i + 1 : j] for i, j in itertools.pairwise(steps))
