"""HTTP binding (spec 10.3): a thin Starlette adapter over the service.

Each ``POST /v1/<operation>`` reads a bounded body, decodes one JSON
envelope, hands it to the single writer and encodes what comes back:
the response payload with 200, or the error response of spec 8.1 with
the status :data:`field.errors.HTTP_STATUS` gives its code. No request
ever gets a stack trace: unexpected failures become ``INTERNAL_ERROR``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .. import __version__
from ..config import Config
from ..core.context import Outcome
from ..core.embedding import Embedder, load_embedder
from ..core.field import Field
from ..core.state import AgentRecord
from ..errors import (
    Code,
    FieldError,
    InvalidJSON,
    InvalidPayload,
    PayloadTooLarge,
    ValidationError,
    internal_error,
)
from ..liveness import Liveness
from ..model import CONFLICT_STATUSES, CONFLICT_TYPES, OPERATIONS, UNRESOLVED_CONFLICT_STATUSES
from ..service import FieldService
from ..store import EventLog, open_log
from .push import PushHub
from .streaming import absolute_urls, sse_endpoint, ws_endpoint

logger = logging.getLogger("field.http")

#: Endpoint name → protocol operation: ``/v1/record`` is RECORD (spec 10.3).
OPERATION_ROUTES = {operation.lower(): operation for operation in OPERATIONS}


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(error: FieldError, operation: str | None = None) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.http_status == 401 else None
    response = json_response(error.to_response(operation), error.http_status)
    if headers:
        response.headers.update(headers)
    return response


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, refusing bodies over ``limit`` bytes unread."""
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ValidationError(
            f"requests must be sent as application/json, not {media or 'no content type'}",
            code=Code.UNSUPPORTED_MEDIA_TYPE,
            suggested_action="Send the header 'Content-Type: application/json'.",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit} byte limit")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit} byte limit")
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None


class HTTPBinding:
    """The Starlette endpoints of one Field service."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.service: FieldService | None = None
        self.hub: PushHub | None = None
        self.started = time.monotonic()

    def _service(self) -> FieldService:
        if self.service is None:
            raise FieldError("the Field is starting", code=Code.OVERLOADED, recoverable=True)
        return self.service

    def operation_endpoint(self, operation: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await self.operation(request, operation)

        return endpoint

    async def operation(self, request: Request, operation: str) -> Response:
        try:
            body = await read_json(request, self.config.limits.max_body_bytes)
            token = bearer_token(request)
            outcome = await self._service().execute(
                lambda field: field.handle(body, token=token, operation=operation),
                operation=operation,
            )
        except FieldError as error:
            return error_response(error, operation)
        return json_response(absolute_urls(outcome.response, str(request.base_url).rstrip("/")))

    async def _read(
        self, request: Request, job: Callable[[Field, AgentRecord], dict[str, Any]]
    ) -> Response:
        token = bearer_token(request)

        def authenticated(field: Field) -> Outcome:
            return Outcome(job(field, field.authenticate(token)))

        try:
            outcome = await self._service().execute(authenticated)
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def field_status(self, request: Request) -> Response:
        service = self._service()

        def status(field: Field) -> Outcome:
            body = field.status()
            body["server_version"] = __version__
            body["log"] = {
                "backend": service.log.backend,
                "last_position": field.state.last_position,
            }
            body["uptime_seconds"] = round(time.monotonic() - self.started, 3)
            return Outcome(body)

        try:
            outcome = await service.execute(status)
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def subscription_events(self, request: Request) -> Response:
        if self.hub is None:
            return error_response(FieldError("the Field is starting", code=Code.OVERLOADED))
        return await sse_endpoint(request, self.hub, error_response)

    async def agents(self, request: Request) -> Response:
        return await self._read(
            request,
            lambda field, _: {"status": "ok", "agents": field.list_agents(), "epoch": field.epoch},
        )

    async def conflicts(self, request: Request) -> Response:
        params = request.query_params

        def listing(field: Field, viewer: AgentRecord) -> dict[str, Any]:
            statuses = _query_values(params.getlist("status"), CONFLICT_STATUSES, "status")
            types = _query_values(params.getlist("type"), CONFLICT_TYPES, "type")
            agents = [a for v in params.getlist("involving_agent") for a in v.split(",") if a]
            conflicts = field.list_conflicts(
                viewer,
                statuses=statuses or sorted(UNRESOLVED_CONFLICT_STATUSES),
                types=types,
                involving_agents=agents,
            )
            return {"status": "ok", "conflicts": conflicts, "epoch": field.epoch}

        return await self._read(request, listing)


def _query_values(raw: list[str], allowed: Any, name: str) -> list[str]:
    values = [v for item in raw for v in item.split(",") if v]
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise InvalidPayload(f"unknown {name} value(s): {', '.join(unknown)}")
    return values


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    if status == 405:
        response = error_response(
            FieldError(
                f"{request.method} is not allowed on {request.url.path}",
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
            f"no endpoint at {request.url.path}",
            code=Code.NOT_FOUND,
            recoverable=False,
            suggested_action="See protocol/README.md for the endpoints.",
        )
    )


async def _crash(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(internal_error())


class _FieldApp(Starlette):
    """Starlette, except that the two busiest paths go straight to their endpoints.

    ``POST /v1/<operation>`` is every write: routing it past the middleware
    stack and the router's list of routes saves their time on each one.
    ``/v1/ws``: a WebSocket lives for hours and there may be tens of
    thousands; each layer it passed through would stay on its stack for
    its whole life. Both endpoints turn every failure into a response.
    """

    def __init__(self, binding: HTTPBinding, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._binding = binding
        self._operations = {f"/v1/{name}": op for name, op in OPERATION_ROUTES.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and scope["method"] == "POST":
            operation = self._operations.get(scope["path"])
            if operation is not None:
                scope["app"] = self
                request = Request(scope, receive)
                try:
                    response = await self._binding.operation(request, operation)
                except Exception as exc:
                    response = await _crash(request, exc)
                await response(scope, receive, send)
                return
        elif kind == "websocket" and scope["path"] == "/v1/ws":
            scope["app"] = self
            hub = self._binding.hub
            if hub is None:  # starting or stopping: try again
                await send({"type": "websocket.close", "code": 1013, "reason": ""})
                return
            await ws_endpoint(scope, receive, send, hub)
            return
        await super().__call__(scope, receive, send)


def create_app(
    config: Config, *, log: EventLog | None = None, embedder: Embedder | None = None
) -> Starlette:
    """The ASGI application serving one Field.

    Its log is ``log`` if given (the caller opened it, to report a busy data
    directory before the server starts), else the one ``config`` names,
    opened at start-up. The app closes the log when it stops. Likewise its
    embedder is ``embedder`` if given, else the one ``config`` names.
    """
    binding = HTTPBinding(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal log
        if log is None:
            log = open_log(config.data_dir, synchronous=config.sync)
        chosen = embedder or load_embedder(config.embedder)
        service = FieldService(
            log,
            lambda: Field(
                limits=config.limits,
                persistent=log.persistent,
                operator_token=config.operator_token,
                embedder=chosen,
            ),
            max_queue=config.max_queue,
            max_batch=config.max_batch,
        )
        await service.start()
        binding.service = service
        binding.hub = PushHub(service, config.push)
        liveness = Liveness(
            service,
            failure_grace=config.failure_grace,
            heartbeat_timeout=config.heartbeat_timeout,
        )
        service.on_seen = liveness.seen
        binding.hub.liveness = liveness
        liveness.start()
        app.state.service = service
        app.state.push_hub = binding.hub
        state = service.field.state
        host = f"[{config.host}]" if ":" in config.host else config.host
        logger.info(
            "Field %s listening on http://%s:%d: %s log (%s) at position %d, epoch %d",
            state.field_id,
            host,
            config.port,
            log.backend,
            config.data_dir if config.data_dir is not None else "in memory",
            state.last_position,
            state.clock.value,
        )
        try:
            yield
        finally:
            await liveness.stop()
            binding.hub.shutdown()
            binding.service = None
            await service.stop()
            logger.info("Field %s stopped; log closed", state.field_id)

    routes = [
        Route("/v1/field/status", binding.field_status, methods=["GET"]),
        Route("/v1/agents", binding.agents, methods=["GET"]),
        Route("/v1/conflicts", binding.conflicts, methods=["GET"]),
        Route(
            "/v1/subscriptions/{subscription_id}/events",
            binding.subscription_events,
            methods=["GET"],
        ),
        *(
            Route(f"/v1/{name}", binding.operation_endpoint(operation), methods=["POST"])
            for name, operation in OPERATION_ROUTES.items()
        ),
    ]
    app = _FieldApp(
        binding,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _not_found, Exception: _crash},
    )
    app.router.redirect_slashes = False  # /v1/record/ is not an endpoint: 404, no redirect
    return app
