"""One loop that empties a connection's outbox into a socket, for every streaming sink.

A WebSocket, an SSE stream and a console stream all consume their outbox the same
way: wait for a frame, take what is queued behind it (a bounded batch, written in
one go), wait for the agent's notification tokens (:meth:`PushHub.pace`), and hand
the batch to the sink, which only frames and sends it. :func:`consume` is that loop;
a sink gives it its ``write`` (and, for a stream that must show it is alive while
idle, what to send after ``idle`` seconds of quiet).

The durable sinks (webhooks, RAP, MCP resources) hold no task while idle and take
one frame at a time as their receiver answers; they read their outbox directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .latency import Latency
from .push import Connection, PushHub
from .router import Frame, count_notifications

logger = logging.getLogger("field.push")

#: What a sink does with one batch of frames; True: the stream ends with it.
Write = Callable[[list[Frame]], Awaitable[bool]]
#: A sink's plain write of encoded frames (what ``encode`` made of them): all of them
#: written at once (True), or none (False: the socket takes no more now, the
#: connection is closing).
WriteNow = Callable[[list[bytes]], bool]


async def consume(
    hub: PushHub,
    connection: Connection,
    write: Write,
    *,
    most: int,
    last: frozenset[str] = frozenset(),
    idle: float | None = None,
    quiet: Callable[[], Awaitable[None]] | None = None,
    write_now: WriteNow | None = None,
    encode: Callable[[Frame], bytes] | None = None,
) -> bool:
    """Copy ``connection``'s frames to ``write``, a batch at a time, until its outbox is
    closed and drained (True) or ``write`` says the stream ends (False).

    A batch is the first frame and what is queued behind it, ``most`` frames at most
    (fewer under a notification rate: :meth:`PushHub.batch_size`), and none after a
    frame whose kind is in ``last``; it is written once its notifications' tokens are
    there. With ``idle``, ``quiet()`` is awaited whenever the outbox has been empty that
    long (a keep-alive). Whatever ``write`` or ``quiet`` raise (a send timed out, the
    client left) ends the loop and reaches the caller.

    With ``write_now`` and ``encode`` (and neither ``last`` nor ``idle``), frames that
    arrive while the loop waits are written as they arrive, in the same batches and
    order, without waking it (:attr:`Outbox.take_now`), whenever that needs no wait.
    """
    outbox = connection.outbox
    most = hub.batch_size(most)
    counts = hub.counts
    sent = None if counts is None else counts.sender(connection.kind)
    latency = None if counts is None else counts.latency_of(connection.kind)
    if write_now is not None and encode is not None and not last and idle is None:
        outbox.take_now = _WriteNow(hub, connection, write_now, encode, most, sent, latency)
    try:
        while True:
            if idle is None:
                frame = await outbox.get()
            else:
                try:
                    async with asyncio.timeout(idle):
                        frame = await outbox.get()
                except TimeoutError:
                    if quiet is not None:
                        await quiet()
                    continue
            if frame is None:
                return True
            batch = [frame]
            if frame.kind not in last:
                for queued in outbox.drain_now(most - 1):
                    batch.append(queued)
                    if queued.kind in last:
                        break
            await hub.pace(connection, count_notifications(batch, sent))
            ends = await write(batch)
            if latency is not None:
                latency.sent(batch)
            # an idle stream must not pin the frames it last sent
            del frame, batch
            if ends:
                return False
    finally:
        outbox.take_now = None


class _WriteNow:
    """:attr:`Outbox.take_now` for :func:`consume`: its loop's batches, encoded and
    written by the sink's ``write_now`` while the loop waits; True once the outbox is
    empty. (An object of slots, not a closure: an idle connection keeps it.)"""

    __slots__ = ("hub", "connection", "write_now", "encode", "most", "sent", "latency")

    def __init__(
        self,
        hub: PushHub,
        connection: Connection,
        write_now: WriteNow,
        encode: Callable[[Frame], bytes],
        most: int,
        sent: dict[str, int] | None,
        latency: Latency | None,
    ) -> None:
        self.hub, self.connection, self.write_now, self.encode = hub, connection, write_now, encode
        self.most, self.sent, self.latency = most, sent, latency

    def __call__(self) -> bool:
        hub, connection = self.hub, self.connection
        outbox = connection.outbox
        while batch := outbox.drain_now(self.most):
            notifications = count_notifications(batch, None)
            try:
                written = hub.may_send_now(connection, notifications) and self.write_now(
                    [self.encode(frame) for frame in batch]
                )
            except Exception:  # whatever it is, the loop meets it again, in its own task
                logger.exception("a direct write of %s failed", connection.kind)
                written = False
            if not written:
                outbox.unget(batch)  # the loop sends them, once it may
                return False
            hub.sent_now(connection, notifications)
            if self.sent is not None:
                count_notifications(batch, self.sent)
            if self.latency is not None:
                self.latency.sent(batch)
        return True
