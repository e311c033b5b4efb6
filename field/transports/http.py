"""HTTP binding (spec 10.3): a thin Starlette adapter over the service.

Each ``POST /v1/<operation>`` reads a bounded body, decodes one JSON
envelope, hands it to the single writer and encodes what comes back:
the response payload with 200, or the error response of spec 8.1 with
the status :data:`field.contract.errors.HTTP_STATUS` gives its code. No request
ever gets a stack trace: unexpected failures become ``INTERNAL_ERROR``.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from ..contract.errors import (
    Code,
    FieldError,
    InvalidPayload,
    Overloaded,
    PayloadTooLarge,
    ValidationError,
    internal_error,
)
from ..contract.model import (
    CONFLICT_STATUSES,
    CONFLICT_TYPES,
    OPERATIONS,
    UNRESOLVED_CONFLICT_STATUSES,
    Limits,
)
from ..core.context import Outcome
from ..core.field import Field
from ..core.pages import DEFAULT_GET_LIMIT, PageRequest, page_request
from ..core.state import AgentRecord
from ..core.validation import AGENT_ID
from ..engine.admission import Work
from ..engine.delivery import DeliveryEngine
from ..engine.push import PushHub
from ..engine.ratelimits import AgentRateLimits, agent_of
from ..engine.service import FieldService
from ..engine.snapshotter import Snapshotter
from .access import access_of
from .cors import cors_middleware, mcp_refusal, websocket_refusal
from .documents import decode_document
from .door import FrontDoor
from .index import MCP_PATH
from .metrics import Metrics
from .sse import sse_endpoint, subscription_of
from .streaming import absolute_urls, deny_websocket, ws_endpoint

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from starlette.routing import BaseRoute

    from ..core.egress import EgressPolicy
    from .hosts import AllowedHosts
    from .mcp.streamable_http import McpHttpBinding
    from .registration import RegisterLimit
    from .sources import SourcesBinding

logger = logging.getLogger("field.http")

#: Endpoint name → protocol operation: ``/v1/record`` is RECORD (spec 10.3).
OPERATION_ROUTES = {operation.lower(): operation for operation in OPERATIONS}


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(error: FieldError, operation: str | None = None) -> Response:
    response = json_response(error.to_response(operation), error.http_status)
    if error.http_status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if error.retry_after is not None:
        # whole seconds, rounded up: a client that waits that long is not refused again
        response.headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return response


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def read_json(request: Request, limits: Limits) -> Any:
    """The request body as JSON within ``limits`` (size first, unread past it)."""
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ValidationError(
            f"requests must be sent as application/json, not {_media_shown(media)}",
            code=Code.UNSUPPORTED_MEDIA_TYPE,
            suggested_action="Send the header 'Content-Type: application/json'.",
        )
    return decode_document(await read_body(request, limits.max_body_bytes), limits)


async def read_body(request: Request, limit: int, what: str = "request body") -> bytes:
    """The raw body, at most ``limit`` bytes: a larger one is refused (413) by its
    ``Content-Length`` before it is read, or as soon as it is past the limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"{what} of {declared} bytes exceeds the {limit} byte limit")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"{what} exceeds the {limit} byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _media_shown(media: str) -> str:
    """A client's media type for a message: bounded, whatever was sent."""
    return _bounded(media, 80) if media else "no content type"


def _bounded(text: str, limit: int = 200) -> str:
    """A client's text (a path, a method) for a message or a log line: at most ``limit``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class HTTPBinding:
    """The Starlette endpoints of one Field service."""

    def __init__(
        self,
        *,
        limits: Limits,
        egress: EgressPolicy,
        rate_limits: AgentRateLimits,
        register_limit: RegisterLimit | None = None,
    ) -> None:
        #: the bounds of every request and document
        self.limits = limits
        self.service: FieldService | None = None
        self.hub: PushHub | None = None
        self.deliveries: DeliveryEngine | None = None
        #: where webhooks may go (checked again, with DNS, before a SUBSCRIBE runs)
        self.egress = egress
        self.started = time.monotonic()
        #: inbound event sources (their counts appear in the status)
        self.sources: SourcesBinding | None = None
        #: the way in of every operation, whatever its transport: it holds the per-agent
        #: limit on operations and REGISTER's per-client rate
        self.door = FrontDoor(self, rate_limits=rate_limits, register_limit=register_limit)
        #: ``GET /metrics`` and what it counts (None: ``--no-metrics``)
        self.metrics: Metrics | None = None
        #: MCP over HTTP at /mcp (None: the mcp package is not installed)
        self.mcp: McpHttpBinding | None = None
        #: writes snapshots of the state beside the server (None: a log in memory)
        self.snapshotter: Snapshotter | None = None

    def running(self) -> FieldService:
        """The service, while the Field runs; else ``OVERLOADED`` (it is starting or
        stopping)."""
        if self.service is None:
            raise FieldError("the Field is starting", code=Code.OVERLOADED, recoverable=True)
        return self.service

    def operation_endpoint(self, operation: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await self.operation(request, operation)

        return endpoint

    async def operation(self, request: Request, operation: str) -> Response:
        access = access_of(request.scope)
        token: str | None = None
        with self.door.visit("http", operation, access=access) as visit:
            try:
                token = bearer_token(request)
                client = request.client
                # first: a refusal costs no body read
                self.door.admit(token, operation, None if client is None else client.host)
                visit.body = body = await read_json(request, self.limits)
                visit.result = outcome = await self.door.run(
                    lambda field: field.handle(body, token=token, operation=operation),
                    operation,
                    body,
                )
            except FieldError as error:
                if access is not None and self.service is not None:  # whose request failed
                    access.agent = agent_of(self.service.field, token)
                visit.result = error
                return error_response(error, operation)
            except ClientDisconnect:
                # the client left before its body arrived: nothing ran, no one to answer
                return Response(status_code=400)
        return json_response(absolute_urls(outcome.response, str(request.base_url).rstrip("/")))

    async def _read(
        self, request: Request, job: Callable[[Field, AgentRecord], dict[str, Any]]
    ) -> Response:
        token = bearer_token(request)
        access = access_of(request.scope)

        def authenticated(field: Field) -> Outcome:
            agent = field.authenticate(token)
            if access is not None:
                access.agent = agent.id
            return Outcome(job(field, agent))

        try:
            self.door.admit(token, None)
            outcome = await self.running().execute(authenticated, work=Work.READ)
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def field_status(self, request: Request) -> Response:
        """The status page, read straight from the Field: it never waits for the writer,
        so it answers while the writer is busy or the log is stalled."""
        try:
            return json_response(self.status())
        except FieldError as error:
            return error_response(error)

    def status(self) -> dict[str, Any]:
        """The status page's body (the console shows it too); OVERLOADED while starting."""
        service = self.running()
        field = service.field
        body = field.status()
        body["server_version"] = __version__
        refusing = service.refusing
        body["log"] = {
            "backend": service.log.backend,
            "last_position": field.state.last_position,
            "writable": refusing is None,
            "refusing": None
            if refusing is None
            else {"code": refusing.code, "message": refusing.message},
        }
        location = service.log.location()
        if location is not None:
            body["log"]["database"] = location
        body["writer"] = {
            "running": service.running,
            "queued": service.queued,
            "admission": service.admission.status(),
        }
        embeddings = service.embeddings
        body["embedding"] = {
            "after_commit": embeddings is not None,
            "queued": field.state.index.waiting if embeddings is not None else 0,
            "held_entries": service.held,
        }
        body["sources"] = {} if self.sources is None else self.sources.status(field)
        body["uptime_seconds"] = round(time.monotonic() - self.started, 3)
        body["node"] = {
            "id": service.node_id,
            "position": field.state.last_position,
            "log_head": max(service.log_head, field.state.last_position),
            "lag": service.lag,
        }
        body["node"]["delivery_owner"] = self.deliveries is not None and self.deliveries.owner
        body["snapshot"] = None if self.snapshotter is None else self.snapshotter.status()
        return body

    async def subscription_events(self, request: Request) -> ASGIApp:
        if self.hub is None:
            return error_response(FieldError("the Field is starting", code=Code.OVERLOADED))
        return await sse_endpoint(request, self.hub, error_response)

    async def agents(self, request: Request) -> Response:
        params = request.query_params

        def listing(field: Field, _: AgentRecord) -> dict[str, Any]:
            ids = _query_values(params, "id", AGENT_ID, field.limits)
            return field.agents_page(_page_request(params, field.limits), ids=ids)

        return await self._read(request, listing)

    async def conflicts(self, request: Request) -> Response:
        params = request.query_params

        def listing(field: Field, viewer: AgentRecord) -> dict[str, Any]:
            limits = field.limits
            statuses = _query_values(params, "status", CONFLICT_STATUSES, limits)
            types = _query_values(params, "type", CONFLICT_TYPES, limits)
            agents = _query_values(params, "involving_agent", AGENT_ID, limits)
            return field.conflicts_page(
                viewer,
                _page_request(params, limits),
                statuses=statuses or sorted(UNRESOLVED_CONFLICT_STATUSES),
                types=types,
                involving_agents=agents,
            )

        return await self._read(request, listing)


def _query_values(
    params: Any, name: str, allowed: Collection[str] | re.Pattern[str], limits: Limits
) -> list[str]:
    """The values of a repeatable, comma-separated parameter: each one of ``allowed``, or
    (a pattern) one that it matches whole, as the document's schema for the values says."""
    values = [v for item in params.getlist(name) for v in item.split(",") if v]
    if len(values) > limits.max_page_items:
        raise InvalidPayload(f"at most {limits.max_page_items} {name} values")
    if isinstance(allowed, re.Pattern):
        invalid = [v for v in values if allowed.fullmatch(v) is None]
        if invalid:
            raise InvalidPayload(f"{name} value(s) not of the form allowed: {_quoted(invalid)}")
    unknown = [v for v in values if not isinstance(allowed, re.Pattern) and v not in allowed]
    if unknown:
        raise InvalidPayload(f"unknown {name} value(s): {_quoted(unknown)}")
    return values


def _page_request(params: Any, limits: Limits) -> PageRequest:
    """``?after=`` and ``?limit=`` of a GET list (default limit: 100)."""
    raw = params.get("limit")
    if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise InvalidPayload(f"limit must be an integer from 1 to {limits.max_page_items}")
    source = {"after": params.get("after"), "limit": None if raw is None else int(raw)}
    return page_request(source, limits, default=DEFAULT_GET_LIMIT)


def _quoted(values: list[str], most: int = 5) -> str:
    """A few client values for a message, each cut short: never a client's whole input."""
    shown = ", ".join(repr(v[:64]) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    if status == 405:
        response = error_response(
            FieldError(
                f"{_bounded(request.method, 16)} is not allowed on {_bounded(request.url.path)}",
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
            f"no endpoint at {_bounded(request.url.path)}",
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
            "unhandled error on %s %s", _bounded(request.method, 16), _bounded(request.url.path)
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
    if not (path.startswith("/v1/sources/") and path.endswith("/events")):
        return None
    name = path[len("/v1/sources/") : -len("/events")]
    return name if name and "/" not in name else None


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
        binding: HTTPBinding,
        *,
        origins: Collection[str],
        hosts: AllowedHosts,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._binding = binding
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
            if name is not None and self._binding.sources is not None:
                # an inbound event: as busy a path as the operations
                scope["app"], scope["path_params"] = self, {"name": name}
                request = Request(scope, receive)
                try:
                    response = await self._binding.sources.event(request)
                except Exception as exc:
                    response = await _crash(request, exc)
                await response(scope, receive, send)
                return
            if operation is not None:
                scope["app"] = self
                request = Request(scope, receive)
                try:
                    response = await self._binding.operation(request, operation)
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
                    stream = await self._binding.subscription_events(request)
                except Exception as exc:
                    stream = await _crash(request, exc)
                del request
                await stream(scope, receive, send)
                return
        if kind == "http" and scope["path"] == MCP_PATH and self._binding.mcp is not None:
            # MCP over HTTP: its GET streams live as long as SSE streams. A browser page may
            # call it only from an allowed origin (MCP's rule against DNS rebinding)
            refusal = mcp_refusal(scope, self._origins, self._hosts)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
            scope["app"] = self
            await self._binding.mcp(scope, receive, send)
            return
        if kind == "http" and scope["path"] == "/v1/ws":
            response = error_response(_not_a_handshake())
            response.headers["Sec-WebSocket-Version"] = "13"  # the version the Field speaks
            await response(scope, receive, send)
            return
        if kind == "websocket":
            scope["app"] = self
            hub = self._binding.hub
            refusal = websocket_refusal(scope, self._origins, self._hosts)
            if refusal is not None:  # a browser page of another origin
                await deny_websocket(scope, send, refusal)
            elif scope["path"] != "/v1/ws":
                await deny_websocket(scope, send, _no_endpoint())
            elif hub is None:  # starting or stopping: try again
                await deny_websocket(scope, send, Overloaded("the Field is not running"))
            else:
                await ws_endpoint(scope, receive, send, hub, self._binding.door)
            return
        await super().__call__(scope, receive, send)


class _CORSFieldApp(_FieldApp):
    """:class:`_FieldApp` behind CORS (``--cors-origin``): every HTTP answer, those of the
    paths it serves itself and every error included (``field.transports.cors``)."""

    def __init__(self, binding: HTTPBinding, *, origins: Collection[str], **kwargs: Any) -> None:
        super().__init__(binding, origins=origins, **kwargs)
        serve = functools.partial(_FieldApp.__call__, self)
        self._cors = cors_middleware(serve, origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._cors(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def application(
    binding: HTTPBinding,
    routes: list[BaseRoute],
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
    *,
    cors_origin: Collection[str],
    hosts: AllowedHosts,
) -> Starlette:
    """The ASGI application of ``binding`` serving ``routes``: every failure an error
    response, no redirect for a trailing slash, CORS only if an origin is allowed."""
    app = (_CORSFieldApp if cors_origin else _FieldApp)(
        binding,
        origins=cors_origin,
        hosts=hosts,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _not_found, Exception: _crash},
    )
    app.router.redirect_slashes = False  # /v1/record/ is not an endpoint: 404, no redirect
    app.state.metrics = binding.metrics  # uvicorn_config hands it the connection counts
    return app
