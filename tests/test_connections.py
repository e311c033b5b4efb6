"""Connection limits end to end: deadlines, caps, upgrades, push connections per agent.

Every test runs the real app on uvicorn (``server_factory``) with ``field
serve``'s protocols and small limits, and talks to it over raw loopback
sockets where the bytes matter. A second loopback address (127.0.0.2) is
another client. Waits for the server to close a socket are bounded reads;
a state the server reaches without telling the client (a released
connection slot) is polled with a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from field.cli.main import _config, _parser, connection_cap
from field.client import FieldClient
from field.server.config import Config

from .conftest import ServerProcess, ThreadedServer
from .schema_util import assert_valid
from .test_push import SSE, open_sse, open_ws, record, subscribe

#: Failure guard for one awaited answer (never a pacing delay).
TIMEOUT = 5.0
#: The deadlines of the servers under test, in seconds.
HEADER = 0.5
BODY = 0.5

STATUS = b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\n\r\n"
WS_HEAD = (
    b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


# -- raw HTTP ----------------------------------------------------------------------


class Raw:
    """One TCP connection to the server, from ``source``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, server: ThreadedServer, source: str = "127.0.0.1") -> Raw:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, local_addr=(source, 0)
        )
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], Any]:
        """The next response: status, headers (lower-case names), JSON body or None."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines if line)
        size = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(size), TIMEOUT) if size else b""
        return int(status_line.split()[1]), headers, orjson.loads(body) if body else None

    async def closed(self) -> bytes:
        """Whatever the server still sends before it closes the connection."""
        return await asyncio.wait_for(self.reader.read(), TIMEOUT)

    def close(self) -> None:
        self.writer.close()


async def connect(server: ThreadedServer, raws: list[Raw], source: str = "127.0.0.1") -> Raw:
    raw = await Raw.open(server, source)
    raws.append(raw)
    return raw


async def kept_alive(server: ThreadedServer, raws: list[Raw], source: str = "127.0.0.1") -> Raw:
    """A connection that has been answered once (so the server has surely counted it)."""
    raw = await connect(server, raws, source)
    await raw.send(STATUS)
    status, _, _ = await raw.response()
    assert status == 200
    return raw


def assert_error(answer: tuple[int, dict[str, str], Any], status: int, code: str) -> None:
    """An error response with the spec's body, and the connection closing after it."""
    got, headers, body = answer
    assert (got, body["code"]) == (status, code), body
    assert_valid("error", body)
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"


def poll(condition: Any, what: str) -> None:
    """Wait for a state the server does not announce (bounded)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# -- the server's log ----------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def server_log() -> Iterator[Records]:
    """Everything uvicorn and the Field log during a test; none of it may be a
    traceback or an error (a client's misbehaviour is not the server's fault)."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "field")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)
    bad = [r for r in handler.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    """One server, with short deadlines, for the tests that need no limits of their own."""
    config = Config(data_dir=None, log_level="warning", header_timeout=HEADER, body_timeout=BODY)
    started = ThreadedServer(config).start()
    yield started
    started.stop()


# == deadlines ========================================================================


async def timed_out(raw: Raw, started: float, deadline: float, what: str) -> None:
    """The connection is answered 408 once ``deadline`` has passed, then closed."""
    answer = await raw.response()
    elapsed = time.monotonic() - started
    assert_error(answer, 408, "REQUEST_TIMEOUT")
    assert what in answer[2]["message"]
    assert elapsed >= deadline * 0.9, elapsed  # not before the deadline (timer slack)
    assert await raw.closed() == b""


async def test_a_connection_that_sends_nothing_is_answered_408(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    started = time.monotonic()
    raw = await connect(server, raws)
    await timed_out(raw, started, HEADER, "head")


async def test_a_partial_head_is_answered_408(server: ThreadedServer, raws: list[Raw]) -> None:
    raw = await connect(server, raws)
    started = time.monotonic()
    await raw.send(b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\nContent-Type: appl")
    await timed_out(raw, started, HEADER, "head")


async def test_a_head_sent_byte_by_byte_still_has_one_deadline(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(server, raws)
    started = time.monotonic()

    async def drip() -> None:
        for byte in STATUS[:-4]:  # never the blank line that ends the head
            await raw.send(bytes([byte]))
            await asyncio.sleep(HEADER / 10)  # pacing: each byte well within the deadline

    dripping = asyncio.create_task(drip())
    try:
        await timed_out(raw, started, HEADER, "head")
    finally:
        dripping.cancel()


async def test_a_stalled_body_is_answered_408_and_its_request_ends_quietly(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(server, raws)
    await raw.send(
        b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b'Content-Length: 200\r\n\r\n{"protocol": "akashik",'
    )
    started = time.monotonic()
    await timed_out(raw, started, BODY, "body")
    tasks = server.server.server_state.tasks
    poll(lambda: not tasks, "the request's application task did not end")


async def test_a_kept_alive_client_may_pause_between_requests(
    server_factory: Any, raws: list[Raw]
) -> None:
    idle = 3 * HEADER
    server = server_factory(header_timeout=HEADER, idle_timeout=idle)
    raw = await kept_alive(server, raws)
    await asyncio.sleep(1.5 * HEADER)  # idle past the header deadline, within the idle one
    await raw.send(STATUS)
    status, headers, _ = await raw.response()
    assert status == 200 and "connection" not in headers
    answered = time.monotonic()
    assert await raw.closed() == b"", "an idle connection is closed without a word"
    assert time.monotonic() - answered >= idle * 0.9


async def test_a_slow_client_inside_the_deadlines_is_served(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    body = orjson.dumps({"not": "an envelope"})
    raw = await connect(server, raws)
    await raw.send(b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\n")
    await asyncio.sleep(HEADER / 2)
    await raw.send(b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    await asyncio.sleep(BODY / 2)
    await raw.send(body)
    status, _, answer = await raw.response()
    assert (status, answer["code"]) == (400, "INVALID_ENVELOPE")


async def test_push_streams_outlive_every_deadline(server_factory: Any) -> None:
    server = server_factory(header_timeout=HEADER, body_timeout=BODY, idle_timeout=HEADER)
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        reader = await field.register("agent-r", "analyst", interests=["market sizing"])
        writer = await field.register("agent-w", "analyst")
        subscription = await subscribe(reader, ["memory.recorded"])
        sse_url = subscription["sse_url"]
        async with (
            open_ws(server, reader.token) as ws,
            open_sse(http, sse_url, reader.token) as got,
        ):
            assert got.status == 200
            sse = SSE(got)
            await ws.ready()
            while (event := await sse.next()) is not None and event.event != "live":
                pass
            await asyncio.sleep(3 * HEADER)  # both idle past every deadline
            written = await record(writer, "market sizing: the streams are still open")
            [pushed] = await ws.notifications(1)
            streamed = await sse.next()
            assert streamed is not None and streamed.event == "memory.recorded"
            assert pushed["memory_unit_id"] == streamed.data["memory_unit_id"]
            assert pushed["memory_unit_id"] == written["memory_unit_id"]


# == caps ================================================================================


async def test_past_the_total_cap_a_connection_is_answered_503_at_once(
    server_factory: Any, raws: list[Raw]
) -> None:
    server = server_factory(max_connections=3, header_timeout=TIMEOUT, idle_timeout=TIMEOUT)
    held = [await kept_alive(server, raws, source) for source in ("127.0.0.1", "127.0.0.2")]
    await kept_alive(server, raws)
    refused = await connect(server, raws, "127.0.0.3")
    answer = await refused.response()
    assert_error(answer, 503, "OVERLOADED")
    assert answer[1]["retry-after"] == "1"
    assert await refused.closed() == b""
    held[0].close()  # a slot comes free once the server sees the close

    async def served() -> bool:
        raw = await connect(server, raws, "127.0.0.3")
        await raw.send(STATUS)
        return (await raw.response())[0] == 200

    deadline = time.monotonic() + TIMEOUT
    while not await served():
        assert time.monotonic() < deadline, "the closed connection's slot never came free"


async def test_past_a_clients_cap_it_is_answered_429_and_others_are_served(
    server_factory: Any, raws: list[Raw]
) -> None:
    server = server_factory(max_connections_per_client=2, header_timeout=TIMEOUT)
    async with FieldClient(server.url) as field:  # one connection, closed after this
        agent = await field.register("agent-a", "analyst")
    async with open_ws(server, agent.token) as ws:  # a WebSocket counts too
        await kept_alive(server, raws)
        refused = await connect(server, raws)
        assert_error(await refused.response(), 429, "TOO_MANY_CONNECTIONS")
        assert await refused.closed() == b""
        await kept_alive(server, raws, "127.0.0.2")  # another client is served
        assert ws.connection.close_code is None
    # the WebSocket's slot comes free when it closes

    async def served() -> bool:
        raw = await connect(server, raws)
        await raw.send(STATUS)
        return (await raw.response())[0] == 200

    deadline = time.monotonic() + TIMEOUT
    while not await served():
        assert time.monotonic() < deadline, "the WebSocket's slot never came free"


# == every complete request is answered ============================================


def register(agent_id: str) -> bytes:
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-1",
        "operation": "REGISTER",
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": {"id": agent_id, "role": "analyst"},
    }
    return orjson.dumps(envelope)


def chunked(body: bytes) -> bytes:
    half = len(body) // 2
    return b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])


async def test_a_post_asking_to_upgrade_is_served_with_its_body(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    body = register("agent-ws")
    raw = await connect(server, raws)
    await raw.send(
        b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\n"
        + WS_HEAD
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    status, headers, answer = await raw.response()
    assert status == 200 and answer["token"], answer
    assert headers["connection"] == "close"
    assert await raw.closed() == b""


async def test_an_h2c_upgrade_with_a_chunked_body_is_served_as_http(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(server, raws)
    await raw.send(
        b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(register("agent-h2c"))
    )
    status, headers, answer = await raw.response()
    assert status == 200 and answer["agent"]["id"] == "agent-h2c", answer
    assert headers["connection"] == "close"


#: Requests for /v1/ws the Field does not upgrade, each answered 400 INVALID_HANDSHAKE.
NOT_HANDSHAKES = {
    # with a body (websockets would wait for it forever)
    "content-length": b"GET /v1/ws HTTP/1.1\r\n" + WS_HEAD + b"Content-Length: 5\r\n\r\nhello",
    "chunked": b"GET /v1/ws HTTP/1.1\r\n"
    + WS_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n"
    + b"5\r\nhello\r\n0\r\n\r\n",
    "post": b"POST /v1/ws HTTP/1.1\r\n" + WS_HEAD + b"Content-Length: 0\r\n\r\n",
    "http-1.0": b"GET /v1/ws HTTP/1.0\r\n" + WS_HEAD + b"\r\n",
    # headers websockets refuses
    "no-key": b"GET /v1/ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    "version-8": b"GET /v1/ws HTTP/1.1\r\n" + WS_HEAD.replace(b": 13", b": 8") + b"\r\n",
}


@pytest.mark.parametrize("head", NOT_HANDSHAKES.values(), ids=NOT_HANDSHAKES.keys())
async def test_a_handshake_the_field_cannot_take_gets_an_error_body(
    server: ThreadedServer, raws: list[Raw], head: bytes
) -> None:
    raw = await connect(server, raws)
    await raw.send(head.replace(b"\r\n", b"\r\nHost: localhost\r\n", 1))
    answer = await raw.response()
    assert_error(answer, 400, "INVALID_HANDSHAKE")
    assert answer[1]["sec-websocket-version"] == "13"  # the version the Field speaks
    assert await raw.closed() == b""


async def test_a_handshake_for_another_path_is_answered_404(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(server, raws)
    await raw.send(b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\n" + WS_HEAD + b"\r\n")
    assert_error(await raw.response(), 404, "NOT_FOUND")
    assert await raw.closed() == b""


async def test_other_upgrades_are_served_and_the_connection_closed(
    server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(server, raws)
    head = STATUS.replace(b"\r\n\r\n", b"\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
    await raw.send(head + STATUS)  # the pipelined request is dropped with the connection
    status, headers, answer = await raw.response()
    assert status == 200 and answer["status"] == "ok"
    assert headers["connection"] == "close"
    assert await raw.closed() == b""


# == push connections per agent ========================================================


async def test_an_agent_past_its_push_cap_is_refused_on_websocket_and_sse(
    server_factory: Any,
) -> None:
    server = server_factory(max_push_per_agent=2)
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        agent = await field.register("agent-a", "analyst")
        other = await field.register("agent-b", "analyst")
        subscription = await subscribe(agent, ["memory.recorded"])
        async with open_ws(server, agent.token) as first, open_ws(server, agent.token):
            await first.ready()
            async with open_ws(server, agent.token) as third:
                frames, code = await third.until_closed()
            assert code == 4429 and third.connection.close_reason == "TOO_MANY_CONNECTIONS"
            assert [f["type"] for f in frames] == ["error"]
            assert frames[0]["data"]["code"] == "TOO_MANY_CONNECTIONS"
            assert_valid("error", frames[0]["data"])
            async with open_sse(http, subscription["sse_url"], agent.token) as response:
                assert response.status == 429
                body = await response.json()
                assert body["code"] == "TOO_MANY_CONNECTIONS"
                assert_valid("error", body)
            async with open_ws(server, other.token) as theirs:  # another agent is not counted
                assert (await theirs.request("SUBSCRIBE", "agent-b", {"action": "list"}))[
                    "status"
                ] == 200

        async def streams() -> bool:
            async with open_sse(http, subscription["sse_url"], agent.token) as response:
                return response.status == 200

        deadline = time.monotonic() + TIMEOUT
        while not await streams():  # the closed WebSockets' places come free
            assert time.monotonic() < deadline, "the agent's closed connections still count"


# == configuration ========================================================================


def test_connection_settings_come_from_flags_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FIELD_MAX_CONNECTIONS", "1000")
    monkeypatch.setenv("FIELD_HEADER_TIMEOUT", "2.5")
    monkeypatch.setenv("FIELD_MAX_PUSH_PER_AGENT", "3")
    args = _parser().parse_args(
        ["serve", "--max-connections", "2000", "--max-connections-per-client", "20",
         "--body-timeout", "7", "--idle-timeout", "60"]
    )  # fmt: skip
    config = _config(args)
    assert config.max_connections == 2000  # the flag wins
    assert config.max_connections_per_client == 20
    assert config.max_push_per_agent == 3
    assert (config.header_timeout, config.body_timeout, config.idle_timeout) == (2.5, 7, 60)
    defaults = Config()
    assert (defaults.max_connections, defaults.max_connections_per_client) == (50_000, 5_000)
    assert (defaults.header_timeout, defaults.body_timeout, defaults.idle_timeout) == (10, 30, 30)
    assert defaults.max_push_per_agent == 16


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_connections", 0),
        ("max_connections_per_client", -1),
        ("max_push_per_agent", 0),
        ("header_timeout", 0.0),
        ("body_timeout", -1.0),
        ("idle_timeout", float("inf")),
        ("header_timeout", float("nan")),
        ("body_timeout", 86_401.0),
    ],
)
def test_connection_settings_are_validated(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        Config(**{name: value})


def test_a_malformed_number_in_the_environment_names_its_variable() -> None:
    with pytest.raises(ValueError, match="FIELD_IDLE_TIMEOUT must be a number"):
        Config.from_env({"FIELD_IDLE_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="FIELD_MAX_CONNECTIONS must be an integer"):
        Config.from_env({"FIELD_MAX_CONNECTIONS": "1e3"})


def test_the_connection_cap_stays_below_the_open_file_limit() -> None:
    assert connection_cap(50_000, 1_048_576) == 50_000
    assert connection_cap(50_000, 20_000) == 20_000 - 2048 - 256  # backlog and a reserve
    assert connection_cap(50_000, 1024) == 512  # few descriptors: half are kept
    assert connection_cap(100, 20_000) == 100


@pytest.mark.slow
def test_field_serve_says_when_it_lowers_the_cap(server_process: Any, tmp_path: Path) -> None:
    proc: ServerProcess = server_process(tmp_path / "data", "--max-connections", "100000000")
    assert proc.stop() == 0
    lowered = [line for line in proc.lines if "connections, not 100000000" in line]
    assert len(lowered) == 1, proc.lines
