"""The SSE response (``field/transports/sse.py``) driven as an ASGI server drives it.

No sockets: a :class:`Server` plays the ASGI server's side of one request
(``receive`` waits on a future until the client "goes away", ``send``
records every message and can stall), so each test can say exactly when
the client leaves or stops reading, and count the tasks a stream holds.
The end-to-end behaviour over real servers is in ``test_push.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson
import pytest

from field.engine.push import Connection
from field.transports import asgi, sse

from .schema_util import assert_valid
from .test_push_hub import Hub, hub  # noqa: F401  (the fixture)

SCOPE = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}


class Server:
    """The ASGI server's side of one SSE request."""

    def __init__(self, *, gone: bool = False) -> None:
        loop = asyncio.get_running_loop()
        #: completes when the client goes away (uvicorn: the connection is lost)
        self.left: asyncio.Future[None] = loop.create_future()
        if gone:
            self.left.set_result(None)
        self.requested = False
        self.messages: list[MutableMapping[str, Any]] = []
        self._arrived = asyncio.Condition()
        #: while true, every send blocks (the client stopped reading) until ``resumed`` is
        #: set; sends whose message passes ``accept`` go through regardless
        self.stall = False
        self.resumed = asyncio.Event()
        self.accept: Callable[[MutableMapping[str, Any]], bool] = lambda message: False

    async def receive(self) -> dict[str, Any]:
        if not self.requested:  # a GET's empty body first, as uvicorn hands it over
            self.requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.left
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if self.stall and not self.accept(message):
            await self.resumed.wait()
        if self.left.done():
            return  # uvicorn drops what is sent to a client that is gone
        async with self._arrived:
            self.messages.append(message)
            self._arrived.notify_all()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    async def until(self, part: bytes) -> None:
        """Wait until the body holds ``part``."""
        async with asyncio.timeout(10), self._arrived:
            await self._arrived.wait_for(lambda: part in self.body)

    def leave(self) -> None:
        self.left.set_result(None)


def released(h: Hub, connection: Connection) -> bool:
    return connection not in h.hub.connections and h.hub.router.by_agent.get("a") is None


async def start(h: Hub, server: Server) -> tuple[Connection, asyncio.Task[None]]:
    subscription_id = await h.subscribe("a", ["memory.recorded"])
    connection = h.stream("a", subscription_id)
    stream = sse.HubEventStream(h.hub, connection, subscription_id)
    task = asyncio.create_task(stream(SCOPE, server.receive, server.send))
    return connection, task


def events(body: bytes) -> list[tuple[str, str | None, Any]]:
    """(event, id, data) of every event of an SSE body (comments skipped)."""
    out = []
    for block in body.decode().split("\r\n\r\n"):
        fields = dict(
            line.split(": ", 1) for line in block.split("\r\n") if line and ": " in line[1:]
        )
        if "event" in fields:
            out.append((fields["event"], fields.get("id"), orjson.loads(fields["data"])))
    return out


async def test_an_idle_stream_is_one_task_that_pings_and_ends_when_its_client_leaves(
    hub: Hub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "SSE_PING_SECONDS", 0.05)
    before = len(asyncio.all_tasks())
    server = Server()
    connection, task = await start(hub, server)
    await server.until(b"event: live")
    assert server.messages[0]["type"] == "http.response.start"
    headers = dict(server.messages[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-store"
    assert len(asyncio.all_tasks()) == before + 1  # the request's own task, nothing else
    await server.until(b": ping - ")
    assert len(asyncio.all_tasks()) == before + 1
    unit = await hub.record("writer", "pricing while streaming")
    await server.until(unit.encode())
    server.leave()
    async with asyncio.timeout(10):
        await task
    assert released(hub, connection)
    assert connection.ended == (1000, "client closed")


async def test_a_client_gone_before_the_first_byte_lets_go_of_its_connection(
    hub: Hub,  # noqa: F811
) -> None:
    server = Server(gone=True)
    connection, task = await start(hub, server)
    async with asyncio.timeout(10):
        await task
    assert released(hub, connection)
    assert server.messages == []


async def test_a_receive_that_awaits_no_future_still_tells_the_client_left(
    hub: Hub,  # noqa: F811
) -> None:
    """A server whose ``receive()`` yields bare (``sleep(0)``) is stepped on every turn."""
    server = Server()
    left = False

    async def receive() -> dict[str, Any]:
        while not left:
            await asyncio.sleep(0)
        return {"type": "http.disconnect"}

    subscription_id = await hub.subscribe("a", ["memory.recorded"])
    connection = hub.stream("a", subscription_id)
    stream = sse.HubEventStream(hub.hub, connection, subscription_id)
    task = asyncio.create_task(stream(SCOPE, receive, server.send))
    await server.until(b"event: live")
    left = True
    async with asyncio.timeout(10):
        await task
    assert released(hub, connection)


async def test_the_server_stopping_ends_the_stream_cleanly(hub: Hub) -> None:  # noqa: F811
    """The last event says why the stream ends and where to resume: the cursor of the
    last notification sent (here none: the ``live`` event's)."""
    server = Server()
    connection, task = await start(hub, server)
    await server.until(b"event: live")
    hub.hub.shutdown()
    async with asyncio.timeout(10):
        await task
    last = server.messages[-1]
    assert last["more_body"] is False
    head, _, data = last["body"].partition(b"\r\ndata: ")
    assert head == b"event: shutdown"
    live = orjson.loads(server.body.split(b"event: live\r\ndata: ")[1].split(b"\r\n")[0])
    assert orjson.loads(data) == {
        "subscription_id": live["subscription_id"],
        "reason": "server shutting down",
        "cursor": live["cursor"],
    }
    assert released(hub, connection)


async def test_a_consumer_that_stops_reading_is_cut_with_its_cursor(
    hub: Hub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A send that blocks past the send timeout ends the stream: an ``overflow`` event with
    the cursor of the last notification sent, if the consumer takes it at once."""
    monkeypatch.setattr(sse, "SEND_TIMEOUT_SECONDS", 0.1)
    server = Server()
    connection, task = await start(hub, server)
    first = await hub.record("writer", "pricing that is read")
    await server.until(first.encode())
    server.stall = True
    server.accept = lambda message: b"event: overflow" in message.get("body", b"")
    second = await hub.record("writer", "pricing that is never read")
    async with asyncio.timeout(10):
        await task
    assert released(hub, connection)
    assert connection.ended == (4008, "send timed out")
    assert second.encode() not in server.body
    assert server.messages[-1]["more_body"] is False
    sent = events(server.body)
    name, event_id, data = sent[-1]
    assert (name, event_id) == ("overflow", None)
    assert_valid("ws-frame", {"type": "overflow", "data": data})
    (notified,) = [e for e in sent if e[1] is not None]
    assert notified[2]["memory_unit_id"] == first
    assert data["cursors"] == {connection_subscription(sent): notified[1]}


async def test_a_consumer_that_never_reads_again_is_let_go(
    hub: Hub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "SEND_TIMEOUT_SECONDS", 0.05)
    monkeypatch.setattr(sse, "FAREWELL_SECONDS", 0.05)
    server = Server()
    connection, task = await start(hub, server)
    await server.until(b"event: live")
    server.stall = True
    await hub.record("writer", "pricing nobody reads")
    async with asyncio.timeout(10):
        await task
    assert released(hub, connection)
    assert connection.ended == (4008, "send timed out")
    assert b"event: overflow" not in server.body


async def test_before_any_notification_the_cursor_is_where_the_stream_began(
    hub: Hub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "SEND_TIMEOUT_SECONDS", 0.05)
    server = Server()
    connection, task = await start(hub, server)
    await server.until(b"event: live")
    server.stall = True
    server.accept = lambda message: b"event: overflow" in message.get("body", b"")
    await hub.record("writer", "pricing nobody reads")
    async with asyncio.timeout(10):
        await task
    sent = events(server.body)
    resume = next(data for name, _, data in sent if name == "resume")
    assert sent[-1][2]["cursors"] == {connection_subscription(sent): resume["from"]}


def connection_subscription(sent: list[tuple[str, str | None, Any]]) -> str:
    return str(next(data for name, _, data in sent if name == "resume")["subscription_id"])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/subscriptions/sub_1/events", "sub_1"),
        ("/v1/subscriptions//events", None),
        ("/v1/subscriptions/a/b/events", None),
        ("/v1/subscriptions/sub_1/events/", None),
        ("/v1/subscriptions/sub_1", None),
        ("/v1/sources/github/events", None),
    ],
)
def test_the_stream_path_names_one_subscription(path: str, expected: str | None) -> None:
    assert asgi.subscription_of(path) == expected
