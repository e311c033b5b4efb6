"""The ASGI application of one Field: the routes the root assembles, behind the few paths
it serves straight.

Every failure is an error response (spec 8.1; never a stack trace), a trailing slash is no
redirect, and CORS wraps every HTTP answer only when an origin is allowed. The busiest and
longest-lived paths (the operations, inbound events, SSE streams, ``/mcp``, ``/v1/ws``) go
straight to the endpoints the root hands over as :class:`FastPaths`; this module imports
no binding.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..contract.errors import Code, FieldError, internal_error
from .cors import cors_middleware, mcp_refusal, websocket_refusal
from .index import MCP_PATH
from .web import OPERATION_ROUTES, bounded, deny_websocket, error_response

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from starlette.routing import BaseRoute

    from .hosts import AllowedHosts

logger = logging.getLogger("field.http")


@dataclass(frozen=True, slots=True, kw_only=True)
class FastPaths:
    """The endpoints the application calls straight, past its middleware and routes."""

    #: ``POST /v1/<operation>``: the request and the operation its path names
    operation: Callable[[Request, str], Awaitable[Response]]
    #: ``GET /v1/subscriptions/<id>/events``: the stream, or the response refusing it
    subscription_events: Callable[[Request], Awaitable[ASGIApp]]
    #: a handshake at ``/v1/ws`` from an allowed origin
    websocket: ASGIApp
    #: ``POST /v1/sources/<name>/events``: an inbound event (None: no inbound sources)
    source_event: Callable[[Request], Awaitable[Response]] | None = None
    #: ``/mcp`` (None: MCP over HTTP is not served)
    mcp: ASGIApp | None = None


def _segment(path: str, prefix: str, suffix: str) -> str | None:
    """The one path segment between ``prefix`` and ``suffix`` (not empty, no ``/``), or
    None when ``path`` is not of that shape (a route's single ``{parameter}``)."""
    if not (path.startswith(prefix) and path.endswith(suffix)):
        return None
    segment = path[len(prefix) : -len(suffix)]
    return segment if segment and "/" not in segment else None


def subscription_of(path: str) -> str | None:
    """The subscription named by ``/v1/subscriptions/<id>/events``, or None for any other
    path (the route's ``{subscription_id}``: one segment, not empty)."""
    return _segment(path, "/v1/subscriptions/", "/events")


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    if status == 405:
        response = error_response(
            FieldError(
                f"{bounded(request.method, 16)} is not allowed on {bounded(request.url.path)}",
                code=Code.METHOD_NOT_ALLOWED,
                recoverable=False,
                suggested_action="Operations are POST; field/status, agents, conflicts are GET.",
            )
        )
        if isinstance(exc, HTTPException) and exc.headers:
            response.headers.update(exc.headers)
        return response
    return error_response(
        FieldError(
            f"no endpoint at {bounded(request.url.path)}",
            code=Code.NOT_FOUND,
            recoverable=False,
            suggested_action="See protocol/README.md for the endpoints.",
        )
    )


def _no_endpoint() -> FieldError:
    return FieldError(
        "no WebSocket endpoint at this path; the one WebSocket endpoint is /v1/ws",
        code=Code.NOT_FOUND,
        recoverable=False,
        suggested_action="See protocol/README.md for the endpoints.",
    )


async def _crash(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ClientDisconnect):  # nobody is left to answer, and no fault of ours
        logger.debug("a client went away before its request was read")
    else:
        logger.exception(
            "unhandled error on %s %s", bounded(request.method, 16), bounded(request.url.path)
        )
    return error_response(internal_error())


def _not_a_handshake() -> FieldError:
    return FieldError(
        "/v1/ws is a WebSocket endpoint and the request is not a WebSocket handshake",
        code=Code.INVALID_HANDSHAKE,
        recoverable=True,
        suggested_action="Open /v1/ws with a WebSocket client (GET, HTTP/1.1, no body).",
    )


def _event_source(path: str) -> str | None:
    """The source named by ``/v1/sources/<name>/events``, or None for any other path."""
    return _segment(path, "/v1/sources/", "/events")


class _FieldApp(Starlette):
    """Starlette, except that the two busiest paths go straight to their endpoints.

    ``POST /v1/<operation>`` is every write, and ``POST /v1/sources/<name>/events``
    every inbound event: routing them past the middleware stack and the router's
    list of routes saves their time on each one.
    ``/v1/ws``: a WebSocket lives for hours and there may be tens of
    thousands; each layer it passed through would stay on its stack for
    its whole life. Both endpoints turn every failure into a response.
    The same holds for an SSE stream (``GET /v1/subscriptions/<id>/events``).

    Every request and handshake, whatever its path, is first checked for its
    ``Host`` (``field.transports.hosts``: against DNS rebinding), here rather
    than in a layer around the app for the same reason.
    """

    def __init__(
        self,
        paths: FastPaths,
        *,
        origins: Collection[str],
        hosts: AllowedHosts,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._paths = paths
        self._operations = {f"/v1/{name}": op for name, op in OPERATION_ROUTES.items()}
        #: the browser origins a WebSocket or /mcp may come from besides the Field's own
        self._origins = frozenset(origins)
        #: the host names the Field answers to
        self._hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        refusal = self._hosts.refusal(scope)
        if refusal is not None:  # a host name the Field does not answer to
            if kind == "websocket":
                await deny_websocket(scope, send, refusal)
            else:
                await error_response(refusal)(scope, receive, send)
            return
        if kind == "http" and scope["method"] == "POST":
            operation = self._operations.get(scope["path"])
            name = _event_source(scope["path"])
            if name is not None and self._paths.source_event is not None:
                # an inbound event: as busy a path as the operations
                scope["app"], scope["path_params"] = self, {"name": name}
                request = Request(scope, receive)
                try:
                    response = await self._paths.source_event(request)
                except Exception as exc:
                    response = await _crash(request, exc)
                await response(scope, receive, send)
                return
            if operation is not None:
                scope["app"] = self
                request = Request(scope, receive)
                try:
                    response = await self._paths.operation(request, operation)
                except Exception as exc:
                    response = await _crash(request, exc)
                await response(scope, receive, send)
                return
        if kind == "http" and scope["method"] in ("GET", "HEAD"):
            subscription_id = subscription_of(scope["path"])
            if subscription_id is not None:  # an SSE stream: it may live for hours, as /v1/ws
                scope["app"], scope["path_params"] = self, {"subscription_id": subscription_id}
                request = Request(scope, receive)
                try:
                    stream = await self._paths.subscription_events(request)
                except Exception as exc:
                    stream = await _crash(request, exc)
                del request
                await stream(scope, receive, send)
                return
        mcp = self._paths.mcp
        if kind == "http" and scope["path"] == MCP_PATH and mcp is not None:
            # MCP over HTTP: its GET streams live as long as SSE streams. A browser page may
            # call it only from an allowed origin (MCP's rule against DNS rebinding)
            refusal = mcp_refusal(scope, self._origins, self._hosts)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
            scope["app"] = self
            await mcp(scope, receive, send)
            return
        if kind == "http" and scope["path"] == "/v1/ws":
            response = error_response(_not_a_handshake())
            response.headers["Sec-WebSocket-Version"] = "13"  # the version the Field speaks
            await response(scope, receive, send)
            return
        if kind == "websocket":
            scope["app"] = self
            refusal = websocket_refusal(scope, self._origins, self._hosts)
            if refusal is not None:  # a browser page of another origin
                await deny_websocket(scope, send, refusal)
            elif scope["path"] != "/v1/ws":
                await deny_websocket(scope, send, _no_endpoint())
            else:  # the endpoint refuses it while the Field is starting or stopping
                await self._paths.websocket(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class _CORSFieldApp(_FieldApp):
    """:class:`_FieldApp` behind CORS (``--cors-origin``): every HTTP answer, those of the
    paths it serves itself and every error included (``field.transports.cors``)."""

    def __init__(self, paths: FastPaths, *, origins: Collection[str], **kwargs: Any) -> None:
        super().__init__(paths, origins=origins, **kwargs)
        serve = functools.partial(_FieldApp.__call__, self)
        self._cors = cors_middleware(serve, origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._cors(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def application(
    paths: FastPaths,
    routes: list[BaseRoute],
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
    *,
    cors_origin: Collection[str],
    hosts: AllowedHosts,
) -> Starlette:
    """The ASGI application serving ``paths`` straight and ``routes`` through its router:
    every failure an error response, no redirect for a trailing slash, CORS only if an
    origin is allowed."""
    app = (_CORSFieldApp if cors_origin else _FieldApp)(
        paths,
        origins=cors_origin,
        hosts=hosts,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _not_found, Exception: _crash},
    )
    app.router.redirect_slashes = False  # /v1/record/ is not an endpoint: 404, no redirect
    return app
