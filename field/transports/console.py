"""The console: a live page of the Field in a browser, and the stream it draws from.

``GET /console`` serves the page (``field/console/``: one HTML file, one
script and one style sheet written by hand, served from the package; no
build step, nothing fetched from anywhere else). It signs in with a token,
an agent's or the operator's, and reads two streams, both with the token
in the ``Authorization`` header:

* **events**, as any agent reads them: its subscription named ``console``
  (all 13 events, its own included) over that subscription's SSE stream.
  The operator holds subscriptions like an agent (it sees every event), so
  the page reads events the same way whoever signs in.
* **snapshots** (``GET /v1/console/stream``, this module): what is not an
  event, in one SSE event ``snapshot`` once a second and soon after every
  committed batch: the status page, the agents with their push
  connections, the open conflicts the viewer may see, the subscriptions it
  may see with their lag, and operations a second and delivery latency.

The page adds nothing else to the server. The recent past comes from the log:
for the operator, ``GET /v1/events`` (the Field's events, newest first, from
before the console was ever opened); for an agent, its ``console``
subscription's SSE stream resumed from an earlier cursor, read up to where the
live stream began, then dropped. A page of 50 events comes at sign-in, another
at each "Older events"; cursors keep the past and the live stream apart. Each id
opens a view built from reads the API already offers (``GET /v1/agents``,
``GET /v1/conflicts``, REPLAY, SUBSCRIBE ``list``, the snapshot), and each
action is the API's own request sent with the signed-in token (DEREGISTER,
``POST /v1/agents/{id}/fail``, SUBSCRIBE ``unsubscribe`` and ``resume``, the
operator's registration tokens and sources), so it is checked and logged as any
other.

Cheap and bounded:

* one :class:`ConsoleFeed` builds each snapshot once per tick for all
  streams: the shared part once, the part that depends on the viewer (its
  conflicts and subscriptions) once per viewer; lists are cut at fixed
  lengths and their totals given;
* a stream holds at most the latest snapshot it has not sent: a reader
  that falls behind skips snapshots, it never queues them;
* streams are capped: :data:`MAX_STREAMS_PER_VIEWER` for each viewer and
  :data:`MAX_AGENT_STREAMS` for all agents together (the operator's are
  not counted among them, so agents cannot lock the operator out);
* a tick runs only while a stream is open.

Each stream is a push-hub connection of kind ``console`` (no agent cap, not
proof of life), so a server that stops ends it as it ends every push
stream. A viewer whose token stops being valid (its agent deregistered)
gets an ``end`` event, and the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..contract.errors import Code, FieldError, Overloaded
from ..contract.model import StoredEntry
from ..core import authority, subscribe, visibility
from ..core.context import Outcome
from ..core.field import Field
from ..core.state import AgentRecord, FieldState
from ..engine.admission import Work
from ..engine.consumer import consume
from ..engine.outbox import Outbox
from ..engine.push import Connection, PushHub
from ..engine.router import SHUTDOWN, SINK_KINDS, Frame
from ..subscriptions.delivery import Progress
from .eventstream import Departure, sse_event
from .index import CONSOLE_PATH
from .web import SEND_TIMEOUT_SECONDS, error_response, json_response, token_of

if TYPE_CHECKING:
    from .door import FrontDoor
    from .runtime import Running, Runtime

logger = logging.getLogger("field.console")

#: Seconds between two snapshots when nothing changes (and between two rate samples).
SNAPSHOT_SECONDS = 1.0
#: Least seconds between two snapshots: a busy Field is shown at most this often.
MIN_GAP_SECONDS = 0.2
#: Console streams one viewer (an agent, or the operator) may hold at once.
MAX_STREAMS_PER_VIEWER = 4
#: Console streams of all agents together (the operator's are not counted).
MAX_AGENT_STREAMS = 32
#: Agents, open conflicts and subscriptions a snapshot lists at most (with their totals).
LISTED_AGENTS = 200
LISTED_CONFLICTS = 100
LISTED_SUBSCRIPTIONS = 200
#: Characters of a unit's content a listed conflict shows.
EXCERPT = 240
#: Rate samples a snapshot carries (one a second: the last two minutes).
HISTORY = 120
#: Seconds one sample of the longer history covers, and how many it keeps (an hour).
LONG_STEP = 10
LONG_HISTORY = 360
#: Most queued frames looked at to count a subscription's lag, per tick in all.
TALLY_BUDGET = 200_000
#: Bytes one snapshot may take (a stream's outbox holds one).
MAX_SNAPSHOT_BYTES = 4 << 20

#: The files of the page: name in the URL after ``/console/`` → (file in ``field/console``,
#: media type).
FILES = {
    "": ("index.html", "text/html; charset=utf-8"),
    "console.js": ("console.js", "text/javascript; charset=utf-8"),
    "console.css": ("console.css", "text/css; charset=utf-8"),
}
#: Everything the page loads comes from the Field itself; nothing may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


def _load_files() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the package."""
    folder = resources.files("field").joinpath("console")
    return {
        name: (folder.joinpath(file).read_bytes(), media) for name, (file, media) in FILES.items()
    }


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who a console stream shows the Field to: the operator, or an agent as it signed in."""

    record: AgentRecord
    operator: bool

    @property
    def id(self) -> str:
        return self.record.id

    def now(self, state: FieldState) -> AgentRecord | None:
        """The viewer's record as it is now; None once its token is no longer valid."""
        if self.operator:
            return self.record
        agent = state.agents.get(self.record.id)
        if agent is None or agent.token_hash != self.record.token_hash:
            return None
        return agent


def viewer_of(field: Field, token: str | None) -> Viewer:
    """The viewer a bearer token signs in (401 as for any request otherwise)."""
    record = field.authenticate(token)
    return Viewer(record, record.id == authority.OPERATOR_ID)


#: What the metrics counted so far (``Metrics.answered``): operations, and their seconds.
Answered = tuple[float, float]


class ConsoleBinding:
    """The page's routes and the snapshot stream of one server."""

    def __init__(
        self,
        runtime: Runtime,
        door: FrontDoor,
        *,
        status: Callable[[], dict[str, Any]],
        answered: Callable[[], Answered] | None = None,
    ) -> None:
        """``status``: the status page's body (``GET /v1/field/status``); ``answered``: what
        the metrics counted so far (None: ``--no-metrics``)."""
        self._runtime = runtime
        self._door = door
        self.files = _load_files()
        self.feed = ConsoleFeed(runtime, status=status, answered=answered)

    def routes(self) -> list[Route]:
        """``/console``, each of its files (any other path is the router's 404), and the
        snapshot stream."""
        return [
            *(
                Route(f"{CONSOLE_PATH}/{name}".rstrip("/"), self._file(name), methods=["GET"])
                for name in FILES
            ),
            Route("/v1/console/stream", self.stream, methods=["GET"]),
            Route("/v1/console/history", self.history, methods=["GET"]),
        ]

    def _file(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        body, media = self.files[name]

        async def endpoint(request: Request) -> Response:
            return Response(body, media_type=media, headers=PAGE_HEADERS)

        return endpoint

    async def _viewer(self, request: Request) -> tuple[Viewer, PushHub]:
        """Who the request's token is (an agent, or the operator), past the front door's
        rate limit; and the running hub. Raises the refusal."""
        token = token_of(request.headers, request.query_params)
        self._door.admit(token, None)
        running = self._runtime.current
        if running is None:
            raise Overloaded("the Field is starting")
        hub = running.hub
        outcome = await hub.service.execute(
            lambda field: Outcome({"viewer": viewer_of(field, token)}), work=Work.READ
        )
        viewer: Viewer = outcome.response["viewer"]
        return viewer, hub

    async def history(self, request: Request) -> Response:
        """The last hour of rates in samples of :data:`LONG_STEP` seconds, for the charts'
        longer windows: taken whether or not a console was open (:meth:`ConsoleFeed.start`)."""
        try:
            await self._viewer(request)
        except FieldError as error:
            return error_response(error)
        answer = json_response({"step_seconds": LONG_STEP, "samples": self.feed.meter.hour()})
        answer.headers["Cache-Control"] = "no-store"
        return answer

    async def stream(self, request: Request) -> Any:
        try:
            viewer, hub = await self._viewer(request)
            self.feed.admit(viewer)
        except FieldError as error:
            return error_response(error)
        if request.method == "HEAD":
            return Response(headers={"Cache-Control": "no-store"}, media_type="text/event-stream")
        return self.feed.open(hub, viewer)


class ConsoleFeed:
    """The snapshots of one server, built per tick for every open console stream."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        status: Callable[[], dict[str, Any]],
        answered: Callable[[], Answered] | None = None,
    ) -> None:
        self._runtime = runtime
        #: the status page's body, which each snapshot shows
        self._status = status
        #: what the metrics counted so far (None: no metrics)
        self._metrics_answered = answered
        self.streams: set[ConsoleStream] = set()
        self.meter = Meter()
        self._task: asyncio.Task[None] | None = None
        #: samples the rates once a second while the server runs (:meth:`start`)
        self._sampler: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        #: the last tick's shared part, and the monotonic time it was built
        self._shared: tuple[bytes, float] | None = None
        #: how the bound subscriptions are read, as of the last shared part
        self._reading = _Reading()

    # -- streams ---------------------------------------------------------------------

    def admit(self, viewer: Viewer) -> None:
        """Refuse (``TOO_MANY_CONNECTIONS``) a stream past the caps."""
        mine = sum(s.viewer.id == viewer.id for s in self.streams)
        if mine >= MAX_STREAMS_PER_VIEWER:
            raise _too_many(f"{viewer.id} already holds {mine} console streams")
        agents = sum(not s.viewer.operator for s in self.streams)
        if not viewer.operator and agents >= MAX_AGENT_STREAMS:
            raise _too_many(f"agents hold {agents} console streams, as many as the Field allows")

    def open(self, hub: PushHub, viewer: Viewer) -> ConsoleStream:
        """A new stream for ``viewer``, its first snapshot queued at once."""
        outbox = Outbox(max_frames=2, max_bytes=2 * MAX_SNAPSHOT_BYTES)
        stream = ConsoleStream(self, hub, viewer, hub.connect_sink(viewer.id, "console", outbox))
        self.streams.add(stream)
        self._run_ticks()
        shared = self._shared
        if shared is None or time.monotonic() - shared[1] > SNAPSHOT_SECONDS:
            self._shared = shared = (self._shared_part(hub), time.monotonic())
        self._offer(hub, stream, shared[0], {})
        return stream

    def close(self, stream: ConsoleStream) -> None:
        self.streams.discard(stream)
        stream.hub.disconnect(stream.connection)
        if not self.streams and self._changed is not None:
            self._changed.set()  # the ticks stop at once

    async def stop(self) -> None:
        """End every stream, then the ticks (a server that stops ends the streams through
        the hub: :meth:`PushHub.shutdown`)."""
        for stream in list(self.streams):
            stream.end(None)
            self.close(stream)
        if self._task is not None:
            await self._task
        await self.stop_sampling()

    async def stop_sampling(self) -> None:
        """Stop :meth:`start`'s sampling (the server stops)."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    async def start(self) -> None:
        """Sample the rates once a second from now on, whether or not a console is open, so
        that the last hour is there when one opens (the Field has started)."""
        running = self._runtime.current
        if running is None or self._sampler is not None:
            return
        self._sampler = asyncio.get_running_loop().create_task(
            self._sample(running), name="console-meter"
        )

    async def _sample(self, running: Running) -> None:
        service = running.service
        self.meter.start(service.field.epoch, self._answered())
        service.listeners.add(self.meter.observe)
        try:
            while self._runtime.current is running:
                await asyncio.sleep(SNAPSHOT_SECONDS)
                self.meter.sample(service.field.epoch, self._answered())
        finally:
            service.listeners.remove(self.meter.observe)

    # -- ticks -----------------------------------------------------------------------

    def _run_ticks(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._ticks(), name="console")

    async def _ticks(self) -> None:
        """Build and offer a snapshot every :data:`SNAPSHOT_SECONDS`, and soon after each
        committed batch, while any stream is open."""
        running = self._runtime.current
        if running is None:
            return
        hub, service = running.hub, running.service
        changed = self._changed = asyncio.Event()
        # without the server's sampler (a feed that was not started), the ticks sample
        sampling = self._sampler is None
        if sampling:
            self.meter.start(service.field.epoch, self._answered())
        service.listeners.add(self._published)
        loop = asyncio.get_running_loop()
        sample_at = loop.time() + SNAPSHOT_SECONDS
        try:
            while self.streams and self._runtime.current is running:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, sample_at - loop.time())):
                        await changed.wait()
                changed.clear()
                if not self.streams:
                    break
                if loop.time() >= sample_at:
                    if sampling:
                        self.meter.sample(service.field.epoch, self._answered())
                    sample_at = loop.time() + SNAPSHOT_SECONDS
                try:
                    self._tick(hub)
                except Exception:  # a snapshot that fails must not end the console
                    logger.exception("building a console snapshot failed")
                await asyncio.sleep(MIN_GAP_SECONDS)
        finally:
            service.listeners.remove(self._published)
            if self._runtime.current is not running:  # the server stopped
                for stream in list(self.streams):
                    stream.end(None)

    def _answered(self) -> Answered | None:
        answered = self._metrics_answered
        return None if answered is None else answered()

    def _published(self, entries: list[StoredEntry]) -> None:
        """A batch is durable (the writer calls this): count it (unless the sampler does),
        and show it soon."""
        if self._sampler is None:
            self.meter.observe(entries)
        if self._changed is not None:
            self._changed.set()

    def _tick(self, hub: PushHub) -> None:
        shared = self._shared_part(hub)
        self._shared = (shared, time.monotonic())
        parts: dict[str, bytes] = {}
        for stream in list(self.streams):
            self._offer(hub, stream, shared, parts)

    def _offer(
        self, hub: PushHub, stream: ConsoleStream, shared: bytes, parts: dict[str, bytes]
    ) -> None:
        """Offer ``stream`` its snapshot: the shared part and its viewer's (``parts``
        caches the viewers' parts of this tick)."""
        viewer = stream.viewer.now(hub.field.state)
        if viewer is None:
            stream.end({"reason": "the viewer's token is no longer valid (agent deregistered)"})
            return
        part = parts.get(viewer.id)
        if part is None:
            part = parts[viewer.id] = _inner(self._viewer_part(hub, stream.viewer, viewer))
        stream.offer(b"{" + shared + b"," + part + b"}")

    # -- what a snapshot holds ---------------------------------------------------------

    def _shared_part(self, hub: PushHub) -> bytes:
        state = hub.field.state
        by_agent, by_kind = _connections(hub.connections)
        self._reading = _Reading(hub)
        return _inner(
            {
                "at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "field": self._status(),
                "agents": _agents(state, by_agent),
                "connections": dict(by_kind),
                "rates": self.meter.latest(),
                "history": self.meter.recent(),
            }
        )

    def _viewer_part(self, hub: PushHub, viewer: Viewer, record: AgentRecord) -> dict[str, Any]:
        field = hub.field
        return {
            "viewer": {
                "id": record.id,
                "role": record.role,
                "authority": record.authority,
                "operator": viewer.operator,
                # MERGE needs 6; resolving an escalated conflict needs the operator's 10
                "may_merge": record.authority >= authority.SENIOR,
            },
            "conflicts": _conflicts(field.state, record, viewer.operator),
            "subscriptions": _subscriptions(field, viewer, self._reading),
        }


#: Most frames a console stream writes at once (a snapshot and an ``end``, at most).
_BATCH = 8


class ConsoleStream:
    """One console stream: an ASGI app sending the snapshots offered to it as SSE
    events, until the client leaves, the viewer is ended or the server stops."""

    def __init__(self, feed: ConsoleFeed, hub: PushHub, viewer: Viewer, connection: Connection):
        self.feed, self.hub, self.viewer, self.connection = feed, hub, viewer, connection

    def offer(self, body: bytes) -> None:
        """Queue ``body`` in place of any snapshot not yet sent."""
        outbox = self.connection.outbox
        outbox.drain_now(len(outbox))
        if not outbox.put(Frame(body, "snapshot")):
            logger.error("a console snapshot of %d bytes was too large to send", len(body))

    def end(self, data: dict[str, Any] | None) -> None:
        """End the stream after an ``end`` event holding ``data`` (None: no event)."""
        if self.connection.ended is None:
            self.connection.ended = (1000, "console ended")
            frame = None if data is None else Frame(orjson.dumps(data), "end")
            self.connection.outbox.close_with(frame)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        departure = Departure(receive, lambda: self.end(None))  # as an SSE stream watches

        async def write(frames: list[Frame]) -> bool:
            """What the outbox held, as SSE events in one body message."""
            body = b"".join(sse_event(frame) for frame in frames)
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                await send({"type": "http.response.body", "body": body, "more_body": True})
            return False

        try:
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                await send(
                    {"type": "http.response.start", "status": 200, "headers": _STREAM_HEADERS}
                )
            await consume(self.hub, self.connection, write, most=_BATCH)
            last = b""  # the body ends
            if self.connection.ended == SHUTDOWN:  # the server stops: say so, as SSE does
                last = sse_event(Frame(orjson.dumps({"reason": SHUTDOWN[1]}), "shutdown"))
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                await send({"type": "http.response.body", "body": last, "more_body": False})
        except TimeoutError:
            logger.warning("a console stream of %s stopped reading", self.viewer.id)
        finally:
            departure.close()
            self.feed.close(self)


class Meter:
    """Operations a second, their latency and delivery latency, sampled once a second.

    *Operations a second* are the operations answered (every transport and
    outcome) as ``GET /metrics`` counts them; with ``--no-metrics``, how far the
    epoch moved (every operation that succeeds advances it by one). *Operation
    latency* is their mean time from arrival to answer (metrics only).
    *Delivery latency* is the time from a batch's first log entry being made to
    its notifications being queued for their subscribers: the group commit and
    the matching, measured on every committed batch.
    """

    def __init__(
        self,
        *,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        #: the wall clock samples are stamped with, and the clock seconds are counted in
        self._now, self._monotonic = now, monotonic
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        #: the last hour, a sample per :data:`LONG_STEP` seconds (each from the one-second
        #: samples of its step)
        self.long: deque[dict[str, Any]] = deque(maxlen=LONG_HISTORY)
        #: the one-second samples of the step under way
        self._step: list[dict[str, Any]] = []
        self._epoch = 0
        self._answered: Answered | None = None
        self._at = 0.0
        self._entries = 0
        self._batches = 0
        self._delay_sum = 0.0
        self._delay_max = 0.0

    def start(self, epoch: int, answered: Answered | None) -> None:
        """Count from now: the epoch, and what the metrics have counted (None: no metrics)."""
        self._epoch, self._answered, self._at = epoch, answered, self._monotonic()
        self._entries = self._batches = 0
        self._delay_sum = self._delay_max = 0.0

    def observe(self, entries: list[StoredEntry]) -> None:
        """A committed batch, just published."""
        delay = max(0.0, self._now() - entries[0].ts)
        self._entries += len(entries)
        self._batches += 1
        self._delay_sum += delay
        self._delay_max = max(self._delay_max, delay)

    def sample(self, epoch: int, answered: Answered | None) -> None:
        """Close the second that ended now: one sample in :attr:`history`."""
        seconds = max(self._monotonic() - self._at, 1e-6)
        operations, latency = float(max(0, epoch - self._epoch)), None
        if answered is not None and self._answered is not None:
            operations = answered[0] - self._answered[0]
            if operations > 0:
                latency = {"mean": round(1000 * (answered[1] - self._answered[1]) / operations, 3)}
        batches = self._batches
        now = self._now()
        if self._step and now // LONG_STEP != self._step[0]["t"] // LONG_STEP:
            self.long.append(_step_sample(self._step))
            self._step = []
        self.history.append(
            {
                "t": round(now, 3),
                "operations_per_s": round(operations / seconds, 2),
                "operation_latency_ms": latency,
                "entries_per_s": round(self._entries / seconds, 2),
                "delivery_latency_ms": {
                    "mean": round(1000 * self._delay_sum / batches, 3),
                    "max": round(1000 * self._delay_max, 3),
                }
                if batches
                else None,
            }
        )
        self._step.append(self.history[-1])
        self.start(epoch, answered)

    def hour(self) -> list[dict[str, Any]]:
        """The samples of :data:`LONG_STEP` seconds of the last hour, oldest first (the
        step under way is not among them)."""
        since = self._now() - LONG_STEP * LONG_HISTORY
        return [sample for sample in self.long if sample["t"] >= since]

    def recent(self) -> list[dict[str, Any]]:
        """The samples of the last :data:`HISTORY` seconds (none while no console was open)."""
        since = self._now() - HISTORY
        return [sample for sample in self.history if sample["t"] >= since]

    def latest(self) -> dict[str, Any] | None:
        """The sample of the second that just ended, if a console was open then."""
        recent = self.history[-1] if self.history else None
        return recent if recent is not None and recent["t"] >= self._now() - 2 else None


def _step_sample(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One sample of :data:`LONG_STEP` seconds from its one-second ``samples``: the means of
    the rates, operation latency weighted by operations, delivery latency's mean of means
    and its max; stamped with the end of its step."""
    step = samples[0]["t"] // LONG_STEP
    count = len(samples)
    timed = [(s["operations_per_s"], s["operation_latency_ms"]) for s in samples]
    weighted = [(ops, latency["mean"]) for ops, latency in timed if latency is not None]
    weight = sum(ops for ops, _ in weighted)
    delivered = [s["delivery_latency_ms"] for s in samples if s["delivery_latency_ms"]]
    return {
        "t": round((step + 1) * LONG_STEP, 3),
        "operations_per_s": round(sum(s["operations_per_s"] for s in samples) / count, 2),
        "operation_latency_ms": {
            "mean": round(sum(ops * mean for ops, mean in weighted) / weight, 3)
        }
        if weight > 0
        else None,
        "entries_per_s": round(sum(s["entries_per_s"] for s in samples) / count, 2),
        "delivery_latency_ms": {
            "mean": round(sum(d["mean"] for d in delivered) / len(delivered), 3),
            "max": max(d["max"] for d in delivered),
        }
        if delivered
        else None,
    }


# -- the parts of a snapshot ------------------------------------------------------------


def _inner(body: dict[str, Any]) -> bytes:
    """An object's JSON without its braces, to be joined with another's."""
    return orjson.dumps(body)[1:-1]


def _too_many(message: str) -> FieldError:
    return FieldError(
        message,
        code=Code.TOO_MANY_CONNECTIONS,
        recoverable=True,
        suggested_action="Close a console tab first.",
    )


def _connections(
    connections: Iterable[Connection],
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Push connections by agent (its own sockets only: WebSocket, SSE, MCP) and by kind."""
    by_agent: dict[str, dict[str, int]] = {}
    by_kind: dict[str, int] = {}
    for connection in connections:
        kind = connection.kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if kind not in SINK_KINDS:
            mine = by_agent.get(connection.agent_id)
            if mine is None:
                mine = by_agent[connection.agent_id] = {}
            mine[kind] = mine.get(kind, 0) + 1
    return by_agent, by_kind


def _agents(state: FieldState, connections: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Failed agents first, then connected ones, then the rest; by id in each."""
    agents = state.agents.values()
    listed = heapq.nsmallest(
        LISTED_AGENTS,
        agents,
        key=lambda a: (a.status != "failed", a.id not in connections, a.id),
    )
    return {
        "total": len(state.agents),
        "by_status": dict(Counter(a.status for a in agents)),
        "listed": [
            {"agent": a.to_wire(), "connections": dict(connections.get(a.id, {}))} for a in listed
        ],
    }


def _conflicts(state: FieldState, viewer: AgentRecord, operator: bool) -> dict[str, Any]:
    """The unresolved conflicts ``viewer`` may see, oldest first, each with its units."""
    listed: list[dict[str, Any]] = []
    visible = 0
    units = state.known_units
    for conflict_id in state.unresolved:
        conflict = state.conflicts[conflict_id]
        if not operator and not visibility.conflict_visible(state, viewer, conflict):
            continue
        visible += 1
        if len(listed) < LISTED_CONFLICTS:
            shown = {key: conflict[key] for key in ("unit_a", "unit_b") if conflict[key] in units}
            excerpts = {key: _excerpt(units[unit_id]) for key, unit_id in shown.items()}
            listed.append({"conflict": conflict, "units": excerpts})
    return {"open": visible, "listed": listed}


def _excerpt(unit: dict[str, Any]) -> dict[str, Any]:
    content = unit.get("content")
    text = content if isinstance(content, str) else ""
    return {
        "id": unit.get("id"),
        "type": unit.get("type"),
        "status": unit.get("status"),
        "agent_id": (unit.get("source") or {}).get("agent_id"),
        "confidence": (unit.get("confidence") or {}).get("score"),
        "content": text if len(text) <= EXCERPT else text[: EXCERPT - 1] + "…",
    }


class _Reading:
    """How the bound subscriptions are read now: the hub's streams gathered once a tick
    (one pass), each listed subscription's figures counted when asked for, each outbox
    counted at most once and all of them within :data:`TALLY_BUDGET` frames."""

    def __init__(self, hub: PushHub | None = None) -> None:
        self.streams: dict[str, list[tuple[Connection, bool]]] = {}
        #: frames waiting for each bound subscription's readers, where there are any
        self.waiting: dict[str, int] = {}
        for subscription_id, connection, replaying in () if hub is None else hub.stream_states():
            bound = self.streams.get(subscription_id)
            if bound is None:
                self.streams[subscription_id] = [(connection, replaying)]
            else:
                bound.append((connection, replaying))
            if depth := len(connection.outbox):
                self.waiting[subscription_id] = self.waiting.get(subscription_id, 0) + depth
        self._tallies: dict[int, dict[str, int] | None] = {}
        self._budget = TALLY_BUDGET

    def progress(self, subscription_id: str) -> dict[str, Any]:
        """``readers``, ``outbox``, ``lag`` (its notifications among those frames; None when
        nothing reads it, or an outbox is too deep to count) and ``replaying``."""
        bound = self.streams.get(subscription_id, ())
        readers: dict[str, int] = {}
        lag: int | None = 0 if bound else None
        for connection, _ in bound:
            readers[connection.kind] = readers.get(connection.kind, 0) + 1
            tally = self._tally(connection)
            lag = None if tally is None or lag is None else lag + tally.get(subscription_id, 0)
        return {
            "readers": readers,
            "outbox": self.waiting.get(subscription_id, 0),
            "lag": lag,
            "replaying": any(replaying for _, replaying in bound),
        }

    def _tally(self, connection: Connection) -> dict[str, int] | None:
        key = id(connection)
        if key not in self._tallies:
            outbox = connection.outbox
            self._tallies[key] = outbox.tally(self._budget)
            self._budget -= len(outbox)
        return self._tallies[key]


def _subscriptions(field: Field, viewer: Viewer, reading: _Reading) -> dict[str, Any]:
    """The active subscriptions the viewer may see (its own; the operator: every agent's),
    those read now or delivered by the Field first, those with the most waiting first."""
    state = field.state
    if viewer.operator:
        total = sum(len(ids) for ids in state.active_subscriptions.values())
        wanted = {s for s in (*reading.streams, *state.deliveries) if s in state.subscriptions}
        for agent_id in state.active_subscriptions:
            if len(wanted) >= LISTED_SUBSCRIPTIONS:
                break
            wanted.update(state.active_subscriptions[agent_id])
    else:
        wanted = set(state.active_subscriptions.get(viewer.id, ()))
        total = len(wanted)
    subscriptions, waiting, owed = state.subscriptions, reading.waiting, field.delivery_progress
    order = [
        (-waiting.get(s, 0) - _owed(owed, s, state.deliveries), subscriptions[s]["agent_id"], s)
        for s in wanted
        if subscriptions[s].get("status") == "active"
    ]
    listed = heapq.nsmallest(LISTED_SUBSCRIPTIONS, order)
    return {"total": total, "listed": [_subscription(field, s, reading) for *_, s in listed]}


def _owed(sending: Progress | None, subscription_id: str, deliveries: dict[str, Any]) -> int:
    """What the Field's own delivery of a subscription owes (0: it delivers none)."""
    if sending is None or subscription_id not in deliveries:
        return 0
    progress = sending.progress(subscription_id)
    return int((progress or {}).get("owed", 0))


def _subscription(field: Field, subscription_id: str, reading: _Reading) -> dict[str, Any]:
    wire = subscribe.subscription_wire(field, subscription_id)
    progress = reading.progress(subscription_id)
    delivery = wire.get("delivery")
    if delivery is not None:  # the Field delivers it: what its delivery owes
        progress["lag"] = delivery.get("owed", 0)
    return {"subscription": wire, **progress}
