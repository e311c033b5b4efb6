"""The push hub: the router's asyncio driver.

The single writer calls :meth:`PushHub.publish` with every batch of entries right
after they are durable. The hub hands them to its :class:`~field.engine.router.Router`,
which matches, debounces, encodes and queues frames in the connections' outboxes
without waiting on anything, so a slow consumer cannot slow the writer: its outbox
fills, overflows, and the connection is closed with the cursors it can resume from.

The hub does what takes time, for the router: it replays a stream from the log (in
a worker thread, paced by the outbox) while the router holds its live notifications
back, so the seam has no gap and no duplicate; it catches up a stream whose agent ran
out of filter time; it keeps the one timer of the debounce windows; and it wakes the
connections' senders a few per turn of the loop after a fan-out.

Notifications are also paced per agent (``--notify-rate``): a socket's sender waits in
:meth:`PushHub.pace` for its agent's tokens before it writes the next batch. Nothing
is dropped meanwhile: frames wait in the connection's outbox, and one that overflows
ends with the cursors to resume from, as for any slow consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import numpy as np

from ..contract.model import StoredEntry
from ..contract.ratelimit import KeyedLimiter, Rate
from ..core.field import Field
from ..subscriptions.stream import Stream, parse_cursor
from . import router
from .listeners import Stage
from .liveness import Liveness
from .outbox import Outbox, Waker
from .router import SINK_KINDS, Frame, PushCounts, PushLimits, Router
from .service import FieldService

logger = logging.getLogger("field.push")

#: One connection of the hub: its frames wait in an :class:`Outbox`.
Connection = router.Connection[Outbox]
#: One stream bound to a connection of the hub.
Binding = router.Binding[Outbox]

REPLAY_PAGE = 2000
#: Entries of a replayed page matched at once (:meth:`Router.offer_steps`), whose frames
#: are then queued a few hundred at a time, the event loop running every other
#: connection between two steps: a whole page held it for 130-140 ms on a 2-core machine
#: (about 65 us an entry); a step holds it for under 1 ms at the median, 6-7 ms at the
#: 99th percentile (the matching). Matching 512 events at once costs 3.3-3.5 us an
#: event, 128 at once 5.4-5.7 us.
REPLAY_SLICE = 512
#: Longest a replay waiting for its agent's filter time sleeps before looking again.
FILTER_TIME_POLL = 0.05


class PushHub:
    """Drives a :class:`~field.engine.router.Router` on the event loop (module docstring)."""

    def __init__(
        self,
        service: FieldService,
        limits: PushLimits | None = None,
        *,
        max_per_agent: int = router.DEFAULT_MAX_PER_AGENT,
        notify_rate: Rate | None = None,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
        liveness: Liveness | None = None,
        counts: PushCounts | None = None,
    ) -> None:
        self.service = service
        #: told of every connection and disconnection of an agent's sockets, if set
        self.liveness = liveness
        self.router: Router[Outbox] = Router(
            lambda: service.field,
            self,
            limits,
            max_per_agent=max_per_agent,
            presence=liveness,
            counts=counts,
        )
        self.limits = self.router.limits
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: the steps of the batch being routed, if one is under way
        self._publishing: Iterator[None] | None = None
        #: wakes the connections' senders a few per turn of the loop after a fan-out
        self.waker = Waker()
        #: notifications each agent's push connections are written, all together
        #: (:meth:`pace`); None: not limited
        self.notifications = None if notify_rate is None else KeyedLimiter(notify_rate, clock=clock)
        #: how :meth:`pace` waits (a test's fake clock advances in it)
        self._pause = pause
        service.listeners.add(self.publish, Stage.ROUTING)

    @property
    def field(self) -> Field:
        return self.service.field

    @property
    def tag(self) -> str:
        return self.field.field_tag

    @property
    def connections(self) -> set[Connection]:
        return self.router.connections

    @property
    def counts(self) -> PushCounts | None:
        """What the connections did, for ``GET /metrics``; None: not counted."""
        return self.router.counts

    @property
    def published(self) -> int:
        """The last log position routed (a batch's, as its routing starts)."""
        return self.router.published

    # -- connections -----------------------------------------------------------

    def connect(self, agent_id: str, kind: str) -> Connection:
        """A new push connection of ``agent_id``; ``TOO_MANY_CONNECTIONS`` past the
        agent's cap (each connection may queue a full outbox)."""
        limits = self.router.limits
        outbox = Outbox(
            max_frames=limits.outbox_frames, max_bytes=limits.outbox_bytes, waker=self.waker
        )
        return self.router.connect(agent_id, kind, outbox)

    def connect_sink(self, agent_id: str, kind: str, outbox: Outbox) -> Connection:
        """A durable sink's connection (``kind`` in :data:`~field.engine.router.SINK_KINDS`):
        its own small outbox, no cap, and it says nothing about the agent's liveness."""
        return self.router.connect_sink(agent_id, kind, outbox)

    def disconnect(self, connection: Connection) -> None:
        self.router.disconnect(connection)

    def end(self, connection: Connection, code: int, reason: str, frame: Frame | None) -> None:
        """Close a connection from the hub's side, after what is queued and ``frame``."""
        self.router.end(connection, code, reason, frame)

    def overflow(
        self,
        connection: Connection,
        why: str = "outbox overflow",
        detail: str = "the consumer fell too far behind",
    ) -> None:
        """The consumer fell too far behind: close it with the cursors to resume from."""
        self.router.overflow(connection, why, detail)

    def sleep(self, subscription_id: str, sleeper: router.Sleeper[Outbox]) -> None:
        """Match ``subscription_id`` with no connection (:meth:`Router.sleep`)."""
        self.router.sleep(subscription_id, sleeper)

    def is_dormant(self, subscription_id: str) -> bool:
        return self.router.is_dormant(subscription_id)

    def unsleep(self, subscription_id: str) -> None:
        self.router.unsleep(subscription_id)

    def stream_states(self) -> Iterator[tuple[str, Connection, bool]]:
        """Every stream bound now (:meth:`Router.stream_states`)."""
        return self.router.stream_states()

    def shutdown(self) -> None:
        """End every connection (the server is stopping) and cancel replays."""
        self.router.end_all()
        for task in list(self._tasks):
            task.cancel()
        if self._timer is not None:
            self._timer.cancel()

    # -- pacing ------------------------------------------------------------------

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
        limiter = self._limiter_of(connection)
        if limiter is None:
            return
        burst = int(limiter.rate.burst)
        while frames > 0 and connection.ended is None:
            cost = min(frames, burst)
            wait = limiter.take(connection.agent_id, cost)
            if wait:
                await self._pause(wait)
            else:
                frames -= cost

    def may_send_now(self, connection: Connection, frames: int) -> bool:
        """Whether :meth:`pace` would let ``frames`` notifications (at most a batch, see
        :meth:`batch_size`) through without waiting; nothing is taken."""
        limiter = self._limiter_of(connection)
        if limiter is None or connection.ended is not None:
            return True
        return frames == 0 or limiter.wait(connection.agent_id, frames) == 0.0

    def sent_now(self, connection: Connection, frames: int) -> None:
        """Take the tokens of ``frames`` notifications :meth:`may_send_now` found there."""
        limiter = self._limiter_of(connection)
        if limiter is None or connection.ended is not None:
            return
        if frames:
            limiter.take(connection.agent_id, frames)

    def _limiter_of(self, connection: Connection) -> KeyedLimiter | None:
        """The notification limiter that paces ``connection``: None with no rate, or for a
        durable sink (a delivery has its own ``delivery_rate``)."""
        if connection.kind in SINK_KINDS:
            return None
        return self.notifications

    # -- streams -----------------------------------------------------------------

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
        """Start streaming a subscription to a connection from log position ``after``
        (:meth:`Router.attach`); on a shared log, a cursor ahead of this node is checked
        against the newest position it knows the log to hold."""
        head = self.service.log_head if self.service.log.shared else None
        self.router.attach(connection, subscription_id, after, problem=problem, head=head)

    def detach(self, connection: Connection, subscription_id: str, reason: str) -> None:
        self.router.detach(connection, subscription_id, reason)

    # -- the router's driver -----------------------------------------------------------

    def replay(self, binding: Binding, after: int, until: int) -> None:
        self._spawn(self._replay(binding, after, until))

    def catch_up(self, binding: Binding, after: int) -> None:
        self._spawn(self._catch_up(binding, after))

    def schedule(self, deadline: float) -> None:
        if self._deadline is not None and self._deadline <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._deadline = deadline
        delay = max(0.0, deadline - time.time())
        self._timer = loop.call_later(delay, self._on_timer)

    def rescheduled(self, deadline: float | None) -> None:
        self._deadline = None
        if deadline is not None:
            self.schedule(deadline)

    def after_answers(self, callback: Callable[..., object], *args: object) -> None:
        self.service.when_answered(callback, *args)

    def left(self, agent_id: str) -> None:
        if self.notifications is not None:
            self.notifications.forget(agent_id)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- replay ----------------------------------------------------------------

    async def _replay(self, binding: Binding, after: int, until: int) -> None:
        """Offer the stream every event in (start, until], then release held ones.

        If the subscription ends meanwhile (or had ended: ``binding.ending``),
        the replay goes on to just before its end, and the stream ends there
        instead of going live: what was held is in that stretch of the log.
        """
        routes = self.router
        try:
            stream = binding.stream
            outbox = binding.connection.outbox
            start = await asyncio.to_thread(self._replay_start, stream, after)
            state = self.field.state
            row = np.array([state.registry_row(stream.subscription_id)])
            names = frozenset(state.subscriptions[stream.subscription_id]["events"])
            replayed = 0
            position = start
            filtered = state.subscriptions[stream.subscription_id].get("filter") is not None
            agent_id = binding.connection.agent_id
            # a page's filters run at once: no more of them than the agent's burst holds
            most = self.field.filters.replay_page(stream.subscription_id, REPLAY_PAGE)

            while position < binding.target(until) and not binding.gone:
                await outbox.wait_for_room()
                # an entry yields at most one notification: never read more than fit.
                # The next page is not read ahead while this one is matched: the reading
                # thread then takes the GIL back from the loop for every row SQLite
                # steps, and both go slower (31-35k notifications/s against 44-47k)
                page = max(1, min(most, outbox.room(), binding.target(until) - position))
                entries = await asyncio.to_thread(self.service.log.read, position, page)
                target = binding.target(until)
                entries = [e for e in entries if e.position <= target]
                if not entries or binding.gone:
                    break
                if filtered:  # at the pace the agent's filter time allows, looked at just
                    # before its filters run: the charge of one page is seen by the next
                    await self._filter_time(agent_id)
                    if binding.gone:
                        break
                # each entry is at most one frame: never offer more than fits now
                entries = entries[: max(1, outbox.room())]
                position = entries[-1].position
                await self._embedded(entries)
                if binding.gone:
                    break
                replayed += await self._offer(binding, entries, row, names)
            # the last page may have filled the outbox: make room for "live" (and what
            # was held) before going live, as for any page
            await outbox.wait_for_room()
            if binding.gone or not routes.release(binding):
                return
            if binding.lagging:  # set aside meanwhile: what followed is read from the log
                replayed += await self._catch_up(binding, binding.lag_after)
                if binding.gone:
                    return
            # a window that ended while replaying goes before "live"
            routes.take_live(binding, replayed, self._now(stamp=False))
        except Exception:
            logger.exception("replaying %s failed", binding.stream.subscription_id)
            routes.end(binding.connection, 1011, "replay failed", None)

    async def _offer(
        self,
        binding: Binding,
        entries: list[StoredEntry],
        row: np.ndarray,
        names: frozenset[str],
        *,
        charged: str | None = None,
    ) -> int:
        """Offer a page read from the log to ``binding``'s stream, :data:`REPLAY_SLICE`
        entries at a time, each in steps (:meth:`Router.offer_steps`) with the loop
        running every other connection between two; returns the notifications queued.

        ``charged``: the agent whose filter time each step is charged to, whole (its
        filters charge their own evaluations; the matching and encoding around them
        too, here: catching up is the agent's doing).
        """
        clock = self.field.filters.time
        queued = 0
        for first in range(0, len(entries), REPLAY_SLICE):
            steps = self.router.offer_steps(
                binding, entries[first : first + REPLAY_SLICE], row, names
            )
            while True:
                began, spent = time.perf_counter(), clock.spent if clock is not None else 0.0
                step = next(steps, None)
                if charged is not None and clock is not None:
                    rest = time.perf_counter() - began - (clock.spent - spent)
                    clock.spend(charged, max(0.0, rest))
                if step is None:
                    break
                queued += step
                await asyncio.sleep(0)
                if binding.gone:
                    return queued
        return queued

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

    async def _embedded(self, entries: list[StoredEntry]) -> None:
        """Wait until the units ``entries`` may name are embedded: with a sentence model
        units are embedded after their commit (:mod:`field.engine.embedder`), and a replay
        reads the log beyond what was published."""
        embeddings = self.service.embeddings
        if embeddings is not None:
            needed = int(self.field.state.index.count_at(entries[-1].epoch))
            await embeddings.caught_up(needed, None)

    async def _catch_up(self, binding: Binding, after: int) -> int:
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
        try:
            while not binding.gone:
                target = binding.target(self.published)
                if position >= target:
                    if self.routing:  # a batch is under way: take it live between two
                        await asyncio.sleep(0)
                        continue
                    break
                await connection.outbox.wait_for_room()
                page = max(1, min(most, connection.outbox.room(), target - position))
                entries = await asyncio.to_thread(self.service.log.read, position, page)
                entries = [e for e in entries if e.position <= target]
                if binding.gone or not entries:
                    break
                # the agent's time is looked at just before its filters run, with no
                # wait between: the charge of one page is seen by the next
                await self._filter_time(connection.agent_id)
                if binding.gone:
                    break
                await self._embedded(entries)
                if binding.gone:
                    break
                position = entries[-1].position
                offered += await self._offer(
                    binding, entries, row, names, charged=connection.agent_id
                )
            if binding.gone:
                return offered
            self.router.caught_up(binding)
        except Exception:
            logger.exception("catching up %s failed", subscription_id)
            self.router.end(connection, 1011, "catching up failed", None)
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
            yield from self.router.route(entries)
        finally:
            self.waker.uncork()
            self._publishing = None

    def _now(self, *, stamp: bool = True) -> float | None:
        """Log time now, for closing debounce windows; None while the writer is busy
        (entries in flight may still belong to a window). ``stamp``: later entries are
        not stamped before it (a flush of every window closes them at this time)."""
        if self.service.busy:
            return None
        now = max(time.time(), self.field.state.last_ts)
        if stamp:
            self.field.state.last_ts = now
        return now

    def flush_due(self, now: float | None = None) -> None:
        """Deliver every debounce window that has ended by ``now`` (log time; None: the
        clock's time, once the writer is not busy)."""
        if now is None:
            now = self._now()
            if now is None:
                self.schedule(time.time() + 0.005)
                return
        self.router.flush(now)

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
