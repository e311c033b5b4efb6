"""The push hub: from durable log entries to frames in connection outboxes.

The single writer calls :meth:`PushHub.publish` with every batch of
entries right after they are durable. The hub turns them into events,
matches each batch against every subscription at once, runs each
attached stream's debounce, encodes each event once, and queues frames
in the outboxes of the connections that consume those subscriptions.
It never awaits on that path, so a slow consumer cannot slow the writer:
its outbox fills, overflows, and the connection is closed with the
cursors it can resume from.

Attaching a stream with a cursor replays the subscription's stream from
the log (in a worker thread) while live notifications for it are held
back; the held ones follow the replay, so the seam has no gap and no
duplicate.

Notifications are also paced per agent (``--notify-rate``): a socket's sender
waits in :meth:`PushHub.pace` for its agent's tokens before it writes the next
batch. Nothing is dropped meanwhile: frames wait in the connection's outbox,
and one that overflows ends with the cursors to resume from, as for any slow
consumer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from ..contract.errors import Code, FieldError
from ..contract.model import StoredEntry
from ..contract.ratelimit import KeyedLimiter, Rate
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
    parse_cursor,
    shared_tail,
    subscription_prefix,
)
from .listeners import Stage
from .liveness import Liveness
from .outbox import Frame, Outbox, PushLimits, Waker
from .service import FieldService

if TYPE_CHECKING:
    pass

logger = logging.getLogger("field.push")

#: A notification's bytes from its reason to its ``folded`` count of 0, by (event name,
#: reason flags, requires_action): few (13 names, 7 flags, 2), so never trimmed.
_MIDDLES: dict[tuple[str, int, bool], bytes] = {}


def _middle(name: str, flags: int, requires_action: bool) -> bytes:
    key = (name, flags, requires_action)
    middle = _MIDDLES.get(key)
    if middle is None:
        middle = _MIDDLES[key] = own_middle(reason_text(name, flags), requires_action) + b"0"
    return middle


REPLAY_PAGE = 2000
#: Longest a replay waiting for its agent's filter time sleeps before looking again.
FILTER_TIME_POLL = 0.05
#: ``Connection.ended`` of every connection when the server stops (close code, reason).
SHUTDOWN = (1001, "server shutting down")
#: Default of ``--max-push-per-agent``.
DEFAULT_MAX_PER_AGENT = 16


#: Connections that are the Field's own durable sinks (webhook, RAP) or console streams
#: (:mod:`.console`), not an agent's sockets: neither counted against the agent's cap nor
#: proof that the agent is alive.
SINK_KINDS = frozenset({"webhook", "rap", "console"})


@dataclass(eq=False, slots=True)
class Connection:
    """One WebSocket, SSE or durable-sink consumer of one agent's subscriptions."""

    agent_id: str
    kind: str
    outbox: Outbox
    streams: dict[str, _Binding] = field(default_factory=dict)
    #: close code and reason once the hub has ended this connection
    ended: tuple[int, str] | None = None


@dataclass(slots=True)
class PushCounts:
    """What the hub and its connections did since start-up (``GET /metrics``): plain
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

    def sender(self, kind: str) -> dict[str, int]:
        """The tally of notifications written to connections of ``kind``, by event."""
        return self.sent.setdefault(kind, {})


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


class Sleeper(Protocol):
    """A durable sink the hub matches while it holds no connection (:meth:`PushHub.sleep`)."""

    def awaken(self) -> Connection | None:
        """A connection for the stream the hub binds now (None: the sink is gone)."""


@dataclass(eq=False, slots=True)
class _Binding:
    stream: Stream
    connection: Connection
    #: live notifications held while the stream replays; None once live
    held: list[Notification] | None = None
    #: cursor of the last notification queued in the outbox
    queued: int = 0
    #: set when the subscription ended or the connection let go of it
    detached: bool = False
    #: the subscription's part of its notifications' bytes (:func:`subscription_prefix`)
    prefix: bytes = b""
    #: the log position where the subscription ended (it was cancelled), once it has:
    #: the stream owes what matched before it, then ends
    ending: int | None = None
    #: set while the stream catches up from the log after its agent ran out of filter
    #: time: live routing passes it by until it has caught up (:meth:`PushHub._catch_up`)
    lagging: bool = False
    #: where it catches up from (the position before the first event it did not take)
    lag_after: int = 0


class PushHub:
    """Routes committed entries to the streams attached to them."""

    def __init__(
        self,
        service: FieldService,
        limits: PushLimits | None = None,
        *,
        max_per_agent: int = DEFAULT_MAX_PER_AGENT,
        notify_rate: Rate | None = None,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.service = service
        self.limits = limits or PushLimits()
        #: most push connections (WebSocket and SSE together) one agent may hold
        self.max_per_agent = max_per_agent
        self.connections: set[Connection] = set()
        #: each agent's connections (a few each: a list is the smallest)
        self._by_agent: dict[str, list[Connection]] = {}
        self._by_subscription: dict[str, list[_Binding]] = {}
        #: bindings whose stream holds a debounce window open (what flush_due looks at)
        self._windowed: set[_Binding] = set()
        #: the matcher's scope of the bound subscriptions' rows; None when bindings changed
        self._scope: Scope | None = None
        #: durable sinks that owe nothing and hold no connection, by subscription: matched
        #: like bound streams, and woken by a match or by their subscription's end
        self._dormant: dict[str, Sleeper] = {}
        #: the last log position routed (a batch's, as its routing starts)
        self.published = service.field.state.last_position
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: the steps of the batch being routed, if one is under way
        self._publishing: Iterator[None] | None = None
        #: wakes the connections' senders a few per turn of the loop after a fan-out
        self.waker = Waker()
        #: told of every connection and disconnection, if set
        self.liveness: Liveness | None = None
        #: notifications each agent's push connections are written, all together
        #: (:meth:`pace`); None: not limited
        self.notifications = None if notify_rate is None else KeyedLimiter(notify_rate, clock=clock)
        #: how :meth:`pace` waits (a test's fake clock advances in it)
        self._pause = pause
        #: what the connections did, for ``GET /metrics``; None: not counted (--no-metrics)
        self.counts: PushCounts | None = None
        service.listeners.add(self.publish, Stage.ROUTING)

    @property
    def field(self) -> Field:
        return self.service.field

    @property
    def tag(self) -> str:
        return self.field.field_tag

    # -- connections -----------------------------------------------------------

    def connect(self, agent_id: str, kind: str) -> Connection:
        """A new push connection of ``agent_id``; ``TOO_MANY_CONNECTIONS`` past the
        agent's cap (each connection may queue a full outbox)."""
        held = len(self._by_agent.get(agent_id, ()))
        if held >= self.max_per_agent:
            raise FieldError(
                f"the agent already holds {held} push connections, as many as the Field allows",
                code=Code.TOO_MANY_CONNECTIONS,
                recoverable=True,
                suggested_action="Close one first; one WebSocket carries all of an agent's "
                "subscriptions.",
            )
        outbox = Outbox(
            max_frames=self.limits.outbox_frames,
            max_bytes=self.limits.outbox_bytes,
            waker=self.waker,
        )
        connection = Connection(agent_id, kind, outbox)
        self.connections.add(connection)
        self._by_agent.setdefault(agent_id, []).append(connection)
        if self.liveness is not None:
            self.liveness.connected(agent_id)
        return connection

    def connect_sink(self, agent_id: str, kind: str, outbox: Outbox) -> Connection:
        """A durable sink's connection (``kind`` in :data:`SINK_KINDS`): its own small
        outbox, no cap, and it says nothing about the agent's liveness."""
        connection = Connection(agent_id, kind, outbox)
        self.connections.add(connection)
        return connection

    def batch_size(self, most: int) -> int:
        """Most frames a sender writes at once: ``most``, and no more than the burst of the
        notification bucket, so that :meth:`pace` spreads a long queue out at the rate
        instead of letting it out in lumps of ``most``."""
        if self.notifications is None:
            return most
        return max(1, min(most, int(self.notifications.rate.burst)))

    async def pace(self, connection: Connection, frames: int) -> None:
        """Wait until ``connection``'s agent may be written ``frames`` more notifications.

        The bucket is the agent's, shared by all its push connections. The sender
        calls this before it writes a batch, so notifications wait in the outbox
        (bounded; overflow ends the connection with cursors) and are never dropped.
        A durable sink is not paced here (a delivery has its own ``delivery_rate``),
        and neither is a connection that has ended: nothing more is queued on it, and
        what is left is sent at once (the client may be gone).
        """
        limiter = self.notifications
        if limiter is None or connection.kind in SINK_KINDS:
            return
        burst = int(limiter.rate.burst)
        while frames > 0 and connection.ended is None:
            cost = min(frames, burst)
            wait = limiter.take(connection.agent_id, cost)
            if wait:
                await self._pause(wait)
            else:
                frames -= cost

    def sleep(self, subscription_id: str, sleeper: Sleeper) -> None:
        """Match ``subscription_id`` with no connection; the sleeper owes nothing up to
        :attr:`published`. The first event it matches (or its end) wakes it: it gets a
        connection from ``sleeper.awaken()`` with the stream bound live from there, as
        if it had been attached all along, and it is forgotten here."""
        self._dormant[subscription_id] = sleeper
        self._scope = None

    def is_dormant(self, subscription_id: str) -> bool:
        return subscription_id in self._dormant

    def unsleep(self, subscription_id: str) -> None:
        if self._dormant.pop(subscription_id, None) is not None:
            self._scope = None

    def _wake(self, subscription_id: str, after: int) -> None:
        """Bind a dormant subscription live from position ``after``: it was matched against
        everything before (and matched nothing), so nothing is read from the log."""
        sleeper = self._dormant.pop(subscription_id, None)
        if sleeper is None:
            return
        self._scope = None
        connection = sleeper.awaken()
        if connection is None:
            return
        subscription = self.field.state.subscriptions[subscription_id]
        binding = self._bind(connection, subscription, after, replaying=False)
        binding.ending = subscription.get("ended_position")

    def disconnect(self, connection: Connection) -> None:
        if (
            connection in self.connections
            and self.liveness is not None
            and connection.kind not in SINK_KINDS
        ):
            self.liveness.disconnected(connection.agent_id)
        self.connections.discard(connection)
        same_agent = self._by_agent.get(connection.agent_id)
        if same_agent is not None and connection in same_agent:
            same_agent.remove(connection)
            if not same_agent:
                del self._by_agent[connection.agent_id]
        for subscription_id, binding in list(connection.streams.items()):
            self._unbind(subscription_id, binding)
        connection.streams.clear()

    def _unbind(self, subscription_id: str, binding: _Binding) -> None:
        binding.detached = True
        self._windowed.discard(binding)
        bindings = self._by_subscription.get(subscription_id, [])
        if binding in bindings:
            bindings.remove(binding)
        if not bindings:
            self._by_subscription.pop(subscription_id, None)
            self._scope = None
            self.field.filters.unlag(subscription_id)

    def end(self, connection: Connection, code: int, reason: str, frame: Frame | None) -> None:
        """Close a connection from the hub's side, after what is queued and ``frame``."""
        if connection.ended is None:
            connection.ended = (code, reason)
            connection.outbox.close_with(frame)

    def shutdown(self) -> None:
        """End every connection (the server is stopping) and cancel replays."""
        for connection in list(self.connections):
            self.end(connection, *SHUTDOWN, None)
        for task in list(self._tasks):
            task.cancel()
        if self._timer is not None:
            self._timer.cancel()

    def attach(self, connection: Connection, subscription_id: str, since: str | None) -> None:
        """Start streaming a subscription to a connection, from the cursor a client sent
        (its wire form: see :meth:`attach_at`)."""
        if since is None:
            self.attach_at(connection, subscription_id, None)
            return
        position, problem = parse_cursor(since, self.tag)
        self.attach_at(connection, subscription_id, position, problem=problem)

    def attach_at(
        self,
        connection: Connection,
        subscription_id: str,
        after: int | None,
        *,
        problem: str | None = None,
    ) -> None:
        """Start streaming a subscription to a connection.

        With ``after`` None (and no ``problem``) the stream starts live at the end of the
        log. Else everything the subscription owes after that log position is replayed
        first (in a task, paced by the outbox). A position the Field cannot honour (a
        ``problem`` with the cursor it came as, or ahead of the log) starts the stream
        live and says why (``recovered: false``). The connection gets a ``resume`` frame
        first and a ``live`` frame where replay ends and live notifications begin.
        """
        subscription = self.field.state.subscriptions[subscription_id]
        last = self.field.state.last_position
        report: dict[str, Any] = {"subscription_id": subscription_id, "recovered": True}
        resumed = after is not None or problem is not None
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
        binding = self._bind(connection, subscription, after, replaying=after < until)
        binding.ending = ending
        if subscription_id in self.field.filters.lagging:
            # its other streams catch up from the log, and live events are set aside for
            # them: this one reads from the log too once it is where they would take it
            binding.lagging, binding.lag_after = True, until
            if binding.held is None:
                self._spawn(self._catch_up(binding, until))
        report["from"] = format_cursor(self.tag, after)
        self._control(connection, "resume", report, subscription_id)
        if binding.held is None and ending is not None:
            self._end_stream(binding, self._ended_because(binding))
        elif binding.held is None:
            self._went_live(binding, 0)
        else:
            task = asyncio.create_task(self._replay(binding, after, until))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _bind(
        self, connection: Connection, subscription: dict[str, Any], after: int, *, replaying: bool
    ) -> _Binding:
        """A stream of ``subscription`` from cursor ``after``, routed to ``connection``."""
        stream = Stream(subscription["id"], window_ms=subscription["debounce_ms"], after=after)
        binding = _Binding(
            stream,
            connection,
            held=[] if replaying else None,
            queued=after,
            prefix=subscription_prefix(subscription["id"]),
        )
        connection.streams[subscription["id"]] = binding
        bindings = self._by_subscription.setdefault(subscription["id"], [])
        if not bindings:
            self._scope = None
        bindings.append(binding)
        return binding

    def _went_live(self, binding: _Binding, replayed: int) -> None:
        report = {
            "subscription_id": binding.stream.subscription_id,
            "replayed": replayed,
            "cursor": format_cursor(self.tag, binding.queued),
        }
        self._control(binding.connection, "live", report, binding.stream.subscription_id)

    def _control(
        self, connection: Connection, kind: str, data: dict[str, Any], subscription_id: str
    ) -> None:
        if not connection.outbox.put(Frame(orjson.dumps(data), kind, None, subscription_id)):
            self.overflow(connection)

    def detach(self, connection: Connection, subscription_id: str, reason: str) -> None:
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

    # -- replay ----------------------------------------------------------------

    async def _replay(self, binding: _Binding, after: int, until: int) -> None:
        """Offer the stream every event in (start, until], then release held ones.

        If the subscription ends meanwhile (or had ended: ``binding.ending``),
        the replay goes on to just before its end, and the stream ends there
        instead of going live: what was held is in that stretch of the log.
        """
        ahead: asyncio.Future[list[StoredEntry]] | None = None
        try:
            stream = binding.stream
            outbox = binding.connection.outbox
            start = await asyncio.to_thread(self._replay_start, stream, after)
            state = self.field.state
            row = np.array([state.registry_row(stream.subscription_id)])
            names = frozenset(state.subscriptions[stream.subscription_id]["events"])
            replayed = 0
            position = start

            def target() -> int:
                return until if binding.ending is None else binding.ending - 1

            filtered = state.subscriptions[stream.subscription_id].get("filter") is not None
            agent_id = binding.connection.agent_id
            # a page's filters run at once: no more of them than the agent's burst holds
            most = self.field.filters.replay_page(stream.subscription_id, REPLAY_PAGE)

            def gone() -> bool:
                return binding.connection.ended is not None or binding.detached

            while position < target() and not gone():
                await outbox.wait_for_room()
                if ahead is None:
                    # an entry yields at most one notification: never read more than fit
                    page = max(1, min(most, outbox.room(), target() - position))
                    entries = await asyncio.to_thread(self.service.log.read, position, page)
                else:
                    entries, ahead = await ahead, None
                entries = [e for e in entries if e.position <= target()]
                if not entries or gone():
                    break
                if filtered:  # at the pace the agent's filter time allows, looked at just
                    # before its filters run: the charge of one page is seen by the next
                    await self._filter_time(agent_id)
                    if gone():
                        break
                # each entry is at most one frame: never offer more than fits now (a page
                # read ahead was sized earlier), the rest is read again next time
                entries = entries[: max(1, outbox.room())]
                position = entries[-1].position
                # read the next page while this one is matched and encoded; it fits in
                # what is left of the outbox after this page, whatever the consumer does
                page = min(most, outbox.room() - len(entries), target() - position)
                if page > 0:
                    ahead = asyncio.ensure_future(
                        asyncio.to_thread(self.service.log.read, position, page)
                    )
                await self._embedded(entries)
                if gone():
                    break
                replayed += self._offer_entries(binding, entries, row, names)
            # the last page may have filled the outbox: make room for "live" (and what
            # was held) before going live, as for any page
            await outbox.wait_for_room()
            if binding.connection.ended is not None or binding.detached:
                return
            if binding.ending is not None:  # what was held is in what was replayed
                binding.held = None
                self._end_stream(binding, self._ended_because(binding))
                return
            held, binding.held = binding.held or [], None
            for notification in held:
                self._offer(binding, notification)
            if binding.lagging:  # set aside meanwhile: what followed is read from the log
                replayed += await self._catch_up(binding, binding.lag_after)
                if gone():
                    return
            if not self.service.busy:  # a window that ended while replaying goes before "live"
                now = max(time.time(), self.field.state.last_ts)
                replayed += self._deliver(binding, stream.advance(now))
            self._went_live(binding, replayed)
            self._schedule(stream.deadline)
        except Exception:
            logger.exception("replaying %s failed", binding.stream.subscription_id)
            self.end(binding.connection, 1011, "replay failed", None)
        finally:
            if ahead is not None:  # the replay stopped early: its read is not wanted
                ahead.cancel()

    async def _filter_time(self, agent_id: str) -> None:
        """Wait until ``agent_id``'s filters may run again (its share of filter time)."""
        clock = self.field.filters.time
        while clock is not None and (delay := clock.wait(agent_id)) > 0:
            # looked at again every so often: a restored or forgiven share counts at once
            await asyncio.sleep(min(delay, FILTER_TIME_POLL))

    def _replay_start(self, stream: Stream, after: int) -> int:
        """Where replay must begin: the start of the debounce window holding ``after``.

        Events before the cursor in that window count towards ``folded``.
        Log timestamps never decrease, so a binary search finds it.
        """
        if not stream.window_ms or after == 0:
            return after
        log = self.service.log
        entry = log.read(after - 1, 1)
        if not entry:
            return after
        window = stream.window_of(entry[0].ts)
        low, high = 0, after  # the first position (after ``low``) in that window
        while low < high:
            mid = (low + high) // 2
            probe = log.read(mid, 1)
            if probe and stream.window_of(probe[0].ts) >= window:
                high = mid
            else:
                low = mid + 1
        return low

    def _offer_entries(
        self,
        binding: _Binding,
        entries: list[StoredEntry],
        rows: np.ndarray,
        names: frozenset[str] | None = None,
    ) -> int:
        """Offer one replayed page to ``binding``'s stream (rows: its registry row).

        Only entries of the ``names`` the subscription lists become events.
        """
        units = self.field.state.known_units
        events = []
        for entry in entries:
            if names is None or event_name(entry.kind) in names:
                event = event_of(entry, units)
                if event is not None:
                    events.append(event)
        # a replay is bounded by the stream's end: its row counts even once cancelled
        matches = self._matcher().match(events, only=rows, inactive=True)
        stream = binding.stream
        delivered = 0
        if not stream.window_ms:  # no debounce: straight to frames
            tag = self.tag
            for match in matches:  # one row: this stream's
                event = match.event
                cursor = format_cursor(tag, event.position)
                tail = shared_tail(encode_event(event, cursor))
                relevance, flags = float(match.relevance[0]), int(match.flags[0])
                action = bool(match.requires_action[0])
                if self._direct(binding, event, cursor, tail, relevance, flags, action):
                    delivered += 1
                elif binding.connection.ended is not None:  # overflowed
                    break
        else:
            for match in matches:
                shared = encode_event(match.event, format_cursor(self.tag, match.event.position))
                for notification in self._notifications(match, shared):
                    delivered += self._offer(binding, notification)
        if entries:
            delivered += self._deliver(binding, stream.advance(entries[-1].ts))
        return delivered

    def _direct(
        self,
        binding: _Binding,
        event: FieldEvent,
        cursor: str,
        tail: bytes,
        relevance: float,
        flags: int,
        requires_action: bool,
    ) -> bool:
        """Queue one notification to a stream without debounce, encoded at once.

        The frame :meth:`_deliver` would queue for what :meth:`Stream.offer`
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
            Frame(body, event.name, cursor, stream.subscription_id, position)
        ):
            self.overflow(binding.connection)
            return False
        stream.after = binding.queued = position
        return True

    def _matcher(self, *, live: bool = False) -> Matcher:
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
            self._scope = None  # its rows are no longer matched live
            if subscription_id in self._dormant:
                self._wake(subscription_id, before)
            for binding in self._by_subscription.get(subscription_id, ()):
                if binding.lagging or binding.connection.ended is not None:
                    continue
                binding.lagging = True
                binding.lag_after = before
                if self.counts is not None:
                    self.counts.set_aside[binding.connection.kind] += 1
                if binding.held is not None:
                    continue  # replaying: it catches up once its replay is done
                self._spawn(self._catch_up(binding, before))

    def _charged(
        self,
        agent_id: str,
        binding: _Binding,
        entries: list[StoredEntry],
        row: np.ndarray,
        names: frozenset[str],
    ) -> int:
        """:meth:`_offer_entries`, its whole time charged to the agent's filter time (its
        filters charge their own evaluations; the matching and encoding around them too,
        here: catching up is the agent's doing)."""
        clock = self.field.filters.time
        if clock is None:
            return self._offer_entries(binding, entries, row, names)
        began, charged = time.perf_counter(), clock.spent
        offered = self._offer_entries(binding, entries, row, names)
        rest = time.perf_counter() - began - (clock.spent - charged)
        clock.spend(agent_id, max(0.0, rest))
        return offered

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _embedded(self, entries: list[StoredEntry]) -> None:
        """Wait until the units ``entries`` may name are embedded: with a sentence model
        units are embedded after their commit (:mod:`field.engine.embedder`), and a replay
        reads the log beyond what was published."""
        embeddings = self.service.embeddings
        if embeddings is not None:
            needed = int(self.field.state.index.count_at(entries[-1].epoch))
            await embeddings.caught_up(needed, None)

    async def _catch_up(self, binding: _Binding, after: int) -> int:
        """Offer a lagging stream every event after ``after`` from the log, as its agent's
        filter time allows, up to the log's end; then take it live again (or end it, if
        its subscription ended meanwhile). Returns how many notifications it queued."""
        stream = binding.stream
        connection = binding.connection
        subscription_id = stream.subscription_id
        state = self.field.state
        row = np.array([state.registry_row(subscription_id)])
        names = frozenset(state.subscriptions[subscription_id]["events"])
        most = self.field.filters.replay_page(subscription_id, REPLAY_PAGE)
        position = after
        offered = 0

        def gone() -> bool:
            return connection.ended is not None or binding.detached

        try:
            while not gone():
                target = self.published if binding.ending is None else binding.ending - 1
                if position >= target:
                    if self.routing:  # a batch is under way: take it live between two
                        await asyncio.sleep(0)
                        continue
                    break
                await connection.outbox.wait_for_room()
                page = max(1, min(most, connection.outbox.room(), target - position))
                entries = await asyncio.to_thread(self.service.log.read, position, page)
                entries = [e for e in entries if e.position <= target]
                if gone() or not entries:
                    break
                # the agent's time is looked at just before its filters run, with no
                # wait between: the charge of one page is seen by the next
                await self._filter_time(connection.agent_id)
                if gone():
                    break
                await self._embedded(entries)
                if gone():
                    break
                position = entries[-1].position
                offered += self._charged(connection.agent_id, binding, entries, row, names)
            if gone():
                return offered
            binding.lagging = False
            self.field.filters.unlag(subscription_id)  # it takes live events again
            self._scope = None
            if binding.ending is not None:
                self._end_stream(binding, self._ended_because(binding))
            else:
                self._schedule(stream.deadline)
        except Exception:
            logger.exception("catching up %s failed", subscription_id)
            self.end(connection, 1011, "catching up failed", None)
        return offered

    # -- live --------------------------------------------------------------------

    def publish(self, entries: list[StoredEntry]) -> Iterator[None]:
        """Route a batch of newly durable entries (called by the writer), in steps.

        The routing is done as the steps are taken, one event's notifications a
        step, so that the writer can let the loop run between them; the steps of
        one batch are all taken before the next batch's (a batch published while
        another is under way finishes it first). The senders of the connections
        given frames are woken once the batch is routed, a few per turn of the
        loop (:class:`~field.engine.outbox.Waker`): each writes all its
        frames of the batch at once.
        """
        if self._publishing is not None:
            for _ in self._publishing:
                pass
        steps = self._publishing = self._steps(entries)
        return steps

    @property
    def routing(self) -> bool:
        """Whether a batch is being routed (the loop runs between its steps)."""
        return self._publishing is not None

    def _steps(self, entries: list[StoredEntry]) -> Iterator[None]:
        self.waker.cork()
        try:
            yield from self._route_batch(entries)
        finally:
            self.waker.uncork()
            self._publishing = None

    def _route_batch(self, entries: list[StoredEntry]) -> Iterator[None]:
        self.published = entries[-1].position
        ended = self._lifecycle(entries)
        if not self._by_subscription and not self._dormant:
            return
        events = self._events(entries)
        if events:
            matcher = self._matcher(live=True)
            scope = self._scope
            if scope is None or not scope.fits(matcher.registry):
                state = self.field.state
                # streams catching up read from the log: their rows are not matched live
                rows = [
                    state.registry_row(sid)
                    for sid, bindings in self._by_subscription.items()
                    if not all(binding.lagging for binding in bindings)
                ]
                rows.extend(state.registry_row(sid) for sid in self._dormant)  # some in both
                scope = self._scope = matcher.scope(np.unique(np.array(rows, dtype=np.intp)))
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
        self.flush_due(entries[-1].ts)

    def _route(self, match: Match) -> None:
        shared = tail = b""
        cursor = ""
        event = match.event
        ids = self.field.state.registry.ids
        by_subscription = self._by_subscription
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
                    self._offer(binding, notification)
                    self._schedule(binding.stream.deadline)

    def _hold(self, binding: _Binding, notification: Notification) -> None:
        assert binding.held is not None
        if len(binding.held) >= self.limits.replay_hold:
            self.overflow(binding.connection)
            return
        binding.held.append(notification)

    def flush_due(self, now: float | None = None) -> None:
        """Deliver every debounce window that has ended by ``now`` (log time)."""
        if now is None:
            if self.service.busy:  # entries in flight may still belong to a window
                self._schedule(time.time() + 0.005)
                return
            now = max(time.time(), self.field.state.last_ts)
            # later entries must not be stamped before a window this flush closed
            self.field.state.last_ts = now
        soonest: float | None = None
        for binding in list(self._windowed):
            if binding.held is None and not binding.lagging:
                self._deliver(binding, binding.stream.advance(now))
            deadline = binding.stream.deadline
            if deadline is None:
                self._windowed.discard(binding)
            elif soonest is None or deadline < soonest:
                soonest = deadline
        self._deadline = None
        self._schedule(soonest)

    def _schedule(self, deadline: float | None) -> None:
        if deadline is None or (self._deadline is not None and self._deadline <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._deadline = deadline
        delay = max(0.0, deadline - time.time())
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._deadline = None
        self.waker.cork()
        try:
            self.flush_due()
        except Exception:
            logger.exception("flushing debounce windows failed")
        finally:
            self.waker.uncork()

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

    def _offer(self, binding: _Binding, notification: Notification) -> int:
        """Offer a notification to a debounced (or replaying) stream; queue what is due."""
        delivered = self._deliver(binding, binding.stream.offer(notification))
        if binding.stream.deadline is not None and not binding.detached:
            self._windowed.add(binding)
        return delivered

    def _deliver(self, binding: _Binding, notifications: list[Notification]) -> int:
        connection = binding.connection
        for notification in notifications:
            frame = Frame(
                encode_notification(notification),
                notification.event.name,
                format_cursor(self.tag, notification.position),
                notification.subscription_id,
                notification.position,
            )
            if not connection.outbox.put(frame):
                self.overflow(connection)
                return 0
            binding.queued = notification.position
        return len(notifications)

    def overflow(
        self,
        connection: Connection,
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
        body = orjson.dumps({"reason": f"{why}: {detail}", "cursors": cursors})
        if self.counts is not None:
            self.counts.overflows[(connection.kind, why)] += 1
        logger.warning(
            "closing a slow %s consumer of agent %s (%s)",
            connection.kind,
            connection.agent_id,
            why,
        )
        self.end(connection, 4008, why, Frame(body, "overflow"))
        self.disconnect(connection)

    def _lifecycle(self, entries: list[StoredEntry]) -> dict[str, int]:
        """Attach new subscriptions to their agent's sockets; return the subscriptions the
        batch ended (cancelled, or their agent deregistered) with where they ended."""
        ended: dict[str, int] = {}
        subscriptions = self.field.state.subscriptions
        for entry in entries:
            if entry.kind == "subscription.created":
                subscription = entry.data["subscription"]
                for connection in list(self._by_agent.get(subscription["agent_id"], ())):
                    if connection.kind == "ws":
                        self._bind(connection, subscription, entry.position, replaying=False)
            elif entry.kind == "subscription.cancelled":
                ended[entry.data["subscription_id"]] = entry.position
            elif entry.kind == "agent.deregistered":
                agent_id = entry.data["agent_id"]
                if self.notifications is not None:
                    self.notifications.forget(agent_id)
                for subscription_id in [*self._by_subscription, *self._dormant]:
                    subscription = subscriptions[subscription_id]
                    if (
                        subscription["agent_id"] == agent_id
                        and subscription.get("ended_position") == entry.position
                    ):
                        ended[subscription_id] = entry.position
                # after its streams have ended and the DEREGISTER response is queued
                for connection in list(self._by_agent.get(agent_id, ())):
                    self.service.when_answered(
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
        bindings = list(self._by_subscription.get(subscription_id, ()))
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
                self._offer_entries(binding, before, row, names)
            if binding.connection.ended is None:
                self._end_stream(binding, self._ended_because(binding))

    def _ended_because(self, binding: _Binding) -> str:
        """The ``end`` frame's reason: the subscription expired, or it was cancelled."""
        subscription = self.field.state.subscriptions.get(binding.stream.subscription_id, {})
        expired = (subscription.get("cancel_reason") or "").startswith(EXPIRED)
        return "subscription expired" if expired else "subscription cancelled"

    def _end_stream(self, binding: _Binding, reason: str) -> None:
        """Deliver a stream's open debounce window, then its ``end``."""
        stream = binding.stream
        if stream.window_ms:
            self._deliver(binding, stream.advance(math.inf))
        self.detach(binding.connection, stream.subscription_id, reason)

    # -- what the console shows ----------------------------------------------------

    def stream_states(self) -> Iterator[tuple[str, Connection, bool]]:
        """Every stream bound now: its subscription id, the connection it is queued on,
        and whether it is still replaying (live notifications held back meanwhile)."""
        for subscription_id, bindings in self._by_subscription.items():
            for binding in bindings:
                yield subscription_id, binding.connection, binding.held is not None
