"""Request ids and the access log (``--access-log``): one line per HTTP request, a line when
a push connection opens and one when it closes, and the request id in every answer.

The log is read from a real ``field serve`` (its stderr, one JSON object a line), stopped
first so that it is complete; the MCP and RAP lines from a server in this process, whose
records a handler here formats as ``field serve`` does and lets a test await. The
answers come from real servers over loopback, refusals made before a request reaches the
application included.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect

from field.cli.logs import JsonFormatter
from field.client import FieldClient
from field.transports.access import MAX_REQUEST_ID, request_id_of

from .conftest import ServerProcess, ThreadedServer
from .test_connections import STATUS, Raw, kept_alive
from .test_connections import connect as raw_connect
from .test_push import TIMEOUT, open_ws, subscribe, ws_url

#: A request id the Field makes: 32 hex digits.
MADE = re.compile(r"[0-9a-f]{32}")
JSON = {"Content-Type": "application/json"}


def envelope(operation: str, agent_id: str, payload: dict[str, Any], message_id: str) -> bytes:
    return orjson.dumps(
        {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": message_id,
            "operation": operation,
            "agent_id": agent_id,
            "session_id": None,
            "epoch": 0,
            "payload": payload,
        }
    )


def finding(content: str) -> dict[str, Any]:
    return {
        "type": "finding",
        "content": content,
        "intent": {"purpose": "test the access log"},
        "confidence": {"score": 0.8, "reasoning": "made up for the test"},
    }


def records_of(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line of a stopped server's log, each one JSON object."""
    records = [orjson.loads(line) for line in server.lines]
    assert all(isinstance(r, dict) for r in records)
    return records


def of_logger(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r["logger"] == name]


def only(records: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The one record with these fields (there must be exactly one)."""
    found = [r for r in records if all(r.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, (fields, found)
    return found[0]


async def no_push_connections(http: aiohttp.ClientSession, url: str) -> None:
    """Wait until the server holds no WebSocket or SSE connection (it was told of every
    client's close): what it scrapes in ``GET /metrics`` (polled; the server announces
    nothing)."""
    open_ = re.compile(rb'^field_connections\{transport="(websocket|sse)"\} ([0-9.]+)$', re.M)
    deadline = time.monotonic() + TIMEOUT
    while True:
        async with http.get(f"{url}/metrics") as response:
            counts = [float(n) for _, n in open_.findall(await response.read())]
        if len(counts) == 2 and not any(counts):
            return
        assert time.monotonic() < deadline, "the server still holds push connections"


# -- field serve --access-log --log-format json ------------------------------------


async def test_each_request_has_one_line_with_its_request_id(
    server_process: Callable[..., ServerProcess], tmp_path: Any
) -> None:
    server = server_process(tmp_path / "data", "--access-log", "--log-format", "json")
    url = server.url
    bogus = {
        "too long": "x" * (MAX_REQUEST_ID + 1),
        "a space": "two words",
        "a quote": 'say-"hi"',
        "a tab": "tab\there",
        "not ASCII": "caf\u00e9",
    }
    made: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        register = envelope("REGISTER", "agent-a", {"id": "agent-a", "role": "r"}, "msg-1")
        headers = {**JSON, "X-Request-Id": "register-1"}
        async with http.post(f"{url}/v1/register", data=register, headers=headers) as r:
            assert r.status == 200 and r.headers["X-Request-Id"] == "register-1"
            token = (await r.json())["token"]
        auth = {**JSON, "Authorization": f"Bearer {token}"}
        recorded = envelope("RECORD", "agent-a", finding("One finding."), "msg-2")
        headers = {**auth, "X-Request-Id": "record-2"}
        async with http.post(f"{url}/v1/record", data=recorded, headers=headers) as r:
            assert r.status == 200 and r.headers["X-Request-Id"] == "record-2"
        headers = {**auth, "X-Request-Id": "bad-3"}  # an error is answered with it too
        async with http.post(f"{url}/v1/record", data=b"{", headers=headers) as r:
            assert r.status == 400 and r.headers["X-Request-Id"] == "bad-3"
        # without one, the Field makes one; a token in the query is no secret of the line
        listing = f"{url}/v1/agents?limit=5&token={token}"
        async with http.get(listing, headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200 and MADE.fullmatch(r.headers["X-Request-Id"])
            made["none sent"] = r.headers["X-Request-Id"]
        for what, value in bogus.items():
            sent = {"X-Request-Id": value.encode().decode("latin-1")}
            async with http.get(f"{url}/v1/field/status", headers=sent) as r:
                assert r.status == 200, what
                assert MADE.fullmatch(r.headers["X-Request-Id"]), (what, r.headers)
                made[what] = r.headers["X-Request-Id"]
    assert len(set(made.values())) == len(made)  # a new one each time
    assert server.stop() == 0

    records = records_of(server)
    assert token not in "\n".join(server.lines)
    access = of_logger(records, "field.access")
    # one line per request, and only the Field's: no uvicorn line, no second operation line
    assert len(access) == 3 + len(made)
    assert not of_logger(records, "uvicorn.access") and not of_logger(records, "field.operation")
    line = only(access, request_id="register-1")
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/register", 200)
    assert (line["agent"], line["operation"], line["outcome"]) == ("agent-a", "REGISTER", "ok")
    assert line["message_id"] == "msg-1" and line["transport"] == "http"
    assert line["client"].startswith("127.0.0.1:") and line["duration_ms"] > 0
    assert line["level"] == "info"
    line = only(access, request_id="record-2")
    assert (line["agent"], line["operation"], line["outcome"]) == ("agent-a", "RECORD", "ok")
    assert line["message_id"] == "msg-2" and line["status"] == 200
    line = only(access, request_id="bad-3")
    assert (line["status"], line["operation"], line["outcome"]) == (400, "RECORD", "INVALID_JSON")
    assert line["agent"] == "agent-a"  # a failed operation names whose request it was
    line = only(access, request_id=made["none sent"])
    assert line["path"] == "/v1/agents?limit=5&token=<redacted>" and line["agent"] == "agent-a"
    assert "operation" not in line and "request_id=" + made["none sent"] in line["event"]
    for what, value in bogus.items():
        only(access, request_id=made[what], path="/v1/field/status")
        assert not [r for r in access if r["request_id"] == value], what


async def test_a_push_connection_has_a_line_when_it_opens_and_when_it_closes(
    server_process: Callable[..., ServerProcess], tmp_path: Any
) -> None:
    server = server_process(tmp_path / "data", "--access-log", "--log-format", "json")
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        stream = await subscribe(b, ["memory.recorded"])
        sid = stream["subscription_id"]
        headers = {"Authorization": f"Bearer {b.token}", "X-Request-Id": "ws-7"}
        async with connect(ws_url(server.url), additional_headers=headers) as ws:
            assert ws.response is not None and ws.response.headers["X-Request-Id"] == "ws-7"
            while orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["type"] != "live":
                pass
            attune = {"scope": {"role": "researcher", "max_units": 5}}
            await ws.send(envelope("ATTUNE", b.id, attune, "on-socket-1"))
            while orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["type"] != "response":
                pass
            await ws.close(4000, "done\nfor now")  # a client's reason stays on its line
        # a WebSocket refused once open (a token the Field never issued): one line
        async with open_ws(server.url, "not-a-token") as refused:
            _, code = await refused.until_closed()
            assert code == 4401
        headers = {**headers, "Accept": "text/event-stream", "X-Request-Id": "sse-8"}
        async with http.get(stream["sse_url"], headers=headers) as response:
            assert response.status == 200 and response.headers["X-Request-Id"] == "sse-8"
            while not (await response.content.readline()).startswith(b"event: live"):
                pass
        await no_push_connections(http, server.url)
    assert server.stop() == 0

    records = records_of(server)
    access = of_logger(records, "field.access")
    opened = only(access, request_id="ws-7", stream="open")
    assert (opened["agent"], opened["transport"]) == ("agent-b", "websocket")
    assert opened["subscriptions"] == [sid] and opened["path"] == "/v1/ws"
    assert "status" not in opened and "duration_ms" not in opened
    closed = only(access, request_id="ws-7", stream="closed")
    assert (closed["agent"], closed["status"], closed["transport"]) == ("agent-b", 101, "websocket")
    assert (closed["close_code"], closed["close_reason"]) == (4000, "done\\nfor now")
    assert closed["duration_ms"] > 0 and closed["subscriptions"] == [sid]
    assert records.index(opened) < records.index(closed)
    # the operation sent on it has a line of its own, naming the WebSocket's request id
    operation = only(of_logger(records, "field.operation"), request_id="ws-7")
    assert (operation["operation"], operation["agent"]) == ("ATTUNE", "agent-b")
    assert operation["message_id"] == "on-socket-1" and operation["transport"] == "websocket"
    # the refused one: no open line, its one line says how it was closed
    refusal = only(access, path="/v1/ws", close_code=4401)
    assert refusal["close_reason"] == "UNAUTHENTICATED" and "agent" not in refusal
    assert "stream" not in refusal
    opened = only(access, request_id="sse-8", stream="open")
    assert (opened["agent"], opened["transport"], opened["subscriptions"]) == (
        "agent-b",
        "sse",
        [sid],
    )
    closed = only(access, request_id="sse-8", stream="closed")
    assert (closed["status"], closed["close_code"], closed["close_reason"]) == (
        200,
        1000,
        "client closed",
    )
    assert closed["method"] == "GET" and closed["path"] == f"/v1/subscriptions/{sid}/events"
    assert records.index(opened) < records.index(closed)


# -- without --access-log ------------------------------------------------------------


async def test_without_the_access_log_nothing_is_logged_per_request_or_connection(
    server_process: Callable[..., ServerProcess], tmp_path: Any
) -> None:
    server = server_process(tmp_path / "data", "--log-level", "info")
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        stream = await subscribe(b, ["memory.recorded"])
        sent = {"X-Request-Id": "kept-1"}  # still answered with the request's id
        async with http.get(f"{server.url}/v1/field/status", headers=sent) as r:
            assert r.headers["X-Request-Id"] == "kept-1"
        async with http.get(f"{server.url}/v1/field/status") as r:
            assert MADE.fullmatch(r.headers["X-Request-Id"])
        async with open_ws(server.url, b.token) as ws:
            await ws.ready()
            assert ws.connection.response is not None
            assert MADE.fullmatch(ws.connection.response.headers["X-Request-Id"])
        async with open_ws(server.url, "not-a-token") as refused:
            assert (await refused.until_closed())[1] == 4401
        headers = {"Authorization": f"Bearer {b.token}", "Accept": "text/event-stream"}
        async with http.get(stream["sse_url"], headers=headers) as response:
            assert response.status == 200 and MADE.fullmatch(response.headers["X-Request-Id"])
        await no_push_connections(http, server.url)
    assert server.stop() == 0
    log = "\n".join(server.lines)
    assert "listening on" in log  # the log is there, at INFO
    for logger in ("field.access", "field.operation", "uvicorn.access"):
        assert f" {logger}: " not in log, logger
    assert '"WebSocket /v1/ws' not in log  # uvicorn's INFO line for each handshake
    assert "connection open" not in log  # and websockets' for each one opened


# -- the request id in every answer --------------------------------------------------


async def test_every_answer_carries_the_request_id(
    server_factory: Callable[..., ThreadedServer], raws: list[Raw]
) -> None:
    server = server_factory(agent_rate=0.001, agent_burst=1)
    async with FieldClient(server.url, retries=0) as field, aiohttp.ClientSession() as http:
        a = await field.register("agent-a", "analyst")
        auth = {"Authorization": f"Bearer {a.token}"}
        answers = {}
        for n, path in enumerate(["/v1/field/status", "/v1/nowhere", "/v1/agents"]):
            headers = {"X-Request-Id": f"id-{n}"}
            async with http.get(f"{server.url}{path}", headers=headers) as r:
                answers[path] = (r.status, r.headers["X-Request-Id"])
        assert answers == {
            "/v1/field/status": (200, "id-0"),
            "/v1/nowhere": (404, "id-1"),
            "/v1/agents": (401, "id-2"),
        }
        # the agent's one operation, then 429 RATE_LIMITED before any body is read
        attune = envelope("ATTUNE", a.id, {"scope": {"role": "analyst", "max_units": 1}}, "m")
        statuses = []
        for n in range(2):
            headers = {**JSON, **auth, "X-Request-Id": f"attune-{n}"}
            async with http.post(f"{server.url}/v1/attune", data=attune, headers=headers) as r:
                statuses.append((r.status, r.headers["X-Request-Id"]))
        assert statuses == [(200, "attune-0"), (429, "attune-1")]
    # a Host the Field does not answer to: 421 before anything else
    raw = await raw_connect(server, raws)
    await raw.send(
        b"GET /v1/field/status HTTP/1.1\r\nHost: evil.example\r\nX-Request-Id: h-1\r\n\r\n"
    )
    status, headers, _ = await raw.response()
    assert (status, headers["x-request-id"]) == (421, "h-1")
    # a WebSocket handshake websockets refuses, and one the application denies
    head = (
        b"GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Request-Id: ws-1\r\n"
    )
    for version, path, expected in ((b"8", b"/v1/ws", 400), (b"13", b"/v1/other", 404)):
        raw = await raw_connect(server, raws)
        handshake = head.replace(b"/v1/ws", path) + b"Sec-WebSocket-Version: " + version
        await raw.send(handshake + b"\r\n\r\n")
        status, headers, _ = await raw.response()
        assert (status, headers["x-request-id"]) == (expected, "ws-1")


async def test_a_connection_refused_at_accept_carries_a_request_id(
    server_factory: Callable[..., ThreadedServer], raws: list[Raw]
) -> None:
    server = server_factory(max_connections_per_client=1, header_timeout=TIMEOUT)
    await kept_alive(server, raws)
    refused = await raw_connect(server, raws)
    await refused.send(STATUS)
    status, headers, body = await refused.response()
    assert (status, body["code"]) == (429, "TOO_MANY_CONNECTIONS")
    assert MADE.fullmatch(headers["x-request-id"])


def test_a_request_id_is_taken_only_if_it_is_sane() -> None:
    def taken(value: bytes) -> bool:
        return request_id_of([(b"accept", b"*/*"), (b"x-request-id", value)]) == value.decode(
            "latin-1"
        )

    for sane in (b"a", b"req-42", b"0f8fad5b-d9cb-469f-a165-70867728950e", b"YWJj+/=:@_.~"):
        assert taken(sane), sane
    assert taken(b"x" * MAX_REQUEST_ID)
    for bogus in (b"", b"x" * (MAX_REQUEST_ID + 1), b"a b", b"a\tb", b"a\x00", b"a\x7f", b'"a"'):
        assert not taken(bogus), bogus
        assert MADE.fullmatch(request_id_of([(b"x-request-id", bogus)]))
    assert MADE.fullmatch(request_id_of([]))
    assert request_id_of([]) != request_id_of([])
    # the first of several, if it is sane
    assert request_id_of([(b"x-request-id", b"one"), (b"x-request-id", b"two")]) == "one"


# -- MCP and RAP (a server in this process) -----------------------------------------


class AccessRecords(logging.Handler):
    """The access log's records, as ``field serve --log-format json`` writes them; a test
    awaits the one it expects (they are made on the server's thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        line = orjson.loads(self.format(record))
        with self._changed:
            self.records.append(line)
            self._changed.notify_all()

    async def one(self, **fields: Any) -> dict[str, Any]:
        """The first record with these fields, once it is made."""

        def found() -> dict[str, Any] | None:
            for line in self.records:
                if all(line.get(k) == v for k, v in fields.items()):
                    return line
            return None

        def wait() -> dict[str, Any] | None:
            with self._changed:
                self._changed.wait_for(lambda: found() is not None, TIMEOUT)
                return found()

        line = await asyncio.to_thread(wait)
        assert line is not None, (fields, self.records)
        return line


@pytest.fixture
def access_records() -> Iterator[AccessRecords]:
    handler = AccessRecords()
    loggers = [logging.getLogger(name) for name in ("field.access", "field.operation")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    yield handler
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_mcp_and_rap_requests_have_the_same_line(
    server_factory: Callable[..., ThreadedServer],
    access_records: AccessRecords,
    http: aiohttp.ClientSession,
) -> None:
    server = server_factory(access_log=True, webhook_allow_net=("127.0.0.0/8",))
    async with FieldClient(server.url) as field:
        a = await field.register("agent-a", "analyst")
    auth = {"Authorization": f"Bearer {a.token}", **JSON}
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "akashik_record", "arguments": finding("Over MCP.")},
    }
    headers = {**auth, "Accept": "application/json, text/event-stream", "X-Request-Id": "mcp-1"}
    async with http.post(f"{server.url}/mcp", json=call, headers=headers) as r:
        assert r.status == 200 and r.headers["X-Request-Id"] == "mcp-1"
        assert (await r.json())["result"]["isError"] is False
    line = await access_records.one(logger="field.access", request_id="mcp-1")
    assert (line["method"], line["path"], line["status"]) == ("POST", "/mcp", 200)
    assert (line["transport"], line["agent"]) == ("mcp", "agent-a")
    assert (line["operation"], line["outcome"]) == ("RECORD", "ok")

    invocation = {
        "operation": "akashik_record",
        "arguments": finding("Over RAP."),
        "id": "call-1",
        "call_id": None,
        "callback_url": "http://127.0.0.1:9/results",  # nothing listens: never delivered
        "group_id": "thread-1",
        "user_id": "user-1",
    }
    headers = {**auth, "X-Request-Id": "rap-1"}
    async with http.post(f"{server.url}/rap/invoke", json=invocation, headers=headers) as r:
        assert r.status == 200 and r.headers["X-Request-Id"] == "rap-1"
    line = await access_records.one(logger="field.access", request_id="rap-1")
    assert (line["path"], line["status"], line["agent"]) == ("/rap/invoke", 200, "agent-a")
    assert line["operation"] == "RECORD" and "outcome" not in line  # it runs after the answer
    ran = await access_records.one(logger="field.operation", request_id="rap-1")
    assert (ran["transport"], ran["operation"], ran["outcome"]) == ("rap", "RECORD", "ok")
    assert ran["agent"] == "agent-a"
