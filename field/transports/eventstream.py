"""The framing of an event stream (``text/event-stream``) and watching for its client to
leave: what the SSE stream of a subscription (``sse.py``) and the console's stream
(``console.py``) both write with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from sse_starlette import ServerSentEvent
from starlette.types import Receive

from ..engine.router import Frame

logger = logging.getLogger("field.sse")


def sse_event(frame: Frame) -> bytes:
    """``ServerSentEvent(data=body, event=kind, id=cursor).encode()``, by concatenation.

    Frame bodies are JSON from orjson (no raw line breaks, so one ``data:``
    line); anything else goes through sse-starlette's encoder.
    """
    body = frame.body
    if b"\n" in body or b"\r" in body:
        event = ServerSentEvent(data=body.decode(), event=frame.kind, id=frame.cursor)
        return event.encode()
    head = b"event: " + frame.kind.encode() + b"\r\ndata: "
    if frame.cursor is not None:
        head = b"id: " + frame.cursor.encode() + b"\r\n" + head
    return head + body + b"\r\n\r\n"


class Departure:
    """Calls ``gone()`` once the client has gone away, with no task of its own.

    Once the request's (empty) body has been read, the server's ``receive()``
    waits until the client disconnects. A task awaiting it would be a second
    task per stream; instead the coroutine is stepped by hand, as a task
    would step it: each step runs it until it awaits a future, whose
    completion steps it again. A ``receive()`` that awaits anything else
    than an asyncio future (a bare yield) is stepped again on the next turn
    of the loop.
    """

    __slots__ = ("_receive", "_gone", "_coro")

    def __init__(self, receive: Receive, gone: Callable[[], None]) -> None:
        self._receive = receive
        self._gone: Callable[[], None] | None = gone
        self._coro: Coroutine[Any, Any, Any] | None = None
        self._listen()

    def _listen(self) -> None:
        self._coro = self._receive()  # type: ignore[assignment]
        self._step(None)

    def _step(self, _: object) -> None:
        coro = self._coro
        if coro is None:
            return
        try:
            awaited = coro.send(None)
        except StopIteration as stop:
            message = stop.value
            if isinstance(message, dict) and message.get("type") == "http.request":
                self._listen()  # the request's body: read on
            else:
                self._depart()
            return
        except Exception:
            logger.exception("watching an SSE client failed")
            self._depart()
            return
        if asyncio.isfuture(awaited):
            awaited._asyncio_future_blocking = False
            awaited.add_done_callback(self._step)
        else:
            asyncio.get_running_loop().call_soon(self._step, None)

    def _depart(self) -> None:
        self._coro = None
        gone, self._gone = self._gone, None
        if gone is not None:
            gone()

    def close(self) -> None:
        """Stop watching (the response has ended)."""
        coro, self._coro, self._gone = self._coro, None, None
        if coro is not None:
            coro.close()
