"""One consumer's stream of one subscription: cursor, debounce, encoding.

The notifications of a subscription form a stream that is a pure function
of the log: every notification carries the position of the log entry it
is about (its *cursor*), and a stream delivers strictly increasing
cursors. That is what makes resuming exact: a consumer that saw cursor
``c`` is owed precisely the stream's notifications after ``c``, which
the Field recomputes from the log.

Debounce (``debounce_ms`` = W > 0) keeps that property by cutting time
into consecutive windows of W milliseconds (counted from the Unix epoch,
on the log's timestamps, which never decrease). All events about one
entity in one window fold into a single notification: the latest of
them, with ``folded`` saying how many earlier ones it replaces. A
window's notifications are delivered when it ends, in cursor order. So
an entity is notified at most once per window, its final state is always
delivered, no notification waits longer than W, and since every event of
a window precedes every event of the next, cursors still increase.
Each debounced notification says which window it closed (``window``:
its start and end, RFC 3339), so a client sees where windows lie.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson

from ..contract.clock import epoch_ms
from .events import FieldEvent


@dataclass(slots=True)
class Notification:
    """A matched event on its way to one subscription."""

    subscription_id: str
    event: FieldEvent
    relevance: float
    reason: str
    requires_action: bool
    folded: int = 0
    #: the event's shared encoded part (:func:`encode_event`)
    shared: bytes = b"{}"
    #: the debounce window it was delivered at the end of, encoded (:func:`window_field`);
    #: empty without debounce
    window: bytes = b""

    @property
    def position(self) -> int:
        return self.event.position


class Stream:
    """Cursor and debounce state of one subscription for one consumer."""

    __slots__ = ("subscription_id", "window_ms", "after", "_pending", "_window")

    def __init__(self, subscription_id: str, *, window_ms: int, after: int) -> None:
        self.subscription_id = subscription_id
        self.window_ms = window_ms
        #: cursor of the last notification delivered (or skipped as already seen)
        self.after = after
        #: the open debounce window's notifications by entity (a dict only while one is open)
        self._pending: dict[str, Notification] | None = None
        self._window: int | None = None

    def window_of(self, ts: float) -> int:
        """The window holding log time ``ts``: its whole milliseconds (those its
        RFC 3339 form shows, :func:`~field.contract.clock.epoch_ms`), divided by W."""
        if not self.window_ms:
            return 0
        if not math.isfinite(ts):  # "the end of time" flushes everything
            return sys.maxsize if ts > 0 else -sys.maxsize
        return epoch_ms(ts) // self.window_ms

    @property
    def deadline(self) -> float | None:
        """About when the pending window ends (seconds), for scheduling a flush."""
        if self._window is None:
            return None
        return (self._window + 1) * self.window_ms / 1000.0

    def offer(self, notification: Notification) -> list[Notification]:
        """Add a matched notification; return what is due now, in cursor order.

        Notifications must be offered in log order. Those at or before the
        cursor still count towards ``folded`` but are not delivered again.
        """
        if not self.window_ms:
            return self._deliver([notification])
        due = self.advance(notification.event.ts)
        key = notification.event.entity_key
        pending = self._pending
        if pending is None:
            pending = self._pending = {}
        earlier = pending.get(key)
        if earlier is not None:
            notification.folded = earlier.folded + 1
        pending[key] = notification
        self._window = self.window_of(notification.event.ts)
        notification.window = window_field(self.window_ms, self._window)
        return due

    def advance(self, now: float) -> list[Notification]:
        """Deliver the pending window if it has ended by ``now`` (log time)."""
        if self._window is None or self.window_of(now) <= self._window:
            return []
        due = sorted((self._pending or {}).values(), key=lambda n: n.position)
        self._pending = None
        self._window = None
        return self._deliver(due)

    def _deliver(self, notifications: list[Notification]) -> list[Notification]:
        fresh = [n for n in notifications if n.position > self.after]
        if fresh:
            self.after = fresh[-1].position
        return fresh


# -- the wire form -------------------------------------------------------------


def format_cursor(field_tag: str, position: int) -> str:
    return f"{field_tag}-{position}"


#: The longest cursor read: this Field's are at most 32 characters (a tag of 12, a
#: position of up to 19 digits); a longer one is refused unread, and shown cut short.
MAX_CURSOR_CHARS = 64


def parse_cursor(cursor: str, field_tag: str) -> tuple[int | None, str | None]:
    """(position, None) for a cursor of this Field, else (None, reason); the reason
    quotes at most :data:`MAX_CURSOR_CHARS` characters of a client's cursor."""
    if len(cursor) > MAX_CURSOR_CHARS:
        shown = repr(cursor[:MAX_CURSOR_CHARS])
        return None, f"{shown}... is not a cursor this Field issued (too long)"
    tag, sep, number = cursor.rpartition("-")
    if not sep or not (number.isascii() and number.isdigit()) or len(number) > 19:
        return None, f"{cursor!r} is not a cursor this Field issued"
    if tag != field_tag:
        return None, f"cursor {cursor!r} belongs to another Field"
    return int(number), None


def encode_event(event: FieldEvent, cursor: str) -> bytes:
    """The part of a notification every subscriber shares, encoded once per event."""
    return orjson.dumps(event_fields(event, cursor))


def event_fields(event: FieldEvent, cursor: str) -> dict[str, Any]:
    """The fields of :func:`encode_event`, in its order."""
    body: dict[str, Any] = {
        "event": event.name,
        "epoch": event.epoch,
        "summary": event.summary,
        "memory_unit_id": event.memory_unit_id,
        "conflict_id": event.conflict_id,
        "cursor": cursor,
        "entity": {"type": event.entity_type, "id": event.entity_id},
        "agent_id": event.actor,
    }
    if event.detail is not None:  # task, handoff, session and agent.failed events
        body["detail"] = event.detail
    return body


def encode_notification(notification: Notification) -> bytes:
    """One subscriber's notification: its own fields spliced onto the shared part.

    The same bytes as ``orjson.dumps`` of the subscriber's fields (in the
    order below) followed by the shared part's fields::

        {"subscription_id":…,"relevance_score":…,"relevance_reason":…,
         "requires_action":…,"folded":…[,"window":…],<the shared part's fields>}

    built from cached pieces with one join, since fan-out makes one per
    subscriber (:func:`subscription_prefix`, :func:`own_middle`,
    :func:`shared_tail`).
    """
    return b"".join(
        (
            subscription_prefix(notification.subscription_id),
            orjson.dumps(round(notification.relevance, 6)),
            own_middle(notification.reason, notification.requires_action),
            b"%d" % notification.folded,
            notification.window,
            shared_tail(notification.shared),
        )
    )


def subscription_prefix(subscription_id: str) -> bytes:
    """A notification's bytes up to its relevance score."""
    return b'{"subscription_id":' + orjson.dumps(subscription_id) + b',"relevance_score":'


#: own_middle's pieces by (reason, requires_action): reasons are few (cached per flags)
_MIDDLES: dict[tuple[str, bool], bytes] = {}
_MAX_MIDDLES = 4096


def own_middle(reason: str, requires_action: bool) -> bytes:
    """A notification's bytes after its relevance score, up to the ``folded`` count."""
    key = (reason, requires_action)
    middle = _MIDDLES.get(key)
    if middle is None:
        if len(_MIDDLES) >= _MAX_MIDDLES:  # bounded whatever reasons appear
            _MIDDLES.clear()
        action = b"true" if requires_action else b"false"
        middle = _MIDDLES[key] = (
            b',"relevance_reason":' + orjson.dumps(reason) + b',"requires_action":' + action
        ) + b',"folded":'
    return middle


def shared_tail(shared: bytes) -> bytes:
    """A notification's bytes after its ``folded`` count: the shared part's fields."""
    return b"," + shared[1:]


#: window_field's pieces by (W, window number): subscribers of one W share them
_WINDOWS: dict[tuple[int, int], bytes] = {}
_MAX_WINDOWS = 4096


def window_field(window_ms: int, window: int) -> bytes:
    """``,"window":{"start":…,"end":…}`` of debounce window number ``window`` of W =
    ``window_ms``: the milliseconds [window × W, (window + 1) × W) since the Unix epoch,
    as RFC 3339 timestamps (UTC, to the millisecond; the end is not in the window)."""
    key = (window_ms, window)
    encoded = _WINDOWS.get(key)
    if encoded is None:
        if len(_WINDOWS) >= _MAX_WINDOWS:
            _WINDOWS.clear()
        start = window * window_ms
        bounds = {"start": rfc3339_ms(start), "end": rfc3339_ms(start + window_ms)}
        encoded = _WINDOWS[key] = b',"window":' + orjson.dumps(bounds)
    return encoded


def rfc3339_ms(ms: int) -> str:
    """Whole milliseconds since the Unix epoch as an RFC 3339 UTC timestamp, exactly."""
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
