"""End-to-end tests of push: SUBSCRIBE, the WebSocket ``/v1/ws`` and SSE streams.

Every test runs a real server on a loopback port (``field_server`` /
``server_factory`` from conftest) and talks to it with real clients: the
SDK for operations, the ``websockets`` asyncio client for ``/v1/ws`` and
a raw aiohttp stream with the small Server-Sent Events parser below for
``/v1/subscriptions/{id}/events``.

Nothing here sleeps to wait for something it could await: every wait is
on a frame, an event or a response, with a bounded timeout that only
guards against a hang. Where a test needs the server to be *silent* about
something (a filtered event, a duplicate), it proves it with a sentinel:
streams are delivered in cursor order, so once a later notification has
arrived, an earlier one that was not delivered never will be.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from field.client import AgentClient, FieldClient, FieldClientError
from field.contract.model import Limits
from field.engine.router import PushLimits

from .conftest import ThreadedServer
from .schema_util import assert_valid

#: Failure guard for one awaited frame, event or exchange (never a pacing delay).
TIMEOUT = 5.0

NOTIFICATION_KEYS = {
    "subscription_id",
    "event",
    "epoch",
    "relevance_score",
    "relevance_reason",
    "summary",
    "memory_unit_id",
    "conflict_id",
    "requires_action",
    "cursor",
    "entity",
    "agent_id",
    "folded",
}
MEMORY_EVENTS = ["memory.recorded", "memory.contested", "conflict.detected"]
CURSOR = re.compile(r"(?P<tag>[0-9a-z]+)-(?P<position>\d+)")


# -- operations ------------------------------------------------------------------


async def record(agent: AgentClient, content: str, **options: Any) -> dict[str, Any]:
    """RECORD a committed finding (with the confidence committed units need)."""
    options.setdefault("confidence", 0.8)
    options.setdefault("reasoning", "observed in the test")
    memory_type = options.pop("memory_type", "finding")
    return await agent.record(memory_type, content, purpose="share what was found", **options)


async def contradict(agent: AgentClient, target_id: str, content: str) -> dict[str, Any]:
    """RECORD a unit that contradicts ``target_id`` (a conflict, contested units)."""
    return await record(agent, content, relations=[{"type": "contradicts", "target_id": target_id}])


async def subscribe(agent: AgentClient, events: Iterable[str], **options: Any) -> dict[str, Any]:
    subscription = {"events": list(events), **options}
    payload = {"action": "subscribe", "subscription": subscription}
    assert_valid("subscribe.request", payload)
    response = await agent.send("SUBSCRIBE", payload)
    assert_valid("subscribe.response", response)
    return response


async def unsubscribe(agent: AgentClient, subscription_id: str) -> dict[str, Any]:
    payload = {"action": "unsubscribe", "subscription": {"id": subscription_id}}
    response = await agent.send("SUBSCRIBE", payload)
    assert_valid("subscribe.response", response)
    return response


async def listed(agent: AgentClient) -> list[dict[str, Any]]:
    response = await agent.send("SUBSCRIBE", {"action": "list"})
    assert_valid("subscribe.response", response)
    assert response["status"] == "ok"
    subscriptions: list[dict[str, Any]] = response["subscriptions"]
    return subscriptions


async def refused(call: Any, status: int, code: str) -> FieldClientError:
    """Await ``call``; assert it failed with ``status`` and ``code``."""
    with pytest.raises(FieldClientError) as info:
        await call
    error = info.value
    assert (error.status, error.code) == (status, code), error.body
    assert_valid("error", error.body)
    assert error.body["message"], error.body
    return error


def tag_of(cursor: str) -> str:
    match = CURSOR.fullmatch(cursor)
    assert match, f"{cursor!r} is not a cursor"
    return match["tag"]


def position_of(cursor: str) -> int:
    match = CURSOR.fullmatch(cursor)
    assert match, f"{cursor!r} is not a cursor"
    return int(match["position"])


# -- a WebSocket consumer ----------------------------------------------------------


def ws_url(server_url: str, query: list[tuple[str, str]] | None = None) -> str:
    url = "ws" + server_url[len("http") :] + "/v1/ws"
    return url + ("?" + urlencode(query) if query else "")


class WS:
    """One ``/v1/ws`` connection: decoded frames, with bounded waits."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        #: frames read while looking for something else (a response)
        self.backlog: list[dict[str, Any]] = []
        self._ids = 0

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        if self.backlog:
            return self.backlog.pop(0)
        raw = await asyncio.wait_for(self.connection.recv(), timeout)
        frame: dict[str, Any] = orjson.loads(raw)
        assert_valid("ws-frame", frame)  # every frame obeys the documented framing
        return frame

    async def until(
        self, done: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT
    ) -> list[dict[str, Any]]:
        """Frames up to and including the first for which ``done`` is true."""
        deadline = time.monotonic() + timeout
        frames = []
        while True:
            frame = await self.recv(max(0.01, deadline - time.monotonic()))
            frames.append(frame)
            if done(frame):
                return frames

    async def ready(self, count: int = 1) -> list[dict[str, Any]]:
        """Frames up to the ``count``-th ``live`` frame (every stream is live)."""
        seen = 0

        def live(frame: dict[str, Any]) -> bool:
            nonlocal seen
            seen += frame["type"] == "live"
            return bool(seen == count)

        return await self.until(live)

    async def notifications(self, count: int, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """The next ``count`` notifications (any other frame fails the test)."""
        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        while len(out) < count:
            frame = await self.recv(max(0.01, deadline - time.monotonic()))
            assert frame["type"] == "notification", f"expected a notification, got {frame}"
            out.append(frame["data"])
        return out

    async def request(self, operation: str, agent_id: str, payload: Any) -> dict[str, Any]:
        """Send one envelope; the response frame with its id (other frames are kept)."""
        self._ids += 1
        envelope_id = f"ws-{self._ids}"
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": envelope_id,
            "operation": operation,
            "agent_id": agent_id,
            "session_id": None,
            "epoch": 0,
            "payload": payload,
        }
        await self.connection.send(orjson.dumps(envelope).decode())
        deadline = time.monotonic() + TIMEOUT
        held: list[dict[str, Any]] = []
        while True:
            raw = await asyncio.wait_for(
                self.connection.recv(), max(0.01, deadline - time.monotonic())
            )
            frame = orjson.loads(raw)
            assert_valid("ws-frame", frame)
            if frame.get("type") == "response" and frame.get("id") == envelope_id:
                self.backlog.extend(held)
                response: dict[str, Any] = frame
                return response
            held.append(frame)

    async def until_closed(self, timeout: float = TIMEOUT) -> tuple[list[dict[str, Any]], int]:
        """Every frame left and the close code the server closed with."""
        deadline = time.monotonic() + timeout
        frames = list(self.backlog)
        self.backlog.clear()
        try:
            while True:
                raw = await asyncio.wait_for(
                    self.connection.recv(), max(0.01, deadline - time.monotonic())
                )
                frames.append(orjson.loads(raw))
                assert_valid("ws-frame", frames[-1])
        except websockets.ConnectionClosed:
            pass
        code = self.connection.close_code
        assert code is not None
        return frames, code


@contextlib.asynccontextmanager
async def open_ws(
    server: ThreadedServer | str,
    token: str | None,
    *,
    since: Iterable[str] = (),
    query_token: str | None = None,
    sock: socket.socket | None = None,
    max_queue: int | None = 16,
    compression: str | None = "deflate",
) -> AsyncIterator[WS]:
    """A ``/v1/ws`` connection with ``token`` as a bearer header (or ``query_token``)."""
    base = server if isinstance(server, str) else server.url
    query = [("since", cursor) for cursor in since]
    if query_token is not None:
        query.append(("token", query_token))
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with connect(
        ws_url(base, query),
        additional_headers=headers,
        sock=sock,
        max_queue=max_queue,
        compression=compression,
        open_timeout=TIMEOUT,
        close_timeout=2,
    ) as connection:
        yield WS(connection)


# -- a Server-Sent Events consumer ---------------------------------------------------


@dataclass
class SSEEvent:
    event: str | None
    id: str | None
    data: Any


class SSE:
    """A raw ``text/event-stream`` read line by line and parsed here."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments = 0

    async def next(self, timeout: float = TIMEOUT) -> SSEEvent | None:
        """The next event, or None when the server ended the stream."""
        deadline = time.monotonic() + timeout
        event: str | None = None
        event_id: str | None = None
        data: list[str] = []
        while True:
            line = await asyncio.wait_for(
                self.response.content.readline(), max(0.01, deadline - time.monotonic())
            )
            if not line:
                assert not data, f"the stream ended inside an event: {data}"
                return None
            text = line.decode("utf-8").rstrip("\r\n")
            if not text:
                if data:
                    parsed = orjson.loads("\n".join(data))
                    if event_id is not None:
                        assert_valid("notification", parsed)
                    else:  # a control event carries the data of the same WebSocket frame
                        assert_valid("ws-frame", {"type": event, "data": parsed})
                    return SSEEvent(event, event_id, parsed)
                event, event_id = None, None
                continue
            if text.startswith(":"):
                self.comments += 1
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value

    async def until(
        self, done: Callable[[SSEEvent], bool], timeout: float = TIMEOUT
    ) -> list[SSEEvent]:
        deadline = time.monotonic() + timeout
        events: list[SSEEvent] = []
        while True:
            event = await self.next(max(0.01, deadline - time.monotonic()))
            assert event is not None, f"the stream ended early after {events}"
            events.append(event)
            if done(event):
                return events

    async def ready(self) -> list[SSEEvent]:
        return await self.until(lambda e: e.event == "live")

    async def notifications(self, count: int, timeout: float = TIMEOUT) -> list[SSEEvent]:
        deadline = time.monotonic() + timeout
        out: list[SSEEvent] = []
        while len(out) < count:
            event = await self.next(max(0.01, deadline - time.monotonic()))
            assert event is not None, f"the stream ended after {len(out)} notifications"
            assert event.id is not None, f"expected a notification, got {event}"
            out.append(event)
        return out


@contextlib.asynccontextmanager
async def open_sse(
    session: aiohttp.ClientSession,
    url: str,
    token: str | None,
    *,
    last_event_id: str | None = None,
    since: str | None = None,
    query_token: str | None = None,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """GET an SSE stream; yields the response (its status may be an error)."""
    headers = {"Accept": "text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    params = {}
    if since is not None:
        params["since"] = since
    if query_token is not None:
        params["token"] = query_token
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT)
    async with session.get(url, headers=headers, params=params, timeout=timeout) as response:
        yield response


@contextlib.asynccontextmanager
async def sse_stream(
    session: aiohttp.ClientSession, url: str, token: str | None, **options: Any
) -> AsyncIterator[SSE]:
    """An open SSE stream that must have been accepted (200, text/event-stream)."""
    async with open_sse(session, url, token, **options) as response:
        body = b"" if response.status == 200 else await response.read()
        assert response.status == 200, (response.status, body)
        assert response.content_type == "text/event-stream"
        yield SSE(response)


# -- fixtures ----------------------------------------------------------------------


@pytest.fixture
async def field(field_server: ThreadedServer) -> AsyncIterator[FieldClient]:
    async with FieldClient(field_server.url) as client:
        yield client


@dataclass
class Agents:
    a: AgentClient
    b: AgentClient
    c: AgentClient


@pytest.fixture
async def agents(field: FieldClient) -> Agents:
    """A writes, B subscribes, C is a bystander; B and A share interests."""
    a = await field.register("agent-a", "analyst", interests=["market sizing", "pricing"])
    b = await field.register("agent-b", "researcher", interests=["market sizing"])
    c = await field.register("agent-c", "auditor", interests=["compliance"])
    return Agents(a, b, c)


def check_notification(
    data: dict[str, Any],
    *,
    subscription_id: str,
    event: str,
    actor: str,
    tag: str,
) -> None:
    """The fields every notification carries, with their types and ranges (and the
    debounce ``window`` of a debounced one)."""
    keys = set(data) - {"window"}
    assert keys == NOTIFICATION_KEYS, sorted(keys ^ NOTIFICATION_KEYS)
    assert data["subscription_id"] == subscription_id
    assert data["event"] == event
    assert data["agent_id"] == actor
    assert isinstance(data["epoch"], int) and data["epoch"] > 0
    score = data["relevance_score"]
    assert isinstance(score, (int, float)) and 0.0 <= score <= 1.0, score
    assert isinstance(data["relevance_reason"], str) and data["relevance_reason"].strip()
    assert isinstance(data["summary"], str) and data["summary"].strip()
    assert isinstance(data["requires_action"], bool)
    assert isinstance(data["folded"], int) and data["folded"] >= 0
    assert tag_of(data["cursor"]) == tag
    assert set(data["entity"]) == {"type", "id"}


def ids(notifications: Iterable[dict[str, Any]]) -> list[str | None]:
    return [n["memory_unit_id"] for n in notifications]


def cursors_increase(notifications: list[dict[str, Any]]) -> bool:
    positions = [position_of(n["cursor"]) for n in notifications]
    return all(x < y for x, y in zip(positions, positions[1:], strict=False))


# == 1. subscribe, list, unsubscribe ================================================


async def test_subscribe_over_http_returns_subscription_cursor_and_absolute_urls(
    field_server: ThreadedServer, field: FieldClient, agents: Agents
) -> None:
    response = await subscribe(
        agents.b,
        ["conflict.detected", "memory.recorded", "memory.recorded"],
        min_relevance=0.25,
        debounce_ms=150,
    )
    subscription_id = response["subscription_id"]
    assert response["status"] == "ok"
    assert isinstance(subscription_id, str) and subscription_id
    assert response["subscription"] == {
        "id": subscription_id,
        "agent_id": "agent-b",
        "events": ["memory.recorded", "conflict.detected"],  # deduplicated, spec order
        "min_relevance": 0.25,
        "debounce_ms": 150,
        "include_own": False,
        "status": "active",
        "created_epoch": response["epoch"],
    }
    assert response["epoch"] > agents.c.registration["epoch"]  # after C registered
    cursor = response["cursor"]
    assert isinstance(cursor, str) and CURSOR.fullmatch(cursor), cursor
    status = await field.status()
    assert 0 < position_of(cursor) <= status["log"]["last_position"]
    host = field_server.url[len("http://") :]
    assert response["ws_url"] == f"ws://{host}/v1/ws"
    assert response["sse_url"] == f"http://{host}/v1/subscriptions/{subscription_id}/events"

    defaults = await subscribe(agents.b, ["agent.joined"])
    assert defaults["subscription"]["min_relevance"] == 0.0
    assert defaults["subscription"]["debounce_ms"] == 0
    assert defaults["subscription"]["include_own"] is False
    assert defaults["subscription_id"] != subscription_id
    assert tag_of(defaults["cursor"]) == tag_of(cursor)
    assert position_of(defaults["cursor"]) > position_of(cursor)


async def test_subscribe_over_websocket_is_correlated_and_streams_at_once(
    field_server: ThreadedServer, agents: Agents
) -> None:
    async with open_ws(field_server, agents.b.token) as ws:
        payload = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
        frame = await ws.request("SUBSCRIBE", "agent-b", payload)
        assert frame["status"] == 200, frame
        body = frame["body"]
        subscription_id = body["subscription_id"]
        assert body["subscription"]["agent_id"] == "agent-b"
        assert CURSOR.fullmatch(body["cursor"])
        host = field_server.url[len("http://") :]
        assert body["ws_url"] == f"ws://{host}/v1/ws"
        assert body["sse_url"] == f"http://{host}/v1/subscriptions/{subscription_id}/events"

        # the new subscription streams on this connection, from its creation on
        written = await record(agents.a, "market sizing: EU HR SaaS grows 23% a year")
        (data,) = await ws.notifications(1)
        assert data["subscription_id"] == subscription_id
        assert data["memory_unit_id"] == written["memory_unit_id"]
        assert position_of(data["cursor"]) > position_of(body["cursor"])

        # errors come back as response frames with the envelope's id
        bad = await ws.request(
            "SUBSCRIBE", "agent-b", {"action": "subscribe", "subscription": {"events": []}}
        )
        assert bad["status"] == 422 and bad["body"]["code"] == "INVALID_PAYLOAD", bad
        other = await ws.request("SUBSCRIBE", "agent-a", {"action": "list"})
        assert other["status"] == 403 and other["body"]["code"] == "FORBIDDEN", other
        mine = await ws.request("SUBSCRIBE", "agent-b", {"action": "list"})
        assert mine["status"] == 200
        assert [s["id"] for s in mine["body"]["subscriptions"]] == [subscription_id]


async def test_list_shows_only_the_callers_active_subscriptions(agents: Agents) -> None:
    first = await subscribe(agents.b, ["memory.recorded"])
    second = await subscribe(agents.b, ["conflict.detected"], min_relevance=0.5)
    others = await subscribe(agents.c, ["agent.joined"])
    assert sorted(s["id"] for s in await listed(agents.b)) == sorted(
        [first["subscription_id"], second["subscription_id"]]
    )
    assert [s["id"] for s in await listed(agents.c)] == [others["subscription_id"]]
    assert await listed(agents.a) == []

    cancelled = await unsubscribe(agents.b, first["subscription_id"])
    assert cancelled["subscription_id"] == first["subscription_id"]
    assert cancelled["subscription"]["status"] == "cancelled"
    (remaining,) = await listed(agents.b)
    assert remaining == second["subscription"]


async def test_unsubscribe_ends_the_streams_and_twice_is_invalid_transition(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    gone = await subscribe(agents.b, ["memory.recorded"])
    kept = await subscribe(agents.b, ["memory.recorded"])
    gone_id, kept_id = gone["subscription_id"], kept["subscription_id"]
    async with (
        open_ws(field_server, agents.b.token) as ws,
        sse_stream(http, gone["sse_url"], agents.b.token) as sse,
    ):
        await ws.ready(2)
        await sse.ready()
        await unsubscribe(agents.b, gone_id)

        (end,) = await ws.until(lambda f: f["type"] == "end")
        assert end["data"]["subscription_id"] == gone_id
        assert isinstance(end["data"]["reason"], str) and end["data"]["reason"]
        assert tag_of(end["data"]["cursor"]) == tag_of(gone["cursor"])

        event = await sse.next()
        assert event is not None and event.event == "end" and event.id is None
        assert event.data["subscription_id"] == gone_id
        assert await sse.next() is None  # the server closed the stream

        # the other subscription still streams on the same socket; the ended one is silent
        written = await record(agents.a, "market sizing: a new pricing survey")
        (data,) = await ws.notifications(1)
        assert (data["subscription_id"], data["memory_unit_id"]) == (
            kept_id,
            written["memory_unit_id"],
        )

    await refused(unsubscribe(agents.b, gone_id), 409, "INVALID_TRANSITION")
    async with open_sse(http, gone["sse_url"], agents.b.token) as response:
        assert response.status == 409
        assert (await response.json())["code"] == "INVALID_TRANSITION"
    assert [s["id"] for s in await listed(agents.b)] == [kept_id]


async def test_deregistering_ends_the_agents_streams_with_4409(
    field_server: ThreadedServer, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        await agents.b.deregister()
        frames, code = await ws.until_closed()
        assert code == 4409
        ends = [f for f in frames if f["type"] == "end"]
        assert [f["data"]["subscription_id"] for f in ends] == [response["subscription_id"]]


async def test_requests_on_the_socket_are_answered_in_order_with_stream_frames(
    field_server: ThreadedServer, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    subscription_id = response["subscription_id"]
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        payload = {"action": "unsubscribe", "subscription": {"id": subscription_id}}
        await ws.connection.send(
            orjson.dumps(
                agents.b.field.envelope("SUBSCRIBE", "agent-b", payload, epoch=agents.b.epoch)
            ).decode()
        )
        end, answer = await ws.until(lambda f: f["type"] == "response")
        assert end["type"] == "end" and end["data"]["subscription_id"] == subscription_id
        assert answer["status"] == 200
        assert answer["body"]["subscription"]["status"] == "cancelled"
        await ws.connection.send("this is not JSON")
        (garbage,) = await ws.until(lambda f: f["type"] == "response")
        assert garbage["id"] is None and garbage["status"] == 400
        assert garbage["body"]["code"] == "INVALID_JSON"

        frame = await ws.request("DEREGISTER", "agent-b", {"agent_id": "agent-b"})
        assert frame["status"] == 200
        frames, code = await ws.until_closed()
    assert code == 4409
    assert frames == []


async def test_a_new_subscription_joins_every_open_socket_of_the_agent(
    field_server: ThreadedServer, agents: Agents
) -> None:
    async with (
        open_ws(field_server, agents.b.token) as first,
        open_ws(field_server, agents.b.token) as second,
        open_ws(field_server, agents.c.token) as bystander,
    ):
        # (no subscriptions yet, so no frames; a request proves each socket is served)
        for ws, agent in ((first, "agent-b"), (second, "agent-b"), (bystander, "agent-c")):
            assert (await ws.request("SUBSCRIBE", agent, {"action": "list"}))["status"] == 200
        response = await subscribe(agents.b, ["memory.recorded"])
        written = await record(agents.a, "market sizing: for both sockets")
        for ws in (first, second):
            (data,) = await ws.notifications(1)
            assert data["subscription_id"] == response["subscription_id"]
            assert data["memory_unit_id"] == written["memory_unit_id"]
        # C has no subscription: its socket only answers C's own requests
        answer = await bystander.request("SUBSCRIBE", "agent-c", {"action": "list"})
        assert answer["body"]["subscriptions"] == [] and bystander.backlog == []


async def test_a_re_registered_agent_does_not_inherit_its_old_subscriptions(
    field_server: ThreadedServer, field: FieldClient, agents: Agents
) -> None:
    old = await subscribe(agents.b, ["memory.recorded"])
    await agents.b.deregister()
    b = await field.register(
        "agent-b", "researcher", interests=["market sizing"], previous_token=agents.b.token
    )
    assert await listed(b) == []
    fresh = await subscribe(b, ["memory.recorded"])
    async with open_ws(field_server, b.token, since=[old["cursor"]]) as ws:
        frames = await ws.ready()
        written = await record(agents.a, "market sizing: after the comeback")
        (data,) = await ws.notifications(1)
    assert [f["data"]["subscription_id"] for f in frames if f["type"] == "resume"] == [
        fresh["subscription_id"]
    ]
    assert data["subscription_id"] == fresh["subscription_id"]
    assert data["memory_unit_id"] == written["memory_unit_id"]


# == 2. notifications: fields, own records, min_relevance, conflicts ===================


async def test_notification_reaches_websocket_and_sse_with_every_field(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    subscription_id, tag = response["subscription_id"], tag_of(response["cursor"])
    async with (
        open_ws(field_server, agents.b.token) as ws,
        sse_stream(http, response["sse_url"], agents.b.token) as sse,
    ):
        (resume, live) = await ws.ready()
        assert resume == {
            "type": "resume",
            "data": {
                "subscription_id": subscription_id,
                "recovered": True,
                "from": live["data"]["cursor"],
            },
        }
        assert live["data"]["subscription_id"] == subscription_id
        assert live["data"]["replayed"] == 0
        sse_control = await sse.ready()
        assert [e.event for e in sse_control] == ["resume", "live"]
        assert all(e.id is None for e in sse_control)

        content = "market sizing: EU HR SaaS grows 23% a year across the region"
        written = await record(agents.a, content)
        (over_ws,) = await ws.notifications(1)
        (over_sse,) = await sse.notifications(1)

    assert over_ws == over_sse.data
    assert over_sse.event == "memory.recorded"
    assert over_sse.id == over_ws["cursor"]
    check_notification(
        over_ws, subscription_id=subscription_id, event="memory.recorded", actor="agent-a", tag=tag
    )
    unit_id = written["memory_unit_id"]
    assert over_ws["epoch"] == written["epoch"]
    assert over_ws["memory_unit_id"] == unit_id
    assert over_ws["conflict_id"] is None
    assert over_ws["entity"] == {"type": "memory_unit", "id": unit_id}
    assert over_ws["requires_action"] is False
    assert over_ws["folded"] == 0
    assert "EU HR SaaS grows 23%" in over_ws["summary"]
    assert over_ws["relevance_score"] > 0  # shared interest "market sizing"
    assert "memory.recorded" in over_ws["relevance_reason"]
    assert position_of(over_ws["cursor"]) > position_of(response["cursor"])


async def test_agent_joined_is_notified_with_the_joining_agent(
    field: FieldClient, http: aiohttp.ClientSession, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["agent.joined"])
    async with sse_stream(http, response["sse_url"], agents.b.token) as sse:
        await sse.ready()
        await field.register("agent-d", "researcher", interests=["market sizing"])
        (event,) = await sse.notifications(1)
    data = event.data
    assert event.event == "agent.joined"
    check_notification(
        data,
        subscription_id=response["subscription_id"],
        event="agent.joined",
        actor="agent-d",
        tag=tag_of(response["cursor"]),
    )
    assert data["entity"] == {"type": "agent", "id": "agent-d"}
    assert data["memory_unit_id"] is None and data["conflict_id"] is None
    assert data["requires_action"] is False
    assert data["relevance_score"] > 0  # same role, shared interest
    assert "agent-d" in data["summary"]


async def test_own_records_are_notified_only_with_include_own(
    field_server: ThreadedServer, agents: Agents
) -> None:
    plain = (await subscribe(agents.b, ["memory.recorded"]))["subscription_id"]
    own = (await subscribe(agents.b, ["memory.recorded"], include_own=True))["subscription_id"]
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready(2)
        mine = await record(agents.b, "market sizing: my own estimate")
        theirs = await record(agents.a, "market sizing: their estimate")
        got = await ws.notifications(3)
    by_subscription: dict[str, list[str | None]] = {plain: [], own: []}
    for data in got:
        by_subscription[data["subscription_id"]].append(data["memory_unit_id"])
    # ``plain`` got the later unit, so it will never get the earlier own one
    assert by_subscription[plain] == [theirs["memory_unit_id"]]
    assert by_subscription[own] == [mine["memory_unit_id"], theirs["memory_unit_id"]]
    own_notice = next(d for d in got if d["memory_unit_id"] == mine["memory_unit_id"])
    assert own_notice["agent_id"] == "agent-b"


async def test_min_relevance_one_passes_only_must_act_conflict_events(
    field_server: ThreadedServer, agents: Agents
) -> None:
    every = await subscribe(agents.b, MEMORY_EVENTS)
    must = await subscribe(agents.b, MEMORY_EVENTS, min_relevance=1.0)
    every_id, must_id = every["subscription_id"], must["subscription_id"]
    tag = tag_of(every["cursor"])
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready(2)
        target = await record(agents.b, "market sizing: EU HR SaaS grows 23% a year")
        target_id = target["memory_unit_id"]
        plain = await record(agents.a, "pricing: seats cost 8 euros a month")
        contradictions = [
            await contradict(agents.a, target_id, f"EU HR SaaS shrinks {n}% a year")
            for n in (1, 2, 3)
        ]
        conflicts = [c["conflicts_detected"][0] for c in contradictions]
        last = conflicts[-1]
        # the last conflict is the sentinel: once both streams delivered it,
        # everything before it has been delivered or never will be
        waiting = {every_id, must_id}

        def both_reached_last(frame: dict[str, Any]) -> bool:
            data = frame.get("data", {})
            if data.get("event") == "conflict.detected" and data.get("conflict_id") == last:
                waiting.discard(data["subscription_id"])
            return not waiting

        frames = await ws.until(both_reached_last)
    assert all(f["type"] == "notification" for f in frames), frames
    got = [f["data"] for f in frames]
    must_got = [d for d in got if d["subscription_id"] == must_id]
    every_got = [d for d in got if d["subscription_id"] == every_id]

    # min_relevance 1.0: only B's unit contested (once: it stays contested) and
    # every conflict it is in
    assert [(d["event"], d["conflict_id"], d["memory_unit_id"]) for d in must_got] == [
        ("conflict.detected", conflicts[0], None),
        ("memory.contested", conflicts[0], target_id),
        ("conflict.detected", conflicts[1], None),
        ("conflict.detected", conflicts[2], None),
    ]
    for data in must_got:
        check_notification(
            data, subscription_id=must_id, event=data["event"], actor="agent-a", tag=tag
        )
        assert data["relevance_score"] == 1.0
        assert data["requires_action"] is True
        assert "your unit" in data["relevance_reason"]
        assert data["epoch"] in {c["epoch"] for c in contradictions}
    contested = must_got[1]
    assert contested["entity"] == {"type": "memory_unit", "id": target_id}
    assert contested["epoch"] == contradictions[0]["epoch"]
    assert must_got[0]["entity"] == {"type": "conflict", "id": conflicts[0]}

    # min_relevance 0: every event but B's own RECORD, in log order
    expected: list[tuple[str, Any]] = [("memory.recorded", plain["memory_unit_id"])]
    for written, conflict in zip(contradictions, conflicts, strict=True):
        expected += [
            ("memory.recorded", written["memory_unit_id"]),
            ("conflict.detected", conflict),
        ]
        if conflict != last:  # each new unit is contested; the target only the first time
            contested_now = {written["memory_unit_id"]} | (
                {target_id} if conflict == conflicts[0] else set()
            )
            expected += [("memory.contested", frozenset(contested_now))]
    observed: list[tuple[str, Any]] = []
    for data in every_got:
        key = (
            data["conflict_id"] if data["event"] == "conflict.detected" else data["memory_unit_id"]
        )
        if data["event"] == "memory.contested" and observed[-1][0] == "memory.contested":
            observed[-1] = ("memory.contested", observed[-1][1] | {key})
        else:
            observed.append(
                (data["event"], frozenset({key}) if data["event"] == "memory.contested" else key)
            )
    assert observed == expected
    assert every_got[0]["requires_action"] is False
    for data in every_got:
        if data["event"] == "memory.contested":
            assert data["requires_action"] is (data["memory_unit_id"] == target_id), data
        if data["event"] == "conflict.detected":
            assert data["requires_action"] is True and data["relevance_score"] == 1.0
    assert cursors_increase(every_got) and cursors_increase(must_got)


# == 3. debounce ====================================================================

EPOCH_START = datetime(1970, 1, 1, tzinfo=UTC)


def millis(timestamp: str) -> int:
    """A unit's ``source.timestamp`` (ISO, millisecond precision) as Unix milliseconds."""
    return (datetime.fromisoformat(timestamp) - EPOCH_START) // timedelta(milliseconds=1)


async def supersede(agent: AgentClient, target_id: str, content: str) -> dict[str, Any]:
    return await record(agent, content, relations=[{"type": "supersedes", "target_id": target_id}])


async def timestamps(reader: AgentClient) -> dict[str, int]:
    """Unix milliseconds of every unit ``reader`` can see (not its own)."""
    response = await reader.attune(max_units=1000, since_epoch=0, format="full")
    return {
        item["memory_unit"]["id"]: millis(item["memory_unit"]["source"]["timestamp"])
        for item in response["record"]
    }


async def test_debounce_folds_each_entity_per_window_and_does_not_block_others(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    window_ms = 250
    response = await subscribe(agents.b, ["memory.superseded"], debounce_ms=window_ms)
    subscription_id = response["subscription_id"]
    busy = (await record(agents.b, "market sizing: draft estimate 1"))["memory_unit_id"]
    quiet = (await record(agents.b, "market sizing: draft estimate 2"))["memory_unit_id"]

    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        received: list[dict[str, Any]] = []
        arrived = {busy: asyncio.Event(), quiet: asyncio.Event()}

        async def read() -> None:
            while True:
                (data,) = await ws.notifications(1, timeout=30)
                received.append(data)
                arrived[data["memory_unit_id"]].set()

        reader = asyncio.create_task(read())
        try:
            writes = [await supersede(agents.a, quiet, "market sizing: estimate 2, revised")]
            busy_writes = []
            # Keep the busy unit changing (paced, so the edits span several windows)
            # until both entities have been notified: the quiet one must not wait
            # for the busy one to calm down.
            for n in range(300):
                busy_writes.append(await supersede(agents.a, busy, f"market sizing: take {n}"))
                if arrived[busy].is_set() and arrived[quiet].is_set():
                    break
                await asyncio.sleep(window_ms / 1000 / 8)  # pacing the writer, not a wait
            else:
                pytest.fail(f"not both notified while the busy unit kept changing: {received}")
            for n in range(3):  # these land in a later window than anything delivered yet
                busy_writes.append(await supersede(agents.a, busy, f"market sizing: last {n}"))
            writes += busy_writes
            final_epoch = busy_writes[-1]["epoch"]
            deadline = time.monotonic() + window_ms / 1000 + TIMEOUT
            while not any(d["epoch"] == final_epoch for d in received):
                assert time.monotonic() < deadline, (
                    f"the final edit was never delivered: {received}"
                )
                arrived[busy].clear()
                await asyncio.wait_for(arrived[busy].wait(), max(0.01, deadline - time.monotonic()))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    # expected: the edits of each entity grouped by the fixed window of their log time
    when = await timestamps(agents.b)
    expected: list[tuple[str, int, int]] = []  # (unit, epoch of the latest edit, folded)
    for target, edits in ((quiet, writes[:1]), (busy, busy_writes)):
        windows: dict[int, list[int]] = {}
        for written in edits:
            windows.setdefault(when[written["memory_unit_id"]] // window_ms, []).append(
                written["epoch"]
            )
        expected += [(target, max(epochs), len(epochs) - 1) for epochs in windows.values()]
    got = [(d["memory_unit_id"], d["epoch"], d["folded"]) for d in received]
    assert sorted(got, key=lambda g: g[1]) == sorted(expected, key=lambda e: e[1])
    assert sum(folded + 1 for unit, _, folded in got if unit == busy) == len(busy_writes)
    assert len([g for g in got if g[0] == busy]) >= 2, "one window swallowed every edit"
    assert cursors_increase(received)
    for data in received:
        check_notification(
            data,
            subscription_id=subscription_id,
            event="memory.superseded",
            actor="agent-a",
            tag=tag_of(response["cursor"]),
        )
        assert data["entity"] == {"type": "memory_unit", "id": data["memory_unit_id"]}

    # the debounced stream is a function of the log: replaying it gives the same
    # notifications, exactly once (where ``live`` falls is checked separately, in
    # test_debounced_notification_of_an_ended_window_is_replayed_before_live)
    async with open_ws(field_server, agents.b.token, since=[response["cursor"]]) as ws:
        frames = await ws.ready()
        assert frames[0]["data"]["recovered"] is True
        replayed = [f["data"] for f in frames if f["type"] == "notification"]
        replayed += await ws.notifications(len(received) - len(replayed))
        assert replayed == received
    async with sse_stream(
        http, response["sse_url"], agents.b.token, since=response["cursor"]
    ) as sse:
        events = [e for e in await sse.ready() if e.id is not None]
        events += await sse.notifications(len(received) - len(events))
        assert [e.data for e in events] == received
        assert [e.id for e in events] == [d["cursor"] for d in received]


async def debounced_resume_frames(server: ThreadedServer, agents: Agents) -> list[dict[str, Any]]:
    """Frames of a resume, from the subscription's cursor, of a debounced stream whose
    only notification's window ended before the reconnect (up to ``live``)."""
    response = await subscribe(agents.b, ["memory.superseded"], debounce_ms=100)
    target = (await record(agents.b, "market sizing: draft"))["memory_unit_id"]
    async with open_ws(server, agents.b.token) as ws:
        await ws.ready()
        written = await supersede(agents.a, target, "market sizing: revised")
        (live_notice,) = await ws.notifications(1)  # its window has ended
        assert live_notice["epoch"] == written["epoch"]
    async with open_ws(server, agents.b.token, since=[response["cursor"]]) as ws:
        frames = await ws.until(lambda f: f["type"] == "notification")
        if frames[-1]["type"] != "live":
            frames += await ws.until(lambda f: f["type"] == "live")
    assert [f["data"] for f in frames if f["type"] == "notification"] == [live_notice]
    return frames


async def test_debounced_notification_of_an_ended_window_is_replayed_before_live(
    field_server: ThreadedServer, agents: Agents
) -> None:
    # the consumer missed exactly one notification, whose window has ended: a resume
    # replays it, then goes live
    frames = await debounced_resume_frames(field_server, agents)
    assert [f["type"] for f in frames] == ["resume", "notification", "live"], frames
    assert frames[-1]["data"]["cursor"] == frames[1]["data"]["cursor"]


async def test_live_counts_a_flushed_window_as_replayed(
    field_server: ThreadedServer, agents: Agents
) -> None:
    frames = await debounced_resume_frames(field_server, agents)
    assert [f["type"] for f in frames] == ["resume", "notification", "live"], frames
    assert frames[-1]["data"]["replayed"] == 1, frames[-1]


# == 4. disconnect and resume =========================================================


async def record_many(agent: AgentClient, count: int, label: str) -> list[str]:
    """``count`` sequential RECORDs; their unit ids in log order."""
    return [
        (await record(agent, f"market sizing: {label} finding {n}"))["memory_unit_id"]
        for n in range(count)
    ]


async def test_websocket_resume_replays_exactly_the_missed_then_goes_live(
    field_server: ThreadedServer, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    subscription_id = response["subscription_id"]
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        before = await record_many(agents.a, 3, "before")
        seen = await ws.notifications(3)
    assert ids(seen) == before
    last = seen[-1]["cursor"]

    missed = await record_many(agents.a, 4, "missed")
    async with open_ws(field_server, agents.b.token, since=[last]) as ws:
        frames = await ws.ready()
        assert frames[0] == {
            "type": "resume",
            "data": {"subscription_id": subscription_id, "recovered": True, "from": last},
        }
        replayed = [f["data"] for f in frames[1:-1]]
        assert all(f["type"] == "notification" for f in frames[1:-1]), frames
        live = frames[-1]
        assert live["data"] == {
            "subscription_id": subscription_id,
            "replayed": 4,
            "cursor": replayed[-1]["cursor"],
        }
        after = await record_many(agents.a, 2, "after")
        fresh = await ws.notifications(2)
    everything = seen + replayed + fresh
    assert ids(everything) == before + missed + after  # no gap, no duplicate, in order
    assert cursors_increase(everything)


@pytest.mark.parametrize("how", ["last-event-id", "since"])
async def test_sse_resume_replays_exactly_the_missed_then_goes_live(
    http: aiohttp.ClientSession, agents: Agents, how: str
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    url, token = response["sse_url"], agents.b.token
    async with sse_stream(http, url, token) as sse:
        await sse.ready()
        before = await record_many(agents.a, 3, "before")
        seen = await sse.notifications(3)
    assert [e.data["memory_unit_id"] for e in seen] == before
    assert all(e.event == "memory.recorded" and e.id == e.data["cursor"] for e in seen)
    last = seen[-1].id
    assert last is not None

    missed = await record_many(agents.a, 4, "missed")
    option = {"last_event_id": last} if how == "last-event-id" else {"since": last}
    async with sse_stream(http, url, token, **option) as sse:
        events = await sse.ready()
        assert events[0].event == "resume" and events[0].data["recovered"] is True
        assert events[0].data["from"] == last
        replayed = events[1:-1]
        assert all(e.id is not None for e in replayed)
        assert events[-1].data["replayed"] == 4
        assert events[-1].data["cursor"] == replayed[-1].id
        after = await record_many(agents.a, 2, "after")
        fresh = await sse.notifications(2)
    everything = [e.data for e in seen + replayed + fresh]
    assert ids(everything) == before + missed + after
    assert cursors_increase(everything)


async def test_websocket_resume_takes_a_cursor_per_subscription(
    field_server: ThreadedServer, agents: Agents
) -> None:
    first = (await subscribe(agents.b, ["memory.recorded"]))["subscription_id"]
    second = (await subscribe(agents.b, ["memory.recorded"]))["subscription_id"]
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready(2)
        units = await record_many(agents.a, 2, "early")
        got = await ws.notifications(4)
    cursor = {(d["subscription_id"], d["memory_unit_id"]): d["cursor"] for d in got}
    later = await record_many(agents.a, 2, "late")

    def streams(frames: list[dict[str, Any]]) -> dict[str, list[str | None]]:
        out: dict[str, list[str | None]] = {first: [], second: []}
        for frame in frames:
            if frame["type"] == "notification":
                out[frame["data"]["subscription_id"]].append(frame["data"]["memory_unit_id"])
        return out

    # each subscription from its own cursor
    since = [f"{first}@{cursor[first, units[0]]}", f"{second}@{cursor[second, units[1]]}"]
    async with open_ws(field_server, agents.b.token, since=since) as ws:
        frames = await ws.ready(2)
    resumed = {f["data"]["subscription_id"]: f["data"] for f in frames if f["type"] == "resume"}
    assert resumed[first]["from"] == cursor[first, units[0]]
    assert resumed[second]["from"] == cursor[second, units[1]]
    assert streams(frames) == {first: [units[1], *later], second: later}

    # one bare cursor for every subscription, and a per-subscription one wins over it
    since = [cursor[first, units[0]], f"{second}@{cursor[second, units[1]]}"]
    async with open_ws(field_server, agents.b.token, since=since) as ws:
        frames = await ws.ready(2)
    assert streams(frames) == {first: [units[1], *later], second: later}
    async with open_ws(field_server, agents.b.token, since=[cursor[first, units[0]]]) as ws:
        frames = await ws.ready(2)
    assert streams(frames) == {first: [units[1], *later], second: [units[1], *later]}


async def test_replayed_stream_equals_the_live_stream(
    field_server: ThreadedServer, agents: Agents
) -> None:
    response = await subscribe(agents.b, MEMORY_EVENTS)
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        mine = (await record(agents.b, "market sizing: EU HR SaaS grows 23% a year"))[
            "memory_unit_id"
        ]
        await record_many(agents.a, 10, "stream")
        await contradict(agents.a, mine, "market sizing: EU HR SaaS shrinks")
        await record_many(agents.c, 5, "bystander")
        sentinel = (await record(agents.a, "market sizing: the end"))["memory_unit_id"]
        frames = await ws.until(lambda f: f["data"].get("memory_unit_id") == sentinel)
    live = [f["data"] for f in frames]
    async with open_ws(field_server, agents.b.token, since=[response["cursor"]]) as ws:
        frames = await ws.ready()
    assert [f["data"] for f in frames[1:-1]] == live  # same notifications, same scores
    assert frames[-1]["data"]["replayed"] == len(live)


async def test_a_cursor_older_than_the_subscription_replays_only_what_it_owes(
    field_server: ThreadedServer, agents: Agents
) -> None:
    earlier = await record_many(agents.a, 2, "before the subscription")
    response = await subscribe(agents.b, ["memory.recorded"])
    later = await record_many(agents.a, 2, "after the subscription")
    oldest = f"{tag_of(response['cursor'])}-0"
    async with open_ws(field_server, agents.b.token, since=[oldest]) as ws:
        frames = await ws.ready()
    assert frames[0]["data"]["recovered"] is True and frames[0]["data"]["from"] == oldest
    replayed = [f["data"] for f in frames[1:-1]]
    assert ids(replayed) == later and not set(earlier) & set(ids(replayed))


@pytest.fixture
async def other_field_cursor(server_factory: Callable[..., ThreadedServer]) -> str:
    """A valid cursor of another Field."""
    other = server_factory()
    async with FieldClient(other.url) as client:
        agent = await client.register("agent-b", "researcher")
        response = await subscribe(agent, ["memory.recorded"])
    cursor: str = response["cursor"]
    return cursor


@pytest.mark.parametrize(
    "kind", ["other-field", "garbage", "ahead-of-log", "no-position", "empty-tag"]
)
async def test_resume_from_an_unusable_cursor_goes_live_and_says_why(
    field_server: ThreadedServer,
    http: aiohttp.ClientSession,
    agents: Agents,
    other_field_cursor: str,
    kind: str,
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    tag = tag_of(response["cursor"])
    assert tag_of(other_field_cursor) != tag
    bad = {
        "other-field": other_field_cursor,
        "garbage": "not a cursor at all",
        "ahead-of-log": f"{tag}-999999",
        "no-position": f"{tag}-",
        "empty-tag": "-5",
    }[kind]
    await record_many(agents.a, 2, "old")  # not replayed: the stream starts live
    async with (
        open_ws(field_server, agents.b.token, since=[bad]) as ws,
        sse_stream(http, response["sse_url"], agents.b.token, last_event_id=bad) as sse,
    ):
        resume, live = await ws.ready()
        events = await sse.ready()
        assert [e.event for e in events] == ["resume", "live"]
        for report in (resume["data"], events[0].data):
            assert report["recovered"] is False
            assert report["subscription_id"] == response["subscription_id"]
            assert isinstance(report["reason"], str) and report["reason"].strip()
            assert tag_of(report["from"]) == tag
        assert live["data"]["replayed"] == 0 and events[1].data["replayed"] == 0
        written = await record(agents.a, "market sizing: after the resume")
        (over_ws,) = await ws.notifications(1)
        (over_sse,) = await sse.notifications(1)
    assert over_ws["memory_unit_id"] == over_sse.data["memory_unit_id"] == written["memory_unit_id"]


@pytest.mark.parametrize("position", ["\u00b2", "9" * 5000], ids=["superscript", "5000-digits"])
async def test_resume_from_a_malformed_position_goes_live_and_says_why(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents, position: str
) -> None:
    # digits int() refuses (a superscript) or will not convert (over 4300 digits)
    response = await subscribe(agents.b, ["memory.recorded"])
    bad = f"{tag_of(response['cursor'])}-{position}"
    async with sse_stream(http, response["sse_url"], agents.b.token, since=bad) as sse:
        events = await sse.ready()
    async with open_ws(field_server, agents.b.token, since=[bad]) as ws:
        frames = await ws.ready()
    assert [e.event for e in events] == ["resume", "live"]
    assert [f["type"] for f in frames] == ["resume", "live"]
    for report in (events[0].data, frames[0]["data"]):
        assert report["recovered"] is False and report["reason"]


# == 6. backpressure ==================================================================


def stalling_socket(server: ThreadedServer) -> socket.socket:
    """A TCP connection whose kernel buffers fill after a few KB (so a stall shows fast).

    A tiny receive buffer, and a small maximum segment size so that the server's
    send buffer (which Linux sizes from the segment size) stays small too.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    if hasattr(socket, "TCP_MAXSEG"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    return sock


async def test_a_stalled_consumer_is_cut_off_with_cursors_and_others_keep_up(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(
        push=PushLimits(outbox_frames=20, outbox_bytes=1 << 16),
        limits=Limits(max_response_bytes=1 << 16),
    )
    total = 600
    padding = "x" * 4096
    async with FieldClient(server.url) as field:
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        response = await subscribe(b, ["memory.recorded"])
        subscription_id = response["subscription_id"]
        async with (
            open_ws(server, b.token) as reader,
            # never read below (until the end): frames pile up in its 1-frame client
            # queue, its tiny kernel buffers, then the server's outbox of 20 frames;
            # no compression, or the repetitive frames would shrink to a few bytes
            open_ws(
                server, b.token, sock=stalling_socket(server), max_queue=1, compression=None
            ) as stalled,
        ):
            await reader.ready()
            await stalled.ready()  # attached and live; from now on it is not read
            received: list[dict[str, Any]] = []
            everything = asyncio.Event()

            async def read() -> None:
                while len(received) < total:
                    received.extend(await reader.notifications(1, timeout=20))
                everything.set()

            reading = asyncio.create_task(read())
            try:
                # every RECORD succeeds whatever the stalled consumer does
                written = [
                    (await record(a, f"market sizing: finding {n} {padding}"))["memory_unit_id"]
                    for n in range(total)
                ]
                await asyncio.wait_for(everything.wait(), 20)
            finally:
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading

            # the reading consumer got everything, exactly once, in order
            assert ids(received) == written
            assert cursors_increase(received)

            # the stalled one: what was queued for it, then the overflow, then 4008
            frames, code = await stalled.until_closed(timeout=20)
        assert code == 4008, (code, frames[-3:])
        overflow = frames[-1]
        assert overflow["type"] == "overflow", frames[-3:]
        assert isinstance(overflow["data"]["reason"], str) and overflow["data"]["reason"]
        assert all(f["type"] == "notification" for f in frames[:-1]), frames[:-1]
        got = [f["data"] for f in frames[:-1]]
        assert ids(got) == written[: len(got)]
        assert len(got) < total, "the stalled consumer was never cut off"
        resume_at = overflow["data"]["cursors"][subscription_id]
        assert resume_at == (got[-1]["cursor"] if got else response["cursor"])

        # resuming from the overflow's cursor delivers the rest, exactly once
        async with open_ws(server, b.token, since=[f"{subscription_id}@{resume_at}"]) as ws:
            frames = await ws.until(lambda f: f["type"] == "live", timeout=20)
        assert frames[0]["data"] == {
            "subscription_id": subscription_id,
            "recovered": True,
            "from": resume_at,
        }
        rest = [f["data"] for f in frames[1:-1]]
        assert ids(got) + ids(rest) == written
        assert frames[-1]["data"]["replayed"] == len(rest)


#: A consumer in its own process that reads frames as fast as they come (no flow
#: control: it never lets the server's socket fill) and prints how it ended.
PROMPT_READER = """
import asyncio, json, sys
from websockets.asyncio.client import connect

async def main(url, token, total):
    headers = {"Authorization": "Bearer " + token}
    async with connect(url, additional_headers=headers, max_queue=None) as ws:
        count = 0
        while count < total:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["type"] == "live":
                print("live", flush=True)
            elif frame["type"] == "notification":
                count += 1
            elif frame["type"] == "overflow":
                print("overflow", count, flush=True)
                return
        print("ok", count, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_a_prompt_consumer_is_not_cut_off_under_concurrent_writers(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(push=PushLimits(outbox_frames=200))
    writers, per_writer = 16, 100
    total = writers * per_writer
    async with FieldClient(server.url) as field:
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        await subscribe(b, ["memory.recorded"])
        reader = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PROMPT_READER,
            ws_url(server.url),
            b.token,
            str(total),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert reader.stdout is not None
            line = await asyncio.wait_for(reader.stdout.readline(), 20)
            assert line == b"live\n", line

            async def write(w: int) -> None:
                for n in range(per_writer):
                    await record(a, f"market sizing: writer {w} finding {n}")

            await asyncio.gather(*(write(w) for w in range(writers)))
            outcome = (await asyncio.wait_for(reader.stdout.read(), 30)).decode().strip()
        finally:
            if reader.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    reader.kill()
            await reader.wait()
    assert outcome == f"ok {total}", f"a consumer reading at once was cut off: {outcome}"


# == 7. security ======================================================================


async def test_another_agent_cannot_list_cancel_or_stream_a_subscription(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    subscription_id = response["subscription_id"]
    assert await listed(agents.c) == []
    error = await refused(unsubscribe(agents.c, subscription_id), 403, "FORBIDDEN")
    assert error.body["recoverable"] is False
    async with open_sse(http, response["sse_url"], agents.c.token) as sse_response:
        assert sse_response.status == 403
        assert (await sse_response.json())["code"] == "FORBIDDEN"
    async with open_sse(
        http, response["sse_url"], None, query_token=agents.c.token
    ) as sse_response:
        assert sse_response.status == 403
    # C's socket, even asking for B's subscription by id, streams only C's own
    since = [f"{subscription_id}@{response['cursor']}"]
    async with open_ws(field_server, agents.c.token, since=since) as ws:
        frame = await ws.request(
            "SUBSCRIBE",
            "agent-c",
            {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}},
        )
        own = frame["body"]["subscription_id"]
        written = await record(agents.a, "market sizing: a finding for everyone")
        frames = await ws.until(lambda f: f["type"] == "notification")
        assert [f["type"] for f in frames] == ["notification"], frames
        assert frames[0]["data"]["subscription_id"] == own
        assert frames[0]["data"]["memory_unit_id"] == written["memory_unit_id"]
    # and B's subscription is untouched
    assert [s["id"] for s in await listed(agents.b)] == [subscription_id]


@pytest.mark.parametrize("token", [None, "not-a-token-this-field-issued"], ids=["none", "bad"])
async def test_streams_refuse_a_missing_or_bad_token(
    field_server: ThreadedServer,
    http: aiohttp.ClientSession,
    agents: Agents,
    token: str | None,
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    for header, query in ((token, None), (None, token)):
        async with open_sse(http, response["sse_url"], header, query_token=query) as sse_response:
            assert sse_response.status == 401
            assert sse_response.headers["WWW-Authenticate"].startswith("Bearer")
            body = await sse_response.json()
            assert body["code"] == "UNAUTHENTICATED" and body["message"]
        async with open_ws(field_server, header, query_token=query) as ws:
            frames, code = await ws.until_closed()
        assert code == 4401
        assert [f["type"] for f in frames] == ["error"]
        assert frames[0]["data"]["code"] == "UNAUTHENTICATED"


async def test_a_deregistered_agents_token_no_longer_opens_streams(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    await agents.b.deregister()
    async with open_sse(http, response["sse_url"], agents.b.token) as sse_response:
        assert sse_response.status == 401
        assert (await sse_response.json())["code"] == "AGENT_NOT_REGISTERED"
    async with open_ws(field_server, agents.b.token) as ws:
        frames, code = await ws.until_closed()
    assert code == 4401
    assert frames[0]["data"]["code"] == "AGENT_NOT_REGISTERED"


async def test_token_in_the_query_opens_both_streams(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    response = await subscribe(agents.b, ["memory.recorded"])
    async with (
        open_ws(field_server, None, query_token=agents.b.token) as ws,
        sse_stream(http, response["sse_url"], None, query_token=agents.b.token) as sse,
    ):
        await ws.ready()
        await sse.ready()
        written = await record(agents.a, "market sizing: seen through query tokens")
        (over_ws,) = await ws.notifications(1)
        (over_sse,) = await sse.notifications(1)
    assert over_ws["memory_unit_id"] == over_sse.data["memory_unit_id"] == written["memory_unit_id"]


# == 8. bad SUBSCRIBE payloads ========================================================

_EVENTS = ["memory.recorded"]


@pytest.mark.parametrize(
    ("payload", "mentions"),
    [
        ({"action": "subscribe", "subscription": {"events": []}}, "events"),
        ({"action": "subscribe", "subscription": {}}, "events"),
        ({"action": "subscribe", "subscription": {"events": "memory.recorded"}}, "events"),
        ({"action": "subscribe", "subscription": {"events": [7]}}, "events"),
        ({"action": "subscribe"}, "subscription"),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "min_relevance": 1.5}},
            "min_relevance",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "min_relevance": -0.1}},
            "min_relevance",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "min_relevance": "high"}},
            "min_relevance",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "debounce_ms": -1}},
            "debounce_ms",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "debounce_ms": "100"}},
            "debounce_ms",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "debounce_ms": 2.5}},
            "debounce_ms",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "debounce_ms": 3_600_001}},
            "debounce_ms",
        ),
        (
            {"action": "subscribe", "subscription": {"events": _EVENTS, "include_own": "yes"}},
            "include_own",
        ),
        ({"action": "subscribe", "subscription": {"events": _EVENTS, "id": "sub-mine"}}, "id"),
        ({"action": "subscribe", "subscription": {"events": _EVENTS, "colour": "red"}}, "colour"),
        ({"action": "pause", "subscription": {"events": _EVENTS}}, "action"),
        ({"subscription": {"events": _EVENTS}}, "action"),
        ({"action": "unsubscribe"}, "subscription"),
        ({"action": "unsubscribe", "subscription": {}}, "id"),
    ],
    ids=[
        "empty-events",
        "missing-events",
        "events-not-a-list",
        "event-not-a-string",
        "missing-subscription",
        "min-relevance-1.5",
        "min-relevance-negative",
        "min-relevance-string",
        "debounce-negative",
        "debounce-string",
        "debounce-fraction",
        "debounce-over-max",
        "include-own-string",
        "id-on-subscribe",
        "unknown-key",
        "unknown-action",
        "missing-action",
        "unsubscribe-without-subscription",
        "unsubscribe-without-id",
    ],
)
async def test_bad_subscribe_payload_is_422_with_a_clear_message(
    agents: Agents, payload: dict[str, Any], mentions: str
) -> None:
    error = await refused(agents.b.send("SUBSCRIBE", payload), 422, "INVALID_PAYLOAD")
    assert mentions in error.body["message"], error.body
    assert error.body["recoverable"] is True and error.body["suggested_action"]
    assert await listed(agents.b) == []  # nothing was created


async def test_unknown_event_names_are_listed_in_the_error(agents: Agents) -> None:
    payload = {
        "action": "subscribe",
        "subscription": {"events": ["memory.recorded", "memory.exploded", "agent.danced"]},
    }
    error = await refused(agents.b.send("SUBSCRIBE", payload), 422, "INVALID_PAYLOAD")
    details = error.body["details"]
    assert details["unknown_events"] == ["agent.danced", "memory.exploded"]
    assert "memory.recorded" in details["valid_events"] and len(details["valid_events"]) == 13
    assert "memory.exploded" in error.body["message"]


async def test_unsubscribing_an_unknown_subscription_is_404(agents: Agents) -> None:
    error = await refused(unsubscribe(agents.b, "sub-nope"), 404, "SUBSCRIPTION_NOT_FOUND")
    assert "sub-nope" in error.body["message"]


async def test_the_per_agent_subscription_cap_is_409(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(limits=Limits(max_subscriptions_per_agent=3))
    async with FieldClient(server.url) as field:
        b = await field.register("agent-b", "researcher")
        c = await field.register("agent-c", "auditor")
        made = [(await subscribe(b, ["memory.recorded"]))["subscription_id"] for _ in range(3)]
        await refused(subscribe(b, ["memory.recorded"]), 409, "SUBSCRIPTION_LIMIT")
        assert len(await listed(b)) == 3
        await subscribe(c, ["memory.recorded"])  # the cap is per agent
        await unsubscribe(b, made[0])  # cancelled ones do not count
        again = await subscribe(b, ["memory.recorded"])
        assert sorted(s["id"] for s in await listed(b)) == sorted(
            [*made[1:], again["subscription_id"]]
        )


# == 9. poller and pusher =============================================================


async def test_poller_and_pusher_see_every_unit_exactly_once(
    field_server: ThreadedServer, agents: Agents
) -> None:
    per_writer = 100
    total = 2 * per_writer
    await subscribe(agents.b, ["memory.recorded"], min_relevance=0.0)
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        start = (await agents.b.attune(max_units=1, since_epoch=0))["epoch"]
        written: list[str] = []
        writing = True

        async def write(agent: AgentClient) -> None:
            for n in range(per_writer):
                written.append(
                    (await record(agent, f"market sizing: {agent.id} {n}"))["memory_unit_id"]
                )

        last_epoch = start

        async def poll() -> list[str]:
            nonlocal last_epoch
            seen: list[str] = []
            deadline = time.monotonic() + 20
            while writing or len(seen) < total:
                assert time.monotonic() < deadline, f"polling stalled at {len(seen)} of {total}"
                response = await agents.b.attune(
                    max_units=37, since_epoch=last_epoch, format="ids_only"
                )
                seen += [item["memory_unit_id"] for item in response["record"]]
                last_epoch = response["epoch"]
            return seen

        async def push() -> list[str | None]:
            return ids(await ws.notifications(total, timeout=20))

        polling = asyncio.create_task(poll())
        pushing = asyncio.create_task(push())
        await asyncio.gather(write(agents.a), write(agents.c))
        writing = False
        polled, pushed = await asyncio.gather(polling, pushing)
        # one more poll from where the poller stopped finds nothing new
        final = await agents.b.attune(max_units=37, since_epoch=last_epoch, format="ids_only")
        assert final["record"] == []
    assert len(written) == total
    assert len(polled) == len(set(polled)) == total, "the poller saw a unit twice"
    assert len(pushed) == len(set(pushed)) == total, "the pusher saw a unit twice"
    assert set(polled) == set(pushed) == set(written)


async def test_a_head_request_for_a_stream_opens_nothing(
    field_server: ThreadedServer, agents: Agents, http: aiohttp.ClientSession
) -> None:
    """HEAD (Starlette answers it on every GET route) says what a GET would be, and opens no
    stream: nothing is left behind in the push hub or counted as the agent's connection."""
    created = await subscribe(agents.b, ["memory.recorded"])
    headers = {"Authorization": f"Bearer {agents.b.token}"}
    for _ in range(3):
        async with http.head(created["sse_url"], headers=headers) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert await response.read() == b""
    async with http.head(created["sse_url"]) as response:  # no token: refused as a GET is
        assert response.status == 401
    hub = field_server.app.state.push_hub
    assert hub.connections == set()
    assert hub.liveness is None or hub.liveness._connections == {}
