"""The WebSocket protocol ``field serve`` gives uvicorn: uvicorn's own, made lean.

A Field may hold tens of thousands of push connections open for hours,
nearly all idle. uvicorn's websockets sans-I/O protocol is used as it is,
with three things taken away from what an idle connection keeps, and
things added for batches, refusals, counts, stalls, oversize messages and
closing:

* its receive queue is an :class:`Inbox` (no deque until a message waits)
  instead of an ``asyncio.Queue`` (four deques, about 3 KB);
* its ``writable`` flag is a :class:`Flag` instead of an ``asyncio.Event``
  (a deque, 0.8 KB);
* once the handshake is accepted it forgets the request and response it
  kept, and the websockets parser that parsed the request starts afresh,
  at the frame boundary where it stands, so that its suspended frame no
  longer holds the request's headers (about 3 KB in all);
* :data:`BATCH_EXTENSION`: the application may send a batch of text frames
  as one ASGI message, written to the socket in one call instead of a
  system call per frame. The extension is announced in the scope's
  ``extensions``, as ASGI extensions are; an application that finds it
  missing (another server) sends frame by frame;
* :data:`WRITE_NOW_EXTENSION`: the same batch written by a plain call, when
  that needs no wait, so that a frame for an idle connection goes out
  without waking the application's sender task;
* a handshake websockets refuses is answered with the Field's error body
  (``400 INVALID_HANDSHAKE``) and an ``X-Request-Id`` instead of plain text
  (:class:`FieldServerProtocol`);
* uvicorn's INFO line for each handshake (accepted, refused) is a DEBUG line: the
  access log tells of each WebSocket, its agent and how it closed (:mod:`.access`);
* the connection's place in the server's connection counts
  (:class:`~field.transports.connections.Admission`), handed over by the HTTP
  protocol at the upgrade, is given back when the connection closes;
* a consumer that stalls ends the documented way, whichever bound it reaches
  first (:data:`STALL_EXTENSION`): uvicorn's keepalive would fail the
  connection with 1011 instead, and a send waiting for a full socket would
  wait for ever;
* a message over ``ws_max_size`` is answered with a ``response`` frame
  (``413 PAYLOAD_TOO_LARGE``) before websockets closes with 1009;
* a closing connection whose consumer does not read is cut after the close
  timeout (asyncio's ``close`` would wait for its buffer to drain for ever);
* a server that stops has the application close each connection with 1001
  (:meth:`FieldWebSocketProtocol.shutdown`), where uvicorn's closes it with 1012
  at once, racing the application's own close.

Everything else, the wire included, is uvicorn's and websockets' own.

**Stalls.** A consumer is stalled when it answers no ping within
``ws_ping_timeout`` (uvicorn's keepalive, whose expiry is taken over here),
or when a batch of frames waits ``ws_ping_timeout`` for the socket's buffer
to drain. Then the protocol stops waiting for the socket: every later write
goes to the transport whatever it holds, and the application receives a
``{"type": STALL_EXTENSION, "reason": ...}`` event, to which it answers by
sending what it has queued, a last frame and a close. What it sends is
bounded by its own queue, and the consumer has ``ws_ping_timeout`` more to
read it before the connection is cut. No task or timer is added: the
keepalive's timers are uvicorn's, and the close timer is reused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import logging
from typing import TYPE_CHECKING, Any

import orjson
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from ..contract.errors import Code, FieldError
from .access import REQUEST_ID_HEADER, new_request_id, sane_or_new

if TYPE_CHECKING:
    from .connections import Admission

logger = logging.getLogger("field.websocket")

#: The scope extension, and the type of its message: ``{"type": BATCH_EXTENSION,
#: "texts": [bytes, ...], "timeout": seconds}``, each text the UTF-8 of one text
#: frame; ``timeout`` (optional; default ``ws_ping_timeout``) bounds the wait for a
#: full socket buffer to drain, past which the consumer is stalled (the texts are
#: written all the same).
BATCH_EXTENSION = "field.websocket.send_texts"
#: The scope extension whose options are ``{"write": write_texts_now}``: a plain call
#: that writes a batch of texts as :data:`BATCH_EXTENSION` does, at once, and answers
#: True, or writes nothing and answers False when that cannot be done without waiting
#: (the socket's buffer is full, the connection is closing, an extension frames the
#: texts); the application then sends them with :data:`BATCH_EXTENSION`.
WRITE_NOW_EXTENSION = "field.websocket.write_texts_now"
#: The scope extension, and the type of the receive event ``{"type": STALL_EXTENSION,
#: "reason": close reason, "detail": what happened}`` that says the consumer stalled
#: (module docstring): the application should end the connection.
STALL_EXTENSION = "field.websocket.stalled"
#: The scope extension, and the type of the receive event ``{"type": SHUTDOWN_EXTENSION}``
#: that says the server is stopping: the application should send what it has queued
#: and close with :data:`SHUTDOWN_CLOSE`, within :data:`SHUTDOWN_SECONDS`.
SHUTDOWN_EXTENSION = "field.websocket.shutdown"
#: The close code and reason of every open WebSocket when the server stops.
SHUTDOWN_CLOSE = (1001, "server shutting down")
#: Seconds the application has, once the server stops, to close a WebSocket (and the
#: client to answer that close) before the protocol closes it itself.
SHUTDOWN_SECONDS = 2.0
#: The options of the extensions (none): one dict for every connection's scope.
_NO_OPTIONS: dict[str, Any] = {}


class Inbox:
    """What uvicorn asks of its receive queue (``put_nowait``, ``get``, ``empty``).

    First in, first out, unbounded (uvicorn pauses reading while messages
    wait), for one reader at a time: a second concurrent ``get`` is a bug
    in the caller and raises ``RuntimeError``.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Any] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("another task is already waiting for this WebSocket's messages")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if not self._items:
            self._items = None  # an idle connection keeps no deque
        return item

    def empty(self) -> bool:
        return not self._items


class Flag:
    """``asyncio.Event``'s ``set``, ``clear``, ``is_set`` and ``wait``; no deque while none wait."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
                if not self._waiters:
                    self._waiters = None
        return True


#: Longest reason from websockets quoted in a refused handshake's message.
MAX_REASON_CHARS = 200


class _Demoted(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose ``info`` lines are ``debug`` lines."""

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)

    @property
    def level(self) -> int:  # uvicorn compares it with its TRACE level
        return int(self.logger.level)


#: uvicorn's logger for its WebSocket protocol, whose INFO lines (a handshake accepted,
#: refused or answered with a status) are DEBUG lines: the access log tells of each
#: WebSocket, with its agent, how it closed and its request id (``--access-log``).
_HANDSHAKES = _Demoted(logging.getLogger("uvicorn.error"))


#: The header of an unmasked, final text frame (RFC 6455 5.2) of each length under 126.
_SHORT_TEXT_HEADERS = [bytes((0x81, length)) for length in range(126)]


def text_frames(parts: list[bytes], texts: list[bytes]) -> list[bytes]:
    """Append to ``parts`` the wire bytes of a final, unmasked text frame for each of
    ``texts``, as websockets' ``send_text`` writes them on a server's connection
    without extensions; return ``parts``."""
    for text in texts:
        length = len(text)
        if length < 126:
            parts.append(_SHORT_TEXT_HEADERS[length])
        elif length < 65536:
            parts.append(b"\x81\x7e" + length.to_bytes(2, "big"))
        else:
            parts.append(b"\x81\x7f" + length.to_bytes(8, "big"))
        parts.append(text)
    return parts


class FieldServerProtocol(ServerProtocol):
    """websockets' server side, whose handshake refusals carry the Field's error body."""

    def accept(self, request: Request) -> Response:
        response = super().accept(request)
        if response.status_code == 101:
            return response
        given = request.headers.get_all(REQUEST_ID_HEADER)  # str, bytes surrogate-escaped
        value = given[0].encode("utf-8", "surrogateescape") if given else None
        return handshake_refusal(response, sane_or_new(value))


def handshake_refusal(refusal: Response, request_id: str | None = None) -> Response:
    """``400 INVALID_HANDSHAKE`` with the error body, saying what websockets found wrong,
    and ``Sec-WebSocket-Version: 13``, the one version the Field speaks (RFC 6455 4.4);
    ``X-Request-Id``: ``request_id``, or a new one."""
    text = refusal.body.decode("utf-8", "replace").partition("\n")[0]
    reason = text.removeprefix("Failed to open a WebSocket connection: ").rstrip(".")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + "..."
    error = FieldError(
        f"the WebSocket handshake is invalid: {reason}",
        code=Code.INVALID_HANDSHAKE,
        recoverable=True,
        suggested_action="Open /v1/ws with a WebSocket client (GET, HTTP/1.1, no body).",
    )
    body = orjson.dumps(error.to_response())
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", "application/json"),
            ("Sec-WebSocket-Version", "13"),
            (REQUEST_ID_HEADER, request_id or new_request_id()),
        ]
    )
    return Response(error.http_status, "Bad Request", headers, body)


class FieldWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets sans-I/O protocol, lean when idle, with batched text frames."""

    #: this connection's place in the server's counts, given back when it closes
    admission: Admission | None = None
    #: the consumer stalled: writes no longer wait for the socket (a class default,
    #: so that a connection that never stalls keeps no attribute for it)
    stalled = False
    #: the receive queue: it also carries this module's own events (a stall, a shutdown)
    queue: Inbox  # type: ignore[assignment]  # uvicorn declares an asyncio.Queue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _HANDSHAKES  # type: ignore[assignment]
        self.queue = Inbox()
        self.writable = Flag(True)  # type: ignore[assignment]
        # the same object, refusing handshakes in the Field's words (it adds no state)
        self.conn.__class__ = FieldServerProtocol
        self.conn.logger = _HANDSHAKES  # websockets' "connection open" too

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self.admission is not None:
                self.admission.release()
                self.admission = None

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the handshake went to the application
            extensions = scope["extensions"]
            for name in (BATCH_EXTENSION, STALL_EXTENSION, SHUTDOWN_EXTENSION):
                extensions[name] = _NO_OPTIONS
            extensions[WRITE_NOW_EXTENSION] = {"write": self.write_texts_now}

    async def send(self, message: Any) -> None:
        if message["type"] == BATCH_EXTENSION:
            await self._send_texts(message["texts"], message.get("timeout"))
            return
        timer = self.close_timer
        await super().send(message)
        if message["type"] == "websocket.close" and self.client:
            code, reason = message.get("code", 1000), message.get("reason") or ""
            logger.debug("closing the WebSocket of %s:%d: %d %s", *self.client, code, reason)
        if self.close_timer is not timer and self.close_timer is not None:
            # uvicorn's close timer closes gracefully, which waits for ever for a consumer
            # that does not read: a stall's own deadline stands, else the close timeout's
            self.close_timer.cancel()
            self.close_timer = timer or self.loop.call_later(self.close_timeout, self._cut)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            self._forget_handshake()
        elif message["type"] == "websocket.http.response.body" and self.close_sent:
            # a denial response went out whole: the handshake is over (uvicorn
            # would otherwise log that the application never completed it)
            self.handshake_complete = True

    def write_texts_now(self, texts: list[bytes]) -> bool:
        """:data:`WRITE_NOW_EXTENSION`: write ``texts`` now as :meth:`_send_texts` would,
        or write nothing and answer False where it would wait or fail."""
        if (
            not self.writable.is_set()
            or self.close_sent
            or not self.handshake_complete
            or self.transport.is_closing()
        ):
            return False
        conn = self.conn
        if (
            conn.state is not State.OPEN
            or conn.extensions
            or conn.expect_continuation_frame
            or conn.debug
        ):
            return False
        self._write_texts(texts)
        return True

    async def _send_texts(self, texts: list[bytes], timeout: float | None) -> None:
        """Frame every text as ``send`` would, and write them all in one go.

        If the socket's buffer is full, wait for it to drain, at most
        ``timeout`` seconds (``TimeoutError``).
        """
        if not self.writable.is_set():
            bound = self.ping_timeout if timeout is None else timeout
            try:
                async with asyncio.timeout(bound):
                    await self.writable.wait()
            except TimeoutError:
                self._stall("send timed out", f"the socket took no bytes for {bound:g} s")
        if self.close_sent or not self.handshake_complete or self.transport.is_closing():
            raise ClientDisconnected()
        conn = self.conn
        if conn.extensions or conn.expect_continuation_frame or conn.debug:
            try:
                for text in texts:
                    conn.send_text(text)
            except InvalidState:
                raise ClientDisconnected() from None
            self.transport.write(b"".join(conn.data_to_send()))
            return
        if conn.state is not State.OPEN:
            raise ClientDisconnected()
        self._write_texts(texts)

    def _write_texts(self, texts: list[bytes]) -> None:
        # what websockets would write, framed here: 6x cheaper than a Frame per text
        self.transport.write(b"".join(text_frames(self.conn.data_to_send(), texts)))

    # -- stalls, oversize messages, closing ------------------------------------------

    def shutdown(self) -> None:
        """The server is stopping: the application closes the connection, with 1001.

        uvicorn's protocol sends close 1012 (no reason) here and then, whatever the
        application is doing: a race with the application's own close (1001 after
        what it still had queued), which the protocol won whenever the server's
        shutdown ran before the application's sender. Instead, the application is
        told (:data:`SHUTDOWN_EXTENSION`) and given :data:`SHUTDOWN_SECONDS` to send
        what it has and close; past them the protocol closes with
        :data:`SHUTDOWN_CLOSE` itself. Either way the code is 1001 and the reason
        ``server shutting down``. A connection already closing, or whose handshake
        is not done, is left to uvicorn's.
        """
        if (
            self.close_sent
            or not self.handshake_complete
            or self.initial_response is not None
            or self.transport.is_closing()
        ):
            super().shutdown()
            return
        self.stop_keepalive()
        self.queue.put_nowait({"type": SHUTDOWN_EXTENSION})
        if self.close_timer is not None:
            self.close_timer.cancel()
        self.close_timer = self.loop.call_later(SHUTDOWN_SECONDS, self._shutdown_deadline)

    def _shutdown_deadline(self) -> None:
        """The application had its time to close; cut a closing handshake that the client
        has not answered, or close with :data:`SHUTDOWN_CLOSE` if nothing closed yet."""
        self.close_timer = None
        if self.close_sent or self.transport.is_closing():
            self._cut()
            return
        code, reason = SHUTDOWN_CLOSE
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        with contextlib.suppress(InvalidState):  # the client's close crossed ours
            self.conn.send_close(code, reason)
        self.close_sent = True
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    def pause_writing(self) -> None:
        if not self.stalled:  # a stalled consumer's writes no longer wait
            self.writable.clear()

    def keepalive_timeout(self) -> None:
        """No pong within ``ping_timeout``: a stall (uvicorn fails the connection, 1011)."""
        self.pong_timer = None
        self.pending_ping_payload = None
        if self.close_sent or self.transport.is_closing():
            return
        self._stall("keepalive ping timeout", f"no pong within {self.ping_timeout:g} s")

    def _stall(self, reason: str, detail: str) -> None:
        """The consumer takes no bytes: stop waiting for it and tell the application."""
        if self.stalled or self.close_sent or self.transport.is_closing():
            return
        self.stalled = True
        self.stop_keepalive()
        self.writable.set()  # wakes a send waiting for the socket: it writes all the same
        if self.client:
            logger.debug("the WebSocket consumer at %s:%d stalled: %s", *self.client, detail)
        self.queue.put_nowait({"type": STALL_EXTENSION, "reason": reason, "detail": detail})
        linger = self.ping_timeout or self.close_timeout
        if self.close_timer is not None:
            self.close_timer.cancel()
        self.close_timer = self.loop.call_later(linger, self._cut)

    def _cut(self) -> None:
        """The close deadline: close if all was handed to the kernel, else drop what is left
        (as :meth:`FieldHttpProtocol._expired` does)."""
        self.close_timer = None
        if self.transport.get_write_buffer_size() == 0:
            self.transport.close()
        else:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        if conn.parser_exc is not None:
            if isinstance(conn.parser_exc, PayloadTooBig):
                self._answer_too_big()
            self.handle_parser_exception()
            return
        self.handle_events()

    def _answer_too_big(self) -> None:
        """A ``response`` frame (``id`` null, ``413 PAYLOAD_TOO_LARGE``) ahead of
        websockets' close (1009), which is already queued in the protocol."""
        if self.close_sent or not self.handshake_complete or self.initial_response is not None:
            return  # no application-level frame may go out
        limit = self.config.ws_max_size
        error = FieldError(
            f"the message is larger than {limit} bytes (max_body_bytes); "
            "the connection is closed (1009)",
            code=Code.PAYLOAD_TOO_LARGE,
            recoverable=True,
            suggested_action=f"Send messages of at most {limit} bytes; reconnect with the "
            "cursors of the last notifications received.",
        )
        body = {"type": "response", "id": None, "status": error.http_status}
        text = orjson.dumps({**body, "body": error.to_response()})
        # uncompressed (RFC 7692 allows it), since the protocol is already closing
        self.transport.write(Frame(Opcode.TEXT, text).serialize(mask=False))

    def _forget_handshake(self) -> None:
        """Let go of the request and response: nothing reads them once the handshake is done."""
        self.request = None  # type: ignore[assignment]
        self.response = None  # type: ignore[assignment]
        restart_frame_parser(self.conn)


def restart_frame_parser(conn: ServerProtocol) -> bool:
    """Swap the parser that read the handshake for a fresh one, if it stands between frames.

    ``ServerProtocol.parse`` parses the request, then delegates to
    ``Protocol.parse`` for frames, holding the request in a local all the
    while. Waiting for the first byte of a frame, with nothing buffered,
    a fresh ``Protocol.parse`` is in the same state, holding nothing.
    (websockets swaps parsers itself, for ``discard``.) Returns whether
    it did; mid-frame, or with any other parser, nothing changes.
    """
    parser: Any = conn.parser
    frames = getattr(parser, "gi_yieldfrom", None)
    waiting = getattr(frames, "gi_yieldfrom", None)
    if not (
        getattr(parser, "gi_code", None) is ServerProtocol.parse.__code__
        and getattr(frames, "gi_code", None) is Protocol.parse.__code__
        and getattr(waiting, "gi_code", None) is StreamReader.at_eof.__code__
    ):
        return False
    parser.close()
    conn.parser = Protocol.parse(conn)
    next(conn.parser)
    return True
