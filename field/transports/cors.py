"""Browsers on other origins (``--cors-origin``): CORS for HTTP, the ``Origin`` of WebSockets.

A page may call the Field from another origin only if the Field says so:

* **HTTP** (the operations, the GET lists, SSE streams...): Starlette's
  ``CORSMiddleware`` answers preflights and adds ``Access-Control-Allow-Origin``
  to every answer to an allowed origin. It wraps the whole application, the
  paths ``_FieldApp`` serves itself included, so errors carry the headers too
  and a page can read why it was refused (``Retry-After`` is exposed). Two
  changes to Starlette's: a refused preflight is the Field's error body
  (``403 FORBIDDEN``) instead of plain text; and each response head is copied
  before headers are added to it, since the SSE streams share one.
* **WebSocket**: browsers send ``Origin`` with a handshake but CORS does not
  apply to it, so the Field checks it: a handshake whose ``Origin`` is neither
  an allowed origin nor the Field's own is refused ``403 FORBIDDEN`` before
  the upgrade. The Field's own origin is the host and port the handshake was
  sent to (its ``Host``), when that host is one the Field answers to
  (:mod:`field.transports.hosts`: a loopback name, or ``--allowed-host``): a
  page of a rebound name sends ``Origin`` equal to ``Host`` too. A client that
  sends no ``Origin`` is not a browser and is not concerned.
* **MCP** (``/mcp``): an ``Origin`` must be an allowed one, or one whose host
  the Field answers to, whatever the ``Host`` (MCP's rule against DNS
  rebinding, as its SDK applies it).

With no ``--cors-origin``, nothing answers a preflight (``405``, as before)
and no response allows another origin, so browsers refuse every cross-origin
read; a WebSocket from another origin is refused.

The Connections refusals (``field.transports.connections``: the caps, the
deadlines, malformed requests) are sent before any request head is read, so
they carry no CORS headers: a browser sees them as a network error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Scope, Send

from ..contract.errors import Code, FieldError
from .hosts import AllowedHosts

#: Methods a page may use (a preflight for another is refused).
ALLOWED_METHODS = ("GET", "HEAD", "POST", "DELETE")
#: Request headers a page may send beyond the safelisted ones: the token, the JSON body's
#: media type (safelisted only for text/plain and forms), EventSource's cursor, and the
#: request's id (:mod:`.access`).
ALLOWED_HEADERS = ("Authorization", "Content-Type", "Last-Event-ID", "X-Request-Id")
#: Response headers a page may read beyond the safelisted ones.
EXPOSED_HEADERS = ("Retry-After", "WWW-Authenticate", "Allow", "X-Request-Id")
#: Seconds a browser may keep a preflight's answer.
PREFLIGHT_MAX_AGE = 600
#: An allowed origin that allows every origin.
ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(text: str) -> str:
    """``text`` as browsers write an origin (``https://app.example.com``, lower case, no
    default port, no path), or ``*``; ValueError for anything else."""
    if text == ANY_ORIGIN:
        return text
    shown = text[:100]
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"{shown!r} is not an origin such as https://app.example.com") from None
    if (
        parts.scheme.lower() not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"{shown!r} is not an origin: a scheme (http or https), a host and maybe a port, "
            "such as https://app.example.com or http://localhost:3000"
        )
    scheme = parts.scheme.lower()
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    shown_port = "" if port is None or port == _DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{host}{shown_port}"


def parse_origins(texts: Iterable[str]) -> tuple[str, ...]:
    """Each of ``texts`` as :func:`parse_origin` writes it, each once."""
    return tuple(dict.fromkeys(parse_origin(text) for text in texts))


class FieldCORSMiddleware(CORSMiddleware):
    """Starlette's CORS, with the Field's error body on a refused preflight and a copy
    of each response head before it gets headers (an SSE stream's head is shared)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ").split(", ")
        error = FieldError(
            f"a browser may not send this request from {request_headers['origin'][:100]!r}: "
            f"the {' and the '.join(refused)} {'is' if len(refused) == 1 else 'are'} "
            "not allowed",
            code=Code.FORBIDDEN,
            recoverable=False,
            suggested_action="Send it from an origin the operator allows (--cors-origin), "
            f"with methods {', '.join(ALLOWED_METHODS)} and headers "
            f"{', '.join(ALLOWED_HEADERS)}.",
        )
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-type", "content-length")
        }
        return Response(
            orjson.dumps(error.to_response()),
            status_code=error.http_status,
            headers=headers,
            media_type="application/json",
        )

    async def send(self, message: Message, send: Send, request_headers: Headers) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", ()))}
        await super().send(message, send, request_headers)


def cors_middleware(app: ASGIApp, origins: Iterable[str]) -> ASGIApp:
    """``app`` answering browsers of ``origins`` (``*``: any)."""
    return FieldCORSMiddleware(
        app,
        allow_origins=tuple(origins),
        allow_methods=ALLOWED_METHODS,
        allow_headers=ALLOWED_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        max_age=PREFLIGHT_MAX_AGE,
    )


def websocket_refusal(
    scope: Scope, origins: frozenset[str], hosts: AllowedHosts
) -> FieldError | None:
    """Why a WebSocket handshake may not be accepted for its ``Origin``; None if it may:
    it has none (not a browser), or an allowed one, or the Field's own (the ``Host`` it was
    sent to, a host the Field answers to)."""

    def own(origin: str) -> bool:
        return _same_origin(origin, _header(scope, b"host")) and hosts.allows_origin(origin)

    return _origin_refusal(scope, origins, own, "open a WebSocket")


def mcp_refusal(scope: Scope, origins: frozenset[str], hosts: AllowedHosts) -> FieldError | None:
    """Why a request to ``/mcp`` may not be served for its ``Origin``; None if it may: it
    has none (not a browser), an allowed one, or one of a host the Field answers to (a
    loopback name, ``--allowed-host``), whatever its ``Host``."""
    return _origin_refusal(scope, origins, hosts.allows_origin, "call the MCP endpoint")


def _origin_refusal(
    scope: Scope, origins: frozenset[str], allowed: Callable[[str], bool], what: str
) -> FieldError | None:
    """The refusal of a request whose ``Origin`` is neither in ``origins`` nor ``allowed``."""
    origin = _header(scope, b"origin")
    if origin is None or ANY_ORIGIN in origins:
        return None
    try:
        origin = parse_origin(origin)
    except ValueError:
        pass  # "null" (a sandboxed page, a file), or garbled: no origin to allow
    else:
        if origin in origins or allowed(origin):
            return None
    return FieldError(
        f"a browser page of origin {origin[:100]!r} may not {what} here",
        code=Code.FORBIDDEN,
        recoverable=False,
        suggested_action="Send it from a page of an origin the operator allows (--cors-origin).",
    )


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` (parsed) names the host and port the request was sent to."""
    if host is None:
        return False
    scheme, _, authority = origin.partition("://")
    host = host.strip().lower()
    default = f":{_DEFAULT_PORTS[scheme]}"
    return authority == host or authority + default == host


def _header(scope: Scope, name: bytes) -> Any:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
