"""WebSocket (``/v1/ws``): envelopes in, responses and pushed frames out.

Thin, as Server-Sent Events (``sse.py``) are: authenticate, make a hub connection,
attach subscriptions with the client's cursors, then copy frames from the connection's
outbox to the socket until one side ends. The framing is in
``protocol/README.md`` ("Push").

WebSocket close codes: 4401 authentication failed, 4429 the agent holds as
many push connections as it may, 4008 the consumer was too slow, whichever
bound it reached (its outbox, a send waiting for the socket, an unanswered
ping; resume from the cursors of the ``overflow`` frame), 4409 the agent
deregistered, 1001 the server is stopping (reason ``server shutting down``, after
what is queued, however the stop reaches the connection: :data:`SHUTDOWN_EXTENSION`).
(A message over the size limit is
answered and closed with 1009 by ``field serve``'s protocol.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..contract.errors import FieldError, Overloaded, internal_error
from ..contract.model import OPERATIONS
from ..core.context import Outcome
from ..core.field import Field
from ..engine.consumer import consume
from ..engine.push import Connection, PushHub
from ..engine.router import Frame
from .access import access_of
from .documents import decode_document
from .web import SEND_TIMEOUT_SECONDS, absolute_urls, deny_websocket, token_of
from .wsprotocol import (
    BATCH_EXTENSION,
    SHUTDOWN_CLOSE,
    SHUTDOWN_EXTENSION,
    STALL_EXTENSION,
    WRITE_NOW_EXTENSION,
)

if TYPE_CHECKING:
    from .door import FrontDoor
    from .runtime import Runtime

logger = logging.getLogger("field.streaming")

#: Most frames the WebSocket sender writes per wake-up.
SEND_BATCH = 256


def since_cursors(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """``since`` parameters: one bare cursor for all, or ``<subscription_id>@<cursor>`` each."""
    default: str | None = None
    each: dict[str, str] = {}
    for value in values:
        subscription_id, sep, cursor = value.partition("@")
        if sep:
            each[subscription_id] = cursor
        else:
            default = value
    return default, each


# -- WebSocket --------------------------------------------------------------------


class WebSocketBinding:
    """``/v1/ws`` of one Field: an ASGI app for a handshake the app has let through (its
    path, its origin), which refuses it while the Field is starting or stopping."""

    def __init__(self, runtime: Runtime, door: FrontDoor) -> None:
        self._runtime = runtime
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        running = self._runtime.current
        if running is None:  # starting or stopping: try again
            await deny_websocket(scope, send, Overloaded("the Field is not running"))
            return
        await ws_endpoint(scope, receive, send, running.hub, self._door)


async def ws_endpoint(
    scope: Scope, receive: Receive, send: Send, hub: PushHub, door: FrontDoor
) -> None:
    websocket = WebSocket(scope, receive, send)
    token = token_of(websocket.headers, websocket.query_params)
    await websocket.accept()
    try:
        outcome = await hub.service.execute(
            lambda field: Outcome({"agent_id": field.authenticate(token).id})
        )
    except FieldError as error:
        await _refuse(websocket, error, 4401)
        return
    agent_id = outcome.response["agent_id"]
    try:
        connection = hub.connect(agent_id, "ws")
    except FieldError as error:  # TOO_MANY_CONNECTIONS
        await _refuse(websocket, error, 4429)
        return
    default, each = since_cursors(websocket.query_params.getlist("since"))
    base_http = str(websocket.base_url).replace("ws", "http", 1).rstrip("/")  # the Host header
    _release_handshake(websocket)
    extensions = scope.get("extensions") or {}
    batched = BATCH_EXTENSION in extensions
    write_now = (extensions.pop(WRITE_NOW_EXTENSION, None) or {}).get("write")
    sender = asyncio.create_task(
        _ws_sender(websocket, hub, connection, send if batched else None, write_now)
    )
    access = access_of(scope)
    try:
        subscriptions = streamed(hub.field, agent_id, each)
        for subscription_id in subscriptions:
            hub.attach(connection, subscription_id, each.get(subscription_id, default))
        if access is not None:
            access.connected(agent_id, subscriptions)
        # this frame lives as long as the connection
        del outcome, default, each, subscriptions
        client = scope.get("client")
        host = client[0] if client else None
        request_id = None if access is None else access.request_id
        await _ws_reader(receive, hub, door, connection, token, base_http, host, request_id)
    except Exception:
        logger.exception("a WebSocket connection of %s failed", agent_id)
        hub.end(connection, 1011, "internal error", None)
    finally:
        hub.disconnect(connection)
        if connection.ended is None:
            connection.ended = (1000, "client closed")
            connection.outbox.close_with(None)
        await sender


def streamed(field: Field, agent_id: str, each: dict[str, str]) -> list[str]:
    """The subscriptions a WebSocket of ``agent_id`` streams: every active one, and each
    cancelled one a ``since`` names by id (it gets what it still owed, then ``end``)."""
    active = field.state.active_subscriptions.get(agent_id, set())
    owing = []
    for subscription_id, cursor in each.items():
        if subscription_id in active:
            continue
        try:
            field.streamable_subscription(subscription_id, agent_id, cursor)
        except FieldError:
            continue  # not this agent's, or unknown: ignored
        owing.append(subscription_id)
    return sorted(active) + sorted(owing)


async def _refuse(websocket: WebSocket, error: FieldError, code: int) -> None:
    """An ``error`` frame with the error response, then close with ``code`` (reason: the
    error code)."""
    await websocket.send_text(_frame("error", error.to_response()).decode())
    await websocket.close(code=code, reason=error.code)


async def _ws_reader(
    receive: Receive,
    hub: PushHub,
    door: FrontDoor,
    connection: Connection,
    token: str | None,
    base_http: str,
    host: str | None,
    request_id: str | None = None,
) -> None:
    """Run each envelope the client sends; queue each response as a frame (``request_id``:
    the WebSocket's, named by each operation's line in the access log).

    A stalled consumer (``field serve``'s protocol says so, :data:`STALL_EXTENSION`)
    is ended as one whose outbox overflowed: what is queued, ``overflow``, 4008.
    """
    while connection.ended is None:
        message = await receive()
        if message["type"] == STALL_EXTENSION:
            hub.overflow(connection, message["reason"], message["detail"])
            return
        if message["type"] == SHUTDOWN_EXTENSION:  # what is queued, then close 1001
            hub.end(connection, *SHUTDOWN_CLOSE, None)
            return
        if message["type"] != "websocket.receive":  # websocket.disconnect
            return
        # a binary frame is accepted if it is UTF-8 JSON
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        msg_id, status, body = await _run_envelope(
            door, hub.field, data, token, base_http, host, request_id
        )
        frame = orjson.dumps({"type": "response", "id": msg_id, "status": status, "body": body})
        if not connection.outbox.put(Frame(frame, "response")):
            hub.overflow(connection)
            return


async def _run_envelope(
    door: FrontDoor,
    field: Field,
    message: str | bytes,
    token: str | None,
    base_http: str,
    host: str | None = None,
    request_id: str | None = None,
) -> tuple[Any, int, dict[str, Any]]:
    msg_id = None
    with door.visit("websocket", request_id=request_id) as visit:
        try:
            visit.body = body = decode_document(message, field.limits, what="the message")
            if isinstance(body, dict):
                msg_id = _echoed_id(body.get("id"))
                visit.operation = _known_operation(body.get("operation"))
            door.admit(token, visit.operation, host)  # before the writer's queue
            visit.result = outcome = await door.run(
                lambda field: field.handle(body, token=token, operation=None),
                visit.operation,
                body,
            )
        except FieldError as error:
            visit.result = error
            return msg_id, error.http_status, error.to_response()
        except Exception:
            logger.exception("a WebSocket request failed")
            visit.result = failure = internal_error()
            return msg_id, failure.http_status, failure.to_response()
    return msg_id, 200, absolute_urls(outcome.response, base_http)


def _echoed_id(value: Any) -> str | None:
    """The envelope id a ``response`` frame echoes: only an id the envelope may carry."""
    return value if isinstance(value, str) and 1 <= len(value) <= 256 else None


def _known_operation(value: Any) -> str | None:
    """The envelope's operation if it names one (it is logged): never a raw client value."""
    return value if isinstance(value, str) and value in OPERATIONS else None


async def _ws_sender(
    websocket: WebSocket,
    hub: PushHub,
    connection: Connection,
    send: Send | None,
    write_texts_now: Callable[[list[bytes]], bool] | None = None,
) -> None:
    """Copy frames to the socket; close with the hub's code when it ends the connection.

    ``send`` is the server's ASGI send when it offers the batch extension
    (``field serve``'s protocol): what is queued goes out in one socket write,
    each batch once its notifications' tokens are there (:meth:`PushHub.pace`),
    and the protocol bounds the wait for a full socket (a stall, which ends the
    connection through :func:`_ws_reader`). Otherwise each send may wait
    :data:`SEND_TIMEOUT_SECONDS`, then the connection is given up. With
    ``write_texts_now`` too (:data:`WRITE_NOW_EXTENSION`), a batch that can go out
    at once is written where it arrives, without waking this task.
    """

    async def write(batch: list[Frame]) -> bool:
        # what is queued goes out in one go; the timeout bounds a consumer that stalls
        if send is not None:
            await send({"type": BATCH_EXTENSION, "texts": [_ws_frame(f) for f in batch]})
        else:
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                for queued in batch:
                    await websocket.send_text(_ws_frame(queued).decode())
        return False

    direct = write_texts_now if send is not None else None
    try:
        await consume(
            hub, connection, write, most=SEND_BATCH + 1, write_now=direct, encode=_ws_frame
        )
        code, reason = connection.ended or (1000, "")
        await websocket.close(code=code, reason=reason)
    except TimeoutError:
        # the consumer stopped reading: give up on it; its cursors let it resume
        connection.ended = connection.ended or (4008, "send timed out")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(websocket.close(code=4008, reason="send timed out"), 1)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # the client is gone; its cursors let it resume


def _release_handshake(websocket: WebSocket) -> None:
    """Let go of the handshake's headers, for a connection that may live for hours.

    The scope's headers and Starlette's parsed copies were read above and
    are not read again. (``field serve``'s protocol drops its own copies.)
    """
    websocket.scope["headers"] = []
    for cached in ("_headers", "_query_params"):
        websocket.__dict__.pop(cached, None)


def _ws_frame(frame: Frame) -> bytes:
    if frame.kind == "response":
        return frame.body
    kind = "notification" if frame.cursor is not None else frame.kind
    return b'{"type":"' + kind.encode() + b'","data":' + frame.body + b"}"


def _frame(kind: str, data: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "data": data})
