"""``GET /`` of a real server: a browser is sent to the console, a client that asks for
JSON gets the Field's entry points, and each of them answers."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from field import PROTOCOL_VERSION, __version__
from field.transports.index import wants_json

from .conftest import ThreadedServer
from .schema_util import assert_valid

StartServer = Callable[..., ThreadedServer]
#: What Chromium sends for a page.
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"


@pytest.mark.parametrize("accept", [None, "*/*", BROWSER, "text/plain", "application/xml"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_the_root_sends_whoever_does_not_ask_for_json_to_the_console(
    field_server: ThreadedServer, method: str, accept: str | None
) -> None:
    headers = {} if accept is None else {"Accept": accept}
    async with (
        aiohttp.ClientSession(skip_auto_headers=() if accept else ("Accept",)) as session,
        session.request(
            method, field_server.url + "/", headers=headers, allow_redirects=False
        ) as response,
    ):
        assert response.status == 307
        assert response.headers["Location"] == "/console"
        assert response.headers["Vary"] == "Accept"
        body = await response.text()
    assert ("/console" in body) is (method == "GET")  # HEAD: no body


async def test_following_the_redirect_opens_the_console(field_server: ThreadedServer) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(field_server.url + "/", headers={"Accept": BROWSER}) as response,
    ):
        assert response.status == 200
        assert response.url.path == "/console"
        assert response.content_type == "text/html"
        assert "<html" in (await response.text()).lower()


async def _links(url: str) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/", headers={"Accept": "application/json"}) as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"
        document: dict[str, object] = await response.json()
        return document


async def test_a_json_client_gets_the_entry_points_and_each_answers(
    field_server: ThreadedServer,
) -> None:
    document = await _links(field_server.url)
    assert document["name"] == "Akashik Field"
    assert document["version"] == __version__
    assert document["protocol_version"] == PROTOCOL_VERSION
    links = document["links"]
    assert isinstance(links, dict)
    assert links == {
        "console": "/console",
        "openapi": "/openapi.json",
        "status": "/v1/field/status",
        "health": "/healthz",
        "ready": "/readyz",
        "websocket": "/v1/ws",
        "metrics": "/metrics",
        "mcp": "/mcp",
    }
    async with aiohttp.ClientSession() as session:
        for name, path in links.items():
            async with session.get(field_server.url + path, allow_redirects=False) as answer:
                # the WebSocket and MCP answer a plain GET with an error of their own
                assert answer.status != 404, (name, path)
                if name not in ("websocket", "mcp"):
                    assert answer.status == 200, (name, path, await answer.text())
        async with session.get(field_server.url + links["status"]) as answer:
            assert_valid("field-status.response", await answer.json())


async def test_without_metrics_the_links_leave_them_out(server_factory: StartServer) -> None:
    server = server_factory(metrics=False)
    links = (await _links(server.url))["links"]
    assert isinstance(links, dict)
    assert "metrics" not in links and links["console"] == "/console"


@pytest.mark.parametrize(
    ("accept", "json"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/json, */*;q=0.1", True),
        ("text/html, application/json", False),
        ("*/*", False),
        ("", False),
        ("application/jsonx", False),
    ],
)
def test_what_asks_for_json(accept: str, json: bool) -> None:
    assert wants_json(accept) is json
