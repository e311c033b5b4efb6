"""Server-Sent Events (``/v1/subscriptions/{id}/events``): one subscription as a stream.

The endpoint authenticates, makes a hub connection and attaches the
subscription with the client's cursor, then :class:`HubEventStream` copies
frames from the connection's outbox to the response until one side ends.
The framing is in ``protocol/README.md`` ("Push", Server-Sent Events).

An idle stream may live for hours and there may be tens of thousands, so
the response is written here rather than by sse-starlette's
``EventSourceResponse``, which runs a task group of four tasks per stream
(sender, ping, shutdown and disconnect listeners; about 29 KB of an idle
stream's 50). Here the request's own task is the stream's only task: it
waits on the outbox with the ping interval as its timeout, and the client
going away is noticed by stepping the server's ``receive()`` by hand
(:class:`Departure`), which costs no task. sse-starlette still encodes
what is not plain (:class:`ServerSentEvent`): pings, and bodies with line
breaks. A server that stops ends every stream through the hub
(:meth:`PushHub.shutdown` closes every outbox), which is what
sse-starlette's shutdown listener was for; the stream's last event is then
``shutdown``, with the cursor to resume from.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..contract.errors import Code, FieldError, internal_error
from ..core.context import Outcome
from ..core.field import Field
from ..engine.consumer import consume
from ..engine.push import Connection, PushHub
from ..engine.router import SHUTDOWN, Frame
from .access import access_of
from .eventstream import Departure, sse_event
from .web import SEND_TIMEOUT_SECONDS, error_response, token_of

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("field.sse")

#: Headers of every SSE response besides its content type (and of the answer to a HEAD).
SSE_HEADERS = {"Cache-Control": "no-store"}
#: Seconds between SSE keep-alive comments.
SSE_PING_SECONDS = 15
#: Most queued frames joined into one body chunk.
SSE_BATCH = 256
#: Seconds the last words to a consumer whose send timed out (its ``overflow`` event) may take.
FAREWELL_SECONDS = 1.0

#: The response head of a stream, as sse-starlette's sends it (proxies must not buffer it).
_HEAD = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    *((name.lower().encode(), value.encode()) for name, value in SSE_HEADERS.items()),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
_START = {"type": "http.response.start", "status": 200, "headers": _HEAD}
_END = {"type": "http.response.body", "body": b"", "more_body": False}


class SSEBinding:
    """``GET /v1/subscriptions/{subscription_id}/events`` of one Field."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def events(self, request: Request) -> ASGIApp:
        """The stream of the subscription the path names, or the error response that
        refuses it (``OVERLOADED`` while the Field is starting or stopping)."""
        running = self._runtime.current
        if running is None:
            return error_response(FieldError("the Field is starting", code=Code.OVERLOADED))
        return await sse_endpoint(request, running.hub)


async def sse_endpoint(request: Request, hub: PushHub) -> ASGIApp:
    """The stream of one subscription, or the error response that refuses it."""
    subscription_id = request.path_params["subscription_id"]
    token = token_of(request.headers, request.query_params)
    since = request.headers.get("last-event-id") or request.query_params.get("since")

    def check(field: Field) -> Outcome:
        agent = field.authenticate(token)
        field.streamable_subscription(subscription_id, agent.id, since)
        return Outcome({"agent_id": agent.id})

    try:
        outcome = await hub.service.execute(check)
    except FieldError as error:
        return error_response(error)
    access = access_of(request.scope)
    if access is not None:
        access.agent, access.transport = outcome.response["agent_id"], "sse"
        access.streams((subscription_id,))
    if request.method == "HEAD":  # what a GET would answer, and no stream (nothing to release)
        return _head
    try:
        connection = hub.connect(outcome.response["agent_id"], "sse")
    except FieldError as error:  # TOO_MANY_CONNECTIONS
        return error_response(error)
    try:
        hub.attach(connection, subscription_id, since)
    except Exception:
        hub.disconnect(connection)
        logger.exception("attaching %s failed", subscription_id)
        return error_response(internal_error())
    _release_request(request)
    return HubEventStream(hub, connection, subscription_id)


async def _head(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to a HEAD: a stream's head and no body."""
    await send(_START)
    await send(_END)


def _release_request(request: Request) -> None:
    """Let go of the request's headers, read above and never again: the scope lives as
    long as the stream, which may be hours."""
    request.scope["headers"] = []
    for cached in ("_headers", "_query_params", "_url"):
        request.__dict__.pop(cached, None)


class HubEventStream:
    """One connection's frames as an SSE response (an ASGI app), which lets go of the
    connection however the response ends: the client gone before the first byte or
    later, the subscription ended, an overflow, a send that timed out, the server
    stopping (the hub closes every outbox)."""

    __slots__ = ("hub", "connection", "subscription_id")

    def __init__(self, hub: PushHub, connection: Connection, subscription_id: str) -> None:
        self.hub, self.connection, self.subscription_id = hub, connection, subscription_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = self.connection
        departure = Departure(receive, lambda: _client_gone(connection))
        try:
            await _stream(self.hub, connection, send, self.subscription_id)
        finally:
            departure.close()
            self.hub.disconnect(connection)
            access = access_of(scope)
            if access is not None:  # its access line says how it ended
                access.ended(connection.ended or _ENDED)


#: ``Connection.ended`` of a stream whose client went away (compared by identity).
_GONE = (1000, "client closed")
#: How a stream that ended with its subscription (an ``end`` event) closed, as its access
#: line says.
_ENDED = (1000, "stream ended")


def _client_gone(connection: Connection) -> None:
    """The client went away: end the stream (its sender is woken by the closed outbox,
    and sends nothing more of what it holds)."""
    if connection.ended is None:
        connection.ended = _GONE
        connection.outbox.close_with(None)


async def _stream(hub: PushHub, connection: Connection, send: Send, subscription_id: str) -> None:
    """Send the response: the head, then the outbox's frames as events (each chunk once
    its notifications' tokens are there: :func:`~field.engine.consumer.consume`), a ping
    comment whenever the outbox has been empty for :data:`SSE_PING_SECONDS`, and the end
    of the body once the outbox closes (with a ``shutdown`` event if the server is
    stopping: :func:`_shutdown_event`). A send that blocks for
    :data:`SEND_TIMEOUT_SECONDS` ends the stream with an ``overflow`` event if the
    consumer takes it at once."""
    #: the cursor the client can resume from: what it has been sent
    resume_from: str | None = None
    #: the response's last message (the server stopping says so first)
    closing = _END

    async def write(frames: list[Frame]) -> bool:
        nonlocal resume_from
        if connection.ended is _GONE:
            return True
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await send(_body(b"".join(sse_event(frame) for frame in frames)))
        resume_from = _resume_point(frames) or resume_from
        return frames[-1].kind in _LAST

    async def ping() -> None:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await send(_body(_ping()))

    try:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await send(_START)
        drained = await consume(
            hub,
            connection,
            write,
            most=SSE_BATCH,
            last=_LAST,
            idle=SSE_PING_SECONDS,
            quiet=ping,
        )
        if drained and connection.ended == SHUTDOWN:
            closing = _closing(_shutdown_event(subscription_id, resume_from))
    except TimeoutError:
        await _farewell(hub, connection, send, subscription_id, resume_from)
        return
    try:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await send(closing)
    except TimeoutError:  # everything was sent but the end: nothing more to say
        logger.warning("an SSE consumer of agent %s stopped reading", connection.agent_id)


async def _farewell(
    hub: PushHub, connection: Connection, send: Send, subscription_id: str, resume_from: str | None
) -> None:
    """The consumer stopped reading: end its stream with an ``overflow`` event holding the
    cursor of the last notification it was sent, if it takes it within
    :data:`FAREWELL_SECONDS` (the server may have to close the connection otherwise)."""
    logger.warning("closing a stalled SSE consumer of agent %s", connection.agent_id)
    if connection.ended is None:
        connection.ended = (4008, "send timed out")
        connection.outbox.close_with(None)
        if hub.counts is not None:
            hub.counts.overflows[(connection.kind, "send timed out")] += 1
    cursors = {subscription_id: resume_from} if resume_from is not None else {}
    data = {"reason": "send timed out: the consumer stopped reading", "cursors": cursors}
    last = sse_event(Frame(orjson.dumps(data), "overflow"))
    try:
        async with asyncio.timeout(FAREWELL_SECONDS):
            await send({"type": "http.response.body", "body": last, "more_body": False})
    except TimeoutError:
        pass


def _shutdown_event(subscription_id: str, resume_from: str | None) -> bytes:
    """The last event of a stream whose server is stopping: reconnect, and resume from
    ``cursor`` (where the stream stands: as good as the last event id received)."""
    data = {"subscription_id": subscription_id, "reason": SHUTDOWN[1], "cursor": resume_from}
    return sse_event(Frame(orjson.dumps(data), "shutdown"))


def _closing(chunk: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": False}


def _body(chunk: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": True}


def _ping() -> bytes:
    """A keep-alive comment, as sse-starlette writes it."""
    comment = f"ping - {datetime.now(UTC)}"
    return ServerSentEvent(comment=comment).encode()


#: The events after which the Field ends a stream.
_LAST = frozenset({"end", "overflow"})


def _resume_point(frames: list[Frame]) -> str | None:
    """Where a client that has read ``frames`` resumes: the last notification's cursor,
    or the ``from`` of the stream's ``resume`` event (nothing is owed before it); None:
    they do not move it."""
    for frame in reversed(frames):
        if frame.cursor is not None:
            return frame.cursor
        if frame.kind == "resume" and frame.control is not None:
            start = frame.control.get("from")
            return start if isinstance(start, str) else None
    return None
