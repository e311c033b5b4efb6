"""Request ids and the access log of ``field serve``.

:class:`AccessLog` is the ASGI layer ``field serve`` puts around the whole
application (:func:`field.cli.main.uvicorn_config`), so that the paths the
application serves itself (:mod:`.asgi`: the operations, SSE streams, ``/mcp``,
``/v1/ws``) pass through it too. It makes an :class:`Access` record for each
HTTP request and WebSocket handshake whose lines it logs and puts it in the
scope (:func:`access_of`), where the endpoints write what they learn: the
agent, the operation and how it ended, the subscriptions streamed.

**Request id.** Every request has one: its ``X-Request-Id`` if that is sane
(:func:`request_id_of`: 1 to :data:`MAX_REQUEST_ID` characters, each a token
character of RFC 9110 or one of ``/:=@``), else a new one (32 hex digits).
Every answer sends it back in ``X-Request-Id``: an operation's response or
error, a refusal (421, 429, 503...), an SSE stream's head, a WebSocket's
accepted or refused handshake. The refusals made before a request is read
whole (the connection caps, the deadlines, malformed HTTP:
:mod:`.connections`; a handshake websockets refuses: :mod:`.wsprotocol`)
carry a new one, which no log line names.

**Access lines** (``--access-log``; logger ``field.access``, at ``info``):

* one per HTTP request, once it is answered (a stream: once it ends): the
  client's address, method, path with its query string (secrets redacted,
  :mod:`field.cli.redaction`), status, duration in milliseconds, the agent it was
  authenticated as, the operation it ran and its outcome (``ok`` or the error
  code), the envelope's ``id`` (``message_id``) and the ``request_id``;
* a push connection has a line when it opens (``stream=open``): an SSE stream
  or an MCP session's GET stream when its head is sent, a WebSocket once its
  agent is authenticated and its subscriptions attached; its line at the end
  (``stream=closed``) says how it closed (``close_code``, ``close_reason``:
  the Field's close, or the client's) and how long it lived. A WebSocket
  refused before it opened has one line, as a request;
* an operation sent on a WebSocket, or run for a RAP invocation after its
  request was answered, has a line of its own (logger ``field.operation``,
  :class:`~.metrics.Observer`) that names the ``request_id`` of its WebSocket
  or invocation.

**Responses by status class** (``field_http_responses_total``): unless
``--no-metrics``, the layer counts each answer's status class as it sends its
head (an increment of the metrics' list, :func:`count_response`): HTTP
responses, streams' heads, WebSocket handshakes accepted (101) or refused.
The refusals :mod:`.connections` writes itself count into the same list.

With ``--log-format json`` each of these is a key of the line (``logs.FIELDS``).
What a client wrote that a line shows (the path and query, a WebSocket close
reason) is cut short and its control characters escaped: one line stays one
line. Off, the layer costs a look at the request's headers, an id and a
wrapped ``send`` (about 2 us a request; 0.3 KB an idle WebSocket keeps), and
logs nothing.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("field.access")

#: The request and response header that carries the request id.
REQUEST_ID_HEADER = "X-Request-Id"
_HEADER = REQUEST_ID_HEADER.lower().encode()
#: Longest request id taken from a request.
MAX_REQUEST_ID = 128
#: A request id the Field takes as it is: token characters (RFC 9110 5.6.2), and ``/:=@``
#: (base64, tracing ids); never a space, a quote, a control character or a non-ASCII byte.
_SANE_ID = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z/:=@]{1," + str(MAX_REQUEST_ID).encode() + rb"}")
#: The key of a request's :class:`Access` in its ASGI scope.
ACCESS = "field.access"
#: Longest path and query string shown in a line (past it, cut short with ``…``).
MAX_TARGET_CHARS = 1000
#: Most subscription ids shown in a push connection's lines.
MAX_SUBSCRIPTIONS_SHOWN = 16
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


#: What every request id this process makes starts with: 16 random hex digits.
_PROCESS = secrets.token_hex(8)
#: Counts the ids this process makes; each is scrambled by this odd number (a bijection
#: of 64-bit numbers), so that ids do not tell how many requests came before.
_MADE = itertools.count(1)
_SCRAMBLE = secrets.randbits(64) | 1
_MASK = (1 << 64) - 1


#: Responses sent, by status class: ``responses[status // 100]`` (1 to 5; 0: a status
#: outside 100 to 599). The :class:`~.metrics.Metrics`' tally; None with ``--no-metrics``.
Responses = list[int]


def no_responses() -> Responses:
    """A tally of responses with none counted yet."""
    return [0] * 6


def count_response(responses: Responses, status: int) -> None:
    """One response of ``status`` sent."""
    responses[status // 100 if 100 <= status < 600 else 0] += 1


def new_request_id() -> str:
    """A request id of the Field's making: 32 hex digits, never made twice in a process,
    and unlike any other process's but by chance (an ``os.urandom`` call per request
    would cost it more than all the rest of this layer)."""
    return f"{_PROCESS}{(next(_MADE) * _SCRAMBLE) & _MASK:016x}"


def request_id_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The request id of a request of these (ASGI) headers: its ``X-Request-Id`` if that
    is sane (the first, if there are several), else a new one."""
    for name, value in headers:
        if name == _HEADER:
            return sane_or_new(value)
    return new_request_id()


def sane_or_new(value: bytes | None) -> str:
    """``value`` (a request's ``X-Request-Id``) if it is sane, else a new request id."""
    if value is not None and _SANE_ID.fullmatch(value):
        return value.decode("ascii")
    return new_request_id()


def id_header(request_id: str) -> tuple[bytes, bytes]:
    """The ``X-Request-Id`` response header, as ASGI sends headers."""
    return (_HEADER, request_id.encode("ascii"))


class Access:
    """One HTTP request or WebSocket whose lines are logged: its id, what it is, and what
    the Field learned of it while answering. Endpoints set :attr:`agent` and
    :attr:`transport`, and call :meth:`streams`, as they learn them; an operation is told
    by :meth:`operated`. (Without ``--access-log`` no request has one.)"""

    __slots__ = (
        "request_id",
        "method",
        "target",
        "client",
        "transport",
        "agent",
        "operation",
        "outcome",
        "message_id",
        "subscriptions",
        "status",
        "close",
        "opened",
    )

    def __init__(self, request_id: str, scope: Scope) -> None:
        self.request_id = request_id
        self.method, self.target, self.client = _request_of(scope)
        #: ``http``, ``websocket``, or what an endpoint says (``sse``, ``mcp``)
        self.transport = "websocket" if scope["type"] == "websocket" else "http"
        self.agent: str | None = None
        self.operation: str | None = None
        self.outcome: str | None = None
        self.message_id: str | None = None
        self.subscriptions: tuple[str, ...] = ()
        #: the status answered (101: a WebSocket accepted); None: no answer yet
        self.status: int | None = None
        #: a push connection's close code and reason, once it closed
        self.close: tuple[int, str] | None = None
        #: a push connection's open line was logged
        self.opened = False

    def operated(
        self, operation: str | None, outcome: str, agent: str | None, message_id: str | None
    ) -> None:
        """The request ran ``operation`` as ``agent``: ``outcome`` is ``ok`` or its error code."""
        self.operation = operation
        self.outcome = outcome
        self.agent = agent or self.agent
        self.message_id = message_id

    def connected(self, agent: str, subscriptions: Iterable[str] = ()) -> None:
        """The WebSocket is a push connection of ``agent``, streaming ``subscriptions``:
        its open line."""
        self.agent = agent
        self.streams(subscriptions)
        self.stream_opened()

    def streams(self, subscriptions: Iterable[str]) -> None:
        """The subscriptions the request streams (the first few are shown)."""
        self.subscriptions = _shown(subscriptions)

    def ended(self, close: tuple[int, str] | None) -> None:
        """The push connection closed with ``close`` (code, reason); the first close told
        is the one kept (the Field's, or the client's if it closed first)."""
        if self.close is None:
            self.close = close

    def stream_opened(self) -> None:
        """The request is a push connection that opened: its open line."""
        self.opened = True
        logger.info(
            '%s "%s %s" open%s',
            self.client,
            self.method,
            self.target,
            self._tail(),
            extra=self._fields(stream="open"),
        )

    def answered(self, seconds: float) -> None:
        """The request was answered (a stream: it ended) ``seconds`` after it came: its line."""
        close = self.close
        closed = f" closed {close[0]} ({close[1]})" if close is not None else ""
        status = "-" if self.status is None else self.status
        logger.info(
            '%s "%s %s" %s %.1f ms%s%s',
            self.client,
            self.method,
            self.target,
            status,
            seconds * 1000,
            closed,
            self._tail(),
            extra=self._fields(
                status=self.status,
                duration_ms=round(seconds * 1000, 3),
                stream="closed" if self.opened else None,
                close_code=None if close is None else close[0],
                close_reason=None if close is None else close[1],
            ),
        )

    def _tail(self) -> str:
        """The line's ``key=value`` pairs, after its request and status."""
        pairs = [
            ("transport", None if self.transport == "http" else self.transport),
            ("agent", self.agent),
            ("operation", self.operation),
            ("outcome", self.outcome),
            ("subscriptions", ",".join(self.subscriptions) or None),
            ("message_id", self.message_id),
            ("request_id", self.request_id),
        ]
        return "".join(f" {key}={value}" for key, value in pairs if value is not None)

    def _fields(self, **more: Any) -> dict[str, Any]:
        """The line's fields, for ``--log-format json``."""
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.target,
            "client": self.client,
            "transport": self.transport,
            "agent": self.agent,
            "operation": self.operation,
            "outcome": self.outcome,
            "message_id": self.message_id,
            "subscriptions": list(self.subscriptions) or None,
            **more,
        }


def access_of(scope: Scope) -> Access | None:
    """The request's access record (None: served without :class:`AccessLog`)."""
    access: Access | None = scope.get(ACCESS)
    return access


class AccessLog:
    """The ASGI layer that gives every request its id, sends it back in every answer, and
    with ``enabled`` logs each request's access line (module docstring).

    A plain callable that returns the application's coroutine (with the id's header
    added by a wrapped ``send``) when nothing is logged: no frame of this layer stays
    on the stack of a WebSocket for its whole life. (uvicorn is told it is ASGI 3,
    as it could not tell by looking: ``uvicorn_config``.)"""

    def __init__(self, app: ASGIApp, *, enabled: bool, responses: Responses | None = None) -> None:
        self.app = app
        self.enabled = enabled
        #: where each answer's status class is counted (None: nowhere)
        self.responses = responses

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":  # lifespan
            return self.app(scope, receive, send)
        request_id = request_id_of(scope["headers"])
        if not self.enabled:  # no record: nothing would read it
            sending = _SendingId(send, id_header(request_id), self.responses)
            return self.app(scope, receive, sending)
        return self._logged(scope, receive, send, request_id)

    async def _logged(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        access = scope[ACCESS] = Access(request_id, scope)
        header = id_header(request_id)
        started = time.perf_counter()
        try:
            if scope["type"] == "http":
                sending = _http_logged(send, header, access, self.responses)
                await self.app(scope, receive, sending)
            else:
                listen = _ws_listened(receive, access)
                await self.app(scope, listen, _ws_logged(send, header, access, self.responses))
        finally:
            access.answered(time.perf_counter() - started)


class _SendingId:
    """``send``, with ``header`` added to the response's head (an HTTP response's, or a
    WebSocket handshake's whether accepted or refused), its status class counted in
    ``responses`` (a WebSocket closed before it was accepted: uvicorn's 403). An object of
    four slots, not a closure: an idle WebSocket keeps it for its whole life."""

    __slots__ = ("send", "header", "responses", "answered")

    def __init__(
        self, send: Send, header: tuple[bytes, bytes], responses: Responses | None
    ) -> None:
        self.send, self.header, self.responses = send, header, responses
        self.answered = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind in _HEADS:
            message = _with_header(message, self.header)
            if self.responses is not None:
                self.answered = True
                count_response(self.responses, message.get("status", 101))
        elif kind == "websocket.close" and not self.answered and self.responses is not None:
            self.answered = True
            count_response(self.responses, 403)
        await self.send(message)


#: The messages that start an answer, whose headers take the request id.
_HEADS = frozenset({"http.response.start", "websocket.accept", "websocket.http.response.start"})


def _http_logged(
    send: Send, header: tuple[bytes, bytes], access: Access, responses: Responses | None
) -> Send:
    """``send``, with the request id in the response's head, noting its status (and
    counting it in ``responses``); an event stream's head is its open line (a HEAD's is
    not: no stream follows it)."""
    streams = access.method != "HEAD"

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            access.status = message["status"]
            if responses is not None:
                count_response(responses, access.status)
            if streams and access.status == 200 and _is_event_stream(message):
                access.stream_opened()
            message = _with_header(message, header)
        await send(message)

    return sending


def _ws_logged(
    send: Send, header: tuple[bytes, bytes], access: Access, responses: Responses | None
) -> Send:
    """``send``, with the request id in the handshake's response, noting its status (and
    counting it in ``responses``) and the Field's close."""

    async def sending(message: Message) -> None:
        kind = message["type"]
        unanswered = access.status is None
        if kind == "websocket.accept":
            access.status = 101
            message = _with_header(message, header)
        elif kind == "websocket.http.response.start":
            access.status = message["status"]
            message = _with_header(message, header)
        elif kind == "websocket.close":
            if access.status is None:  # closed before it was accepted: the server's 403
                access.status = 403
            else:
                access.ended((message.get("code", 1000), message.get("reason") or ""))
        if unanswered and access.status is not None and responses is not None:
            count_response(responses, access.status)
        await send(message)

    return sending


def _ws_listened(receive: Receive, access: Access) -> Receive:
    """``receive``, noting the client's close (or the connection's loss) unless the Field
    closed first."""

    async def listening() -> Message:
        message = await receive()
        if message["type"] == "websocket.disconnect" and access.status == 101:
            code = message.get("code", 1005)
            why = "connection lost" if code == 1006 else "client closed"
            access.ended((code, _printable(message.get("reason") or why)))
        return message

    return listening


def _with_header(message: Message, header: tuple[bytes, bytes]) -> Message:
    """A copy of ``message`` with ``header`` added (heads may be shared: SSE streams')."""
    return {**message, "headers": [*message.get("headers", ()), header]}


def _is_event_stream(message: Message) -> bool:
    for name, value in message.get("headers", ()):
        if name.lower() == b"content-type":
            return bytes(value).startswith(b"text/event-stream")
    return False


def _request_of(scope: Scope) -> tuple[str, str, str]:
    """The method, the path and query string (raw, bounded, printable) and the client's
    address of a request, as its lines show them."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "replace")
    query = scope.get("query_string", b"")
    target = raw.decode("ascii", "backslashreplace")
    if query:
        target += "?" + query.decode("ascii", "backslashreplace")
    client = scope.get("client")
    address = "-" if not client else f"{client[0]}:{client[1]}"
    method = "GET" if scope["type"] == "websocket" else scope["method"]
    return method, _printable(target), address


def _printable(text: str, limit: int = MAX_TARGET_CHARS) -> str:
    """A client's ``text`` for a line: at most ``limit`` characters (cut short with ``…``),
    each control character and line separator escaped (``\\n``, ``\\x7f``)."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if text.isprintable():
        return text
    return _UNPRINTABLE.sub(lambda c: ascii(c.group())[1:-1], text)


def _shown(subscriptions: Iterable[str]) -> tuple[str, ...]:
    """The first :data:`MAX_SUBSCRIPTIONS_SHOWN` ids, and how many more there are."""
    ids = list(subscriptions)
    if len(ids) <= MAX_SUBSCRIPTIONS_SHOWN:
        return tuple(ids)
    return (*ids[:MAX_SUBSCRIPTIONS_SHOWN], f"+{len(ids) - MAX_SUBSCRIPTIONS_SHOWN} more")
