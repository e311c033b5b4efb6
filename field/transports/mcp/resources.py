"""The resources of an MCP session over HTTP: entities by URI, and subscriptions as feeds.

URIs (protocol/README.md, "MCP binding"):

==============================  =============================================
``field://agent``               the session's agent, as ``GET /v1/agents``
``field://units/{id}``          a memory unit the agent may see
``field://conflicts/{id}``      a conflict the agent may see
``field://tasks/{id}``          a task the agent may see
``field://subscriptions/{id}``  one of the agent's subscriptions: a read
                                returns its notifications since the session's
                                previous read (:class:`SubscriptionFeed`)
==============================  =============================================

A subscription resource is a push-hub connection of its own (kind ``mcp``,
counted against the agent's ``--max-push-per-agent``), which the hub fills
like a WebSocket's: the same stream machinery (cursor, debounce, filters,
``min_relevance``, pacing) decides what it owes. Nothing is written out as it
arrives: the frames wait in the connection's bounded outbox until the session
reads the resource, a page at a time, and the session is told (one
``notifications/resources/updated``, not again until it reads) that there is
something to read. An outbox that overflows because nobody reads is
attached again from the last cursor read, so the log replays what it dropped:
every notification is read exactly once.

The other resources are read from the state in the writer like the GET
lists; a session watching one is told when a log entry is about that entity
(the entity index's rule, :func:`field.core.entities.entities_of`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from ...contract.errors import Code, InvalidPayload, NotFound
from ...contract.model import StoredEntry
from ...core import visibility
from ...core.context import Outcome
from ...core.entities import entities_of
from ...core.field import Field
from ...core.state import AgentRecord
from ...engine.push import Connection, PushHub
from ...engine.router import Frame
from ...subscriptions.stream import parse_cursor

SCHEME = "field://"
AGENT_URI = "field://agent"
#: The kinds of ``field://<kind>/{id}`` and what each holds.
TEMPLATES = {
    "units": "A memory unit (full form); subscribe to be told when it changes (superseded, "
    "contested, archived...).",
    "conflicts": "A conflict; subscribe to be told when it changes (a vote, a resolution).",
    "tasks": "A task; subscribe to be told when it changes (assigned, started, completed...).",
    "subscriptions": "One of your subscriptions: each read returns the notifications since "
    "this session's previous read (at most a page; more says whether others wait). Subscribe "
    "to be sent notifications/resources/updated when some are ready.",
}
#: Longest id in a resource URI.
MAX_ID_CHARS = 256
#: Most notifications one read of a subscription resource returns.
READ_PAGE = 100
#: The entity index's kind of each URI kind (an entity watch's key).
_ENTITY_KIND = {"units": "unit", "conflicts": "conflict", "tasks": "task"}


def subscription_uri(subscription_id: str) -> str:
    return f"{SCHEME}subscriptions/{subscription_id}"


def split_since(uri: str) -> tuple[str, str | None]:
    """``(uri, cursor)`` of ``field://subscriptions/{id}?since=<cursor>``: the resource, and
    the cursor a read starts after (None: where the reader's feed is). Another URI, or one
    with another query, is returned whole (and named no resource by :func:`parse_uri`)."""
    base, mark, query = uri.partition("?")
    if not mark or not base.startswith(f"{SCHEME}subscriptions/"):
        return uri, None
    found = parse_qs(query, keep_blank_values=True)
    if set(found) != {"since"} or len(found["since"]) != 1 or not found["since"][0]:
        raise InvalidPayload(
            f"{_shown(uri)}: a subscription resource takes one query parameter, since=<cursor>",
            suggested_action="Read field://subscriptions/<id>, or add ?since=<cursor> with the "
            "cursor of the last read to start after it.",
        )
    return base, found["since"][0]


def parse_uri(uri: str) -> tuple[str, str | None]:
    """``(kind, id)`` of a resource URI (``("agent", None)`` for the agent), or the error
    that says it names no resource of the Field."""
    if uri == AGENT_URI:
        return "agent", None
    rest = uri[len(SCHEME) :] if uri.startswith(SCHEME) else None
    kind, _, ident = (rest or "").partition("/")
    if rest is None or kind not in TEMPLATES:
        raise NotFound(
            f"no resource at {_shown(uri)}",
            suggested_action="The Field's resources are field://agent and field://units/{id}, "
            "field://conflicts/{id}, field://tasks/{id}, field://subscriptions/{id}.",
        )
    if not ident or "/" in ident or len(ident) > MAX_ID_CHARS:
        raise InvalidPayload(
            f"{_shown(uri)} does not name one {kind[:-1]}: field://{kind}/{{id}}, the id one "
            f"segment of at most {MAX_ID_CHARS} characters",
            suggested_action=f"Read field://{kind}/<id> with the id the Field gave.",
        )
    return kind, ident


def _shown(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def read_entity(field: Field, viewer: AgentRecord, kind: str, ident: str | None) -> Outcome:
    """The body of an entity resource, as ``viewer`` may see it (a writer job)."""
    state = field.state
    body: dict[str, Any]
    if kind == "agent":
        agent = state.agents.get(viewer.id, viewer)
        body = {"agent": agent.to_wire()}
    elif kind == "units":
        assert ident is not None
        unit = state.known_units.get(ident)
        if unit is None or not visibility.entity_visible(state, viewer, "unit", ident):
            raise NotFound(
                f"no memory unit {ident!r} in this Field that you may see",
                code=Code.UNIT_NOT_FOUND,
                suggested_action="Use an id from akashik_attune or a notification.",
            )
        body = {"memory_unit": unit}
    elif kind == "conflicts":
        assert ident is not None
        conflict = state.conflicts.get(ident)
        if conflict is None or not visibility.entity_visible(state, viewer, "conflict", ident):
            raise NotFound(
                f"no conflict {ident!r} in this Field that you may see",
                code=Code.CONFLICT_NOT_FOUND,
                suggested_action="List conflicts with akashik_detect (mode list).",
            )
        body = {"conflict": conflict}
    else:
        assert kind == "tasks" and ident is not None
        task = state.tasks.get(ident)
        if task is None or not visibility.entity_visible(state, viewer, "task", ident):
            raise NotFound(
                f"no task {ident!r} in this Field that you may see",
                code=Code.TASK_NOT_FOUND,
                suggested_action="List your tasks with akashik_coordinate (action list).",
            )
        body = {"task": task}
    body["epoch"] = field.epoch
    return Outcome(body, agent_id=viewer.id)


def subscription_resources(field: Field, viewer: AgentRecord) -> Outcome:
    """The viewer's active subscriptions (a writer job): ``{"subscriptions": [...]}``."""
    active = sorted(field.state.active_subscriptions.get(viewer.id, ()))
    listed = [field.state.subscriptions[sid] for sid in active]
    return Outcome({"subscriptions": listed}, agent_id=viewer.id)


# -- subscription resources -------------------------------------------------------------


#: Frames of the stream protocol that a reader is not shown (where a stream starts, where
#: its replay ends).
_QUIET = frozenset({"resume", "live"})


class SubscriptionFeed:
    """One MCP session's stream of one subscription, read a page at a time.

    ``ready`` is called (once, until the next read) when something waits to be
    read and the session has subscribed to the resource: a notification, or
    the end of the subscription.
    """

    __slots__ = (
        "hub",
        "agent_id",
        "subscription_id",
        "uri",
        "ready",
        "connection",
        "head",
        "cursor",
        "ended",
        "subscribed",
        "told",
        "live",
        "used",
        "_waiter",
        "_reading",
    )

    def __init__(
        self,
        hub: PushHub,
        agent_id: str,
        subscription_id: str,
        ready: Callable[[SubscriptionFeed], None],
    ) -> None:
        self.hub = hub
        self.agent_id = agent_id
        self.subscription_id = subscription_id
        self.uri = subscription_uri(subscription_id)
        self.ready = ready
        self.connection: Connection | None = None
        #: the first frame worth reading, taken off the outbox to look at it
        self.head: Frame | None = None
        #: the cursor of the last notification read (where a new attachment resumes)
        self.cursor: str | None = None
        #: the subscription's ``end`` frame, once read
        self.ended: dict[str, Any] | None = None
        #: the session subscribed to the resource (resources/subscribe)
        self.subscribed = False
        #: ``ready`` was called since the last read
        self.told = False
        #: the stream has caught up with the log (its replay, if any, is over)
        self.live = False
        #: when it was last read, on the monotonic clock
        self.used = time.monotonic()
        #: a read waiting for the replay's next frame
        self._waiter: asyncio.Future[None] | None = None
        #: one read at a time (a session may send several at once)
        self._reading = asyncio.Lock()

    def attach(self, since: str | None) -> None:
        """Start the stream at cursor ``since`` (None: live, at the end of the log).

        Raises ``TOO_MANY_CONNECTIONS`` past the agent's push connections."""
        connection = self.hub.connect(self.agent_id, "mcp")
        connection.outbox.notify = self._arrived
        self.connection = connection
        self.live = False
        try:
            self.hub.attach(connection, self.subscription_id, since)
        except Exception:
            self.release()
            raise

    def release(self) -> None:
        """Let go of the hub connection (the cursor is kept)."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.outbox.notify = None
            self.hub.disconnect(connection)
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _restart(self) -> None:
        """Attach again from the last cursor read: the log replays what was not read."""
        self.release()
        self.head = None
        self.attach(self.cursor)

    @property
    def stale(self) -> bool:
        """The hub ended the connection without an end of the subscription (an overflow,
        the agent's other streams...): a read attaches again from :attr:`cursor`."""
        connection = self.connection
        return self.ended is None and (connection is None or connection.ended is not None)

    def _arrived(self) -> None:
        """The outbox got a frame (called by the hub, which must not wait)."""
        self._wake()
        if self.head is None:
            self.head = self._next()
        if self.head is not None and self.subscribed and not self.told:
            self.told = True
            self.ready(self)

    def _next(self) -> Frame | None:
        """The next frame worth reading, off the outbox (None: none yet)."""
        connection = self.connection
        if connection is None:
            return None
        while True:
            taken = connection.outbox.drain_now(1)
            if not taken:
                return None
            frame = taken[0]
            if frame.kind not in _QUIET:
                return frame
            if frame.kind == "live":
                self.live = True
            elif self.cursor is None:  # "resume": nothing is owed before it
                self.cursor = (frame.control or {})["from"]

    def subscribe(self) -> None:
        self.subscribed = True
        if self.head is None:
            self.head = self._next()
        if self.head is not None and not self.told:
            self.told = True
            self.ready(self)

    def unsubscribe(self) -> None:
        self.subscribed = False

    def resume(self, since: str) -> None:
        """Start again after cursor ``since`` (a read's ``cursor``): what follows it is
        read next, whatever was read since (a client resuming where it knows it was).
        ``INVALID_PAYLOAD``, changing nothing, for what is not a cursor of this Field."""
        _, problem = parse_cursor(since, self.hub.tag)
        if problem is not None:
            raise InvalidPayload(
                f"since: {problem}",
                suggested_action="Send the cursor of a read of this Field's resource, as it "
                "answered it.",
            )
        self.release()
        self.head = None
        self.ended = None
        self.cursor = since
        self.attach(since)

    async def _replayed(self) -> None:
        """Wait for the outbox's next frame (or its end)."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def read(self, limit: int, max_bytes: int, since: str | None = None) -> dict[str, Any]:
        """The next page: at most ``limit`` notifications and about ``max_bytes`` (after
        cursor ``since``, if given: :meth:`resume`)."""
        self.used = time.monotonic()
        async with self._reading:
            if since is not None:
                self.resume(since)
            return await self._read(limit, max_bytes)

    async def _read(self, limit: int, max_bytes: int) -> dict[str, Any]:
        if self.stale:
            self._restart()
        taken: list[Frame] = []
        size = 0
        while len(taken) < limit and self.ended is None:
            frame, self.head = self.head or self._next(), None
            if frame is None:
                connection = self.connection
                if self.live or connection is None or connection.ended is not None:
                    break
                await self._replayed()  # the stream still replays the log: its next frame
                continue
            if frame.kind == "overflow":  # the log has the rest: attach again, replay it
                self._restart()
                continue
            if frame.kind == "end":
                self.ended = frame.control
                self.release()
                break
            if taken and size + len(frame.body) > max_bytes:
                self.head = frame  # next time
                break
            taken.append(frame)
            size += len(frame.body)
            self.cursor = frame.cursor
        connection = self.connection
        if connection is not None and taken:
            await self.hub.pace(connection, len(taken))
        counts = self.hub.counts
        if counts is not None and taken:  # each notification's latency ends with the read
            counts.latency_of("mcp").sent(taken)
        self.told = False
        if self.head is None:
            self.head = self._next()
        more = self.head is not None or (self.ended is None and not self.live)
        if self.head is not None and self.subscribed:
            self.told = True
            self.ready(self)
        return {
            "subscription_id": self.subscription_id,
            "notifications": [orjson.loads(frame.body) for frame in taken],
            "more": more,
            "cursor": self.cursor,
            "ended": self.ended,
        }


# -- entity watches -----------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Watch:
    """A session's resources/subscribe on an entity resource."""

    uri: str
    key: tuple[str, str]
    ready: Callable[[Watch], None]
    #: ``ready`` was called since the session last read the resource
    told: bool = False


def watch_key(kind: str, ident: str | None, agent_id: str) -> tuple[str, str]:
    """The entity a watch on ``field://<kind>/<ident>`` is told about."""
    if kind == "agent":
        return "agent", agent_id
    assert ident is not None
    return _ENTITY_KIND[kind], ident


def _agents_of(entry: StoredEntry) -> list[str]:
    """The agents whose record an entry may change: its ``agent_id``, its ``agent``, and the
    assignee of its ``task`` (their current task)."""
    data = entry.data
    found = []
    for value in (
        data.get("agent_id") if entry.kind.startswith("agent.") else None,
        (data.get("agent") or {}).get("id") if isinstance(data.get("agent"), dict) else None,
        (data.get("task") or {}).get("assignee") if isinstance(data.get("task"), dict) else None,
    ):
        if isinstance(value, str):
            found.append(value)
    return found


@dataclass(slots=True)
class Watches:
    """Every session's entity watches, by entity; told of each batch the writer commits."""

    by_key: dict[tuple[str, str], set[Watch]] = field(default_factory=dict)

    def add(self, watch: Watch) -> None:
        self.by_key.setdefault(watch.key, set()).add(watch)

    def remove(self, watch: Watch) -> None:
        watches = self.by_key.get(watch.key)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self.by_key[watch.key]

    def published(self, entries: list[StoredEntry]) -> None:
        """Tell the watches of the entities these entries are about (a writer listener)."""
        if not self.by_key:
            return
        for entry in entries:
            keys: list[tuple[str, str]] = list(entities_of(entry.data))
            keys.extend(("agent", agent_id) for agent_id in _agents_of(entry))
            for key in keys:
                for watch in self.by_key.get(key, ()):
                    if not watch.told:
                        watch.told = True
                        watch.ready(watch)
