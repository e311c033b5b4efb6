"""Rate limits per agent: operations refused past the rate, notifications paced, never lost.

Operations: real servers (``server_factory``) with a small burst, whose limiter reads a
clock the test holds still and moves by hand, so what is allowed never depends on how
fast the machine is. A refusal is ``429 RATE_LIMITED`` with the error body and
``Retry-After`` over HTTP, a ``response`` frame with the same body on the WebSocket.

Notifications: the push hub's bucket also reads the test's clock, and its pause moves
that clock instead of sleeping, so a test sees exactly how long each batch waited.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import AgentClient, FieldClient, FieldClientError
from field.contract.errors import HTTP_STATUS, Code
from field.contract.ratelimit import Rate
from field.core.field import Field
from field.engine.push import PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog

from .conftest import UNLOADED_POLICY, ThreadedServer
from .schema_util import assert_valid
from .test_push import open_ws, record, sse_stream, subscribe
from .test_push_hub import Hub

OPERATOR_TOKEN = "operator-token-of-the-rate-tests"


@dataclass
class Clock:
    """A monotonic clock that moves only when told to."""

    now: float = 1000.0
    #: every pause asked of :meth:`pause`, in order
    pauses: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def pause(self, seconds: float) -> None:
        """A pacing wait: the clock moves on by ``seconds`` at once."""
        self.pauses.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def limited_server(
    server_factory: Callable[..., ThreadedServer], clock: Clock, **overrides: Any
) -> ThreadedServer:
    """A Field whose operation limiter reads ``clock`` (set before any request)."""
    settings = {"agent_rate": 0.4, "agent_burst": 3, "operator_token": OPERATOR_TOKEN}
    server = server_factory(**{**settings, **overrides})
    server.app.state.rate_limits.limiter.clock = clock
    return server


async def attune(agent: AgentClient) -> dict[str, Any]:
    return await agent.attune(max_units=5)


async def refused(call: Any) -> FieldClientError:
    """Await ``call``; it must be refused with 429 RATE_LIMITED (the clients here do not
    retry: what the SDK does with a refusal is tested in ``test_admission.py``)."""
    with pytest.raises(FieldClientError) as info:
        await call
    error = info.value
    assert (error.status, error.code) == (429, Code.RATE_LIMITED), error.body
    assert_valid("error", error.body)
    return error


def check_refusal(body: dict[str, Any], wait: float) -> None:
    """The error body of a refusal ``wait`` seconds before the next token."""
    assert_valid("error", body)
    assert body["code"] == Code.RATE_LIMITED
    assert body["recoverable"] is True
    assert body["suggested_action"]
    assert body["details"] == {"retry_after": wait}


# -- operations ---------------------------------------------------------------------


async def test_an_agent_over_its_burst_gets_429_with_retry_after_rounded_up(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    clock = Clock()
    server = limited_server(server_factory, clock)
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst", interests=["pricing"])
        for n in range(3):  # the burst
            await record(a, f"pricing note {n}")
        units = (await client.status())["counts"]
        body = client.envelope("RECORD", a.id, {"type": "finding", "content": "one too many"})
        headers = {"Authorization": f"Bearer {a.token}", "Content-Type": "application/json"}
        async with http.post(
            server.url + "/v1/record", data=orjson.dumps(body), headers=headers
        ) as response:
            assert response.status == 429 == HTTP_STATUS[Code.RATE_LIMITED]
            # one token at 0.4 a second: 2.5 s, rounded up to whole seconds
            assert response.headers["Retry-After"] == "3"
            refusal = orjson.loads(await response.read())
        check_refusal(refusal, 2.5)
        assert refusal["operation"] == "RECORD"
        # refused before the writer: nothing was recorded (the body was not even valid)
        assert (await client.status())["counts"] == units
        clock.now += 2.5  # the token is back: one more, and only one
        await attune(a)
        error = await refused(attune(a))
        check_refusal(error.body, 2.5)


async def test_other_agents_and_the_operator_are_not_limited_by_one_agent(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    clock = Clock()
    server = limited_server(server_factory, clock)
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst", interests=["pricing"])
        b = await client.register("agent-b", "analyst", interests=["pricing"])
        for _ in range(3):
            await attune(a)
        await refused(attune(a))
        for _ in range(3):  # b has its own bucket, full
            await attune(b)
        await refused(attune(b))
        for _ in range(10):  # the operator has none
            listed = await client.request("GET", "/v1/agents", token=OPERATOR_TOKEN)
            assert {agent["id"] for agent in listed["agents"]} == {"agent-a", "agent-b"}
        # requests without a valid token are not counted: the writer refuses them
        for _ in range(5):
            with pytest.raises(FieldClientError) as info:
                await client.request("GET", "/v1/agents", token="not-a-token-of-this-field")
            assert info.value.code == Code.UNAUTHENTICATED


async def test_the_get_lists_take_from_the_same_bucket(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    clock = Clock()
    server = limited_server(server_factory, clock, agent_rate=2.0)
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst")
        await a.get("/v1/agents")
        await a.get("/v1/conflicts")
        await attune(a)
        for path in ("/v1/agents", "/v1/conflicts"):
            headers = {"Authorization": f"Bearer {a.token}"}
            async with http.get(server.url + path, headers=headers) as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "1"  # 0.5 s, rounded up
                body = orjson.loads(await response.read())
            check_refusal(body, 0.5)
            assert body["operation"] is None


async def test_a_websocket_envelope_over_the_rate_gets_a_429_response_frame(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    clock = Clock()
    server = limited_server(server_factory, clock)
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst", interests=["pricing"])
        async with open_ws(server, a.token) as ws:  # connecting is not an operation
            attuning = {"scope": {"role": "analyst", "max_units": 5}}
            for _ in range(3):
                answer = await ws.request("ATTUNE", a.id, attuning)
                assert answer["status"] == 200, answer
            answer = await ws.request("ATTUNE", a.id, attuning)
            assert answer["status"] == 429
            assert answer["id"].startswith("ws-")  # the envelope's id, echoed
            check_refusal(answer["body"], 2.5)
            assert answer["body"]["operation"] == "ATTUNE"
            # HTTP and the socket share the agent's bucket
            await refused(attune(a))
            clock.now += 2.5
            assert (await ws.request("ATTUNE", a.id, attuning))["status"] == 200


async def test_a_deregistered_agents_bucket_is_forgotten(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    clock = Clock()
    server = limited_server(server_factory, clock)
    limiter = server.app.state.rate_limits.limiter
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst")
        await attune(a)
        await attune(a)
        assert len(limiter) == 1
        await a.deregister()  # the last token of the burst
        assert len(limiter) == 0
        # its revoked token is no agent's: not counted, refused by the writer as before
        with pytest.raises(FieldClientError) as info:
            await attune(a)
        assert info.value.code == Code.AGENT_NOT_REGISTERED
        again = await client.register("agent-a", "analyst", previous_token=a.token)
        for _ in range(3):  # a full bucket, though the clock has not moved
            await attune(again)
        await refused(attune(again))


async def test_no_limit_at_rate_zero(server_factory: Callable[..., ThreadedServer]) -> None:
    server = server_factory(agent_rate=0, agent_burst=1)
    assert server.app.state.rate_limits.limiter is None
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst")
        await asyncio.gather(*(attune(a) for _ in range(20)))


# -- notifications ------------------------------------------------------------------


async def test_notifications_over_the_rate_wait_and_all_arrive_in_order(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    clock = Clock()
    server = server_factory(notify_rate=4.0, notify_burst=5)
    hub = server.app.state.push_hub
    assert hub.batch_size(257) == 5  # a sender writes at most a burst at once
    hub.notifications.clock = clock
    hub._pause = clock.pause
    total = 23
    async with FieldClient(server.url, retries=0) as client:
        a = await client.register("agent-a", "analyst", interests=["market sizing"])
        b = await client.register("agent-b", "researcher", interests=["market sizing"])
        await subscribe(b, ["memory.recorded"])
        async with open_ws(server, b.token) as ws:
            await ws.ready()
            written = await asyncio.gather(
                *(record(a, f"market sizing: finding {n}") for n in range(total))
            )
            got = await ws.notifications(total)
    units = [unit["memory_unit_id"] for unit in written]
    # every one arrived, once, in the order the log holds them
    assert sorted(n["memory_unit_id"] for n in got) == sorted(units)
    positions = [int(n["cursor"].rsplit("-", 1)[1]) for n in got]
    assert positions == sorted(positions) and len(set(positions)) == total
    # and they waited for their tokens: the burst at once, the rest at 4 a second
    assert clock.pauses, "nothing waited"
    assert math.isclose(sum(clock.pauses), (total - 5) / 4.0, rel_tol=1e-9)


async def test_sse_notifications_are_paced_too(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    clock = Clock()
    server = server_factory(notify_rate=4.0, notify_burst=5)
    hub = server.app.state.push_hub
    hub.notifications.clock = clock
    hub._pause = clock.pause
    total = 12
    async with FieldClient(server.url) as client, aiohttp.ClientSession() as http:
        a = await client.register("agent-a", "analyst", interests=["market sizing"])
        b = await client.register("agent-b", "researcher", interests=["market sizing"])
        stream = await subscribe(b, ["memory.recorded"])
        async with sse_stream(http, stream["sse_url"], b.token) as sse:
            await sse.ready()
            written = await asyncio.gather(
                *(record(a, f"market sizing: finding {n}") for n in range(total))
            )
            got = await sse.notifications(total)
    received = [event.data["memory_unit_id"] for event in got]
    assert sorted(received) == sorted(unit["memory_unit_id"] for unit in written)
    assert math.isclose(sum(clock.pauses), (total - 5) / 4.0, rel_tol=1e-9)


@pytest.fixture
async def paced() -> AsyncIterator[tuple[Hub, Clock]]:
    clock = Clock()
    service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
    hub = PushHub(service, notify_rate=Rate(2.0, 4), clock=clock, pause=clock.pause)
    await service.start()
    h = Hub(hub, service, {})
    for agent_id in ("writer", "a", "b"):
        await h.register(agent_id)
    yield h, clock
    await service.stop()


async def test_an_agents_push_connections_share_one_bucket(paced: tuple[Hub, Clock]) -> None:
    h, clock = paced
    first, second = h.hub.connect("a", "ws"), h.hub.connect("a", "sse")
    other = h.hub.connect("b", "ws")
    await h.hub.pace(first, 3)
    await h.hub.pace(second, 1)
    assert clock.pauses == []  # 4 of the burst of 4, between a's two connections
    await h.hub.pace(other, 4)
    assert clock.pauses == []  # b's bucket is its own
    await h.hub.pace(second, 1)
    assert clock.pauses == [0.5]  # a's next token, at 2 a second
    # more than a burst at once is paid a burst at a time
    await h.hub.pace(first, 9)
    assert math.isclose(sum(clock.pauses), 0.5 + 9 / 2.0)


async def test_durable_sinks_and_ended_connections_are_not_paced(
    paced: tuple[Hub, Clock],
) -> None:
    h, clock = paced
    ws = h.hub.connect("a", "ws")
    await h.hub.pace(ws, 4)
    sink = h.hub.connect_sink("a", "webhook", ws.outbox)
    await h.hub.pace(sink, 100)  # a delivery keeps to its own delivery_rate
    h.hub.end(ws, 1000, "client closed", None)
    await h.hub.pace(ws, 100)  # nothing more is queued on it: what is left goes at once
    assert clock.pauses == []


async def test_deregistering_forgets_the_agents_notification_bucket(
    paced: tuple[Hub, Clock],
) -> None:
    h, clock = paced
    notifications = h.hub.notifications
    assert notifications is not None
    await h.hub.pace(h.hub.connect("a", "ws"), 4)
    assert len(notifications) == 1
    await h.call("DEREGISTER", "a", {"agent_id": "a"})
    assert len(notifications) == 0
    await h.hub.pace(h.hub.connect("a", "ws"), 4)  # a new agent of that id: a full bucket
    assert clock.pauses == []
