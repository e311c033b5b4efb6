"""A sender's direct writes: frames that arrive while it waits go out where they arrive.

``consume`` given a sink's plain ``write_now`` writes what reaches the outbox
while its loop waits, in the loop's batches and order, without waking the loop;
whatever cannot go out at once (a full socket, a notification rate to keep, a
closed outbox) wakes the loop, which sends it as before.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from field.engine.consumer import consume
from field.engine.push import Connection, PushHub
from field.engine.router import Frame

from .test_push_hub import Hub, hub  # noqa: F401
from .test_ratelimits import Clock, paced  # noqa: F401


class Sink:
    """A socket that takes bytes (``writable``) or not, and what each path wrote."""

    def __init__(self) -> None:
        self.writable = True
        #: batches written where they arrived (write_now)
        self.now: list[list[bytes]] = []
        #: batches the woken loop wrote
        self.woken: list[list[bytes]] = []
        self._wrote = asyncio.Event()

    def write_now(self, texts: list[bytes]) -> bool:
        if not self.writable:
            return False
        self.now.append(texts)
        self._wrote.set()
        return True

    async def write(self, batch: list[Frame]) -> bool:
        self.woken.append([encode(frame) for frame in batch])
        self._wrote.set()
        return False

    async def until(self, frames: int) -> None:
        """Wait until ``frames`` frames have been written, either way."""
        while sum(map(len, self.now)) + sum(map(len, self.woken)) < frames:
            await self._next()

    async def until_notified(self, count: int) -> None:
        """Wait until ``count`` notifications have been written, either way."""
        while len(units(self.now)) + len(units(self.woken)) < count:
            await self._next()

    async def _next(self) -> None:
        self._wrote.clear()
        await asyncio.wait_for(self._wrote.wait(), 5)


def encode(frame: Frame) -> bytes:
    return frame.body


def sending(h: PushHub, connection: Connection, sink: Sink) -> asyncio.Task[bool]:
    return asyncio.create_task(
        consume(h, connection, sink.write, most=257, write_now=sink.write_now, encode=encode)
    )


async def streaming(h: Hub, sink: Sink) -> tuple[Connection, Sink, asyncio.Task[bool]]:
    """a's WebSocket of a new subscription to memory.recorded, sent to ``sink``, its
    sender waiting once it has sent what attaching queued (the live marker)."""
    subscription = await h.subscribe("a", ["memory.recorded"])
    connection = h.hub.connect("a", "ws")
    h.hub.attach(connection, subscription, None)
    queued = len(connection.outbox)
    assert queued
    task = sending(h.hub, connection, sink)
    await sink.until(queued)
    return connection, sink, task


def units(batches: list[list[bytes]]) -> list[str]:
    """The memory units notified in ``batches``, in order (other frames left out)."""
    found = [orjson.loads(text) for batch in batches for text in batch]
    return [data["memory_unit_id"] for data in found if "memory_unit_id" in data]


def numbered(n: int) -> Frame:
    return Frame(b"frame-%d" % n, "memory.recorded", cursor=f"t-{n}")


async def test_a_fan_out_is_written_where_it_arrives_and_the_sender_sleeps_on(
    hub: Hub,  # noqa: F811
) -> None:
    connection, sink, task = await streaming(hub, Sink())
    recorded = [await hub.record("writer", f"pricing note {n}") for n in range(3)]
    await sink.until_notified(3)
    assert units(sink.now) == recorded and units(sink.woken) == []
    assert not task.done()  # still waiting in the outbox, never woken
    hub.hub.end(connection, 1000, "done", None)
    assert await task is True


async def test_a_socket_that_takes_nothing_now_leaves_the_frames_to_the_sender(
    hub: Hub,  # noqa: F811
) -> None:
    sink = Sink()
    sink.writable = False
    connection, sink, task = await streaming(hub, sink)
    recorded = [await hub.record("writer", f"pricing note {n}") for n in range(2)]
    await sink.until_notified(2)
    assert sink.now == [] and units(sink.woken) == recorded
    sink.writable = True  # the socket drained: the next frame goes out where it arrives
    third = await hub.record("writer", "pricing note 2")
    await sink.until_notified(3)
    assert units(sink.now) == [third]
    hub.hub.end(connection, 1000, "done", None)
    assert await task is True


async def test_what_one_turn_queues_goes_out_in_one_write(hub: Hub) -> None:  # noqa: F811
    connection = hub.hub.connect("a", "ws")
    sink = Sink()
    task = sending(hub.hub, connection, sink)
    await asyncio.sleep(0)  # the sender waits
    for n in range(3):  # put outside a fan-out, as a replay's step or a response is
        assert connection.outbox.put(numbered(n))
    await sink.until(3)
    assert sink.now == [[b"frame-0", b"frame-1", b"frame-2"]] and sink.woken == []
    connection.outbox.close_with(None)
    assert await task is True


async def test_the_agents_notification_rate_holds_for_what_is_written_at_once(
    paced: tuple[Hub, Clock],  # noqa: F811
) -> None:
    h, clock = paced
    connection = h.hub.connect("a", "ws")
    sink = Sink()
    task = sending(h.hub, connection, sink)
    await asyncio.sleep(0)
    for n in range(6):
        assert connection.outbox.put(numbered(n))
    await sink.until(6)
    # a burst of 4 at once; the other 2 waited for their tokens in the sender, 2 a second
    assert sink.now == [[b"frame-%d" % n for n in range(4)]]
    assert sink.woken == [[b"frame-4", b"frame-5"]]
    assert clock.pauses == [1.0]
    connection.outbox.close_with(None)
    assert await task is True


async def test_a_direct_write_that_fails_leaves_its_frames_to_the_sender(
    hub: Hub,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    connection = hub.hub.connect("a", "ws")
    sink = Sink()

    def broken(texts: list[bytes]) -> bool:
        raise RuntimeError("the socket went wrong")

    task = asyncio.create_task(
        consume(hub.hub, connection, sink.write, most=257, write_now=broken, encode=encode)
    )
    await asyncio.sleep(0)
    assert connection.outbox.put(numbered(0)) and connection.outbox.put(numbered(1))
    await sink.until(2)
    assert sink.woken == [[b"frame-0", b"frame-1"]]  # none lost, none twice, in order
    assert "a direct write of ws failed" in caplog.text
    connection.outbox.close_with(None)
    assert await task is True
