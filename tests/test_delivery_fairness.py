"""Delivery slots shared fairly, end to end: a real Field, receivers on several loopback
addresses (each its own host), agents whose receivers hang.

A receiver that answers promptly gets each notification within two seconds while
other agents' receivers hang on more subscriptions than the Field has slots; an
endpoint that keeps timing out is sent one request at a time, and its deliveries
say so; and once the receivers answer again, every notification arrives, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from field.client import AgentClient, FieldClient

from .conftest import ThreadedServer
from .test_webhooks import delivery_of, note, webhook

#: Failure guard for what is awaited, never a pacing delay.
TIMEOUT = 15.0
#: How late a prompt receiver's notification may be, from the RECORD that made it.
PROMPT_WITHIN = 2.0
FAST_RETRIES = {
    "webhook_retry_base": 0.02,
    "webhook_retry_cap": 0.1,
    "webhook_failing_interval": 0.1,  # failing deliveries keep trying, quickly
}


@dataclass
class Arrival:
    path: str
    at: float  # time.monotonic()
    body: dict[str, Any]


@dataclass
class Receiver:
    """Webhook receivers at ``http://<host>:<port>/hook/<n>``; with ``hold``, requests
    wait until it is set (a receiver that hangs until released)."""

    host: str
    hold: asyncio.Event | None = None
    #: when each request came (before it was held), and each answered request
    starts: list[float] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)
    url: str = ""
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook/{n}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.url = f"http://{self.host}:{self._runner.addresses[0][1]}/hook"
        return self

    async def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        arrival = Arrival(request.path, time.monotonic(), orjson.loads(body))
        self.starts.append(arrival.at)
        self._arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        self.arrivals.append(arrival)  # answered (its client may have given up on it)
        self._arrived.set()
        return web.Response(status=204)

    async def until(self, done: Callable[[], bool], what: str, within: float = TIMEOUT) -> None:
        """Wait until ``done()``, each request waking the check; ``within`` seconds at most."""
        deadline = time.monotonic() + within
        while not done():
            self._arrived.clear()
            left = deadline - time.monotonic()
            assert left > 0, f"not within {within:g} s: {what}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def until_units(self, path: str, units: list[str]) -> None:
        """Wait until ``path`` was delivered ``units``, in order, each at least once."""
        await self.until(lambda: self.units(path) == units, f"{units} at {self.host}{path}")

    def units(self, path: str) -> list[str]:
        """The units delivered at ``path``, each once, in the order they first came."""
        found = [a.body.get("memory_unit_id") for a in self.arrivals if a.path == path]
        return [unit for unit in dict.fromkeys(found) if unit is not None]


@pytest.fixture
async def receivers() -> AsyncIterator[Callable[..., Any]]:
    started: list[Receiver] = []

    async def start(host: str, hold: asyncio.Event | None = None) -> Receiver:
        receiver = await Receiver(host, hold).start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.stop()


async def register(field_client: FieldClient, name: str) -> AgentClient:
    return await field_client.register(name, "analyst", interests=["market"])


async def test_a_prompt_receiver_is_served_within_2_s_while_other_agents_hang(
    server_factory: Callable[..., ThreadedServer], receivers: Callable[..., Any]
) -> None:
    """Three agents with 6 webhooks each (18, on 6 hosts) whose receivers hang; the
    Field has 8 slots, 4 per agent, and a 30 s timeout. A fourth agent's receiver, on a
    host of its own, gets each of 5 notifications within 2 s."""
    server = server_factory(
        webhook_allow_net=("127.0.0.0/8",),
        webhook_concurrency=8,
        webhook_concurrency_per_agent=4,
        webhook_timeout=30,
        **FAST_RETRIES,
    )
    hang = asyncio.Event()
    hosts = [await receivers(f"127.0.0.{2 + i}", hang) for i in range(6)]
    prompt = await receivers("127.0.0.9")
    async with FieldClient(server.url) as field_client:
        writer = await register(field_client, "writer")
        slow = {}
        for a in range(3):
            agent = await register(field_client, f"slow-{a}")
            for n in range(6):
                host = hosts[2 * a + n % 2]
                await webhook(agent, f"{host.url}/{a}-{n}")
                slow[f"/hook/{a}-{n}"] = host
        prompt_agent = await register(field_client, "prompt")
        await webhook(prompt_agent, f"{prompt.url}/0")
        units, late = [], []
        for i in range(5):
            recorded = time.monotonic()
            units.append((await note(writer, f"market finding {i}"))["memory_unit_id"])
            await prompt.until(
                lambda: prompt.units("/hook/0") == units,
                f"notification {i} at the prompt receiver",
                within=PROMPT_WITHIN,
            )
            late.append(prompt.arrivals[-1].at - recorded)
        assert max(late) < PROMPT_WITHIN, late
        # the others were tried meanwhile, and still hang
        assert all(host.starts and not host.arrivals for host in hosts)
        hang.set()
        for path, host in slow.items():
            await host.until_units(path, units)


async def test_an_endpoint_that_keeps_timing_out_gets_one_request_at_a_time(
    server_factory: Callable[..., ThreadedServer], receivers: Callable[..., Any]
) -> None:
    """Six webhooks of one agent to a receiver that hangs past the 0.3 s timeout: after
    three timeouts in a row the endpoint is sent one request at a time, SUBSCRIBE list
    says why the others wait, and once it answers everything arrives."""
    server = server_factory(webhook_allow_net=("127.0.0.0/8",), webhook_timeout=0.3, **FAST_RETRIES)
    hang = asyncio.Event()
    hung = await receivers("127.0.0.2", hang)
    async with FieldClient(server.url) as field_client:
        writer = await register(field_client, "writer")
        reader = await register(field_client, "reader")
        ids = [(await webhook(reader, f"{hung.url}/{n}"))["subscription_id"] for n in range(6)]
        units = [(await note(writer, "market finding"))["memory_unit_id"]]
        deadline = time.monotonic() + TIMEOUT
        while True:  # a state the server reaches without telling anyone: polled
            deferred = [
                d
                for d in [await delivery_of(reader, sid) for sid in ids]
                if "in a row" in (d["last_error"] or "")
            ]
            if deferred:
                break
            assert time.monotonic() < deadline, "no delivery was ever deferred"
            await asyncio.sleep(0.02)
        assert deferred[0]["last_status"] is None and deferred[0]["next_attempt_at"]
        assert "timed out" in deferred[0]["last_error"]
        # from now on one request at a time: each starts once the one before timed out
        opened = time.monotonic()

        def since() -> list[float]:
            return [t for t in hung.starts if t > opened]

        await hung.until(lambda: len(since()) >= 3, "three requests after it opened")
        starts = since()
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert min(gaps) >= 0.25, gaps
        hang.set()
        for n in range(6):
            await hung.until_units(f"/hook/{n}", units)
