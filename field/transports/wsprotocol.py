"""The WebSocket protocol ``field serve`` gives uvicorn: uvicorn's own, made lean.

A Field may hold tens of thousands of push connections open for hours,
nearly all idle. uvicorn's websockets sans-I/O protocol is used as it is,
with three things taken away from what an idle connection keeps and three
things added:

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
* a handshake websockets refuses is answered with the Field's error body
  (``400 INVALID_HANDSHAKE``) instead of plain text (:class:`FieldServerProtocol`);
* the connection's place in the server's connection counts
  (:class:`~field.transports.connections.Admission`), handed over by the HTTP
  protocol at the upgrade, is given back when the connection closes.

Everything else, the wire included, is uvicorn's and websockets' own.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
from typing import TYPE_CHECKING, Any

import orjson
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.exceptions import InvalidState
from websockets.http11 import Request, Response
from websockets.protocol import Protocol
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from ..errors import Code, FieldError

if TYPE_CHECKING:
    from .connections import Admission

#: The scope extension, and the type of its message: ``{"type": BATCH_EXTENSION,
#: "texts": [bytes, ...], "timeout": seconds}``, each text the UTF-8 of one text
#: frame; ``timeout`` (optional) bounds the wait for a full socket buffer to drain.
BATCH_EXTENSION = "field.websocket.send_texts"


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


class FieldServerProtocol(ServerProtocol):
    """websockets' server side, whose handshake refusals carry the Field's error body."""

    def accept(self, request: Request) -> Response:
        response = super().accept(request)
        if response.status_code == 101:
            return response
        return handshake_refusal(response)


def handshake_refusal(refusal: Response) -> Response:
    """``400 INVALID_HANDSHAKE`` with the error body, saying what websockets found wrong,
    and ``Sec-WebSocket-Version: 13``, the one version the Field speaks (RFC 6455 4.4)."""
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
        ]
    )
    return Response(error.http_status, "Bad Request", headers, body)


class FieldWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets sans-I/O protocol, lean when idle, with batched text frames."""

    #: this connection's place in the server's counts, given back when it closes
    admission: Admission | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]
        # the same object, refusing handshakes in the Field's words (it adds no state)
        self.conn.__class__ = FieldServerProtocol

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
            scope["extensions"][BATCH_EXTENSION] = {}

    async def send(self, message: Any) -> None:
        if message["type"] == BATCH_EXTENSION:
            await self._send_texts(message["texts"], message.get("timeout"))
            return
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            self._forget_handshake()
        elif message["type"] == "websocket.http.response.body" and self.close_sent:
            # a denial response went out whole: the handshake is over (uvicorn
            # would otherwise log that the application never completed it)
            self.handshake_complete = True

    async def _send_texts(self, texts: list[bytes], timeout: float | None) -> None:
        """Frame every text as ``send`` would, and write them all in one go.

        If the socket's buffer is full, wait for it to drain, at most
        ``timeout`` seconds (``TimeoutError``).
        """
        if not self.writable.is_set():
            async with asyncio.timeout(timeout):
                await self.writable.wait()
        if self.close_sent or not self.handshake_complete or self.transport.is_closing():
            raise ClientDisconnected()
        conn = self.conn
        try:
            for text in texts:
                conn.send_text(text)
        except InvalidState:
            raise ClientDisconnected() from None
        self.transport.write(b"".join(conn.data_to_send()))

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
