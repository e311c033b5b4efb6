"""The delivery client against receivers on loopback: what its requests carry, each
attempt signed when it is made, and how its caps, its slow share and its circuits keep
one receiver from holding up another (its slots alone: ``test_slots.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from field.client import FieldClient
from field.core.egress import EgressPolicy, parse_networks
from field.engine.delivery import Answer, DeliverySettings, Poster
from field.subscriptions.delivery import RetryPolicy

#: Failure guard for what is awaited (a lost slot would hang the test), never a pacing delay.
GUARD = 5.0


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
    stuck = [asyncio.create_task(poster.post(hung_url, b"{}", {}, agent="a")) for _ in range(3)]
    try:
        while not hung.heads:  # the first holds the hung host's only slot
            hung.arrived.clear()
            await asyncio.wait_for(hung.arrived.wait(), GUARD)
        # (another agent's: one agent's requests wait for its own share first)
        answer = await asyncio.wait_for(poster.post(url, b"{}", {}, agent="b"), GUARD)
        assert answer.status == 200
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        await poster.close()
        await hung.close()
        await other.close()


async def test_an_endpoint_is_a_host_and_a_port() -> None:
    """A receiver that hangs takes the slots of its own port, not of its host's others."""
    hung, other = Receiver((b"",)), Receiver()
    hung_url, url = await hung.start("127.0.0.2"), await other.start("127.0.0.2")
    settings = DeliverySettings(concurrency=4, concurrency_per_host=1, timeout=30)
    poster = Poster(settings, EgressPolicy(parse_networks(["127.0.0.0/8"])))
    await poster.start()
    stuck = [asyncio.create_task(poster.post(hung_url, b"{}", {})) for _ in range(2)]
    try:
        while not hung.heads:
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


async def test_requests_that_hang_leave_a_quarter_of_the_slots_to_others() -> None:
    """One agent's hung requests hold every slot: once they have run ``slow_after``, the
    newest is cut short for another agent's request, which is answered at once."""
    hung, prompt = Receiver((b"",)), Receiver()
    hung_url, url = await hung.start("127.0.0.2"), await prompt.start("127.0.0.3")
    settings = DeliverySettings(concurrency=4, concurrency_per_agent=4, slow_after=0.2, timeout=30)
    poster = Poster(settings, EgressPolicy(parse_networks(["127.0.0.0/8"])))
    await poster.start()
    stuck = [asyncio.create_task(poster.post(hung_url, b"{}", {}, agent="slow")) for _ in range(6)]
    try:
        while len(hung.heads) < 4:  # every slot is held by a request that hangs
            hung.arrived.clear()
            await asyncio.wait_for(hung.arrived.wait(), GUARD)
        started = time.monotonic()
        answer = await asyncio.wait_for(poster.post(url, b"{}", {}, agent="prompt"), GUARD)
        waited = time.monotonic() - started
        assert answer.status == 200 and waited < 2.0, f"waited {waited:.2f} s"
        (cut,) = [task.result() for task in stuck if task.done()]
        assert cut.status is None and cut.timed_out and "cut short" in (cut.error or "")
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        await poster.close()
        await hung.close()
        await prompt.close()


async def test_an_endpoint_that_keeps_timing_out_gets_one_request_at_a_time() -> None:
    """Three timeouts in a row open the agent's circuit: its requests are deferred, not
    sent, but for one probe once the delay has passed; another agent's requests still
    go; an answer closes the circuit."""
    receiver = Receiver((b"",))
    url = await receiver.start("127.0.0.2")
    now = [1000.0]
    settings = DeliverySettings(timeout=0.3, retry=RetryPolicy(base=0.5, cap=2.0, open_after=3))
    poster = Poster(settings, EgressPolicy(parse_networks(["127.0.0.0/8"])), clock=lambda: now[0])
    await poster.start()

    async def burst(agent: str, n: int) -> list[Answer]:
        posts = [poster.post(url, b"{}", {}, agent=agent) for _ in range(n)]
        return await asyncio.wait_for(asyncio.gather(*posts), GUARD)

    try:
        assert all(a.timed_out and a.sent for a in await burst("a", 3))
        deferred = await burst("a", 4)
        assert not any(a.sent for a in deferred) and len(receiver.heads) == 3
        assert "timed out 3 times in a row" in (deferred[0].error or "")
        assert 0.25 <= (deferred[0].retry_after or 0) <= 0.5
        assert all(a.sent for a in await burst("b", 2))  # another agent's circuit is closed
        receiver.answers = (OK_WITH_COOKIE,)  # the endpoint answers again
        now[0] += 0.5
        probed = await burst("a", 4)
        assert sorted(a.status or 0 for a in probed) == [0, 0, 0, 200]
        assert len(receiver.heads) == 3 + 2 + 1
        assert all("under way" in (a.error or "") for a in probed if not a.sent)
        assert [a.status for a in await burst("a", 3)] == [200, 200, 200]  # closed
    finally:
        await poster.close()
        await receiver.close()
