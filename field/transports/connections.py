"""The HTTP protocol ``field serve`` gives uvicorn: every connection bounded in number and time.

uvicorn's httptools protocol accepts every socket it is handed and waits for
a request head or body without a deadline. :class:`FieldHttpProtocol` is that
protocol with four things added:

* **Admission.** One :class:`ConnectionGuard` per server counts the open
  connections (HTTP and WebSocket together, from accept to close) in all and
  per client address. A connection past either cap is answered at once,
  ``503 OVERLOADED`` with ``Retry-After`` past the total and ``429
  TOO_MANY_CONNECTIONS`` past the client's, and closed.
* **Deadlines.** Each connection is in one :class:`Phase` at a time; the
  allowed moves are :data:`TRANSITIONS` and each phase's deadline and what
  its expiry does are :data:`DEADLINES`. A request head must be complete
  within ``header_timeout`` of the connection's accept (or of the first byte
  after an idle spell), its whole body within ``body_timeout`` of its head,
  both or ``408 REQUEST_TIMEOUT``; a kept-alive connection with no request
  under way is closed after ``idle_timeout``. While the application has the
  request there is no deadline: answering is its business.
* **Declined upgrades.** llhttp stops at the head of any request that asks
  to upgrade, taking whatever follows for the new protocol. Only a WebSocket
  handshake (``GET``, HTTP/1.1, no body) is upgraded; any other request with
  ``Upgrade`` (``h2c``, a ``POST`` with ``Upgrade: websocket``, a handshake
  with a body) is served as plain HTTP, its body read past the stopped
  parser, and the connection closed after the answer.
* **Malformed requests.** Bytes llhttp refuses (a ``Content-Length`` that is
  not a number, a control character in a header...) are answered ``400
  INVALID_HTTP`` instead of uvicorn's plain text, unless a response is
  already under way; either way the connection closes.

Every answer of this module is the Field's error body with ``Connection:
close`` and a new ``X-Request-Id`` (no request was read whole to take one
from). A connection being closed first sends its answer and a FIN, then
discards what the client still sends until the client closes, at most
:data:`LINGER_SECONDS` (closing with unread input would reset the connection
and could destroy the answer before the client reads it).
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from ..contract.errors import Code, FieldError, Overloaded
from .access import Responses, count_response, id_header, new_request_id

logger = logging.getLogger("field.connections")

#: Seconds a closing connection may take to read our answer and close its side.
LINGER_SECONDS = 2.0
#: Most refused connections lingering at once; past it a refusal closes at once.
MAX_LINGERING = 64
#: Seconds a client refused past the total cap is told to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1
#: Seconds between two log lines about refused connections.
REFUSAL_REPORT_SECONDS = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """The bounds of one server's connections (``field serve`` flags of the same names)."""

    max_connections: int
    max_connections_per_client: int
    header_timeout: float
    body_timeout: float
    idle_timeout: float


class Phase(enum.Enum):
    """Where one HTTP connection stands."""

    HEAD = "waiting for a complete request head"
    BODY = "reading the body of the request the application has"
    APP = "the application has the whole request"
    IDLE = "kept alive, no request under way"
    UPGRADED = "handed to the WebSocket protocol"
    CLOSING = "answered; waiting for the client to close"


#: The moves a connection may make. A pipelined request starts when the one before
#: it is answered (APP → BODY or APP); a request answered before its body is in stays
#: in BODY until the body is (BODY → IDLE). UPGRADED and CLOSING are final.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.HEAD: frozenset({Phase.BODY, Phase.APP, Phase.UPGRADED, Phase.CLOSING}),
    Phase.BODY: frozenset({Phase.APP, Phase.IDLE, Phase.CLOSING}),
    Phase.APP: frozenset({Phase.BODY, Phase.HEAD, Phase.IDLE, Phase.UPGRADED, Phase.CLOSING}),
    Phase.IDLE: frozenset({Phase.HEAD, Phase.CLOSING}),
    Phase.UPGRADED: frozenset(),
    Phase.CLOSING: frozenset(),
}

#: Each phase's deadline (a :class:`ConnectionLimits` field, or a fixed number of
#: seconds) and what its expiry does: ``"408"`` answers REQUEST_TIMEOUT and closes
#: (or only closes if the request was already answered), ``"close"`` closes
#: without a word (RFC 9112 9.8 lets a server close an idle connection), ``"abort"``
#: lets go of the connection for good (whatever it still had queued is dropped).
DEADLINES: dict[Phase, tuple[str | float, str] | None] = {
    Phase.HEAD: ("header_timeout", "408"),
    Phase.BODY: ("body_timeout", "408"),
    Phase.APP: None,
    Phase.IDLE: ("idle_timeout", "close"),
    Phase.UPGRADED: None,  # the WebSocket protocol's pings take over
    Phase.CLOSING: (LINGER_SECONDS, "abort"),
}


def client_key(host: str | None) -> str:
    """The address a client's connections are counted under.

    An IPv4 address as it is (also when mapped into IPv6); an IPv6 address by
    its /64 network, since one host is commonly given a whole /64.
    """
    if not host:
        return ""
    if ":" not in host:
        return host
    if host.startswith("::ffff:") and "." in host:
        return host[len("::ffff:") :]
    try:
        return str(ipaddress.IPv6Network((host.partition("%")[0], 64), strict=False))
    except ValueError:
        return host


class Admission:
    """One admitted connection's place in its guard's counts, given back once."""

    __slots__ = ("_guard", "_key")

    def __init__(self, guard: ConnectionGuard, key: str) -> None:
        self._guard: ConnectionGuard | None = guard
        self._key = key

    def release(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.release(self._key)


class ConnectionGuard:
    """The counts of one server's open connections, in all and by client address.

    Used from the event loop's thread only; every protocol instance of the
    server shares it.
    """

    def __init__(self, limits: ConnectionLimits, *, responses: Responses | None = None) -> None:
        self.limits = limits
        #: admitted connections still open
        self.open = 0
        #: refused connections still lingering (at most :data:`MAX_LINGERING`)
        self.lingering = 0
        self._by_client: dict[str, int] = {}
        self._refused = {"total": 0, "client": 0}
        self._next_report = 0.0
        #: connections refused since start-up, by the cap they met
        self.refused_total = {"total": 0, "client": 0}
        #: where the answers written here (refusals, timeouts, malformed HTTP) are counted
        #: by status class (the metrics' tally, shared with ``AccessLog``); None: nowhere
        self.responses = responses

    def admit(self, key: str) -> Admission:
        """Count a new connection from ``key``, or raise the error that refuses it."""
        limits = self.limits
        if self.open >= limits.max_connections:
            self._note_refusal("total")
            raise Overloaded(
                f"the Field already holds {limits.max_connections} connections, "
                "as many as it allows",
                suggested_action=f"Retry after {RETRY_AFTER_SECONDS} s.",
            )
        held = self._by_client.get(key, 0)
        if held >= limits.max_connections_per_client:
            self._note_refusal("client")
            raise FieldError(
                f"this client address already holds {held} connections, "
                "as many as the Field allows one address",
                code=Code.TOO_MANY_CONNECTIONS,
                recoverable=True,
                suggested_action="Close idle connections, or reuse them (keep-alive).",
            )
        self.open += 1
        self._by_client[key] = held + 1
        return Admission(self, key)

    def release(self, key: str) -> None:
        self.open -= 1
        held = self._by_client.get(key, 0) - 1
        if held > 0:
            self._by_client[key] = held
        else:
            self._by_client.pop(key, None)

    def _note_refusal(self, cap: str) -> None:
        """Log refusals in one line at most every :data:`REFUSAL_REPORT_SECONDS`."""
        self._refused[cap] += 1
        self.refused_total[cap] += 1
        now = time.monotonic()
        if now < self._next_report:
            return
        self._next_report = now + REFUSAL_REPORT_SECONDS
        total, client = self._refused["total"], self._refused["client"]
        self._refused = {"total": 0, "client": 0}
        logger.warning(
            "refused %d connection(s) past the cap of %d and %d past a client's cap of %d "
            "(counted again in %g s)",
            total,
            self.limits.max_connections,
            client,
            self.limits.max_connections_per_client,
            REFUSAL_REPORT_SECONDS,
        )


def error_bytes(
    error: FieldError, default_headers: list[tuple[bytes, bytes]], *extra: tuple[bytes, bytes]
) -> bytes:
    """A whole HTTP/1.1 response: ``error``'s status and body, then ``Connection: close``,
    and a new request id (the request was not read: :mod:`.access`)."""
    body = orjson.dumps(error.to_response())
    parts = [STATUS_LINE[error.http_status]]
    headers = (
        *default_headers,
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        id_header(new_request_id()),
        *extra,
    )
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    parts += [b"\r\n", body]
    return b"".join(parts)


def _timed_out(what: str, seconds: float) -> FieldError:
    return FieldError(
        f"the request {what} did not arrive within {seconds:g} s",
        code=Code.REQUEST_TIMEOUT,
        recoverable=True,
        suggested_action="Send each request whole and without pauses, on a new connection.",
    )


#: Longest parser message quoted in an ``INVALID_HTTP`` answer (llhttp's are short).
MAX_REASON_CHARS = 200


def _malformed(reason: str) -> FieldError:
    return FieldError(
        f"the request is not well-formed HTTP/1.1: {reason[:MAX_REASON_CHARS]}",
        code=Code.INVALID_HTTP,
        recoverable=True,
        suggested_action="Send a well-formed HTTP/1.1 request (RFC 9112) on a new connection.",
    )


class FieldHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with admission, deadlines and declined upgrades."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.phase = Phase.HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._admission: Admission | None = None
        self._lingering = False
        #: the request whose application task runs (uvicorn's ``cycle`` is the last parsed)
        self._running: RequestResponseCycle | None = None
        #: a request head is partly read
        self._in_head = False
        #: reads the body of a request whose upgrade was declined, once llhttp stopped
        self._after_upgrade: _BodyAfterUpgrade | None = None
        #: that request's framing headers, while its head is parsed
        self._declined_framing: bytes | None = None
        #: the answer to malformed bytes that followed requests still being answered
        self._refusal: FieldError | None = None

    # -- phases ---------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        if phase is self.phase:
            return
        if phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"a connection cannot go from {self.phase.name} to {phase.name}")
        self.phase = phase
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _settle(self) -> None:
        """Start the current phase's deadline unless it runs already (it is not
        restarted by more bytes: a deadline bounds the whole head or body)."""
        deadline = DEADLINES[self.phase]
        if self._timer is not None or deadline is None:
            return
        limit, _ = deadline
        seconds = getattr(self.guard.limits, limit) if isinstance(limit, str) else limit
        self._timer = self.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        deadline = DEADLINES[self.phase]
        action = deadline[1] if deadline is not None else "abort"
        if action == "abort":
            # Once our answer has left for the kernel, a plain close frees the descriptor
            # and lets the kernel finish sending it (an abort's RST would discard what the
            # kernel has not sent yet, on a slow link); with bytes still queued here, drop
            # them: the client is not reading.
            if self.transport.get_write_buffer_size() == 0:
                self.transport.close()
            else:
                self.transport.abort()
            return
        answered = self._running is not None and self._running.response_started
        self._let_go_of_request()
        if action == "close" or (self.phase is Phase.BODY and answered):
            self._close()  # idle, or answered before its body was in: nothing to say
        elif self.phase is Phase.HEAD:
            self._answer_and_close(_timed_out("head", self.guard.limits.header_timeout))
        else:
            self._answer_and_close(_timed_out("body", self.guard.limits.body_timeout))

    def _let_go_of_request(self) -> None:
        """Tell the running request's application that its client is gone (it reads
        ``http.disconnect``; what it sends is dropped), before answering for it."""
        cycle = self._running
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()

    def _answer_and_close(self, error: FieldError, *headers: tuple[bytes, bytes]) -> None:
        self._write_error(error, *headers)
        self._enter(Phase.CLOSING)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the FIN follows the answer; reading goes on
        else:
            self.transport.close()
        self._settle()

    def _close(self) -> None:
        self._enter(Phase.CLOSING)
        self.transport.close()
        self._settle()  # a client that reads nothing would keep the socket forever

    # -- uvicorn's protocol, with phases ------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        try:
            self._admission = self.guard.admit(client_key(self.client[0] if self.client else None))
        except FieldError as refusal:
            self._refuse(refusal)
            return
        self._settle()

    def _refuse(self, refusal: FieldError) -> None:
        retry = refusal.code == Code.OVERLOADED
        headers = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())] if retry else []
        if self.guard.lingering < MAX_LINGERING:
            self._lingering = True
            self.guard.lingering += 1
            self._answer_and_close(refusal, *headers)
        else:  # a flood: no time to wait for each client to read its answer
            self._write_error(refusal, *headers)
            self._close()

    def _write_error(self, error: FieldError, *headers: tuple[bytes, bytes]) -> None:
        """Write ``error`` as a whole response (counted in the guard's ``responses``)."""
        self.transport.write(error_bytes(error, self.server_state.default_headers, *headers))
        if self.guard.responses is not None:
            count_response(self.guard.responses, error.http_status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._admission is not None:
            self._admission.release()
        if self._lingering:
            self._lingering = False
            self.guard.lingering -= 1
        self._after_upgrade = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.CLOSING:
            return  # read and dropped, so that closing does not reset the connection
        if self.phase is Phase.IDLE:
            self._enter(Phase.HEAD)
        if self._after_upgrade is not None:
            self._after_upgrade.feed(data)
        else:
            self._parse(data)
        if self.phase is not Phase.UPGRADED:
            self._settle()

    def _parse(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._bad_request(str(exc))
        except httptools.HttpParserUpgrade as upgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._read_past_upgrade(data[upgrade.args[0] :])

    def _bad_request(self, reason: str) -> None:
        """Answer bytes that are not HTTP/1.1 (``400 INVALID_HTTP``) and close.

        The parser cannot find where the bad request ends, so nothing after it
        can be read as a request: the connection closes after the answer. Whole
        requests before it are answered first; if the bytes broke the body of a
        request whose response is already under way, there is no answer to give.
        """
        if self._refusal is not None:
            return  # refused already; llhttp refuses every byte after the first error
        logger.warning("invalid HTTP request received: %s", reason)
        cycle = self._running
        if self.phase is Phase.APP and cycle is not None and not cycle.response_complete:
            # the requests before it are whole: answered first, in order
            self._refusal = _malformed(reason)
            return
        midway = cycle is not None and cycle.response_started and not cycle.response_complete
        self._let_go_of_request()
        if midway:
            self._close()
        else:
            self._answer_and_close(_malformed(reason))

    def _should_upgrade(self) -> bool:
        """Upgrade only a WebSocket handshake: GET, HTTP/1.1, no body."""
        if not super()._should_upgrade():
            return False
        if self.scope["method"] != "GET" or self.scope["http_version"] != "1.1":
            return False
        return _framing(self.headers) is None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self.phase is Phase.IDLE:  # the next request, in the same bytes as the last
            self._enter(Phase.HEAD)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        if self.parser.should_upgrade() and not self._should_upgrade():
            # llhttp now takes the request as complete and stops: serve it as HTTP,
            # read its body (if any) past the parser, and close after the answer.
            self.cycle.keep_alive = False
            self._declined_framing = _framing(self.headers)

    def on_message_complete(self) -> None:
        if self._declined_framing is not None and self._after_upgrade is None:
            return  # llhttp's early end of a declined upgrade: its body is still to come
        super().on_message_complete()
        if self.cycle is self._running and self.phase is Phase.BODY:
            self._enter(Phase.IDLE if self.cycle.response_complete else Phase.APP)

    def _read_past_upgrade(self, rest: bytes) -> None:
        framing, self._declined_framing = self._declined_framing, None
        if framing is None:
            return  # no body; anything after the head is dropped, as the connection closes
        try:
            self._after_upgrade = _BodyAfterUpgrade(self, framing)
        except httptools.HttpParserError as exc:  # framing llhttp refuses (e.g. not chunked)
            self._bad_request(str(exc))
            return
        self._after_upgrade.feed(rest)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle
        self._enter(Phase.BODY if cycle.more_body else Phase.APP)
        super()._start_asgi_task(cycle, _quiet_when_gone(app, cycle))

    def on_response_complete(self) -> None:
        """uvicorn's, with the phases' deadlines instead of its keep-alive timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self._refusal is not None and not self.pipeline:
            self._answer_and_close(self._refusal)
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.phase is not Phase.BODY:  # in BODY the answered request's body is still due
            self._enter(Phase.HEAD if self._in_head else Phase.IDLE)
        self._settle()

    def handle_websocket_upgrade(self) -> None:
        self._enter(Phase.UPGRADED)
        super().handle_websocket_upgrade()
        admission, self._admission = self._admission, None
        if admission is not None:
            _hand_over(admission, self.transport.get_protocol())


def _framing(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """A request's body framing headers, as a head fragment; None if it has no body."""
    framing = [
        name + b": " + value + b"\r\n"
        for name, value in headers
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0")
    ]
    return b"".join(framing) or None


def _hand_over(admission: Admission, protocol: Any) -> None:
    """Let the WebSocket protocol now holding the connection give its place back."""
    if hasattr(protocol, "admission"):  # field serve's (FieldWebSocketProtocol)
        protocol.admission = admission
        return
    lost = protocol.connection_lost  # another of uvicorn's (the tests use them)

    def connection_lost(exc: Exception | None) -> None:
        admission.release()
        lost(exc)

    protocol.connection_lost = connection_lost


def _quiet_when_gone(app: Any, cycle: RequestResponseCycle) -> Callable[..., Any]:
    """``app``, except that what it raises once its client is gone is one log line,
    not uvicorn's traceback: the client going away is no fault of the server."""

    async def run(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except Exception as exc:
            if not cycle.disconnected:
                raise
            logger.debug("a request ended (%s) after its client went away", type(exc).__name__)

    return run


class _BodyAfterUpgrade:
    """Reads the body of a request whose upgrade was declined.

    llhttp stopped at the request's head; a parser of its own is fed a head
    with only the request's framing headers, then the bytes that follow, and
    hands the body to the protocol as uvicorn's parser would have.
    """

    __slots__ = ("_protocol", "_parser", "done")

    def __init__(self, protocol: FieldHttpProtocol, framing: bytes) -> None:
        self._protocol = protocol
        self.done = False
        self._parser = httptools.HttpRequestParser(self)
        self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"Connection: close\r\n\r\n")

    def feed(self, data: bytes) -> None:
        if self.done or not data:
            return  # past the body: dropped, the connection closes after the answer
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.done:
                self._protocol._bad_request(str(exc))

    def on_body(self, body: bytes) -> None:
        self._protocol.on_body(body)

    def on_message_complete(self) -> None:
        self.done = True
        self._protocol.on_message_complete()
