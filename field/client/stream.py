""":class:`NotificationStream`: push notifications as an async iterator that resumes itself.

One stream reads an agent's notifications over a WebSocket (``/v1/ws``, all
of the agent's subscriptions on one connection) or over Server-Sent Events
(``/v1/subscriptions/{id}/events``, one connection per subscription), as
``protocol/README.md`` ("Push") frames them.

**Cursors.** Every notification carries the cursor of its place in the
Field's log. The stream keeps, per subscription, the cursor of the last
notification it handed on (``resume`` and ``live`` frames move it too), and
every connection after the first asks the Field to resume there
(``since=<subscription>@<cursor>``, or ``Last-Event-ID``). The Field then
replays exactly what came after it, so a connection lost for any reason
(the Field restarted or was killed, the network failed, the consumer fell
behind and was cut off with ``overflow`` and close 4008) loses nothing and
repeats nothing.

**When it cannot.** A cursor the Field does not know (another Field's, or one
ahead of its log) is answered ``resume {recovered: false}``: the stream goes
on live, and the gap surfaces as :class:`~field.client.errors.NotificationGap`
(or a :class:`~field.client.types.Gap` event with ``control=True``). A token
the Field refuses (close 4401) raises
:class:`~field.client.errors.FieldClientError` and is not retried; 4409 (the
agent deregistered) ends the stream.

**The first connection.** A stream that cannot connect to any of the Field's
nodes before its first connection (refused, a host name that does not
resolve, a connection timed out) raises
:class:`~field.client.errors.FieldUnavailable`: no Field is there to wait
for. Once it has connected, a lost connection is reconnected.

**Reconnecting** waits :class:`~field.client.types.Reconnect` delays: jittered,
growing, capped (5 s by default, inside the Field's 30 s ``failure_grace``, so
an agent whose stream comes back stays live).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import time
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast
from urllib.parse import quote, urlencode

import aiohttp
import orjson

from .errors import (
    FieldClientError,
    FieldUnavailable,
    NotificationGap,
    StreamUnavailable,
    retry_after_seconds,
)
from .sse import SSEError, SSEParser
from .tokens import write_private
from .types import (
    Disconnected,
    Ended,
    Gap,
    Notification,
    Overflow,
    Reconnect,
    StreamEvent,
    Transport,
)

if TYPE_CHECKING:
    from .agent import AgentClient

#: Close codes after which the stream stops instead of reconnecting.
CLOSE_AUTH_FAILED = 4401
CLOSE_DEREGISTERED = 4409
CLOSE_OVERFLOW = 4008
#: HTTP statuses of a refused connection that are worth trying again later.
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: Seconds a stream waits for its handshake (connecting is bounded by the client's
#: ``connect_timeout``).
CONNECT_TIMEOUT = 10.0
#: Seconds an SSE stream may stay silent past ``heartbeat`` (the Field comments every 15 s).
SSE_SILENCE_MARGIN = 15.0
#: Bytes of an error response that are read.
MAX_ERROR_BYTES = 64 * 1024
#: Bound on a cursor file read (a cursor per subscription: a few dozen bytes each).
MAX_CURSOR_FILE_BYTES = 1024 * 1024


#: What a stream yields: notifications only, or every event (``control=True``).
EventT = TypeVar("EventT", bound=StreamEvent)


class _Retry(Exception):
    """The connection ended in a way worth trying again (``reason`` says how)."""

    def __init__(self, reason: str, *, at_once: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.at_once = at_once


class _Stop(Exception):
    """The stream is over: every subscription it follows ended, or the agent is gone."""


class NotificationStream(Generic[EventT]):
    """An agent's notifications, resumed across connections (see the module docstring).

    Made by :meth:`AgentClient.notifications`. Iterate it with ``async for``;
    close it with ``await stream.aclose()`` or by using it as an async context
    manager. ``cursors`` maps each subscription to the cursor of the last
    notification yielded (pass it as ``since`` to a later stream to go on from
    there); ``overflows`` and ``ended`` record those control events.
    """

    def __init__(
        self,
        agent: AgentClient,
        subscription_ids: list[str],
        *,
        origins: Mapping[str, str] | None = None,
        since: str | Mapping[str, str] | None,
        transport: Transport,
        control: bool,
        reconnect: Reconnect,
        heartbeat: float,
        max_message_bytes: int,
        cursor_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if transport not in ("ws", "sse"):
            raise ValueError(f'transport must be "ws" or "sse", not {transport!r}')
        if heartbeat <= 0 or max_message_bytes < 1024:
            raise ValueError("heartbeat must be positive and max_message_bytes at least 1024")
        self.agent = agent
        self.transport = transport
        self.control = control
        self.reconnect = reconnect
        self.heartbeat = heartbeat
        self.max_message_bytes = max_message_bytes
        #: the subscriptions followed (``None``: all of the agent's, over a WebSocket)
        self.only: frozenset[str] | None = frozenset(subscription_ids) or None
        #: subscription id → cursor of the last notification yielded
        self.cursors: dict[str, str] = {}
        self.overflows: list[Overflow] = []
        self.ended: dict[str, Ended] = {}
        self._since_all: str | None = since if isinstance(since, str) else None
        self._start: dict[str, str] = {}
        self._saved: dict[str, str] = {}  # the cursors last written to the cursor file
        self._cursor_file = None if cursor_file is None else Path(cursor_file)
        if self._cursor_file is not None:
            self._start = _load_cursors(self._cursor_file, agent.id)
            self.cursors, self._saved = dict(self._start), dict(self._start)
            # a subscription the file has no cursor for has had nothing processed: all
            # it owes since its creation is still to come
            self._start = {**(origins or {}), **self._start}
        if isinstance(since, Mapping):
            self._start |= since
        self._epochs: dict[str, int] = {}  # subscription → epoch of its last notification
        self._events: AsyncGenerator[StreamEvent, None] | None = None
        self._http: aiohttp.ClientSession | None = None
        #: whether the Field ever answered this stream; until then, the nodes that could not
        #: be connected to (all of them: FieldUnavailable)
        self._reached = False
        self._unreached: set[str] = set()

    # -- the iterator --------------------------------------------------------------------

    def __aiter__(self) -> NotificationStream[EventT]:
        return self

    async def __anext__(self) -> EventT:
        self._checkpoint()  # the consumer asks for more: it is done with what it was given
        if self._events is None:
            self._events = self._produce()
        while True:
            try:
                event = await self._events.__anext__()
            except BaseException:  # the end, a refusal, or cancelled: the producer is done
                await self._close()
                raise
            if isinstance(event, Notification):
                self.cursors[event.subscription_id] = event.cursor
                self._epochs[event.subscription_id] = event.epoch
                self.agent.observe(event.epoch)
                return cast(EventT, event)
            if isinstance(event, Gap):
                event = dataclasses.replace(
                    event,
                    last_cursor=self.cursors.get(event.subscription_id, event.last_cursor),
                    last_epoch=self._epochs.get(event.subscription_id, 0),
                )
                self.cursors[event.subscription_id] = event.resumed_from
                if not self.control:
                    raise NotificationGap(event)
            elif isinstance(event, Overflow):
                self.overflows.append(event)
            elif isinstance(event, Ended):
                self.ended[event.subscription_id] = event
                self.cursors.pop(event.subscription_id, None)  # nothing more to resume
            if self.control:
                return cast(EventT, event)

    async def aclose(self) -> None:
        """Close the connection(s); the stream yields nothing more. With a ``cursor_file``,
        the cursors of everything yielded are saved (the last notification counts as
        processed)."""
        self._checkpoint()
        await self._close()

    def _checkpoint(self) -> None:
        """Save the cursors to the ``cursor_file``, if there is one and they moved."""
        if self._cursor_file is None or self.cursors == self._saved:
            return
        body = orjson.dumps({"agent_id": self.agent.id, "cursors": self.cursors})
        write_private(self._cursor_file, body, durable=False)
        self._saved = dict(self.cursors)

    async def _close(self) -> None:
        if self._events is not None:
            closing = self._events
            self._events = _nothing()
            await closing.aclose()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> NotificationStream[EventT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.aclose()
        else:  # the last notification yielded may not have been processed: not saved
            await self._close()

    # -- producing events ------------------------------------------------------------------

    @property
    def http(self) -> aiohttp.ClientSession:
        """The stream's own session: no total timeout (a stream lasts), its own connections."""
        if self._http is None:
            # no total: a stream lasts; a handshake or a connection is bounded (the bound on
            # reads is lifted once a WebSocket is open, and set per SSE stream)
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self.agent.field.connect_timeout, sock_read=CONNECT_TIMEOUT
            )
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def _produce(self) -> AsyncGenerator[StreamEvent, None]:
        if self.transport == "ws":
            ws = self._ws()
            async with contextlib.aclosing(ws):
                async for event in ws:
                    yield event
            return
        subscription_ids = sorted(self.only) if self.only else await self._active_streams()
        merged = _merged([self._sse(s) for s in subscription_ids])
        async with contextlib.aclosing(merged):
            async for event in merged:
                yield event

    async def _active_streams(self) -> list[str]:
        """The agent's subscriptions read as streams (not delivered by webhook)."""
        listed = await self.agent.subscriptions()
        return sorted(
            s["id"]
            for s in listed["subscriptions"]
            if (s.get("delivery") or {"type": "stream"}).get("type") == "stream"
        )

    def _start_cursor(self, subscription_id: str, position: dict[str, str]) -> str | None:
        """Where a connection asks a subscription's stream to start."""
        return (
            position.get(subscription_id)
            or self._start.get(subscription_id)
            or self._since_all
            or self.agent.fresh_subscriptions.get(subscription_id)
        )

    def _follows(self, subscription_id: str) -> bool:
        return self.only is None or subscription_id in self.only

    async def _backoff(
        self, failure: BaseException, attempt: int, failing_since: float
    ) -> Disconnected:
        """The wait before reconnection ``attempt``, or StreamUnavailable past the limit."""
        limit = self.reconnect.give_up_after
        if limit is not None and time.monotonic() - failing_since >= limit:
            raise StreamUnavailable(
                f"no connection to the Field at {self.agent.field.base_url} for {limit:g} s: "
                f"{_describe(failure)}",
                dict(self.cursors),
            ) from failure
        delay = self.reconnect.delay(attempt, random.random())
        return Disconnected(_describe(failure), delay, attempt)

    def _unreachable(self, node: str, error: BaseException) -> None:
        """Raise FieldUnavailable if the Field never answered this stream and no node can
        be connected to (``error``: the failure at ``node``)."""
        if self._reached:
            return
        if isinstance(error, FieldUnavailable):  # a request that tried every node already
            raise error
        urls = self.agent.field.urls
        unavailable = FieldUnavailable.of(urls, error)
        if unavailable is None:  # something answered (or may have): keep trying
            return
        self._unreached.add(node)
        if self._unreached.issuperset(urls):
            raise unavailable from error

    # -- WebSocket -----------------------------------------------------------------------

    async def _ws(self) -> AsyncGenerator[StreamEvent, None]:
        position: dict[str, str] = {}  # subscription → cursor to resume after
        following = set(self.only or ())
        attempt, failing_since = 0, 0.0
        while True:
            node = self.agent.field.base_url
            try:
                if self.only is not None:
                    for ended in await self._gone(following, position):
                        following.discard(ended.subscription_id)
                        yield ended
                    if not following:
                        return
                async with self.http.ws_connect(
                    self._ws_url(position),
                    headers={"Authorization": f"Bearer {self.agent.token}"},
                    heartbeat=self.heartbeat,
                    max_msg_size=self.max_message_bytes,
                    compress=0,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
                ) as ws:
                    attempt, self._reached = 0, True
                    frames = self._ws_frames(ws, position, following)
                    async with contextlib.aclosing(frames):
                        async for event in frames:
                            yield event
            except _Stop:
                return
            except _Retry as retry:
                if retry.at_once:
                    continue
                failure: BaseException = retry
            except (aiohttp.WSServerHandshakeError, FieldClientError) as error:
                if error.status not in RETRIED_STATUSES:
                    raise
                failure, self._reached = error, True
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                self._unreachable(node, error)
                failure = error
                self.agent.field.failed(node)  # the next attempt goes to the next node
            if attempt == 0:
                failing_since = time.monotonic()
            attempt += 1
            pause = await self._backoff(failure, attempt, failing_since)
            yield pause
            await asyncio.sleep(pause.retry_in)

    def _ws_url(self, position: dict[str, str]) -> str:
        base = self.agent.field.base_url
        url = ("wss" if base.startswith("https") else "ws") + base[base.index(":") :] + "/v1/ws"
        query = []
        known = set(position) | set(self._start) | set(self.agent.fresh_subscriptions)
        for subscription_id in sorted(known):
            if not self._follows(subscription_id):
                continue
            cursor = self._start_cursor(subscription_id, position)
            if cursor is not None:
                query.append(("since", f"{subscription_id}@{cursor}"))
        if self._since_all is not None:  # every other subscription, e.g. one made meanwhile
            query.append(("since", self._since_all))
        return url + ("?" + urlencode(query, quote_via=quote) if query else "")

    async def _gone(self, following: set[str], position: dict[str, str]) -> list[Ended]:
        """Followed subscriptions that are no longer active and that the next connection
        cannot name with a cursor. One it names (``since=<id>@<cursor>``) gets what it still
        owed and its ``end`` frame from the Field; one it cannot would never end."""
        active = {s["id"] for s in (await self.agent.subscriptions())["subscriptions"]}
        fresh = self.agent.fresh_subscriptions
        following = {s for s in following if not (s in position or s in self._start or s in fresh)}
        return [
            Ended(
                subscription_id,
                "the subscription is not active (cancelled or expired while the stream was "
                "not connected: notifications it owed before that may be missing)",
                position.get(subscription_id) or self._start.get(subscription_id) or "",
            )
            for subscription_id in sorted(following - active)
        ]

    async def _ws_frames(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        position: dict[str, str],
        following: set[str],
    ) -> AsyncGenerator[StreamEvent, None]:
        """The events of one WebSocket connection; how it closed decides what follows."""
        error: dict[str, Any] | None = None
        async for message in ws:
            if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                break
            frame = orjson.loads(message.data)
            kind, data = frame.get("type"), frame.get("data")
            if kind == "error":
                error = data
                continue
            if not isinstance(data, dict):
                continue  # a response frame: this stream sends no requests
            if kind == "overflow":
                for subscription_id, cursor in data.get("cursors", {}).items():
                    position.setdefault(subscription_id, cursor)
                yield Overflow(data.get("reason", ""), dict(data.get("cursors", {})))
                continue
            subscription_id = data.get("subscription_id")
            if not isinstance(subscription_id, str) or not self._follows(subscription_id):
                continue
            event = self._event(kind, data, position)
            if event is not None:
                yield event
            if isinstance(event, Ended) and self.only is not None:
                following.discard(subscription_id)
                if not following:
                    raise _Stop
        code = ws.close_code
        if error is not None and error.get("code") != "TOO_MANY_CONNECTIONS":
            raise FieldClientError(401, error)  # the token was refused (then close 4401)
        if code == CLOSE_AUTH_FAILED:
            body = {"code": "UNAUTHENTICATED", "message": "the Field closed the stream with 4401"}
            raise FieldClientError(401, body)
        if code == CLOSE_DEREGISTERED:
            raise _Stop
        if code == CLOSE_OVERFLOW:
            raise _Retry("the consumer fell behind (4008)", at_once=True)
        exception = ws.exception()
        reason = f"closed with {code}"
        raise _Retry(reason if exception is None else f"{reason} ({_describe(exception)})")

    def _event(
        self, kind: Any, data: dict[str, Any], position: dict[str, str]
    ) -> StreamEvent | None:
        """The event of one frame about one subscription (WebSocket and SSE alike)."""
        subscription_id: str = data["subscription_id"]
        if kind == "notification":
            notification = Notification.from_wire(data)
            position[subscription_id] = notification.cursor
            self.agent.fresh_subscriptions.pop(subscription_id, None)
            return notification
        if kind == "resume":
            self.agent.fresh_subscriptions.pop(subscription_id, None)
            asked = self._start_cursor(subscription_id, position)
            position[subscription_id] = data["from"]
            if data.get("recovered") is False:
                reason = str(data.get("reason", "the cursor was not honoured"))
                return Gap(subscription_id, reason, asked, data["from"], 0)
            return None
        if kind == "live":
            position[subscription_id] = data["cursor"]
            return None
        if kind == "end":
            position.pop(subscription_id, None)
            return Ended(subscription_id, str(data.get("reason", "")), str(data.get("cursor", "")))
        return None

    # -- Server-Sent Events --------------------------------------------------------------

    async def _sse(self, subscription_id: str) -> AsyncGenerator[StreamEvent, None]:
        """One subscription's SSE stream, reconnected with ``Last-Event-ID``."""
        position: dict[str, str] = {}
        path = f"/v1/subscriptions/{quote(subscription_id)}/events"
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.agent.field.connect_timeout,
            sock_read=self.heartbeat + SSE_SILENCE_MARGIN,
        )
        attempt, failing_since = 0, 0.0
        while True:
            headers = {"Authorization": f"Bearer {self.agent.token}"}
            cursor = self._start_cursor(subscription_id, position)
            if cursor is not None:
                headers["Last-Event-ID"] = cursor
            node = self.agent.field.base_url
            try:
                async with self.http.get(node + path, headers=headers, timeout=timeout) as response:
                    self._reached = True
                    if response.status != 200:
                        ended = await self._sse_refused(response, subscription_id, position)
                        yield ended
                        return
                    attempt = 0
                    events = self._sse_events(response, subscription_id, position)
                    async with contextlib.aclosing(events):
                        async for event in events:
                            yield event
                raise _Retry("the stream ended (the Field is stopping?)")
            except _Stop:
                return
            except _Retry as retry:
                if retry.at_once:
                    continue
                failure: BaseException = retry
            except (aiohttp.ClientError, OSError, TimeoutError, SSEError) as error:
                failure = error
                if not isinstance(error, SSEError):
                    self._unreachable(node, error)
                    self.agent.field.failed(node)  # the next attempt goes to the next node
            if attempt == 0:
                failing_since = time.monotonic()
            attempt += 1
            pause = await self._backoff(failure, attempt, failing_since)
            yield pause
            await asyncio.sleep(pause.retry_in)

    async def _sse_refused(
        self, response: aiohttp.ClientResponse, subscription_id: str, position: dict[str, str]
    ) -> Ended:
        """A stream the Field would not open: ended (cancelled), retried, or raised."""
        raw = await response.content.read(MAX_ERROR_BYTES)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {"code": "UNEXPECTED_RESPONSE", "message": raw[:200].decode(errors="replace")}
        wait = retry_after_seconds(response.headers.get("Retry-After"))
        error = FieldClientError(response.status, body, retry_after=wait)
        if error.code == "INVALID_TRANSITION":  # the subscription was cancelled
            cursor = position.get(subscription_id) or self._start.get(subscription_id) or ""
            return Ended(subscription_id, str(body.get("message", "cancelled")), cursor)
        if response.status in RETRIED_STATUSES:
            raise _Retry(str(error))
        try:
            raise error
        finally:
            del error  # the traceback holds this frame: no cycle through it

    async def _sse_events(
        self, response: aiohttp.ClientResponse, subscription_id: str, position: dict[str, str]
    ) -> AsyncGenerator[StreamEvent, None]:
        parser = SSEParser(self.max_message_bytes)
        async for chunk in response.content.iter_any():
            for sse in parser.feed(chunk):
                data = orjson.loads(sse.data)
                if not isinstance(data, dict):
                    continue
                if sse.event == "overflow":
                    cursor = data.get("cursors", {}).get(subscription_id)
                    if isinstance(cursor, str):
                        position.setdefault(subscription_id, cursor)
                    yield Overflow(str(data.get("reason", "")), dict(data.get("cursors", {})))
                    raise _Retry("the consumer fell behind (overflow)", at_once=True)
                kind = "notification" if sse.id is not None else sse.event
                data.setdefault("subscription_id", subscription_id)
                event = self._event(kind, data, position)
                if event is not None:
                    yield event
                if isinstance(event, Ended):
                    raise _Stop


async def _merged(
    streams: list[AsyncGenerator[StreamEvent, None]],
) -> AsyncGenerator[StreamEvent, None]:
    """The events of several streams as they come (each in its own order)."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield event
        return
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=1)

    async def pump(stream: AsyncGenerator[StreamEvent, None]) -> None:
        try:
            async for event in stream:
                await queue.put(("event", event))
            await queue.put(("done", None))
        except Exception as error:  # handed to the reader, which raises it
            await queue.put(("error", error))

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            what, item = await queue.get()
            if what == "event":
                yield item
            elif what == "done":
                running -= 1
            else:
                raise item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            with contextlib.suppress(Exception):
                await stream.aclose()


def _load_cursors(path: Path, agent_id: str) -> dict[str, str]:
    """The cursors a ``cursor_file`` keeps (none when it does not exist yet)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CURSOR_FILE_BYTES + 1)
    except FileNotFoundError:
        return {}
    data: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(raw) if len(raw) <= MAX_CURSOR_FILE_BYTES else None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a cursor file")
    cursors = data.get("cursors")
    if not isinstance(cursors, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in cursors.items()
    ):
        raise ValueError(f"{path} is not a cursor file")
    if data.get("agent_id") != agent_id:
        raise ValueError(f"{path} keeps the cursors of agent {data.get('agent_id')!r}")
    return dict(cursors)


async def _nothing() -> AsyncGenerator[StreamEvent, None]:
    return
    yield  # an async generator that ends at once


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
