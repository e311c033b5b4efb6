"""Routing without I/O: from durable log entries to frames in bounded queues.

The :class:`Router` is the push hub's decisions and nothing else. It holds who
consumes what (connections, the streams bound to them, durable sinks asleep),
matches each batch of newly durable entries against every bound subscription at
once, runs each stream's debounce, encodes each event once and puts frames in the
connections' queues; it holds live notifications back while a stream replays, ends
a consumer that fell behind with the positions it can resume from, and follows the
subscriptions' lifecycle (created, cancelled, their agent deregistered).

It never waits, reads a clock or touches the event loop: time comes in as an
argument (:meth:`Router.flush` takes ``now``, a log timestamp) and whatever takes
time goes out to its :class:`Driver`: replaying a stream from the log, catching one
up, waking it at a debounce deadline, acting once the batch is answered. The asyncio
:class:`~field.engine.push.PushHub` is that driver; a test can be another, and run
the router with no event loop at all (``tests/test_router.py``).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import orjson

from ..contract.errors import Code, FieldError
from ..contract.model import StoredEntry
from ..core import visibility
from ..core.field import Field
from ..core.subscribe import EXPIRED
from ..subscriptions.events import FieldEvent, event_name, event_of
from ..subscriptions.matcher import Match, Matcher, Scope, reason_text
from ..subscriptions.stream import (
    Notification,
    Stream,
    encode_event,
    encode_notification,
    format_cursor,
    own_middle,
    shared_tail,
    subscription_prefix,
)
from .latency import Latency

logger = logging.getLogger("field.push")

#: ``Connection.ended`` of every connection when the server stops (close code, reason).
SHUTDOWN = (1001, "server shutting down")
#: ``Connection.ended`` of a connection whose cursor is ahead of every position this node
#: knows the shared log to hold (WebSocket's "try again later"): resume later, or elsewhere.
BEHIND = (1013, "this node has not reached the cursor yet: resume again")
#: Default of ``--max-push-per-agent``.
DEFAULT_MAX_PER_AGENT = 16

#: Connections that are the Field's own durable sinks (webhook, RAP) or console streams,
#: not an agent's sockets: neither counted against the agent's cap nor proof that the
#: agent is alive.
SINK_KINDS = frozenset({"webhook", "rap", "console"})
#: Matched events whose frames one step of :meth:`Router.offer_steps` queues.
OFFER_SLICE = 256

#: A notification's bytes from its reason to its ``folded`` count of 0, by (event name,
#: reason flags, requires_action): few (13 names, 7 flags, 2), so never trimmed.
_MIDDLES: dict[tuple[str, int, bool], bytes] = {}


def _middle(name: str, flags: int, requires_action: bool) -> bytes:
    key = (name, flags, requires_action)
    middle = _MIDDLES.get(key)
    if middle is None:
        middle = _MIDDLES[key] = own_middle(reason_text(name, flags), requires_action) + b"0"
    return middle


@dataclass(frozen=True, slots=True, kw_only=True)
class PushLimits:
    """Bounds of every push connection (``--outbox-frames``, ``--outbox-bytes``)."""

    outbox_frames: int = 10_000
    outbox_bytes: int = 8 << 20
    #: live notifications held back while a stream replays before it overflows
    replay_hold: int = 100_000


@dataclass(slots=True)
class Frame:
    """One encoded message and what the transport needs to label it (never changed
    once queued; not frozen: one is built per notification, and frozen costs 4x)."""

    body: bytes
    #: the event name (SSE ``event:``), or the control frame's type
    kind: str
    #: the notification's cursor (SSE ``id:``), None for control frames
    cursor: str | None = None
    #: the subscription this frame belongs to, if any
    subscription_id: str | None = None
    #: the notification's log position (``cursor`` is its wire form), None for control
    #: frames: a sink that keeps positions reads this, never parses the cursor back
    position: int | None = None
    #: a control frame's report (``body`` is its JSON): a sink that acts on one reads
    #: this, never decodes the body back; None for notifications
    control: dict[str, Any] | None = None
    #: the log time of the notification's entry (its commit), None for control frames:
    #: where its latency starts (:mod:`~field.engine.latency`); the position's entry
    #: says it, so two frames equal without it
    ts: float | None = field(default=None, compare=False)


class Queue(Protocol):
    """What the router needs of a connection's outbox: it puts, never waits."""

    def put(self, frame: Frame) -> bool:
        """Queue ``frame``; False (and the queue overflowed) if that would pass a bound."""

    def close_with(self, frame: Frame | None) -> None:
        """Queue a last control frame past the bounds and accept nothing more."""

    def room(self) -> int:
        """How many more frames fit."""


Q = TypeVar("Q", bound=Queue)


@dataclass(eq=False, slots=True)
class Connection(Generic[Q]):
    """One WebSocket, SSE or durable-sink consumer of one agent's subscriptions."""

    agent_id: str
    kind: str
    outbox: Q
    streams: dict[str, Binding[Q]] = field(default_factory=dict)
    #: close code and reason once the router has ended this connection
    ended: tuple[int, str] | None = None


@dataclass(eq=False, slots=True)
class Binding(Generic[Q]):
    """A subscription's stream bound to one connection."""

    stream: Stream
    connection: Connection[Q]
    #: live notifications held while the stream replays; None once live
    held: list[Notification] | None = None
    #: position of the last notification queued in the outbox
    queued: int = 0
    #: set when the subscription ended or the connection let go of it
    detached: bool = False
    #: the subscription's part of its notifications' bytes (:func:`subscription_prefix`)
    prefix: bytes = b""
    #: the log position where the subscription ended (it was cancelled), once it has:
    #: the stream owes what matched before it, then ends
    ending: int | None = None
    #: set while the stream catches up from the log after its agent ran out of filter
    #: time: live routing passes it by until it has caught up (:meth:`Driver.catch_up`)
    lagging: bool = False
    #: where it catches up from (the position before the first event it did not take)
    lag_after: int = 0

    @property
    def gone(self) -> bool:
        """Whether nothing more is to be queued for it (its connection ended, or it let
        go): a replay or a catch-up of it stops."""
        return self.connection.ended is not None or self.detached

    def target(self, until: int) -> int:
        """Where a replay of it up to ``until`` stops: just before its subscription's end,
        if that came first."""
        return until if self.ending is None else self.ending - 1


@dataclass(slots=True)
class PushCounts:
    """What the router and its connections did since start-up (``GET /metrics``): plain
    numbers, bumped where it happens and read at scrape time."""

    #: streams attached with a cursor, by (connection kind, whether it was honoured)
    resumes: Counter[tuple[str, bool]] = field(default_factory=Counter)
    #: connections ended for falling behind, by (connection kind, the bound reached)
    overflows: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: streams set aside because their agent used its share of filter time (they then
    #: catch up from the log), by connection kind
    set_aside: Counter[str] = field(default_factory=Counter)
    #: notifications written, by connection kind, then event name
    sent: dict[str, dict[str, int]] = field(default_factory=dict)
    #: seconds from each notification's commit to its write (to its receiver's answer,
    #: for a durable sink), by connection kind
    latency: dict[str, Latency] = field(default_factory=dict)

    def sender(self, kind: str) -> dict[str, int]:
        """The tally of notifications written to connections of ``kind``, by event."""
        return self.sent.setdefault(kind, {})

    def latency_of(self, kind: str) -> Latency:
        """The latency of notifications sent to connections of ``kind``."""
        latency = self.latency.get(kind)
        if latency is None:
            latency = self.latency[kind] = Latency()
        return latency


def count_notifications(frames: Iterable[Frame], sent: dict[str, int] | None) -> int:
    """How many of ``frames`` are notifications (they carry a cursor); each is added to
    ``sent`` by event name, if given (:meth:`PushCounts.sender`)."""
    if sent is None:
        return sum(frame.cursor is not None for frame in frames)
    notifications = 0
    for frame in frames:
        if frame.cursor is not None:
            notifications += 1
            sent[frame.kind] = sent.get(frame.kind, 0) + 1
    return notifications


class Sleeper(Protocol[Q]):
    """A durable sink the router matches while it holds no connection
    (:meth:`Router.sleep`)."""

    def awaken(self) -> Connection[Q] | None:
        """A connection for the stream the router binds now (None: the sink is gone)."""


class Presence(Protocol):
    """Told of an agent's push connections coming and going (liveness)."""

    def connected(self, agent_id: str) -> None: ...

    def disconnected(self, agent_id: str) -> None: ...


class Driver(Protocol[Q]):
    """What the router hands over because it takes time (the module's docstring)."""

    def replay(self, binding: Binding[Q], after: int, until: int) -> None:
        """Offer ``binding`` every event in (``after``, ``until``] from the log
        (:meth:`Router.offer_steps`), then release what it held and take it live
        (:meth:`Router.release`)."""

    def catch_up(self, binding: Binding[Q], after: int) -> None:
        """Offer a lagging ``binding`` every event after ``after`` from the log, as its
        agent's filter time allows, then take it live again (:meth:`Router.caught_up`)."""

    def schedule(self, deadline: float) -> None:
        """Call :meth:`Router.flush` no later than ``deadline`` (log time)."""

    def rescheduled(self, deadline: float | None) -> None:
        """The earliest debounce deadline after a flush (None: no window is open)."""

    def after_answers(self, callback: Callable[..., object], *args: object) -> None:
        """Call ``callback(*args)`` once the batch being routed has been answered."""

    def left(self, agent_id: str) -> None:
        """``agent_id`` deregistered: forget what is kept per agent (its pace)."""


class Router(Generic[Q]):
    """Routes committed entries to the streams attached to them (the module's docstring)."""

    def __init__(
        self,
        field: Callable[[], Field],
        driver: Driver[Q],
        limits: PushLimits | None = None,
        *,
        max_per_agent: int = DEFAULT_MAX_PER_AGENT,
        presence: Presence | None = None,
        counts: PushCounts | None = None,
    ) -> None:
        #: the Field as it is now (it is rebuilt after a failed append)
        self._field = field
        self.driver = driver
        self.limits = limits or PushLimits()
        #: most push connections (WebSocket and SSE together) one agent may hold
        self.max_per_agent = max_per_agent
        #: told of every connection and disconnection of an agent's sockets, if set
        self.presence = presence
        #: what the connections did, for ``GET /metrics``; None: not counted
        self.counts = counts
        self.connections: set[Connection[Q]] = set()
        #: each agent's connections (a few each: a list is the smallest)
        self.by_agent: dict[str, list[Connection[Q]]] = {}
        self.by_subscription: dict[str, list[Binding[Q]]] = {}
        #: bindings whose stream holds a debounce window open (what flush looks at)
        self.windowed: set[Binding[Q]] = set()
        #: the matcher's scope of the bound subscriptions' rows; None when bindings changed
        self.scope: Scope | None = None
        #: durable sinks that owe nothing and hold no connection, by subscription: matched
        #: like bound streams, and woken by a match or by their subscription's end
        self._dormant: dict[str, Sleeper[Q]] = {}
        #: the last log position routed (a batch's, as its routing starts)
        self.published = field().state.last_position

    @property
    def field(self) -> Field:
        return self._field()

    @property
    def tag(self) -> str:
        return self.field.field_tag

    # -- connections -----------------------------------------------------------

    def connect(self, agent_id: str, kind: str, outbox: Q) -> Connection[Q]:
        """A new push connection of ``agent_id`` queueing on ``outbox``;
        ``TOO_MANY_CONNECTIONS`` past the agent's cap (each may queue a full outbox)."""
        held = len(self.by_agent.get(agent_id, ()))
        if held >= self.max_per_agent:
            raise FieldError(
                f"the agent already holds {held} push connections, as many as the Field allows",
                code=Code.TOO_MANY_CONNECTIONS,
                recoverable=True,
                suggested_action="Close one first; one WebSocket carries all of an agent's "
                "subscriptions.",
            )
        connection = Connection(agent_id, kind, outbox)
        self.connections.add(connection)
        self.by_agent.setdefault(agent_id, []).append(connection)
        if self.presence is not None:
            self.presence.connected(agent_id)
        return connection

    def connect_sink(self, agent_id: str, kind: str, outbox: Q) -> Connection[Q]:
        """A durable sink's connection (``kind`` in :data:`SINK_KINDS`): its own small
        outbox, no cap, and it says nothing about the agent's liveness."""
        connection = Connection(agent_id, kind, outbox)
        self.connections.add(connection)
        return connection

    def sleep(self, subscription_id: str, sleeper: Sleeper[Q]) -> None:
        """Match ``subscription_id`` with no connection; the sleeper owes nothing up to
        :attr:`published`. The first event it matches (or its end) wakes it: it gets a
        connection from ``sleeper.awaken()`` with the stream bound live from there, as
        if it had been attached all along, and it is forgotten here."""
        self._dormant[subscription_id] = sleeper
        self.scope = None

    def is_dormant(self, subscription_id: str) -> bool:
        return subscription_id in self._dormant

    def unsleep(self, subscription_id: str) -> None:
        if self._dormant.pop(subscription_id, None) is not None:
            self.scope = None

    def _wake(self, subscription_id: str, after: int) -> None:
        """Bind a dormant subscription live from position ``after``: it was matched against
        everything before (and matched nothing), so nothing is read from the log."""
        sleeper = self._dormant.pop(subscription_id, None)
        if sleeper is None:
            return
        self.scope = None
        connection = sleeper.awaken()
        if connection is None:
            return
        subscription = self.field.state.subscriptions[subscription_id]
        binding = self.bind(connection, subscription, after, replaying=False)
        binding.ending = subscription.get("ended_position")

    def disconnect(self, connection: Connection[Q]) -> None:
        if (
            connection in self.connections
            and self.presence is not None
            and connection.kind not in SINK_KINDS
        ):
            self.presence.disconnected(connection.agent_id)
        self.connections.discard(connection)
        same_agent = self.by_agent.get(connection.agent_id)
        if same_agent is not None and connection in same_agent:
            same_agent.remove(connection)
            if not same_agent:
                del self.by_agent[connection.agent_id]
        for subscription_id, binding in list(connection.streams.items()):
            self._unbind(subscription_id, binding)
        connection.streams.clear()

    def _unbind(self, subscription_id: str, binding: Binding[Q]) -> None:
        binding.detached = True
        self.windowed.discard(binding)
        bindings = self.by_subscription.get(subscription_id, [])
        if binding in bindings:
            bindings.remove(binding)
        if not bindings:
            self.by_subscription.pop(subscription_id, None)
            self.scope = None
            self.field.filters.unlag(subscription_id)

    def end(self, connection: Connection[Q], code: int, reason: str, frame: Frame | None) -> None:
        """Close a connection from the router's side, after what is queued and ``frame``."""
        if connection.ended is None:
            connection.ended = (code, reason)
            connection.outbox.close_with(frame)

    def end_all(self) -> None:
        """End every connection: the server is stopping."""
        for connection in list(self.connections):
            self.end(connection, *SHUTDOWN, None)

    # -- streams -----------------------------------------------------------------

    def attach(
        self,
        connection: Connection[Q],
        subscription_id: str,
        after: int | None,
        *,
        problem: str | None = None,
        head: int | None = None,
    ) -> None:
        """Start streaming a subscription to a connection.

        With ``after`` None (and no ``problem``) the stream starts live at the end of the
        log. Else everything the subscription owes after that log position is replayed
        first (by the driver, paced by the outbox). A position the Field cannot honour
        (a ``problem`` with the cursor it came as, or ahead of the log) starts the stream
        live and says why (``recovered: false``). The connection gets a ``resume`` frame
        first and a ``live`` frame where replay ends and live notifications begin.

        ``head``: on a log other nodes append to, the newest position it is known to
        hold (None: only this node appends). A cursor ahead of what this node applied
        came from a node further on: up to ``head`` the stream starts live from it (what
        this node applies up to it is not notified again); past ``head`` this node cannot
        tell it from a cursor of a lost log, and ends the connection with
        :data:`BEHIND`, for the client to resume later or on another node.
        """
        if connection.ended is not None:
            return  # an ended connection takes no stream (an earlier one sent it back)
        subscription = self.field.state.subscriptions[subscription_id]
        last = self.field.state.last_position
        report: dict[str, Any] = {"subscription_id": subscription_id, "recovered": True}
        resumed = after is not None or problem is not None
        if after is not None and after > last and head is not None:
            if after > head:
                self.end(connection, *BEHIND, None)
                return
            last = after  # the stream starts here: nothing before it is owed
        if after is not None and after > last:
            shown = format_cursor(self.tag, after)
            problem = f"cursor {shown!r} is ahead of this Field's log (at {last})"
        if problem is not None or after is None:
            if problem is not None:
                report.update(recovered=False, reason=problem)
            after = last
        if resumed and self.counts is not None:
            self.counts.resumes[(connection.kind, report["recovered"])] += 1
        ending = subscription.get("ended_position")
        until = last if ending is None else min(last, ending - 1)
        binding = self.bind(connection, subscription, after, replaying=after < until)
        binding.ending = ending
        if subscription_id in self.field.filters.lagging:
            # its other streams catch up from the log, and live events are set aside for
            # them: this one reads from the log too once it is where they would take it
            binding.lagging, binding.lag_after = True, until
            if binding.held is None:
                self.driver.catch_up(binding, until)
        report["from"] = format_cursor(self.tag, after)
        self._control(connection, "resume", report, subscription_id)
        if binding.held is None and ending is not None:
            self.end_stream(binding)
        elif binding.held is None:
            self.went_live(binding, 0)
        else:
            self.driver.replay(binding, after, until)

    def bind(
        self,
        connection: Connection[Q],
        subscription: dict[str, Any],
        after: int,
        *,
        replaying: bool,
    ) -> Binding[Q]:
        """A stream of ``subscription`` from position ``after``, routed to ``connection``."""
        stream = Stream(subscription["id"], window_ms=subscription["debounce_ms"], after=after)
        binding = Binding(
            stream,
            connection,
            held=[] if replaying else None,
            queued=after,
            prefix=subscription_prefix(subscription["id"]),
        )
        connection.streams[subscription["id"]] = binding
        bindings = self.by_subscription.setdefault(subscription["id"], [])
        if not bindings:
            self.scope = None
        bindings.append(binding)
        return binding

    def went_live(self, binding: Binding[Q], replayed: int) -> None:
        report = {
            "subscription_id": binding.stream.subscription_id,
            "replayed": replayed,
            "cursor": format_cursor(self.tag, binding.queued),
        }
        self._control(binding.connection, "live", report, binding.stream.subscription_id)

    def _control(
        self, connection: Connection[Q], kind: str, data: dict[str, Any], subscription_id: str
    ) -> None:
        frame = Frame(orjson.dumps(data), kind, None, subscription_id, control=data)
        if not connection.outbox.put(frame):
            self.overflow(connection)

    def detach(self, connection: Connection[Q], subscription_id: str, reason: str) -> None:
        binding = connection.streams.pop(subscription_id, None)
        if binding is None:
            return
        self._unbind(subscription_id, binding)
        report = {
            "subscription_id": subscription_id,
            "reason": reason,
            "cursor": format_cursor(self.tag, binding.queued),
        }
        self._control(connection, "end", report, subscription_id)

    def release(self, binding: Binding[Q]) -> bool:
        """A replay of ``binding`` is done: if its subscription ended meanwhile, end the
        stream (what was held is in what was replayed) and return False; else offer it
        what was held back meanwhile and return True (it goes live once it has caught
        up, if it must: :meth:`take_live`)."""
        if binding.ending is not None:
            binding.held = None
            self.end_stream(binding)
            return False
        held, binding.held = binding.held or [], None
        for notification in held:
            self.offer(binding, notification)
        return True

    def take_live(self, binding: Binding[Q], replayed: int, now: float | None) -> None:
        """After its replay: deliver a debounce window that ended by ``now`` (None: the
        writer is busy, and entries in flight may still belong to it), then go live."""
        if now is not None:
            replayed += self.deliver(binding, binding.stream.advance(now))
        self.went_live(binding, replayed)
        self._schedule(binding.stream.deadline)

    def caught_up(self, binding: Binding[Q]) -> None:
        """A lagging stream has read the log up to where live routing is: it takes live
        events again (or ends, if its subscription ended meanwhile)."""
        binding.lagging = False
        self.field.filters.unlag(binding.stream.subscription_id)
        self.scope = None
        if binding.ending is not None:
            self.end_stream(binding)
        else:
            self._schedule(binding.stream.deadline)

    def offer_entries(
        self,
        binding: Binding[Q],
        entries: list[StoredEntry],
        rows: np.ndarray,
        names: frozenset[str] | None = None,
    ) -> int:
        """Offer one page read from the log to ``binding``'s stream (rows: its registry
        row), all at once (:meth:`offer_steps`); returns how many notifications it
        queued."""
        return sum(self.offer_steps(binding, entries, rows, names, queue=len(entries)))

    def offer_steps(
        self,
        binding: Binding[Q],
        entries: list[StoredEntry],
        rows: np.ndarray,
        names: frozenset[str] | None = None,
        *,
        queue: int | None = None,
    ) -> Iterator[int]:
        """Offer one page read from the log to ``binding``'s stream, in steps.

        Only entries of the ``names`` the subscription lists become events. The
        first step matches them all at once (one product for the page costs less
        per event than many small ones); each next step queues the frames of up to
        ``queue`` matched events, so that whoever takes the steps can let the loop
        run between them (None: :data:`OFFER_SLICE`). Each step yields how many
        notifications it queued. The stream's debounce clock advances past the page
        with the last step; a stream whose connection overflowed takes no more steps.
        """
        units = self.field.state.known_units
        events = []
        for entry in entries:
            if names is None or event_name(entry.kind) in names:
                event = event_of(entry, units)
                if event is not None:
                    events.append(event)
        # a replay is bounded by the stream's end: its row counts even once cancelled
        matches = self.matcher().match(events, only=rows, inactive=True)
        yield 0
        stream = binding.stream
        queue = max(1, queue or OFFER_SLICE)
        for first in range(0, len(matches), queue):
            some = matches[first : first + queue]
            delivered = 0
            if not stream.window_ms:  # no debounce: straight to frames
                tag = self.tag
                for match in some:  # one row: this stream's
                    event = match.event
                    cursor = format_cursor(tag, event.position)
                    tail = shared_tail(encode_event(event, cursor))
                    relevance, flags = float(match.relevance[0]), int(match.flags[0])
                    action = bool(match.requires_action[0])
                    if self._direct(binding, event, cursor, tail, relevance, flags, action):
                        delivered += 1
                    elif binding.connection.ended is not None:  # overflowed
                        yield delivered
                        return
            else:
                for match in some:
                    position = match.event.position
                    shared = encode_event(match.event, format_cursor(self.tag, position))
                    for notification in self._notifications(match, shared):
                        delivered += self.offer(binding, notification)
            yield delivered
        if entries:
            yield self.deliver(binding, stream.advance(entries[-1].ts))

    def _direct(
        self,
        binding: Binding[Q],
        event: FieldEvent,
        cursor: str,
        tail: bytes,
        relevance: float,
        flags: int,
        requires_action: bool,
    ) -> bool:
        """Queue one notification to a stream without debounce, encoded at once.

        The frame :meth:`deliver` would queue for what :meth:`Stream.offer`
        returns for the :class:`Notification`, with no objects in between
        (``tail``: :func:`shared_tail` of the event's shared part). False
        when it was not queued: already delivered, or the outbox overflowed.
        """
        stream = binding.stream
        position = event.position
        if position <= stream.after:
            return False
        body = b"".join(
            (
                binding.prefix,
                orjson.dumps(round(relevance, 6)),
                _middle(event.name, flags, requires_action),
                tail,
            )
        )
        if not binding.connection.outbox.put(
            # positional: a keyword argument makes the frame 1.7x as costly to build
            Frame(body, event.name, cursor, stream.subscription_id, position, None, event.ts)
        ):
            self.overflow(binding.connection)
            return False
        stream.after = binding.queued = position
        return True

    def matcher(self, *, live: bool = False) -> Matcher:
        """A matcher over the Field as it is, telling events only to their audience.

        ``live``: for newly written events, whose filters an agent out of filter time
        does not run (:class:`~field.subscriptions.filtering.FilterStage`): the streams of
        those subscriptions then catch up from the log (:meth:`_set_aside`)."""
        state = self.field.state
        filters = self.field.filters
        return Matcher(
            state.registry,
            state.index,
            state.known_units,
            # with no session, every event's audience is everyone
            audience=functools.partial(visibility.event_audience, state)
            if state.sessions
            else None,
            screen=functools.partial(filters.screen, defer=True) if live else filters.screen,
        )

    def _set_aside(self, deferred: dict[str, int], before: int) -> None:
        """The subscriptions whose filters were not run for newly written events (their
        agent used its share of filter time), the batch starting after ``before``: each
        of their streams stops taking live notifications and reads the log from
        ``before`` on instead, on the same connection, at the pace its agent's filter time
        allows, until it has caught up (a dormant one is woken to do the same)."""
        for subscription_id in deferred:
            # its live events are set aside (not evaluated) until one of its streams is back
            self.field.filters.lag(subscription_id)
            self.scope = None  # its rows are no longer matched live
            if subscription_id in self._dormant:
                self._wake(subscription_id, before)
            for binding in self.by_subscription.get(subscription_id, ()):
                if binding.lagging or binding.connection.ended is not None:
                    continue
                binding.lagging = True
                binding.lag_after = before
                if self.counts is not None:
                    self.counts.set_aside[binding.connection.kind] += 1
                if binding.held is not None:
                    continue  # replaying: it catches up once its replay is done
                self.driver.catch_up(binding, before)

    # -- live --------------------------------------------------------------------

    def route(self, entries: list[StoredEntry]) -> Iterator[None]:
        """Route a batch of newly durable entries, one event's notifications a step."""
        self.published = entries[-1].position
        ended = self._lifecycle(entries)
        if not self.by_subscription and not self._dormant:
            return
        events = self._events(entries)
        if events:
            matcher = self.matcher(live=True)
            scope = self._live_scope(matcher)
            prepared = False
            for _ in matcher.prepare(events, scope):  # a new checkpoint's scales, in steps
                prepared = True
                yield
            if prepared:  # the Field went on meanwhile
                matcher = self.matcher(live=True)
                scope = self._live_scope(matcher)
            matches = matcher.match(events, scope=scope)
            deferred = self.field.filters.take_deferred()
            if deferred:  # before anything of the batch reaches their streams
                self._set_aside(deferred, entries[0].position - 1)
            for match in matches:
                self._route(match)
                yield
        for subscription_id, position in ended.items():
            self._wake(subscription_id, entries[0].position - 1)  # a dormant one owes its end
            self._finish(subscription_id, position, entries)
        self.flush(entries[-1].ts)

    def _live_scope(self, matcher: Matcher) -> Scope:
        """The scope live events are matched against (kept while it fits the registry):
        the rows of the subscriptions with a stream taking live events, or dormant."""
        scope = self.scope
        if scope is None or not scope.fits(matcher.registry):
            state = self.field.state
            # streams catching up read from the log: their rows are not matched live
            rows = [
                state.registry_row(sid)
                for sid, bindings in self.by_subscription.items()
                if not all(binding.lagging for binding in bindings)
            ]
            rows.extend(state.registry_row(sid) for sid in self._dormant)  # some in both
            scope = self.scope = matcher.scope(np.unique(np.array(rows, dtype=np.intp)))
        return scope

    def _route(self, match: Match) -> None:
        shared = tail = b""
        cursor = ""
        event = match.event
        ids = self.field.state.registry.ids
        by_subscription = self.by_subscription
        relevance = match.relevance.tolist()
        flags = match.flags.tolist()
        actions = match.requires_action.tolist()
        dormant = self._dormant
        for i, row in enumerate(match.rows.tolist()):
            if dormant and ids[row] in dormant:
                self._wake(ids[row], event.position - 1)
            bindings = by_subscription.get(ids[row])
            if not bindings:
                continue
            if not shared:  # encoded once per event, for every subscriber
                cursor = format_cursor(self.tag, event.position)
                shared = encode_event(event, cursor)
                tail = shared_tail(shared)
            for binding in bindings:
                if binding.lagging:  # it reads this from the log
                    continue
                if binding.held is None and not binding.stream.window_ms:
                    self._direct(binding, event, cursor, tail, relevance[i], flags[i], actions[i])
                    continue
                notification = self._notification(match, i, ids[row], shared)
                if binding.held is not None:
                    self._hold(binding, notification)
                else:
                    self.offer(binding, notification)
                    self._schedule(binding.stream.deadline)

    def _hold(self, binding: Binding[Q], notification: Notification) -> None:
        assert binding.held is not None
        if len(binding.held) >= self.limits.replay_hold:
            self.overflow(binding.connection)
            return
        binding.held.append(notification)

    def flush(self, now: float) -> None:
        """Deliver every debounce window that has ended by ``now`` (log time)."""
        soonest: float | None = None
        for binding in list(self.windowed):
            if binding.held is None and not binding.lagging:
                self.deliver(binding, binding.stream.advance(now))
            deadline = binding.stream.deadline
            if deadline is None:
                self.windowed.discard(binding)
            elif soonest is None or deadline < soonest:
                soonest = deadline
        self.driver.rescheduled(soonest)

    def _schedule(self, deadline: float | None) -> None:
        if deadline is not None:
            self.driver.schedule(deadline)

    # -- shared steps --------------------------------------------------------------

    def _events(self, entries: list[StoredEntry]) -> list[FieldEvent]:
        units = self.field.state.known_units
        return [e for e in (event_of(entry, units) for entry in entries) if e is not None]

    def _notifications(self, match: Match, shared: bytes) -> Iterator[Notification]:
        ids = self.field.state.registry.ids
        for i, row in enumerate(match.rows.tolist()):
            yield self._notification(match, i, ids[row], shared)

    @staticmethod
    def _notification(match: Match, i: int, subscription_id: str, shared: bytes) -> Notification:
        return Notification(
            subscription_id,
            match.event,
            float(match.relevance[i]),
            match.reason(i),
            bool(match.requires_action[i]),
            shared=shared,
        )

    def offer(self, binding: Binding[Q], notification: Notification) -> int:
        """Offer a notification to a debounced (or replaying) stream; queue what is due."""
        delivered = self.deliver(binding, binding.stream.offer(notification))
        if binding.stream.deadline is not None and not binding.detached:
            self.windowed.add(binding)
        return delivered

    def deliver(self, binding: Binding[Q], notifications: list[Notification]) -> int:
        """Queue ``notifications`` (due from the stream) on the binding's connection."""
        connection = binding.connection
        for notification in notifications:
            frame = Frame(
                encode_notification(notification),
                notification.event.name,
                format_cursor(self.tag, notification.position),
                notification.subscription_id,
                notification.position,
                None,
                notification.event.ts,
            )
            if not connection.outbox.put(frame):
                self.overflow(connection)
                return 0
            binding.queued = notification.position
        return len(notifications)

    def overflow(
        self,
        connection: Connection[Q],
        why: str = "outbox overflow",
        detail: str = "the consumer fell too far behind",
    ) -> None:
        """The consumer fell too far behind: close it with the cursors to resume from.

        ``why`` is the close reason (the bound reached: the outbox, or for a
        WebSocket ``send timed out`` or ``keepalive ping timeout``), ``why: detail``
        the ``overflow`` frame's.
        """
        if connection.ended is not None:
            return
        cursors = {
            sid: format_cursor(self.tag, binding.queued)
            for sid, binding in connection.streams.items()
        }
        report = {"reason": f"{why}: {detail}", "cursors": cursors}
        if self.counts is not None:
            self.counts.overflows[(connection.kind, why)] += 1
        logger.warning(
            "closing a slow %s consumer of agent %s (%s)",
            connection.kind,
            connection.agent_id,
            why,
        )
        self.end(connection, 4008, why, Frame(orjson.dumps(report), "overflow", control=report))
        self.disconnect(connection)

    def _lifecycle(self, entries: list[StoredEntry]) -> dict[str, int]:
        """Attach new subscriptions to their agent's sockets; return the subscriptions the
        batch ended (cancelled, or their agent deregistered) with where they ended."""
        ended: dict[str, int] = {}
        subscriptions = self.field.state.subscriptions
        for entry in entries:
            if entry.kind == "subscription.created":
                subscription = entry.data["subscription"]
                for connection in list(self.by_agent.get(subscription["agent_id"], ())):
                    if connection.kind == "ws":
                        self.bind(connection, subscription, entry.position, replaying=False)
            elif entry.kind == "subscription.cancelled":
                ended[entry.data["subscription_id"]] = entry.position
            elif entry.kind == "agent.deregistered":
                agent_id = entry.data["agent_id"]
                self.driver.left(agent_id)
                for subscription_id in [*self.by_subscription, *self._dormant]:
                    subscription = subscriptions[subscription_id]
                    if (
                        subscription["agent_id"] == agent_id
                        and subscription.get("ended_position") == entry.position
                    ):
                        ended[subscription_id] = entry.position
                # after its streams have ended and the DEREGISTER response is queued
                for connection in list(self.by_agent.get(agent_id, ())):
                    self.driver.after_answers(
                        self.end, connection, 4409, "agent deregistered", None
                    )
        return ended

    def _finish(self, subscription_id: str, ended: int, entries: list[StoredEntry]) -> None:
        """End the streams of a subscription that ended at position ``ended``.

        Its row was cancelled before this batch was published, so what the batch
        held for it before ``ended`` is matched here (as a replay would), then its
        last debounce window is delivered and its ``end`` queued. A stream still
        replaying goes on to ``ended`` itself.
        """
        bindings = list(self.by_subscription.get(subscription_id, ()))
        if not bindings:
            return
        state = self.field.state
        row = np.array([state.registry_row(subscription_id)])
        names = frozenset(state.subscriptions[subscription_id]["events"])
        before = [e for e in entries if e.position < ended]
        for binding in bindings:
            binding.ending = ended
            if binding.held is not None or binding.lagging:
                continue  # it reads up to its end from the log, then ends
            if before:
                self.offer_entries(binding, before, row, names)
            if binding.connection.ended is None:
                self.end_stream(binding)

    def _ended_because(self, binding: Binding[Q]) -> str:
        """The ``end`` frame's reason: the subscription expired, or it was cancelled."""
        subscription = self.field.state.subscriptions.get(binding.stream.subscription_id, {})
        expired = (subscription.get("cancel_reason") or "").startswith(EXPIRED)
        return "subscription expired" if expired else "subscription cancelled"

    def end_stream(self, binding: Binding[Q]) -> None:
        """Deliver a stream's open debounce window, then its ``end`` (its subscription
        ended: expired, or cancelled)."""
        stream = binding.stream
        if stream.window_ms:
            self.deliver(binding, stream.advance(math.inf))
        self.detach(binding.connection, stream.subscription_id, self._ended_because(binding))

    # -- what the console shows ----------------------------------------------------

    def stream_states(self) -> Iterator[tuple[str, Connection[Q], bool]]:
        """Every stream bound now: its subscription id, the connection it is queued on,
        and whether it is still replaying (live notifications held back meanwhile)."""
        for subscription_id, bindings in self.by_subscription.items():
            for binding in bindings:
                yield subscription_id, binding.connection, binding.held is not None
