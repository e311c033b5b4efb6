"""Browsers on other origins: ``--cors-origin`` (``field/transports/cors.py``).

First over plain HTTP, as a browser would send its requests (preflights, the
``Origin`` header), against real servers; then in a real browser, headless
Chromium, from pages served on other origins.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from field.cli.main import _config, _parser
from field.client import AgentClient, FieldClient
from field.server.config import Config
from field.transports.cors import parse_origin

from .browser import PageServer, chromium_page, needs_chromium
from .conftest import ThreadedServer

APP = "https://app.example.com"
OTHER = "https://evil.example.net"
#: A preflight of a POST with a token and a JSON body, as a browser sends it.
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}
EXPOSED = "access-control-expose-headers"
#: SUBSCRIBE's list: an operation any agent may send on its WebSocket.
LIST = {"action": "list"}

Start = Callable[..., ThreadedServer]


def handshake(origin: str | None = None) -> dict[str, str]:
    """The headers of a browser's WebSocket handshake."""
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
    }
    if origin is not None:
        headers["Origin"] = origin
    return headers


class Answer:
    """A response, read and released: its status, headers and JSON body (or None)."""

    def __init__(self, status: int, headers: Any, body: Any) -> None:
        self.status, self.headers, self.body = status, headers, body


async def send(http: aiohttp.ClientSession, method: str, url: str, **options: Any) -> Answer:
    async with http.request(method, url, **options) as response:
        raw = await response.read()
        body = await response.json() if response.content_type == "application/json" else None
        return Answer(response.status, response.headers, body if raw else None)


async def register(server: ThreadedServer, agent_id: str) -> AgentClient:
    field = FieldClient(server.url)
    return await field.register(agent_id, "researcher", interests=["churn"])


async def close(agent: AgentClient) -> None:
    await agent.field.close()


# -- the setting -----------------------------------------------------------------------------


def test_origins_are_written_as_browsers_send_them() -> None:
    assert parse_origin("HTTPS://App.Example.com/") == APP
    assert parse_origin("http://localhost:80") == "http://localhost"
    assert parse_origin("https://example.com:8443") == "https://example.com:8443"
    assert parse_origin("http://[::1]:3000") == "http://[::1]:3000"
    assert parse_origin("*") == "*"
    for bad in ("example.com", "ftp://example.com", "https://example.com/app", "https://", "null"):
        with pytest.raises(ValueError, match="origin"):
            parse_origin(bad)


def test_the_flag_repeats_and_the_environment_lists() -> None:
    args = _parser().parse_args(
        ["serve", "--cors-origin", "https://App.example.com", "--cors-origin", "http://x:81"]
    )
    assert _config(args).cors_origin == (APP, "http://x:81")
    environment = {"FIELD_CORS_ORIGIN": f"{APP}, http://localhost:3000"}
    assert Config.from_env(environment).cors_origin == (APP, "http://localhost:3000")
    assert Config().cors_origin == ()
    with pytest.raises(ValueError, match="not an origin"):
        Config(cors_origin=("app.example.com",))


# -- without --cors-origin -------------------------------------------------------------------


async def test_without_origins_browsers_get_nothing_and_other_clients_what_they_had(
    server_factory: Start,
) -> None:
    server = server_factory()
    async with aiohttp.ClientSession() as http:
        preflight = await send(
            http, "OPTIONS", f"{server.url}/v1/record", headers={"Origin": APP, **PREFLIGHT}
        )
        assert preflight.status == 405
        assert preflight.body["code"] == "METHOD_NOT_ALLOWED"
        status = await send(http, "GET", f"{server.url}/v1/field/status", headers={"Origin": APP})
        assert status.status == 200
        assert "access-control-allow-origin" not in status.headers
        refused = await send(http, "GET", f"{server.url}/v1/ws", headers=handshake(APP))
        assert refused.status == 403
        assert refused.body["code"] == "FORBIDDEN"
        agent = await register(server, "plain")
        try:
            # no Origin: not a browser; the Field's own origin: its own pages
            for origin in (None, server.url):
                url = f"{server.url}/v1/ws?token={agent.token}"
                headers = {} if origin is None else {"Origin": origin}
                async with http.ws_connect(url, headers=headers) as socket:
                    await socket.send_json(agent.field.envelope("SUBSCRIBE", agent.id, LIST))
                    frame = await socket.receive_json(timeout=10)
                    assert frame["type"] == "response" and frame["status"] == 200
        finally:
            await close(agent)


# -- with --cors-origin ----------------------------------------------------------------------


async def test_a_preflight_of_an_allowed_origin_is_answered(server_factory: Start) -> None:
    server = server_factory(cors_origin=(APP,))
    async with aiohttp.ClientSession() as http:
        answer = await send(
            http, "OPTIONS", f"{server.url}/v1/record", headers={"Origin": APP, **PREFLIGHT}
        )
        assert answer.status == 200
        headers = answer.headers
        assert headers["access-control-allow-origin"] == APP
        assert "POST" in headers["access-control-allow-methods"]
        allowed = headers["access-control-allow-headers"].lower()
        assert {"authorization", "content-type", "last-event-id"} <= set(allowed.split(", "))
        assert int(headers["access-control-max-age"]) > 0


async def test_a_refused_preflight_is_the_error_body(server_factory: Start) -> None:
    server = server_factory(cors_origin=(APP,))
    async with aiohttp.ClientSession() as http:
        other = await send(
            http, "OPTIONS", f"{server.url}/v1/record", headers={"Origin": OTHER, **PREFLIGHT}
        )
        assert other.status == 403
        body = other.body
        assert body["code"] == "FORBIDDEN" and "origin" in body["message"]
        assert body["recoverable"] is False and body["suggested_action"]
        assert "access-control-allow-origin" not in other.headers
        method = {"Origin": APP, "Access-Control-Request-Method": "PUT"}
        put = await send(http, "OPTIONS", f"{server.url}/v1/record", headers=method)
        assert put.status == 403
        assert "method" in put.body["message"]
        # the origin is allowed: the page may read why
        assert put.headers["access-control-allow-origin"] == APP


async def test_every_answer_to_an_allowed_origin_carries_cors(server_factory: Start) -> None:
    """The busy paths the app routes itself, the router's, and errors of every layer."""
    server = server_factory(cors_origin=(APP,), agent_rate=0.001, agent_burst=1)
    agent = await register(server, "browser-agent")
    try:
        origin = {"Origin": APP}
        bearer = {**origin, "Authorization": f"Bearer {agent.token}"}
        async with aiohttp.ClientSession() as http:
            url = server.url
            answers = {
                "status": await send(http, "GET", f"{url}/v1/field/status", headers=origin),
                "unknown path": await send(http, "GET", f"{url}/v1/nothing", headers=origin),
                "method": await send(http, "DELETE", f"{url}/v1/agents", headers=origin),
                "no token": await send(http, "GET", f"{url}/v1/agents", headers=origin),
                "media type": await send(
                    http, "POST", f"{url}/v1/record", data="{}", headers=bearer
                ),
                "over its rate": await send(
                    http, "POST", f"{url}/v1/record", json={}, headers=bearer
                ),
                "source event": await send(
                    http, "POST", f"{url}/v1/sources/none/events", json={}, headers=origin
                ),
                "openapi": await send(http, "GET", f"{url}/openapi.json", headers=origin),
            }
            statuses = {what: answer.status for what, answer in answers.items()}
            assert statuses == {
                "status": 200,
                "unknown path": 404,
                "method": 405,
                "no token": 401,
                "media type": 415,
                "over its rate": 429,
                "source event": 404,
                "openapi": 200,
            }
            for what, answer in answers.items():
                assert answer.headers.get("access-control-allow-origin") == APP, what
                assert "Origin" in answer.headers.get("vary", ""), what
            exposed = answers["over its rate"].headers[EXPOSED].lower()
            assert {"retry-after", "www-authenticate", "x-request-id"} <= set(exposed.split(", "))
            assert "retry-after" in answers["over its rate"].headers
            other = await send(
                http, "GET", f"{server.url}/v1/field/status", headers={"Origin": OTHER}
            )
            assert "access-control-allow-origin" not in other.headers
    finally:
        await close(agent)


async def test_streams_of_several_origins_each_carry_their_own(server_factory: Start) -> None:
    """SSE responses share one response head: each stream's CORS headers are its own."""
    second = "http://localhost:3000"
    server = server_factory(cors_origin=(APP, second))
    agent = await register(server, "streamer")
    try:
        subscribed = await agent.subscribe(["memory.recorded"])
        url = f"{server.url}/v1/subscriptions/{subscribed['subscription_id']}/events"
        async with aiohttp.ClientSession() as http:
            for origin in (APP, second, APP, OTHER, second):
                headers = {"Origin": origin, "Authorization": f"Bearer {agent.token}"}
                async with http.get(url, headers=headers) as stream:
                    assert stream.status == 200
                    assert stream.content_type == "text/event-stream"
                    allowed = stream.headers.get("access-control-allow-origin")
                    assert allowed == (None if origin == OTHER else origin)
                    assert stream.headers.getall("vary", []) in ([], ["Origin"])
                    assert len(stream.headers.getall("access-control-allow-origin", [])) <= 1
    finally:
        await close(agent)


async def test_websockets_are_refused_to_origins_not_allowed(server_factory: Start) -> None:
    server = server_factory(cors_origin=(APP,))
    agent = await register(server, "socket-agent")
    try:
        url = f"{server.url}/v1/ws?token={agent.token}"
        async with aiohttp.ClientSession() as http:
            refused = await send(http, "GET", url, headers=handshake(OTHER))
            assert refused.status == 403
            body = refused.body
            assert body["code"] == "FORBIDDEN" and "WebSocket" in body["message"]
            refused = await send(http, "GET", url, headers=handshake("null"))  # a sandboxed page
            assert refused.status == 403
            for origin in (APP, None, server.url):
                headers = {} if origin is None else {"Origin": origin}
                async with http.ws_connect(url, headers=headers) as socket:
                    await socket.send_json(agent.field.envelope("SUBSCRIBE", agent.id, LIST))
                    frame = await socket.receive_json(timeout=10)
                    assert frame["type"] == "response" and frame["status"] == 200, origin
    finally:
        await close(agent)


# -- in a real browser -----------------------------------------------------------------------

#: The page of the allowed origin: SUBSCRIBE with fetch (a preflighted POST), then the
#: subscription's SSE stream (EventSource, the token in the query) and the WebSocket,
#: both from the subscription's first cursor; and an error it can read.
ALLOWED_SCRIPT = """
async ({api, token, agent}) => {
  window.seen = {sse: null, ws: null, errors: []};
  const envelope = {protocol: "akashik", version: "0.1.0", id: "page-1", operation: "SUBSCRIBE",
    agent_id: agent, session_id: null, epoch: 0,
    payload: {action: "subscribe", subscription: {events: ["memory.recorded"]}}};
  const answer = await fetch(api + "/v1/subscribe", {method: "POST",
    headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
    body: JSON.stringify(envelope)});
  const subscribed = await answer.json();
  const query = "?token=" + encodeURIComponent(token) + "&since="
    + encodeURIComponent(subscribed.cursor);
  const source = new EventSource(subscribed.sse_url + query);
  source.addEventListener("memory.recorded", (event) => {
    window.seen.sse = JSON.parse(event.data); source.close(); });
  source.onerror = () => window.seen.errors.push("sse " + source.readyState);
  const socket = new WebSocket(subscribed.ws_url + query);
  socket.onmessage = (message) => {
    const frame = JSON.parse(message.data);
    if (frame.type === "notification") { window.seen.ws = frame.data; socket.close(); } };
  socket.onerror = () => window.seen.errors.push("ws");
  const refused = await fetch(api + "/v1/agents");
  return {status: answer.status, subscription: subscribed.subscription_id,
          error: {status: refused.status, body: await refused.json(),
                  authenticate: refused.headers.get("WWW-Authenticate")}};
}
"""

#: The page of an origin not allowed: the same three, each refused by the browser.
REFUSED_SCRIPT = """
async ({api, token, agent, sse, ws}) => {
  const out = {};
  const envelope = {protocol: "akashik", version: "0.1.0", id: "page-2", operation: "RECORD",
    agent_id: agent, session_id: null, epoch: 0,
    payload: {type: "finding", content: "from a page not allowed",
              intent: {purpose: "test"}, confidence: {score: 0.5, reasoning: "test"}}};
  try {
    const answer = await fetch(api + "/v1/record", {method: "POST",
      headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
      body: JSON.stringify(envelope)});
    out.fetch = "answered " + answer.status;
  } catch (error) { out.fetch = "refused"; }
  out.sse = await new Promise((resolve) => {
    const source = new EventSource(sse + "?token=" + encodeURIComponent(token));
    source.onopen = () => { source.close(); resolve("open"); };
    source.onerror = () => {
      resolve(source.readyState === EventSource.CLOSED ? "refused" : "retrying");
      source.close(); };
  });
  out.ws = await new Promise((resolve) => {
    const socket = new WebSocket(ws + "?token=" + encodeURIComponent(token));
    socket.onopen = () => { socket.close(); resolve("open"); };
    socket.onclose = (event) => resolve("closed " + event.code);
  });
  return out;
}
"""


@needs_chromium
async def test_a_page_of_an_allowed_origin_calls_streams_and_sockets(
    server_factory: Start,
) -> None:
    with PageServer("<!doctype html><title>app</title>") as site:
        server = server_factory(cors_origin=(site.origin,))
        reader = await register(server, "page-reader")
        writer = await register(server, "page-writer")
        try:
            async with chromium_page(site.url) as page:
                args = {"api": server.url, "token": reader.token, "agent": reader.id}
                opened = await page.evaluate(ALLOWED_SCRIPT, args)
                assert opened["status"] == 200
                error = opened["error"]  # a refusal the page can read, headers included
                assert error["status"] == 401 and error["body"]["code"] == "UNAUTHENTICATED"
                assert error["authenticate"] == "Bearer"
                recorded = await writer.record(
                    "finding", "churn fell", purpose="share", confidence=0.9, reasoning="seen"
                )
                await page.wait_for_function("window.seen.sse && window.seen.ws")
                seen = await page.evaluate("window.seen")
        finally:
            await close(reader)
            await close(writer)
    unit_id = recorded["memory_unit_id"]
    assert seen["sse"]["subscription_id"] == opened["subscription"]
    assert seen["sse"]["memory_unit_id"] == unit_id
    assert seen["ws"]["memory_unit_id"] == unit_id
    assert seen["errors"] == []


@needs_chromium
async def test_a_page_of_another_origin_is_refused_all_three(server_factory: Start) -> None:
    with (
        PageServer("<!doctype html><title>app</title>") as allowed,
        PageServer("<!doctype html><title>elsewhere</title>") as elsewhere,
    ):
        server = server_factory(cors_origin=(allowed.origin,))
        agent = await register(server, "refused-agent")
        try:
            subscribed = await agent.subscribe(["memory.recorded"])
            before = await agent.field.status()
            async with chromium_page(elsewhere.url) as page:
                args = {
                    "api": server.url,
                    "token": agent.token,
                    "agent": agent.id,
                    "sse": subscribed["sse_url"],
                    "ws": subscribed["ws_url"],
                }
                refused = await page.evaluate(REFUSED_SCRIPT, args)
            after = await agent.field.status()
        finally:
            await close(agent)
    assert refused == {"fetch": "refused", "sse": "refused", "ws": "closed 1006"}
    # the preflight was refused, so the POST was never sent: nothing was recorded
    assert after["counts"]["memory_units"] == before["counts"]["memory_units"]


async def test_notifications_reach_the_page_in_order_of_writing(server_factory: Start) -> None:
    """Guard of the browser test's premise, without a browser: the stream a page opens
    from the subscription's cursor receives a unit recorded before or after it opens."""
    server = server_factory(cors_origin=(APP,))
    reader = await register(server, "premise-reader")
    writer = await register(server, "premise-writer")
    try:
        subscribed = await reader.subscribe(["memory.recorded"])
        recorded = await writer.record(
            "finding", "churn fell", purpose="share", confidence=0.9, reasoning="seen"
        )
        url = f"{subscribed['sse_url']}?token={reader.token}&since={subscribed['cursor']}"
        async with (
            aiohttp.ClientSession() as http,
            http.get(url, headers={"Origin": APP}) as stream,
        ):
            seen = b""
            async with asyncio.timeout(10):
                while recorded["memory_unit_id"].encode() not in seen:
                    seen += await stream.content.readany()
        assert b"event: memory.recorded" in seen
    finally:
        await close(reader)
        await close(writer)
