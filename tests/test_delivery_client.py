"""The delivery client: its slots (a bound on requests under way, first come, first
served), what its requests carry, and each attempt signed when it is made, against
receivers on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from field.client import FieldClient
from field.core.egress import EgressPolicy, parse_networks
from field.transports.delivery import DeliverySettings, Poster, Slots

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


OK_WITH_COOKIE = b"HTTP/1.1 200 OK\r\nSet-Cookie: session=abc; Path=/\r\nContent-Length: 0\r\n\r\n"
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n"


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every request (head, body, arrival) and
    answers with ``answers`` in turn, then the last one (a 200 that sets a cookie)."""

    def __init__(self, answers: tuple[bytes, ...] = (OK_WITH_COOKIE,)) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.arrivals: list[float] = []
        self.arrived = asyncio.Event()
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str = "127.0.0.1") -> str:
        """Listen on ``host`` (on 127.0.0.1 for a name); the URL names ``host``."""
        address = host if host[0].isdigit() else "127.0.0.1"
        self.server = await asyncio.start_server(self._serve, address, 0)
        return f"http://{host}:{self.server.sockets[0].getsockname()[1]}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                self.bodies.append(await reader.readexactly(length))
                self.heads.append(head)
                self.arrivals.append(time.time())
                self.arrived.set()
                writer.write(self.answers[min(len(self.heads), len(self.answers)) - 1])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def close(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def test_a_receivers_cookies_are_not_sent_back() -> None:
    receiver = Receiver()
    url = await receiver.start("localhost")  # aiohttp's usual jar takes no cookie from an IP
    loopback = EgressPolicy(parse_networks(["127.0.0.0/8", "::1/128"]))
    poster = Poster(DeliverySettings(), loopback)
    await poster.start()
    try:
        for n in range(2):
            answer = await asyncio.wait_for(
                poster.post(url, b"{}", {"webhook-id": f"m-{n}"}), GUARD
            )
            assert answer.status == 200
    finally:
        await poster.close()
        await receiver.close()
    assert len(receiver.heads) == 2
    assert all(b"\r\ncookie:" not in head.lower() for head in receiver.heads)
    assert b"webhook-id: m-1" in receiver.heads[1].lower()


def headers_of(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }


@pytest.mark.slow
async def test_every_attempt_is_signed_when_it_is_made(
    server_factory: Callable[..., Any],
) -> None:
    receiver = Receiver((UNAVAILABLE, OK_WITH_COOKIE))
    url = await receiver.start()
    server = server_factory(webhook_allow_net=("127.0.0.0/8",))
    try:
        async with FieldClient(server.url) as field:
            listener = await field.register("listener", "analyst")
            secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes of key
            subscription = {
                "events": ["memory.recorded"],
                "delivery": {"type": "webhook", "url": url, "secret": secret},
            }
            await listener.send("SUBSCRIBE", {"action": "subscribe", "subscription": subscription})
            writer = await field.register("writer", "analyst")
            await writer.record(
                "finding", "retried once", purpose="a retry", confidence=0.8, reasoning="seen"
            )
            while len(receiver.heads) < 2:  # 503, then Retry-After: 2 s, then the retry
                receiver.arrived.clear()
                await asyncio.wait_for(receiver.arrived.wait(), GUARD)
    finally:
        await receiver.close()
    first, retry = (headers_of(head) for head in receiver.heads[:2])
    assert first["webhook-id"] == retry["webhook-id"] and receiver.bodies[0] == receiver.bodies[1]
    assert receiver.arrivals[1] - receiver.arrivals[0] >= 2
    assert int(retry["webhook-timestamp"]) >= int(first["webhook-timestamp"]) + 1
    for headers, body in zip((first, retry), receiver.bodies, strict=True):
        Webhook(secret).verify(body, headers)  # each attempt's own time is in its signature


async def test_requests_waiting_for_a_busy_host_hold_none_of_the_clients_slots() -> None:
    hung = Receiver((b"",))  # reads requests, never answers
    other = Receiver()
    hung_url, url = await hung.start("127.0.0.2"), await other.start()
    settings = DeliverySettings(concurrency=2, concurrency_per_host=1, timeout=30)
    poster = Poster(settings, EgressPolicy(parse_networks(["127.0.0.0/8"])))
    await poster.start()
    stuck = [asyncio.create_task(poster.post(hung_url, b"{}", {})) for _ in range(3)]
    try:
        while not hung.heads:  # the first holds the hung host's only slot
            hung.arrived.clear()
            await asyncio.wait_for(hung.arrived.wait(), GUARD)
        answer = await asyncio.wait_for(poster.post(url, b"{}", {}), GUARD)
        assert answer.status == 200
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        await poster.close()
        await hung.close()
        await other.close()
