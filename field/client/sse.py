"""A Server-Sent Events parser that does no I/O: bytes in (:meth:`SSEParser.feed`), events out.

It follows the WHATWG event-stream rules the Field's streams need: lines end
with CR LF, LF or CR; ``event``, ``data`` (several lines joined by LF) and
``id`` fields; comments (``: ping``) ignored; a blank line dispatches. The
buffer is bounded: an event (or a line) longer than ``max_bytes`` raises
:class:`SSEError` rather than growing without end.
"""

from __future__ import annotations

from dataclasses import dataclass


class SSEError(ValueError):
    """The stream is not an event stream this parser accepts (e.g. an event too long)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: ``event`` (``message`` when unnamed), ``data``, and ``id``
    (``None`` when the event set none)."""

    event: str
    data: str
    id: str | None


class SSEParser:
    """Feed it the bytes of a ``text/event-stream`` body; it returns the complete events."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._size = 0  # bytes of the event being built
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._first = True  # a BOM may open the stream

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events ``chunk`` completes (with what was fed before)."""
        self._buffer += chunk
        if self._first and len(self._buffer) >= 3:
            if self._buffer.startswith(b"\xef\xbb\xbf"):
                del self._buffer[:3]
            self._first = False
        events: list[SSEEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            newline = _line_end(buffer, start)
            if newline is None:
                break
            end, after = newline
            event = self._line(bytes(buffer[start:end]))
            if event is not None:
                events.append(event)
            start = after
        del buffer[:start]
        if len(buffer) + self._size > self.max_bytes:
            raise SSEError(f"an event longer than {self.max_bytes} bytes")
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            return self._dispatch()
        self._size += len(raw) + 1
        if self._size > self.max_bytes:
            raise SSEError(f"an event longer than {self.max_bytes} bytes")
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        event = SSEEvent(self._event or "message", "\n".join(self._data), self._id)
        had_data = bool(self._data)
        self._event, self._data, self._id, self._size = "", [], None, 0
        return event if had_data else None


def _line_end(buffer: bytearray, start: int) -> tuple[int, int] | None:
    """Where the line starting at ``start`` ends and the next begins, if it is complete.

    A CR at the very end of the buffer waits for the next byte (it may be
    half of a CR LF).
    """
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start)
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buffer):
            return None
        return cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
    if lf != -1:
        return lf, lf + 1
    return None
