"""The host names the Field answers to: ``--allowed-host`` (``field/transports/hosts.py``).

First the patterns and the rules, without a server; then real servers on
loopback, spoken to over HTTP and WebSocket as a page of a rebound host name
would speak to them: its ``Host`` and ``Origin`` both name the page's site
and port, whatever address the request reaches.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from field.cli.main import _config, _parser, main
from field.client import FieldClient
from field.server.config import Config
from field.transports.cors import mcp_refusal, websocket_refusal
from field.transports.hosts import AllowedHosts, parse_allowed_hosts, parse_host_pattern

from .conftest import ThreadedServer
from .schema_util import assert_valid

Start = Callable[..., ThreadedServer]
#: The name a rebinding page's site has.
EVIL = "evil.example.com"
#: Paths that answer without a token, and so answered a rebound page in full.
TOKENLESS = ("/metrics", "/v1/field/status", "/healthz", "/.well-known/rap-toolset")


# -- the patterns and the rules ----------------------------------------------------------------


def test_patterns_take_the_sdks_forms_and_subdomains() -> None:
    assert parse_allowed_hosts(
        ["Field.Example.com:8765", "field.example.com:8765", "*.example.com", "x.test:*"]
    ) == ("field.example.com:8765", "*.example.com", "x.test:*")
    assert str(parse_host_pattern("[FD00::0005]:080")) == "[fd00::5]:80"
    assert str(parse_host_pattern("10.0.0.5")) == "10.0.0.5"
    for bad in ("*", "*:8765", "", "a b", "http://field.test", "field.test:0", "x:*:*", "x/y"):
        with pytest.raises(ValueError, match="allowed host"):
            parse_host_pattern(bad)


def test_bound_to_loopback_only_loopback_names_and_allowed_hosts_are_answered() -> None:
    hosts = AllowedHosts("127.0.0.1", ["field.test:*", "*.example.org", "exact.test:8765"])
    assert hosts.checking
    for host in (
        "127.0.0.1:8765",
        "127.9.9.9",
        "localhost",
        "LocalHost:1",
        "[::1]:8765",
        "field.test",
        "field.test:1234",
        "a.example.org",
        "a.b.example.org",
        "exact.test:8765",
    ):
        assert hosts.admits(host), host
    for host in (
        f"{EVIL}:8765",
        "example.org",  # *. is the subdomains only
        "a.example.org:8765",  # no port in the pattern: none in Host
        "exact.test:8766",
        "exact.test",
        "localhost.evil.example.com",
        "127.0.0.1.evil.example.com",
        "0x7f.0.0.1",
        "[::2]:8765",
        "",
        "localhost:port",
    ):
        assert not hosts.admits(host), host


def test_bound_elsewhere_host_is_checked_only_with_allowed_hosts() -> None:
    assert AllowedHosts("::1").checking and AllowedHosts("localhost").checking
    open_to_all = AllowedHosts("0.0.0.0")
    assert not open_to_all.checking and open_to_all.admits(f"{EVIL}:8765")
    named = AllowedHosts("0.0.0.0", ["field.example.com"])
    assert named.admits("field.example.com") and named.admits("127.0.0.1:8765")
    assert not named.admits(f"{EVIL}:8765")


def scope(host: str, origin: str | None) -> dict[str, Any]:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "http", "headers": headers}


def test_an_origin_is_not_allowed_for_naming_the_host() -> None:
    """A rebound page sends an ``Origin`` equal to ``Host``: that is no reason to serve it,
    even where ``Host`` itself is not checked (a Field bound to 0.0.0.0)."""
    public = AllowedHosts("0.0.0.0")
    rebound = scope(f"{EVIL}:8765", f"http://{EVIL}:8765")
    for refusal in (
        mcp_refusal(rebound, frozenset(), public),
        websocket_refusal(rebound, frozenset(), public),
    ):
        assert refusal is not None and refusal.code == "FORBIDDEN"
    # a page of the Field itself, at a host it answers to, is its own
    own = scope("127.0.0.1:8765", "http://127.0.0.1:8765")
    assert websocket_refusal(own, frozenset(), public) is None
    assert mcp_refusal(own, frozenset(), public) is None
    named = AllowedHosts("0.0.0.0", ["field.example.com:*"])
    mine = scope("field.example.com:8765", "https://field.example.com:8765")
    assert websocket_refusal(mine, frozenset(), named) is None
    # /mcp takes a loopback or allowed origin whatever the Host; a WebSocket its own only
    elsewhere = scope("field.example.com:8765", "http://localhost:3000")
    assert mcp_refusal(elsewhere, frozenset(), named) is None
    assert websocket_refusal(elsewhere, frozenset(), named) is not None
    other = scope("field.example.com:8765", "http://other.test")
    assert mcp_refusal(other, frozenset({"http://app.test"}), public) is not None
    assert (
        mcp_refusal(scope("x", "http://app.test"), frozenset({"http://app.test"}), public) is None
    )


def test_the_flag_repeats_and_the_environment_lists() -> None:
    args = _parser().parse_args(
        ["serve", "--allowed-host", "Field.test:*", "--allowed-host", "*.example.org"]
    )
    assert _config(args).allowed_host == ("field.test:*", "*.example.org")
    environment = {"FIELD_ALLOWED_HOST": "field.test:8765, *.example.org"}
    assert Config.from_env(environment).allowed_host == ("field.test:8765", "*.example.org")
    assert Config().allowed_host == ()
    with pytest.raises(ValueError, match="allowed host"):
        Config(allowed_host=("*",))


def test_a_bad_pattern_stops_the_server_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--in-memory", "--allowed-host", "http://field.test/"]) == 2
    assert "allowed host" in capsys.readouterr().err


# -- over HTTP ---------------------------------------------------------------------------------


class Answer:
    """A response, read and released: its status, headers and JSON body (or None)."""

    def __init__(self, status: int, headers: Any, body: Any) -> None:
        self.status, self.headers, self.body = status, headers, body


async def send(method: str, url: str, **options: Any) -> Answer:
    async with aiohttp.ClientSession() as http, http.request(method, url, **options) as response:
        raw = await response.read()
        body = await response.json() if response.content_type == "application/json" else None
        return Answer(response.status, response.headers, body if raw else None)


def rebound(server: ThreadedServer, name: str = EVIL) -> dict[str, str]:
    """The headers of a page of ``name`` that was rebound to the Field's address."""
    return {"Host": f"{name}:{server.port}", "Origin": f"http://{name}:{server.port}"}


def misdirected(answer: Answer) -> None:
    assert answer.status == 421, (answer.status, answer.body)
    assert_valid("error", answer.body)
    assert answer.body["code"] == "MISDIRECTED_REQUEST"
    assert answer.body["recoverable"] is False
    assert "--allowed-host" in answer.body["suggested_action"]


def initialize() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "page", "version": "0"},
        },
    }


def mcp_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }


async def test_a_rebound_host_is_refused_on_every_endpoint(server_factory: Start) -> None:
    server = server_factory()
    async with FieldClient(server.url) as field:
        agent = await field.register("rebound-agent", "analyst")
        evil = rebound(server)
        answer = await send(
            "POST",
            f"{server.url}/mcp",
            json=initialize(),
            headers={**mcp_headers(agent.token), **evil},
        )
        misdirected(answer)
        for path in (*TOKENLESS, "/openapi.json", "/console", "/v1/nothing"):
            misdirected(await send("GET", server.url + path, headers=evil))
        envelope = field.envelope("REGISTER", "page-agent", {"id": "page-agent", "role": "x"})
        misdirected(await send("POST", f"{server.url}/v1/register", json=envelope, headers=evil))
        status = await send("GET", f"{server.url}/v1/field/status")
        assert status.body["counts"]["agents"] == 1  # nothing the page sent was applied
        # the same requests to a loopback name are served
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "localhost"):
            for path in TOKENLESS:
                answer = await send("GET", server.url + path, headers={"Host": host})
                assert answer.status == 200, (host, path, answer.status)
        answer = await send(
            "POST",
            f"{server.url}/mcp",
            json=initialize(),
            headers={**mcp_headers(agent.token), "Origin": server.url},
        )
        assert answer.status == 200, answer.body


async def test_a_request_without_host_is_served(server_factory: Start) -> None:
    """HTTP/1.0 may leave ``Host`` out; no browser does."""
    server = server_factory()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]


def handshake(headers: dict[str, str]) -> dict[str, str]:
    return {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        **headers,
    }


async def test_a_rebound_host_opens_no_websocket(server_factory: Start) -> None:
    server = server_factory()
    async with FieldClient(server.url) as field:
        agent = await field.register("socket-agent", "analyst")
        url = f"{server.url}/v1/ws?token={agent.token}"
        misdirected(await send("GET", url, headers=handshake(rebound(server))))
        misdirected(await send("GET", url, headers=handshake({"Host": EVIL})))  # no Origin
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url, headers=rebound(server))
            assert refused.value.status == 421
            # a page of the Field's own loopback origin opens one
            async with http.ws_connect(url, headers={"Origin": server.url}) as socket:
                await socket.send_json(field.envelope("SUBSCRIBE", agent.id, {"action": "list"}))
                frame = await socket.receive_json(timeout=10)
                assert frame["type"] == "response" and frame["status"] == 200


async def test_an_allowed_host_is_answered_and_its_pages_are_the_fields_own(
    server_factory: Start,
) -> None:
    server = server_factory(allowed_host=("field.test:*", "*.example.org:*"))
    async with FieldClient(server.url) as field:
        agent = await field.register("named-agent", "analyst")
        for name in ("field.test", "app.example.org"):
            own = rebound(server, name)  # Origin and Host of a page the Field serves there
            for path in TOKENLESS:
                answer = await send("GET", server.url + path, headers=own)
                assert answer.status == 200, (name, path, answer.status)
            headers = {**mcp_headers(agent.token), **own}
            answer = await send("POST", f"{server.url}/mcp", json=initialize(), headers=headers)
            assert answer.status == 200, answer.body
            url = f"{server.url}/v1/ws?token={agent.token}"
            async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=own) as ws:
                await ws.send_json(field.envelope("SUBSCRIBE", agent.id, {"action": "list"}))
                assert (await ws.receive_json(timeout=10))["status"] == 200
        misdirected(await send("GET", f"{server.url}/healthz", headers=rebound(server)))
        misdirected(await send("GET", f"{server.url}/healthz", headers={"Host": "example.org"}))


async def test_mcp_refuses_an_origin_not_allowed_whatever_the_host(server_factory: Start) -> None:
    """Bound elsewhere than loopback with no --allowed-host, ``Host`` is not checked; /mcp
    still refuses a page of another site, though its ``Origin`` equals ``Host``."""
    server = server_factory(host="0.0.0.0")  # as if: the socket is on loopback all the same
    async with FieldClient(server.url) as field:
        agent = await field.register("public-agent", "analyst")
        headers = mcp_headers(agent.token)
        for origin_and_host in (rebound(server), {"Origin": f"http://{EVIL}", "Host": "x"}):
            answer = await send(
                "POST",
                f"{server.url}/mcp",
                json=initialize(),
                headers={**headers, **origin_and_host},
            )
            assert answer.status == 403, answer.body
            assert_valid("error", answer.body)
            assert answer.body["code"] == "FORBIDDEN" and "MCP endpoint" in answer.body["message"]
        # the host itself is served (not checked), and so is a request with no Origin
        status = await send("GET", f"{server.url}/v1/field/status", headers={"Host": EVIL})
        assert status.status == 200
        answer = await send(
            "POST", f"{server.url}/mcp", json=initialize(), headers={**headers, "Host": EVIL}
        )
        assert answer.status == 200, answer.body
        # a WebSocket of the rebound page is refused too, for its Origin
        url = f"{server.url}/v1/ws?token={agent.token}"
        refused = await send("GET", url, headers=handshake(rebound(server)))
        assert refused.status == 403 and refused.body["code"] == "FORBIDDEN"


async def test_the_console_is_served_to_its_own_page(server_factory: Start) -> None:
    """The console's page fetches the Field from the Field's own origin: ``Host`` a loopback
    name, and ``Origin`` the same on a POST."""
    server = server_factory()
    page = await send("GET", f"{server.url}/console", headers={"Host": f"localhost:{server.port}"})
    assert page.status == 200
    async with FieldClient(server.url) as field:
        for number, origin in enumerate((server.url, f"http://localhost:{server.port}")):
            agent_id = f"console-user-{number}"
            envelope = field.envelope("REGISTER", agent_id, {"id": agent_id, "role": "x"})
            registered = await send(
                "POST",
                f"{server.url}/v1/register",
                json=envelope,
                headers={"Origin": origin, "Host": origin.removeprefix("http://")},
            )
            assert registered.status == 200, registered.body
