"""``GET /``: where someone who opens the Field's address is sent.

A browser (or anything that does not ask for JSON) is redirected to the console
(``307``, ``Location: /console``; a line of text says the same to ``curl``). A
client whose ``Accept`` names ``application/json`` and not ``text/html`` gets a
small JSON document of the Field's entry points instead: the console, the
OpenAPI document, the status, health and readiness probes, the WebSocket, and
``/metrics`` and ``/mcp`` when this server serves them.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import PROTOCOL_VERSION, __version__

#: The paths of the entry points, which their routes take from here.
CONSOLE_PATH = "/console"
OPENAPI_PATH = "/openapi.json"
METRICS_PATH = "/metrics"
MCP_PATH = "/mcp"

_REDIRECT_TEXT = (
    f"The Field's console is at {CONSOLE_PATH}. GET / with Accept: application/json lists "
    f"its entry points; {OPENAPI_PATH} describes its API.\n"
).encode()


def links(*, metrics: bool, mcp: bool) -> dict[str, str]:
    """The Field's entry points by name, as paths; ``/metrics`` and ``/mcp`` when served."""
    paths = {
        "console": CONSOLE_PATH,
        "openapi": OPENAPI_PATH,
        "status": "/v1/field/status",
        "health": "/healthz",
        "ready": "/readyz",
        "websocket": "/v1/ws",
    }
    if metrics:
        paths["metrics"] = METRICS_PATH
    if mcp:
        paths["mcp"] = MCP_PATH
    return paths


def wants_json(accept: str) -> bool:
    """Whether an ``Accept`` header asks for JSON rather than a page: it names
    ``application/json`` and not ``text/html`` (a browser's names both, or ``*/*``)."""
    media = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return "application/json" in media and "text/html" not in media


def index_routes(*, metrics: bool, mcp: bool) -> list[Route]:
    """The route of ``GET /`` (and ``HEAD /``)."""
    body = orjson.dumps(_document(links(metrics=metrics, mcp=mcp)))

    async def index(request: Request) -> Response:
        if wants_json(request.headers.get("accept", "")):
            return Response(body, media_type="application/json", headers={"Vary": "Accept"})
        return Response(
            _REDIRECT_TEXT,
            status_code=307,
            media_type="text/plain; charset=utf-8",
            headers={"Location": CONSOLE_PATH, "Vary": "Accept"},
        )

    return [Route("/", index, methods=["GET"])]


def _document(paths: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "Akashik Field",
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "links": paths,
    }
