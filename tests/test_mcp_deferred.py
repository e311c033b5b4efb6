"""``/mcp`` is made at its first request (:mod:`field.transports.mcp.deferred`).

A real ``field serve`` shows the MCP SDK unimported until a client asks for MCP. It runs
with Python's import log (``PYTHONPROFILEIMPORTTIME``), whose lines go to the server's
stderr as each module is imported. The wrapper's own promises are tested on it directly,
with a stand-in binding: one load however many requests wait for it, a failed load
answered and tried again, and no load once the server stops.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from field.client import FieldClient
from field.transports.mcp.deferred import DeferredMcp

from .conftest import spawn_server
from .test_mcp_http import ACCEPT, initialize_message, post

#: an import log line for the SDK's own package (``import time: self | cumulative | mcp``)
_SDK_IMPORT = re.compile(r"^import time:.*\|\s+mcp$")
#: an import log line for its types, whichever revision
_SDK_TYPES = re.compile(r"^import time:.*\|\s+mcp_types")


@pytest.mark.slow
async def test_field_serve_imports_the_mcp_sdk_at_the_first_mcp_request(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    server = spawn_server(tmp_path)
    try:
        started = len(server.lines)  # up to "listening on", read before spawn_server returned
        assert any(line.startswith("import time:") for line in server.lines[:started])
        assert not any(_SDK_IMPORT.match(line) for line in server.lines[:started])
        async with FieldClient(server.url) as field:
            agent = await field.register("deferred", "tester")
        headers = {
            "Content-Type": "application/json",
            "Accept": ACCEPT,
            "Authorization": f"Bearer {agent.token}",
        }
        # the first requests, at once: they wait for one load and are served alike
        answers = await asyncio.gather(
            *(post(server.url, initialize_message(), headers) for _ in range(3))
        )
    finally:
        server.stop()
    for status, body, answered in answers:
        assert status == 200, body
        assert body["result"]["serverInfo"]["name"] == "akashik-field"
        assert answered["Mcp-Session-Id"]
    assert len({answered["Mcp-Session-Id"] for _, _, answered in answers}) == 3
    later = server.lines[started:]
    assert sum(bool(_SDK_IMPORT.match(line)) for line in later) == 1
    assert any(_SDK_TYPES.match(line) for line in later)


# -- the wrapper, on a stand-in binding ---------------------------------------------------


class StandIn:
    """A binding that records what is done to it and answers every request 200."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.stopped = 0
        self.shut = 0
        self.served = 0

    async def start(self, service: object) -> None:
        await asyncio.sleep(0)  # a turn of the loop, as the real one takes
        self.started.append(service)

    async def stop(self) -> None:
        self.stopped += 1

    def shutdown(self) -> None:
        self.shut += 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.served += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def request(app: DeferredMcp) -> tuple[int, dict[str, Any] | None]:
    """One POST /mcp through ``app``: its status and its JSON body, if any."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], (orjson.loads(body) if body else None)


class Builds:
    """``build`` for :class:`DeferredMcp`: counts its calls, fails the first ``failing``."""

    def __init__(self, failing: int = 0) -> None:
        self.made: list[StandIn] = []
        self.failing = failing

    def __call__(self) -> Any:
        if self.failing:
            self.failing -= 1
            raise RuntimeError("the SDK could not be imported")
        self.made.append(StandIn())
        return self.made[-1]


async def test_nothing_is_built_before_a_request_and_once_for_any_number() -> None:
    builds = Builds()
    app = DeferredMcp(builds)
    service = object()
    await app.start(service)  # type: ignore[arg-type]
    assert builds.made == [] and app.binding is None
    answers = await asyncio.gather(*(request(app) for _ in range(5)))
    assert answers == [(200, None)] * 5
    (binding,) = builds.made
    assert binding.started == [service] and binding.served == 5
    assert app.binding is binding
    await app.stop()
    assert binding.stopped == 1


async def test_a_failed_load_is_answered_500_and_tried_again() -> None:
    builds = Builds(failing=1)
    app = DeferredMcp(builds)
    await app.start(object())  # type: ignore[arg-type]
    status, body = await request(app)
    assert status == 500 and body is not None
    assert body["code"] == "INTERNAL_ERROR" and "Traceback" not in orjson.dumps(body).decode()
    assert await request(app) == (200, None)
    assert len(builds.made) == 1


async def test_a_stopping_server_loads_nothing_and_answers_503() -> None:
    builds = Builds()
    app = DeferredMcp(builds)
    await app.start(object())  # type: ignore[arg-type]
    app.shutdown()
    status, body = await request(app)
    assert status == 503 and body is not None and body["recoverable"] is True
    await app.stop()
    assert builds.made == []


async def test_a_load_the_stop_overtakes_is_stopped_and_its_requests_answered_503() -> None:
    builds = Builds()
    app = DeferredMcp(builds)
    await app.start(object())  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(request(app))
    await asyncio.sleep(0)  # the request has begun the load
    await app.stop()
    status, body = await waiting
    assert status == 503 and body is not None
    (binding,) = builds.made
    assert binding.stopped == 1 and binding.served == 0
    assert app.binding is None
