"""Edges answered inside the contract: malformed HTTP, oversize WebSocket messages, and
consumers that stall, whichever bound they reach first.

Every test runs the real app on uvicorn with ``field serve``'s protocols
(``server_factory``) and talks to it over loopback sockets with real clients,
or raw bytes where the bytes matter. A state the server reaches without telling
the client (it gave up on a stalled consumer) is awaited through its log record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from field.client import AgentClient, FieldClient
from field.contract.model import Limits
from field.engine.router import PushLimits

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_connections import Raw, assert_error, connect
from .test_push import ids, open_ws, record, stalling_socket, subscribe, ws_url

#: Failure guard for one awaited answer (never a pacing delay).
TIMEOUT = 5.0


# == malformed HTTP framing =============================================================

#: Requests llhttp cannot frame, each answered 400 INVALID_HTTP.
MALFORMED = {
    "negative-length": b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n",
    "letters-length": b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
    "control-byte-value": b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\n"
    b"X-Note: a\x01b\r\n\r\n",
    "control-byte-name": b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\n"
    b"X-N\x01te: ab\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_framing_is_answered_with_the_error_body(
    field_server: ThreadedServer, raws: list[Raw], request_bytes: bytes
) -> None:
    raw = await connect(field_server, raws)
    await raw.send(request_bytes)
    answer = await raw.response()
    assert_error(answer, 400, "INVALID_HTTP")
    assert answer[2]["recoverable"] is True and answer[2]["message"]
    assert await raw.closed() == b""  # nothing more, then the server closes


async def test_malformed_framing_after_a_good_request_answers_both(
    field_server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(field_server, raws)
    good = b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\n\r\n"
    await raw.send(good + MALFORMED["negative-length"])
    status, _, _ = await raw.response()
    assert status == 200
    assert_error(await raw.response(), 400, "INVALID_HTTP")
    assert await raw.closed() == b""


# == stalled consumers ==================================================================

#: Keepalive of the servers under test (``--ws-ping-interval``, ``--ws-ping-timeout``),
#: short so that a stall shows fast; every other setting is the default.
PING = 0.3
#: Most notifications a test produces while waiting for the server to give up.
MOST = 3000


class Signals(logging.Handler):
    """Log records of the server (in its own thread), each matching one a test awaits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *wanted: str) -> None:
        super().__init__(logging.DEBUG)
        self.loop = loop
        self.events = {text: asyncio.Event() for text in wanted}
        self.lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for text, event in self.events.items():
            if text in message:
                self.loop.call_soon_threadsafe(event.set)

    async def first(self, *texts: str, timeout: float = 20) -> set[str]:
        """Wait for the first of ``texts``; those seen by then."""
        waiters = [asyncio.ensure_future(self.events[text].wait()) for text in texts]
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        return {text for text in texts if self.events[text].is_set()}


@contextlib.contextmanager
def signals(*wanted: str) -> Iterator[Signals]:
    """Await log records of the push hub and of the WebSocket protocol (at DEBUG)."""
    handler = Signals(asyncio.get_running_loop(), *wanted)
    loggers = [logging.getLogger("field.push"), logging.getLogger("field.websocket")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
    loggers[1].setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


async def two_agents(field: FieldClient) -> tuple[AgentClient, AgentClient, dict[str, Any]]:
    """A writer, a reader, and the reader's subscription to what the writer records."""
    a = await field.register("agent-a", "analyst", interests=["market sizing"])
    b = await field.register("agent-b", "researcher", interests=["market sizing"])
    return a, b, await subscribe(b, ["memory.recorded"])


async def record_until(a: AgentClient, done: asyncio.Event) -> list[str]:
    """RECORD findings until ``done`` (the server gave up on someone); their ids."""
    written = []
    padding = "x" * 2048
    while not done.is_set():
        assert len(written) < MOST, "the server never gave up on the stalled consumer"
        unit = await record(a, f"market sizing: finding {len(written)} {padding}")
        written.append(unit["memory_unit_id"])
    return written


def assert_overflowed(
    frames: list[dict[str, Any]],
    code: int,
    written: list[str],
    subscription: dict[str, Any],
    reasons: tuple[str, ...],
) -> None:
    """Every notification queued for it in order, then ``overflow`` with the cursor of the
    last one, then 4008."""
    assert code == 4008, (code, frames[-3:])
    overflow = frames[-1]
    assert overflow["type"] == "overflow", frames[-3:]
    assert overflow["data"]["reason"].startswith(reasons), overflow
    got = [f["data"] for f in frames[:-1]]
    assert all(f["type"] == "notification" for f in frames[:-1]), frames[:-1][-3:]
    assert ids(got) == written[: len(got)]
    cursor = got[-1]["cursor"] if got else subscription["cursor"]
    assert overflow["data"]["cursors"] == {subscription["subscription_id"]: cursor}


async def test_a_consumer_that_stops_reading_gets_overflow_and_4008_with_default_bounds(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    # the default outbox (10,000 frames, 8 MiB) outlasts the socket: the stall is seen
    # first by a send waiting for the socket or by the unanswered ping
    server = server_factory(ws_ping_interval=PING, ws_ping_timeout=PING)
    async with FieldClient(server.url) as field:
        a, b, subscription = await two_agents(field)
        async with open_ws(
            server, b.token, sock=stalling_socket(server), max_queue=1, compression=None
        ) as stalled:
            await stalled.ready()  # live; from now on it is not read
            with signals("closing a slow ws consumer") as log:
                written = await record_until(a, log.events["closing a slow ws consumer"])
            # the server has given up; reading again, the consumer gets the rest
            frames, code = await stalled.until_closed(timeout=20)
    assert_overflowed(
        frames, code, written, subscription, ("send timed out", "keepalive ping timeout")
    )


async def test_an_outbox_overflow_behind_a_full_socket_still_ends_with_overflow(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    # a longer ping timeout, so that the small outbox surely overflows first
    server = server_factory(
        ws_ping_interval=PING,
        ws_ping_timeout=40 * PING,  # 12 s: a loaded machine records slowly
        push=PushLimits(outbox_frames=20, outbox_bytes=1 << 16),
        limits=Limits(max_response_bytes=1 << 16),
    )
    async with FieldClient(server.url) as field:
        a, b, subscription = await two_agents(field)
        async with open_ws(
            server, b.token, sock=stalling_socket(server), max_queue=1, compression=None
        ) as stalled:
            await stalled.ready()
            with signals("closing a slow ws consumer", "stalled", "closing the WebSocket") as log:
                written = await record_until(a, log.events["closing a slow ws consumer"])
                # the outbox overflowed while the socket was full: the consumer is read
                # only once the server is done waiting for it, having seen the stall or
                # (the socket took the rest in time) sent its close
                assert await log.first("stalled", "closing the WebSocket")
            frames, code = await stalled.until_closed(timeout=20)
    assert_overflowed(frames, code, written, subscription, ("outbox overflow",))


class RawWebSocket:
    """A ``/v1/ws`` client on websockets' sans-I/O protocol: it answers pings, or not."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: ClientProtocol
    ) -> None:
        self.reader, self.writer, self.protocol = reader, writer, protocol
        self.events: list[Any] = []
        self.pings = 0
        self.answer_pings = True

    @classmethod
    async def open(cls, server: ThreadedServer, token: str) -> RawWebSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        protocol = ClientProtocol(parse_uri(ws_url(server.url)), max_size=None)
        request = protocol.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        protocol.send_request(request)
        client = cls(reader, writer, protocol)
        client.flush()
        response = await client.event()
        assert isinstance(response, Response) and response.status_code == 101, response
        return client

    def flush(self) -> None:
        self.writer.write(b"".join(self.protocol.data_to_send()))

    async def event(self) -> Any:
        """The next handshake response or frame (pings are counted, and answered or not)."""
        while not self.events:
            data = await asyncio.wait_for(self.reader.read(1 << 16), TIMEOUT)
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            self.events.extend(self.protocol.events_received())
            pongs = self.protocol.data_to_send()
            if self.answer_pings:
                self.writer.write(b"".join(pongs))
            assert data or self.events, "the server closed the socket without a close frame"
        event = self.events.pop(0)
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pings += 1
        return event

    async def frame(self) -> dict[str, Any] | None:
        """The next JSON message (pings and pongs skipped); None for a close frame."""
        while True:
            event = await self.event()
            if event.opcode is Opcode.CLOSE:
                return None
            if event.opcode is Opcode.TEXT:
                frame: dict[str, Any] = orjson.loads(event.data)
                assert_valid("ws-frame", frame)
                return frame

    async def until_closed(self) -> list[dict[str, Any]]:
        frames = []
        while (frame := await self.frame()) is not None:
            frames.append(frame)
        return frames

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def raw_websockets() -> AsyncIterator[list[RawWebSocket]]:
    opened: list[RawWebSocket] = []
    yield opened
    for client in opened:
        client.close()


async def test_a_consumer_that_stops_answering_pings_gets_overflow_and_4008(
    server_factory: Callable[..., ThreadedServer], raw_websockets: list[RawWebSocket]
) -> None:
    server = server_factory(ws_ping_interval=PING, ws_ping_timeout=PING)
    async with FieldClient(server.url) as field:
        a, b, subscription = await two_agents(field)
        client = await RawWebSocket.open(server, b.token)
        raw_websockets.append(client)
        resume, live = await client.frame(), await client.frame()
        assert resume is not None and live is not None and live["type"] == "live"
        written = [(await record(a, "market sizing: one finding"))["memory_unit_id"]]
        client.answer_pings = False  # it reads everything, but answers no ping
        frames = await client.until_closed()
    close = client.protocol.close_rcvd
    assert close is not None
    assert client.pings >= 1
    assert_overflowed(frames, close.code, written, subscription, ("keepalive ping timeout",))
    assert close.reason == "keepalive ping timeout"


async def test_an_idle_consumer_that_answers_pings_stays_connected(
    server_factory: Callable[..., ThreadedServer], raw_websockets: list[RawWebSocket]
) -> None:
    server = server_factory(ws_ping_interval=PING / 3, ws_ping_timeout=PING)
    async with FieldClient(server.url) as field:
        a, b, _ = await two_agents(field)
        client = await RawWebSocket.open(server, b.token)
        raw_websockets.append(client)
        assert [(await client.frame() or {}).get("type") for _ in range(2)] == ["resume", "live"]
        while client.pings < 10:  # ten rounds of keepalive, idle
            event = await client.event()
            assert event.opcode in (Opcode.PING, Opcode.PONG), event
        written = await record(a, "market sizing: after a long idle spell")
        frame = await client.frame()
    assert frame is not None and frame["type"] == "notification", frame
    assert frame["data"]["memory_unit_id"] == written["memory_unit_id"]


# == oversize WebSocket messages ========================================================


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "deflate"])
async def test_a_message_over_the_limit_gets_a_response_frame_then_1009(
    server_factory: Callable[..., ThreadedServer], deflate: bool
) -> None:
    server = server_factory(ws_deflate=deflate)
    limit = server.config.limits.max_body_bytes
    async with FieldClient(server.url) as field:
        _, b, _ = await two_agents(field)
        compression = "deflate" if deflate else None
        async with open_ws(server, b.token, compression=compression) as ws:
            await ws.ready()
            await ws.connection.send("x" * (limit + 1))
            frames, code = await ws.until_closed()
    assert code == 1009, (code, frames)
    (answer,) = frames
    assert answer["type"] == "response" and answer["id"] is None
    assert answer["status"] == 413
    assert answer["body"]["code"] == "PAYLOAD_TOO_LARGE"
    assert_valid("error", answer["body"])


async def test_a_message_at_the_limit_is_answered_as_usual(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()
    limit = server.config.limits.max_body_bytes
    async with FieldClient(server.url) as field:
        _, b, _ = await two_agents(field)
        async with open_ws(server, b.token, compression=None) as ws:
            await ws.ready()
            await ws.connection.send(" " * (limit - 2) + "{}")
            frame = await ws.recv()
            assert frame["type"] == "response" and frame["status"] == 400, frame
            with pytest.raises(asyncio.TimeoutError):
                await ws.recv(timeout=0.2)  # still open
