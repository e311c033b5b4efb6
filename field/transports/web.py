"""What every binding's edge shares: JSON answers and errors, bearer tokens, bounded bodies,
the URLs a SUBSCRIBE answers with, and a WebSocket handshake refused.

A binding reads and answers HTTP through these alone, so that each answers the same way
(spec 8.1: the error response with the status of its code, ``WWW-Authenticate`` on 401,
``Retry-After`` when the client is told to wait) and none imports another to do so.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope, Send

from ..contract.errors import Code, FieldError, PayloadTooLarge, ValidationError
from ..contract.model import OPERATIONS, Limits
from .documents import decode_document

#: Endpoint name → protocol operation: ``/v1/record`` is RECORD (spec 10.3).
OPERATION_ROUTES = {operation.lower(): operation for operation in OPERATIONS}
#: Seconds a send to a streaming client may block before the consumer is considered dead.
SEND_TIMEOUT_SECONDS = 30


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


def token_of(headers: Any, query: Any) -> str | None:
    """The bearer token from ``Authorization`` or, for browsers, the ``token`` query parameter."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return str(token.strip())
    value = query.get("token")
    return str(value) if value else None


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
    return bounded(media, 80) if media else "no content type"


def bounded(text: str, limit: int = 200) -> str:
    """A client's text (a path, a method) for a message or a log line: at most ``limit``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def absolute_urls(response: dict[str, Any], base_http: str) -> dict[str, Any]:
    """SUBSCRIBE's ``ws_url`` and ``sse_url`` made absolute for the client's host."""
    if "ws_url" in response:
        base_ws = "ws" + base_http[len("http") :]
        response["ws_url"] = base_ws + response["ws_url"]
        response["sse_url"] = base_http + response["sse_url"]
    return response


async def deny_websocket(scope: Scope, send: Send, error: FieldError) -> None:
    """Answer a WebSocket handshake with an HTTP error response instead of accepting it
    (the ASGI denial response; a server without it answers 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": error.code})
        return
    body = orjson.dumps(error.to_response())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    start = {"type": "websocket.http.response.start", "status": error.http_status}
    await send({**start, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
