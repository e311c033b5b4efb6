"""Durable delivery: the Field POSTs subscriptions to webhooks and RAP runtimes.

One :class:`Sink` per durable delivery (``field/subscriptions/delivery.py``
has its state machine). A sink is a consumer of the push hub, as a
WebSocket is: the hub streams the subscription to it from the sink's
acknowledged position (replaying the log, then live) into a small outbox,
and the sink POSTs each frame, one at a time and in log order, moving
on only once the receiver answered 2xx. So a webhook receives exactly the
notifications the subscription's SSE stream carries, with the same bodies
and cursors.

* **Durable.** What a sink delivered is acknowledged in the log, many
  deliveries per ``delivery.acked`` entry, each written as soon as the
  previous one is durable. After a crash every delivery resumes from its
  last acknowledged position: only deliveries whose acknowledgement was in
  flight are sent again, with the same ``webhook-id``. Every message has
  one, made of what names it in the log, never of a count kept in memory:
  a notification's is its cursor; a subscription's last message's, its
  id and ``.final``; a RAP subscription's tool result's, its id and
  ``.result``.
* **Bounded.** An idle sink holds no task and no frame. Its outbox holds
  at most :attr:`DeliverySettings.sink_frames` frames: a receiver slower
  than the Field overflows it, the hub lets go, and the sink attaches
  again from what it delivered, reading the log like a resumed stream.
* **Isolated.** Requests go through one client with caps on concurrent
  requests in all, per agent and per endpoint, connect and total timeouts, a
  bound on the response bytes read, no redirects, and the egress policy at
  every connection. A receiver that is slow, dead or refusing holds only its
  own sink: never the writer, another sink or a stream.
* **Fair.** The client's slots go to agents in turn, each agent has a share
  of them, an endpoint that keeps timing out gets one request at a time, and
  requests that run long never hold more than three quarters of the slots:
  :class:`Poster` says how, and what a prompt receiver can count on.

* **One sender.** When several nodes serve one Field, one of them owns
  the deliveries (:meth:`DeliveryEngine.own`: a lease with a term,
  :mod:`field.store.lease`) and runs the sinks; the others follow the log
  like everyone else, their engines without a sink, until the lease moves
  to them. A node that gains the lease first writes its term to the log
  (``delivery.term``), then resumes every delivery from its acknowledged
  position; every entry it writes as the sender (acknowledgements, state
  changes) carries that term, and the Field refuses one whose term the log
  holds a newer one than: a sender that outlived its lease (a pause, a
  frozen machine) cannot move a cursor or a state once the next sender
  claimed the deliveries. Losing the lease stops every sink at once
  (:meth:`DeliveryEngine.disown`), and the lease is checked again when each
  POST may go, after it waited for its slots (``sending``, given to
  :meth:`DeliveryEngine.start`).

The RAP framing (:class:`RapFrames`) sends the subscribing call's
``tool_result`` first, each notification as a ``subscription_event``, and,
when the Field ends the subscription, one ``final`` event, after which
nothing is ever sent. When the runtime ends it (``/cancel_tool_call``,
``/close_thread``, a 4xx) its delivery ends in the same write, and the sink
stops at once: RAP forbids sending anything after a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from yarl import URL

from .. import __version__
from ..client import retry_after_seconds
from ..contract.clock import iso_timestamp
from ..contract.errors import FieldError
from ..contract.model import StoredEntry
from ..contract.ratelimit import Rate, TokenBucket
from ..core.egress import EgressPolicy
from ..core.field import Field
from ..core.secrets import SecretBox, signature_headers
from ..core.subscribe import refused_url
from ..core.validation import MAX_URL_CHARS
from ..subscriptions.delivery import (
    Circuit,
    Outcome,
    RetryPolicy,
    Verdict,
    public_delivery,
    verdict,
)
from ..subscriptions.stream import format_cursor
from .egress import PolicyConnector, check_destination, refusal_of
from .listeners import Stage
from .outbox import Outbox
from .push import Connection, PushHub
from .router import SHUTDOWN, Frame
from .service import FieldService
from .slots import FairSlots, Slots

logger = logging.getLogger("field.delivery")

USER_AGENT = f"akashik-field/{__version__} (webhook delivery)"
#: Seconds before an acknowledgement the log refused is written again.
ACK_RETRY_SECONDS = 1.0
#: Seconds before a delivery whose stream the hub ended (a replay that could not read the
#: log) reads on from the log.
REOPEN_SECONDS = 1.0
#: Circuits (agent, endpoint) that counted a timeout the client keeps; past it the one
#: used least recently is forgotten (its endpoint starts over, closed).
MAX_CIRCUITS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySettings:
    """Bounds of the Field's outgoing requests (``field serve --webhook-*`` flags)."""

    connect_timeout: float = 5.0
    timeout: float = 15.0
    max_response_bytes: int = 64 << 10
    concurrency: int = 256
    #: requests of one agent under way at once (at most ``concurrency``)
    concurrency_per_agent: int = 64
    #: requests under way to one endpoint (scheme, host and port)
    concurrency_per_host: int = 32
    #: seconds after which a request under way is slow: slow requests hold all the
    #: client's slots but a quarter (at least one) at most (see :class:`Poster`)
    slow_after: float = 1.0
    #: notifications one delivery may send per second, and in a burst
    rate: float = 50.0
    burst: int = 100
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: frames a sink's outbox holds before the sink falls back to reading the log
    sink_frames: int = 32
    sink_bytes: int = 2 << 20
    #: seconds a caught-up delivery keeps its hub connection before it lets go of it and
    #: waits, dormant, for a match (which wakes it to read from the log)
    rest_after: float = 30.0


@dataclass(frozen=True, slots=True)
class Answer:
    """What one POST got: a status (None: no answer), an error, a Retry-After in seconds;
    whether it timed out, and whether it was sent at all (no: deferred by a circuit)."""

    status: int | None
    error: str | None = None
    retry_after: float | None = None
    timed_out: bool = False
    sent: bool = True

    @property
    def outcome(self) -> Outcome:
        if self.status is not None:
            return Outcome.ANSWERED
        if not self.sent:
            return Outcome.ABANDONED
        return Outcome.TIMED_OUT if self.timed_out else Outcome.FAILED


#: What a request carries, made once it may go: (body, headers).
Compose = Callable[[], tuple[bytes, dict[str, str]]]


class Poster:
    """The one HTTP client of durable deliveries (see the module docstring).

    A request passes, in this order (while it waits at one it holds only what the
    steps before gave it, its agent's own share or a slot of its endpoint's):

    1. **its agent's circuit at the endpoint** (:class:`Circuit`; an endpoint is a
       URL's scheme, host and port): once the agent's requests to it timed out
       ``retry.open_after`` times in a row, the next ones are answered at once, not
       sent (``sent=False``, with a Retry-After), but for one probe after a delay that
       grows each time the probe gets no answer, until the endpoint answers again;
    2. **its agent's share**, ``concurrency_per_agent`` requests at once, first come
       first served (one request per delivery at a time: round robin across the
       agent's deliveries);
    3. **the endpoint's slots**, ``concurrency_per_host``, and
    4. **the client's slots**, ``concurrency``: a released slot goes to the waiting
       agent that holds the fewest, in turn among equals (:class:`FairSlots`).

    Then the request runs, and once it has run ``slow_after`` seconds it is *slow*.
    Slow requests may hold all the client's slots but a quarter (at least one); when
    one more turns slow beyond that while an agent waits, or an agent starts to wait
    while they are beyond it, the newest slow request is cut short (a timeout, which
    its circuit counts; the delivery tries again). So a quarter of the slots are
    always free or held by requests younger than ``slow_after``, and the request of an
    agent that holds fewer slots than the others waits at most about ``slow_after``
    for one, however many requests of theirs hang.

    Endpoints are told apart by their host as the URL names it, not by the address
    it resolves to (that is known only once the connector resolves it, after the
    slots): names that share an address have a cap each, and what they can hold is
    bounded by their agents' shares and the slow share. aiohttp's own limits (the
    connector's, keyed by host, port and TLS as the endpoint's are) equal these caps
    and are never the ones reached.
    """

    def __init__(
        self,
        settings: DeliverySettings,
        policy: EgressPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.clock = clock
        self.random = rng
        self._session: aiohttp.ClientSession | None = None
        self._all = FairSlots(settings.concurrency)
        self._share = min(settings.concurrency_per_agent, settings.concurrency)
        #: each agent's share, and each endpoint's slots, while some request holds or
        #: waits for one
        self._agents: dict[str, Slots] = {}
        self._hosts: dict[str, FairSlots] = {}
        #: (agent, endpoint) -> its circuit, least recently used first; a circuit that
        #: counts nothing is not kept
        self._circuits: OrderedDict[tuple[str, str], Circuit] = OrderedDict()
        #: requests under way, by ticket: those not known to be slow, with when each
        #: started (oldest first), and the slow ones, in the order they were found slow;
        #: the tickets of those being cut short; how many slow ones may hold slots while
        #: others wait; the one timer that looks for requests turning slow (while
        #: someone waits for the client's slots, and only then)
        self._young: OrderedDict[int, tuple[float, asyncio.Task[Any]]] = OrderedDict()
        self._slow: OrderedDict[int, asyncio.Task[Any]] = OrderedDict()
        self._cutting: set[int] = set()
        self._slow_share = settings.concurrency - max(1, settings.concurrency // 4)
        self._shedder: asyncio.TimerHandle | None = None
        self._tickets = itertools.count()

    async def start(self) -> None:
        connector = PolicyConnector(
            self.policy,
            limit=self.settings.concurrency,
            limit_per_host=self.settings.concurrency_per_host,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"User-Agent": USER_AGENT},
            # a receiver's cookies are neither kept (without bound) nor sent on
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(
                total=self.settings.timeout, sock_connect=self.settings.connect_timeout
            ),
        )

    async def close(self) -> None:
        if self._shedder is not None:
            self._shedder.cancel()
            self._shedder = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, agent: str = ""
    ) -> Answer:
        """POST ``body`` to ``url`` for ``agent``: the receiver's answer, or why there was
        none."""
        return await self.send(url, lambda: (body, headers), agent=agent)

    async def send(
        self,
        url: str,
        compose: Compose,
        *,
        agent: str = "",
        ready: Callable[[], bool] | None = None,
    ) -> Answer:
        """POST what ``compose`` makes once the request may go (so that it is signed when
        it is sent, not when it started to wait): the answer, or why there was none.
        ``ready``, asked then too: whether it may still be sent at all (False: it is not,
        ``sent=False``)."""
        assert self._session is not None, "the poster is not started"
        target = URL(url)  # parsed once: aiohttp takes it as it is
        endpoint = str(target.origin())
        key = (agent, endpoint)
        circuit = self._circuits.get(key) if self._circuits else None
        probe = False
        if circuit is not None:
            probe, wait = circuit.admit(self.clock())
            if wait > 0:
                return _deferred(endpoint, circuit, wait)
        outcome = Outcome.ABANDONED
        try:
            answer = await self._queue(target, endpoint, agent, compose, ready)
            outcome = answer.outcome
            return answer
        finally:
            self._record(key, outcome, probe)

    async def _queue(
        self,
        target: URL,
        endpoint: str,
        agent: str,
        compose: Compose,
        ready: Callable[[], bool] | None,
    ) -> Answer:
        """The request, once it has its agent's share, its endpoint's slot and the client's
        (each taken at once when free: most requests never wait), among those under way
        (which :meth:`_shed` may cut short)."""
        share = self._agents.get(agent)
        if share is None:
            share = self._agents[agent] = Slots(self._share)
        gate = self._hosts.get(endpoint)
        if gate is None:
            gate = self._hosts[endpoint] = FairSlots(self.settings.concurrency_per_host)
        everyone = self._all
        try:
            if not share.take():
                await share.wait()
            try:
                if not gate.take(agent):
                    await gate.wait(agent)
                try:
                    if not everyone.take(agent):
                        self._shed(waits=True)  # this request waits: make room if due
                        await everyone.wait(agent)
                    try:
                        return await self._timed(target, compose, ready)
                    finally:
                        everyone.release(agent)
                finally:
                    gate.release(agent)
            finally:
                share.release()
        finally:
            if not gate.users and self._hosts.get(endpoint) is gate:
                del self._hosts[endpoint]
            if not share.users and self._agents.get(agent) is share:
                del self._agents[agent]

    async def _timed(
        self, target: URL, compose: Compose, ready: Callable[[], bool] | None
    ) -> Answer:
        """The request, among those under way (which :meth:`_shed` may cut short)."""
        if ready is not None and not ready():
            return Answer(None, "not sent: this node no longer sends the deliveries", sent=False)
        ticket = next(self._tickets)
        task = asyncio.current_task()
        assert task is not None
        self._young[ticket] = (asyncio.get_running_loop().time(), task)
        try:
            body, headers = compose()
            return await self._post(target, body, headers)
        except asyncio.CancelledError:
            if ticket not in self._cutting:
                raise
            self._cutting.discard(ticket)
            if task.uncancel():  # cancelled by someone else too: that stands
                raise
            slow = self.settings.slow_after
            return Answer(None, f"cut short after {slow:g} s: others waited", timed_out=True)
        finally:
            if self._young.pop(ticket, None) is None:
                self._slow.pop(ticket, None)
            if ticket in self._cutting:  # the request swallowed its cancellation
                self._cutting.discard(ticket)
                task.uncancel()

    def _shed(self, *, waits: bool = False) -> None:
        """While some request waits for the client's slots (``waits``: one is about to):
        requests that have run ``slow_after`` seconds are slow, and those beyond the slow
        share are cut short, the newest first; then, if any request is not slow yet,
        look again when the oldest of them turns slow."""
        if not (waits or self._all.waiting):
            return
        loop = asyncio.get_running_loop()
        young, slow = self._young, self._slow
        since = loop.time() - self.settings.slow_after
        while young:
            ticket = next(iter(young))
            started, task = young[ticket]
            if started > since:
                break
            del young[ticket]
            slow[ticket] = task
        while len(slow) > self._slow_share:
            ticket, task = slow.popitem()
            self._cutting.add(ticket)
            task.cancel()  # it waits inside _timed, which takes the cancellation back
        if young and self._shedder is None:
            started, _ = young[next(iter(young))]
            self._shedder = loop.call_at(started + self.settings.slow_after, self._look_again)

    def _look_again(self) -> None:
        self._shedder = None
        self._shed()

    def _record(self, key: tuple[str, str], outcome: Outcome, probe: bool) -> None:
        """Note a request's outcome in its circuit (made by a first timeout, dropped once
        it counts nothing)."""
        circuits = self._circuits
        circuit = circuits.get(key)
        if circuit is None:
            if outcome is not Outcome.TIMED_OUT:
                return
            if len(circuits) >= MAX_CIRCUITS:
                circuits.popitem(last=False)
            circuit = circuits[key] = Circuit()
        else:
            circuits.move_to_end(key)
        now = self.clock()
        circuit.record(outcome, now, probe=probe, policy=self.settings.retry, draw=self.random)
        if circuit.fresh:
            del circuits[key]

    async def _post(self, url: URL, body: bytes, headers: dict[str, str]) -> Answer:
        assert self._session is not None
        try:
            async with self._session.post(
                url,
                data=body,
                headers={"Content-Type": "application/json", **headers},
                allow_redirects=False,
            ) as response:
                # what a receiver answers is read only so far
                await response.content.read(self.settings.max_response_bytes)
                wait = retry_after_seconds(response.headers.get("Retry-After"))
                return Answer(response.status, None, wait)
        except aiohttp.ClientConnectorError as exc:
            refused = refusal_of(exc)
            why = f"refused by the egress policy: {refused}" if refused else _why(exc)
            return Answer(None, why)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Answer(None, _why(exc), timed_out=isinstance(exc, TimeoutError))


def _deferred(endpoint: str, circuit: Circuit, wait: float) -> Answer:
    """The answer to a request its circuit holds back (nothing was sent)."""
    if circuit.state == "probing":
        then = "one request to it is under way, and the others wait for its answer"
    else:
        then = f"the next goes alone in {wait:.1f} s"
    why = f"not sent: requests to {endpoint} timed out {circuit.timeouts} times in a row; {then}"
    return Answer(None, why, wait, sent=False)


def _why(exc: BaseException) -> str:
    """A short, bounded description of a failed request."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"


async def check_webhook(body: Any, policy: EgressPolicy) -> None:
    """Before a SUBSCRIBE naming a webhook runs: refuse (422) a URL whose host name
    resolves to an address the Field may not deliver to. (The Field checks the URL
    itself again, and every connection checks where it goes: DNS may change.)"""
    try:
        url = body["payload"]["subscription"]["delivery"]["url"]
        wanted = body["operation"] == "SUBSCRIBE"
    except (KeyError, TypeError):
        return
    if not wanted or not isinstance(url, str) or len(url) > MAX_URL_CHARS:
        return  # validation answers what is malformed
    reason = await check_destination(policy, url)
    if reason is not None:
        raise refused_url(reason)


# -- framing: what each kind of delivery POSTs ----------------------------------------


class WebhookFrames:
    """A notification as the SSE stream's ``data`` (the same JSON), signed twice."""

    __slots__ = ("url", "_secret")

    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self._secret = secret

    def notification(self, frame: Frame, now: float) -> tuple[bytes, dict[str, str]]:
        assert frame.cursor is not None
        return frame.body, signature_headers(self._secret, frame.cursor, int(now), frame.body)

    def final(
        self, report: bytes, reason: str | None, subscription_id: str, now: float
    ) -> tuple[bytes, dict[str, str]]:
        """The last POST: the stream's ``end`` report with ``final: true`` and why it ended;
        its ``webhook-id`` is the subscription's id + ``.final`` (one per subscription)."""
        body = orjson.dumps({**orjson.loads(report), "reason": reason, "final": True})
        message_id = f"{subscription_id}.final"
        return body, signature_headers(self._secret, message_id, int(now), body)


class RapFrames:
    """The RAP messages of a subscription made by a RAP call (``rap-and-webhooks.md``),
    each with its ``webhook-id``: the same on every attempt, before a restart and after."""

    __slots__ = ("url", "_subscription", "_group", "_call", "_associative", "_call_id")

    def __init__(self, subscription_id: str, record: dict[str, Any]) -> None:
        self.url = record["callback_url"]
        self._subscription = subscription_id
        self._group = record["group_id"]
        self._call = record["tool_call_id"]
        self._associative = bool(record["associative"])
        self._call_id = record.get("call_id")

    def result(self, text: str) -> tuple[bytes, dict[str, str]]:
        """The subscribing call's tool result (``webhook-id``: the subscription's id and
        ``.result``)."""
        message = {
            "type": "tool_result",
            "group_id": self._group,
            "id": self._call,
            "text": text,
            "subscription": True,
        }
        if self._call_id is not None:
            message["call_id"] = self._call_id
        return orjson.dumps(message), {"webhook-id": f"{self._subscription}.result"}

    def notification(self, frame: Frame, now: float) -> tuple[bytes, dict[str, str]]:
        """A notification (``webhook-id``: its cursor, as a webhook's)."""
        return self._event(frame.body.decode(), final=False), _message_id(frame.cursor)

    def final(self, report: bytes, reason: str | None) -> tuple[bytes, dict[str, str]]:
        """The last event: the stream's ``end`` report, with why the subscription ended
        (``webhook-id``: the subscription's id and ``.final``, as a webhook's)."""
        text = report.decode()
        if reason is not None:
            text = orjson.dumps({**orjson.loads(report), "reason": reason}).decode()
        return self._event(text, final=True), {"webhook-id": f"{self._subscription}.final"}

    def _event(self, text: str, *, final: bool) -> bytes:
        message: dict[str, Any] = {
            "type": "subscription_event",
            "group_id": self._group,
            "tool_call_id": self._call,
            "text": text,
            "associative": self._associative,
        }
        if final:
            message["final"] = True
        return orjson.dumps(message)


def _message_id(cursor: str | None) -> dict[str, str]:
    return {"webhook-id": cursor} if cursor else {}


#: What one attempt POSTs, made at the attempt's time: (body, headers).
Message = Callable[[float], tuple[bytes, dict[str, str]]]


def _unsigned(message: tuple[bytes, dict[str, str]]) -> Message:
    """A message made once, the same at every attempt (a RAP tool result or final event:
    RAP messages are not signed)."""
    return lambda now: message


# -- one delivery -----------------------------------------------------------------------


class Sink:
    """One durable delivery: a hub consumer that POSTs in order and acknowledges."""

    __slots__ = (
        "engine",
        "subscription_id",
        "agent_id",
        "kind",
        "frames",
        "connection",
        "task",
        "delivered",
        "created",
        "state",
        "attempts",
        "first_failure",
        "failing_since",
        "last_status",
        "last_error",
        "next_attempt",
        "bucket",
        "in_flight",
        "closed",
        "quiet",
    )

    def __init__(self, engine: DeliveryEngine, subscription_id: str, record: dict[str, Any]):
        self.engine = engine
        self.subscription_id = subscription_id
        self.agent_id: str = record["agent_id"]
        self.kind: str = record["type"]
        self.frames: WebhookFrames | RapFrames = (
            RapFrames(subscription_id, record)
            if self.kind == "rap"
            else WebhookFrames(
                record["url"], engine.secret_box.open(record["secret"], context=subscription_id)
            )
        )
        self.connection: Any = None
        self.task: asyncio.Task[None] | None = None
        #: the last position delivered (the acknowledged one, or past it)
        self.delivered: int = record["acked"]
        self.created: int = record["created_position"]
        self.state: str = record["state"]
        self.attempts = 0
        self.first_failure: float | None = None
        self.failing_since: float | None = engine.clock() if self.state == "failing" else None
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.next_attempt: float | None = None
        #: the delivery's rate limit (a full bucket, refilled long ago)
        self.bucket = TokenBucket(engine.full_bucket, 0.0)
        self.in_flight = False
        self.closed = False
        #: sweeps of the engine since this delivery last sent anything (see :meth:`rest`)
        self.quiet = 0

    # -- life cycle ---------------------------------------------------------------

    def open(self) -> None:
        """Attach to the hub from what was delivered (the log holds everything after);
        or, owing nothing, wait dormant for the hub to wake it."""
        if self.closed or self.state == "suspended":
            return
        hub = self.engine.hub
        start = max(self.delivered, self.created)
        if self._owes_nothing(start):
            hub.sleep(self.subscription_id, self)
            return
        hub.unsleep(self.subscription_id)
        self.connection = self._connect()
        hub.attach_at(self.connection, self.subscription_id, start)
        self.quiet = 0
        self.poke()

    def _reopen(self) -> None:
        """:meth:`open`, unless the delivery was opened (or woken) again meanwhile."""
        if self.connection is None:
            self.open()

    def awaken(self) -> Connection | None:
        """The hub matched an event for this dormant delivery, or its subscription ended:
        a connection, to which the hub binds the stream live (:meth:`PushHub.sleep`)."""
        if self.closed or self.connection is not None:
            return None
        connection = self._connect()
        self.connection = connection
        self.quiet = 0
        return connection

    def _connect(self) -> Connection:
        settings = self.engine.settings
        outbox = Outbox(max_frames=settings.sink_frames, max_bytes=settings.sink_bytes)
        outbox.notify = self.poke
        return self.engine.hub.connect_sink(self.agent_id, self.kind, outbox)

    def _owes_nothing(self, start: int) -> bool:
        """Nothing after ``start`` can be owed but what the hub has yet to route: the
        subscription is active, the hub has routed nothing past ``start``, and a RAP
        call's result was delivered."""
        state = self.engine.field.state
        subscription = state.subscriptions.get(self.subscription_id)
        return (
            subscription is not None
            and subscription["status"] == "active"
            and start >= self.engine.hub.published
            and not (self.kind == "rap" and self.delivered < self.created)
        )

    def rest(self) -> bool:
        """Let go of the hub connection if this delivery has been idle, caught up, for a
        whole sweep: it waits dormant (no outbox, no stream) until a match wakes it."""
        connection = self.connection
        if connection is None or self.closed or self.task is not None or self.in_flight:
            return False
        if self.engine.hub.routing:  # a batch is half routed: what it owes is not known yet
            return False
        if self.state != "active" or len(connection.outbox):
            return False
        binding = connection.streams.get(self.subscription_id)
        if binding is None or binding.held is not None or binding.stream.deadline is not None:
            return False
        if binding.lagging:  # catching up from the log: what it owes is still to be read
            return False
        subscription = self.engine.field.state.subscriptions.get(self.subscription_id)
        if subscription is None or subscription["status"] != "active":
            return False
        self.quiet += 1
        if self.quiet < 2:
            return False
        self.let_go()
        # everything the stream was offered and did not deliver, it did not match: from
        # what was delivered on, the log holds what a wake-up reads
        self.engine.hub.sleep(self.subscription_id, self)
        return True

    def let_go(self) -> None:
        """Leave the hub (the frames it queued are read again from the log later)."""
        if self.connection is not None:
            self.connection.outbox.notify = None
            self.engine.hub.disconnect(self.connection)
            self.connection = None

    def close(self) -> None:
        self.closed = True
        self.engine.hub.unsleep(self.subscription_id)
        self.let_go()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def restart(self) -> None:
        """Start over from what was delivered (after a resume, or a re-attach)."""
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
            self.task = None
        self.let_go()
        self.attempts, self.first_failure, self.next_attempt = 0, None, None
        self.open()

    def poke(self) -> None:
        """Something may be ready: make sure a task is delivering (never two)."""
        if self.task is None and not self.closed and self.state != "suspended":
            self.task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            if self.kind == "rap" and self.delivered < self.created:
                await self._send_result()
            while not self.closed and self.connection is not None:
                frames = self.connection.outbox.drain_now(1)
                if not frames:
                    if self.connection.ended not in (None, SHUTDOWN):
                        # the hub ended the stream with nothing more to say: its replay
                        # or catch-up could not read the log. Read on from the log soon.
                        logger.warning(
                            "delivering %s: %s; reading on from the log in %g s",
                            self.subscription_id,
                            self.connection.ended[1],
                            REOPEN_SECONDS,
                        )
                        self.let_go()
                        self.engine.loop_later(REOPEN_SECONDS, self._reopen)
                    return
                await self._handle(frames[0])
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("delivering %s failed; starting it over", self.subscription_id)
            self.engine.loop_later(5.0, self.restart)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
            connection = self.connection
            if connection is not None and len(connection.outbox) and not self.closed:
                self.poke()  # a frame came while the task was finishing

    async def _handle(self, frame: Frame) -> None:
        position = frame.position
        if position is not None:
            if position <= self.delivered:
                return  # already delivered (before a re-attach)
            self.quiet = 0
            if await self._deliver(functools.partial(self.frames.notification, frame)):
                self.delivered = position
                self.engine.ack(self.subscription_id, position)
                counts = self.engine.hub.counts
                if counts is not None:
                    sent = counts.sender(self.kind)
                    sent[frame.kind] = sent.get(frame.kind, 0) + 1
                    counts.latency_of(self.kind).sent((frame,))
        elif frame.kind == "overflow":
            # the receiver fell behind the log: read on from the log, from where we are
            self.connection = None
            self.open()
        elif frame.kind == "end":
            await self._end(frame)
        elif frame.kind == "resume":
            report = frame.control or {}
            if not report.get("recovered", True):
                self.last_error = f"could not resume: {report.get('reason')}"
                logger.error("delivery %s %s", self.subscription_id, self.last_error)

    async def _send_result(self) -> None:
        """A RAP subscription's first message: the subscribing call's tool result."""
        assert isinstance(self.frames, RapFrames)
        text = self.engine.result_text(self.subscription_id, self.created)
        if await self._deliver(_unsigned(self.frames.result(text))):
            self.delivered = self.created
            self.engine.ack(self.subscription_id, self.created)

    async def _end(self, frame: Frame) -> None:
        """The Field ended the subscription and everything it owed before is delivered: send
        the final message (RAP: the final event; a webhook: a final POST), then end. (A RAP
        runtime's own end never gets here: the sink was closed in the write that made it.)"""
        if not await self._deliver(self._final(frame.body), final=True):
            return  # suspended: the final message is sent when it resumes
        self.closed = True
        self.let_go()
        await self.engine.change(self, "end", None)
        self.engine.forget(self)

    def _final(self, report: bytes) -> Message:
        subscription = self.engine.field.state.subscriptions.get(self.subscription_id, {})
        reason = subscription.get("cancel_reason")
        if isinstance(self.frames, RapFrames):
            return _unsigned(self.frames.final(report, reason))
        return functools.partial(self.frames.final, report, reason, self.subscription_id)

    # -- one message, until it is delivered ----------------------------------------

    async def _deliver(self, message: Message, *, final: bool = False) -> bool:
        """POST until a 2xx (True); False when the delivery must stop for now. Each attempt
        is signed when it is made: receivers refuse a signature's time long past. A receiver
        that refuses the ``final`` message (a 4xx: it let go of the subscription) is done
        with it too: True."""
        engine = self.engine
        policy = engine.settings.retry
        while not self.closed:
            await self._take_token()
            if not engine.may_send():
                engine.disown()  # the lease is gone: another node sends from now on
                return False
            self.in_flight = True
            try:
                answer = await engine.poster.send(
                    self.frames.url,
                    lambda: message(engine.clock()),
                    agent=self.agent_id,
                    ready=engine.may_send,
                )
            finally:
                self.in_flight = False
            if not answer.sent and not engine.may_send():
                engine.disown()  # the lease ran out while the request waited for its slots
                return False
            self.last_status = answer.status
            judged = verdict(answer.status)
            if answer.sent:  # a request its circuit held back is no POST
                engine.attempts[(self.kind, judged.value)] += 1
            now = engine.clock()
            if judged is Verdict.DELIVERED:
                self.attempts, self.first_failure, self.next_attempt = 0, None, None
                self.last_error = None
                if self.state == "failing":
                    await engine.change(self, "recover", None)
                return True
            self.attempts += 1
            self.first_failure = self.first_failure or now
            self.last_error = answer.error or f"answered HTTP {answer.status}"
            if judged is Verdict.REFUSED and final:
                return True  # a refused final message: the receiver is done with it
            if judged is Verdict.REFUSED and self.kind == "rap":
                # the runtime no longer knows the subscription: it ends, nothing more is sent
                await engine.cancel_gone(self)
                return False
            fails = self.state == "active" and (
                judged is Verdict.REFUSED
                or policy.exhausted(self.attempts, self.first_failure, now)
            )
            if fails or self.state == "failing":
                delay = policy.failing_interval * (0.5 + engine.random() / 2)
            else:
                delay = policy.delay(self.attempts, engine.random, answer.retry_after)
            # set before any await: whoever reads the new state reads its next attempt too
            self.next_attempt = now + delay
            if fails:
                self.failing_since = now
                await engine.change(self, "fail", self.last_error)
            if self.state == "failing" and now - (self.failing_since or now) >= (
                policy.suspend_after
            ):
                self.next_attempt = None
                await engine.change(self, "suspend", self.last_error)
                self.let_go()
                return False
            await asyncio.sleep(delay)  # the pace of retries
        return False

    async def _take_token(self) -> None:
        """The delivery's rate limit: a token bucket of ``burst`` at ``rate`` per second."""
        bucket = self.bucket
        wait = bucket.take(self.engine.rate, self.engine.clock())
        if wait > 0:  # over the rate: wait for the token, then it is taken
            await asyncio.sleep(wait)
            bucket.tokens, bucket.stamp = 0.0, self.engine.clock()

    def status(self) -> dict[str, Any]:
        """This delivery's progress, for SUBSCRIBE ``list``."""
        queued = len(self.connection.outbox) if self.connection is not None else 0
        return {
            "owed": queued + self.in_flight,
            "attempts": self.attempts,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "next_attempt_at": (
                iso_timestamp(self.next_attempt) if self.next_attempt is not None else None
            ),
        }


# -- every delivery -----------------------------------------------------------------------


class Sinks(dict[str, Sink]):
    """The sinks this node runs, by subscription: made before the Field, which reads each
    delivery's progress here for SUBSCRIBE ``list``
    (:class:`~field.subscriptions.delivery.Progress`); the engine fills it."""

    def progress(self, subscription_id: str) -> dict[str, Any] | None:
        sink = self.get(subscription_id)
        return sink.status() if sink is not None else None


class DeliveryEngine:
    """Every durable delivery of one Field: its sinks, its client, its acknowledgements."""

    def __init__(
        self,
        service: FieldService,
        hub: PushHub,
        settings: DeliverySettings,
        *,
        policy: EgressPolicy,
        secret_box: SecretBox,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        sinks: Sinks | None = None,
    ) -> None:
        """``sinks``: where the sinks are kept, if the Field reads their progress there
        (the root makes it first and gives it to both)."""
        self.service = service
        self.hub = hub
        self.settings = settings
        self.secret_box = secret_box
        self.poster = Poster(settings, policy, rng=rng)
        self.clock = clock
        self.random = rng
        self.sinks = Sinks() if sinks is None else sinks
        self.full_bucket = float(settings.burst)
        #: each delivery's rate of notifications
        self.rate = Rate(settings.rate, settings.burst)
        self._acks: dict[str, int] = {}
        #: the term the pending acknowledgements were made under
        self._acks_term: int | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._sweeper: asyncio.Task[None] | None = None
        #: POSTs made, by (delivery kind, verdict), and state changes, by (kind, action)
        #: (``GET /metrics``)
        self.attempts: Counter[tuple[str, str]] = Counter()
        self.changes: Counter[tuple[str, str]] = Counter()
        #: whether this node runs the sinks (several nodes: while it holds the lease, once
        #: its term is in the log)
        self.owner = False
        #: the term of the lease this node claims or owns the deliveries under (None: one
        #: node, or not held); every entry the engine writes carries it
        self.term: int | None = None
        #: writes the claim of ``term`` to the log, then runs the sinks
        self._claiming: asyncio.Task[None] | None = None
        #: whether the lease still allows sending (checked at each POST); None: one node
        self._sending: Callable[[], bool] | None = None

    @property
    def field(self) -> Field:
        return self.service.field

    async def start(self, *, own: bool = True, sending: Callable[[], bool] | None = None) -> None:
        """Follow the log from now on and, with ``own``, resume every delivery the log has
        not seen end (else they wait for :meth:`own`). ``sending``: whether the lease this
        node owns the deliveries by still allows a POST, asked before each and again when it
        may go, and before the sinks resume under a new term (None: one node, no lease). It
        comes here rather than to the constructor because the lease is built on the engine
        (it calls :meth:`own` and :meth:`disown`)."""
        self._sending = sending
        await self.poster.start()
        if own:
            self.own()
        self.service.listeners.add(self.observe, Stage.DELIVERIES)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def own(self, term: int | None = None) -> None:
        """Run the sinks: resume every delivery the log holds and has not seen end, each
        from its acknowledged position (a delivery still being stored comes with its entry,
        through :meth:`observe`). With ``term`` (several nodes: the lease was taken under
        it), first claim the deliveries in the log under it (:meth:`_claim`); they resume
        once the claim is durable, if the lease still holds."""
        if term is None:
            self._resume()
            return
        if self.term == term:
            return
        self.disown()  # another term's sinks, if any, stop first
        self.term = term
        self._claiming = asyncio.get_running_loop().create_task(
            self._claim(term), name=f"delivery-claim-{term}"
        )

    async def _claim(self, term: int) -> None:
        """Write ``delivery.term`` (again after a refused write), then run the sinks; stop
        if the lease is lost meanwhile, or the log holds a newer term."""
        claim = functools.partial(Field.claim_deliveries, term=term, node=self.service.node_id)
        while self.term == term:
            try:
                outcome = await self.service.execute(claim, operation="DELIVERY")
            except FieldError as error:  # the log refuses writes, or is overloaded
                logger.warning("claiming the deliveries (term %d) failed: %s", term, error.message)
                await asyncio.sleep(ACK_RETRY_SECONDS)
                continue
            if (
                not self._superseded(outcome.response, term)
                and self.term == term
                and self._may_act()
            ):
                self._resume()
            return

    def _resume(self) -> None:
        if self.owner:
            return
        self.owner = True
        state = self.field.state
        for subscription_id, record in list(state.deliveries.items()):
            stored = record["created_position"] <= state.last_position
            if record["state"] != "ended" and stored and subscription_id not in self.sinks:
                self._add(subscription_id, record)
        # worth a line when there is something to resume (a lease taken is the cluster's line)
        level = logging.INFO if self.sinks else logging.DEBUG
        logger.log(level, "this node sends the Field's deliveries: %d resumed", len(self.sinks))

    def disown(self) -> None:
        """Stop every sink at once: another node sends from now on. Acknowledgements
        already made are still written under their term (they are true, and only ever move
        forward; the log refuses them once a newer term is in it)."""
        self.term = None
        claiming, self._claiming = self._claiming, None
        if claiming is not None and claiming is not asyncio.current_task():
            claiming.cancel()
        if not self.owner:
            return
        self.owner = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for sink in list(self.sinks.values()):
            sink.close()
        self.sinks.clear()
        logger.info("this node no longer sends the Field's deliveries")

    def may_send(self) -> bool:
        """Whether a sink may POST now: this node owns the deliveries, and its lease (if
        any) is still valid."""
        return self.owner and self._may_act()

    def _may_act(self) -> bool:
        return self._sending is None or self._sending()

    def newest_term(self) -> int:
        """The newest term of the deliveries' lease the log holds (0: none)."""
        return self.field.state.delivery_term

    def _superseded(self, response: dict[str, Any], term: int | None) -> bool:
        """Whether the Field's ``response`` to a write made under ``term`` refused it, the
        log holding a newer term; then this node stops sending (if it still sends under
        ``term``)."""
        if response.get("status") != "superseded":
            return False
        logger.warning(
            "the deliveries' term %s is over: the log holds term %s", term, response.get("term")
        )
        if self.term == term:
            self.disown()
        return True

    async def _sweep(self) -> None:
        """Every half ``rest_after``: deliveries idle and caught up since the last sweep
        let go of their hub connections (:meth:`Sink.rest`)."""
        while True:
            await asyncio.sleep(self.settings.rest_after / 2)
            for sink in [s for s in self.sinks.values() if s.connection is not None]:
                sink.rest()

    async def stop(self) -> None:
        """Stop every sink; write the acknowledgements still pending, then close the client."""
        self.service.listeners.remove(self.observe)
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._claiming is not None:
            self._claiming.cancel()
        for timer in self._timers:
            timer.cancel()
        for sink in list(self.sinks.values()):
            sink.close()
        if self._flusher is not None:
            with contextlib.suppress(asyncio.CancelledError, FieldError):
                await asyncio.wait_for(self._flusher, 5)
        await self.poster.close()

    def observe(self, entries: list[StoredEntry]) -> None:
        """New durable deliveries start; a resumed one starts over (the writer calls this).
        A node that does not own the deliveries only follows the log."""
        if not self.owner:
            return
        for entry in entries:
            if entry.kind == "subscription.created" and "delivery" in entry.data:
                subscription_id = entry.data["subscription"]["id"]
                record = self.field.state.deliveries.get(subscription_id)
                if record is not None and subscription_id not in self.sinks:
                    self._add(subscription_id, record)
            elif entry.kind == "delivery.changed" and entry.data["action"] == "resume":
                sink = self.sinks.get(entry.data["subscription_id"])
                if sink is not None and sink.state != "active":
                    sink.state = "active"
                    sink.failing_since = None
                    sink.restart()
            elif entry.kind == "delivery.changed" and entry.data["action"] == "end":
                # a sink that ends itself is closed already; one whose RAP runtime let go of
                # its subscription stops here, at once, whatever it was sending or owed
                sink = self.sinks.pop(entry.data["subscription_id"], None)
                if sink is not None and not sink.closed:
                    sink.close()

    def _add(self, subscription_id: str, record: dict[str, Any]) -> None:
        try:
            sink = Sink(self, subscription_id, record)
        except ValueError:
            logger.error("the secret of %s cannot be opened with this key", subscription_id)
            return
        self.sinks[subscription_id] = sink
        sink.open()

    def forget(self, sink: Sink) -> None:
        self.sinks.pop(sink.subscription_id, None)

    def result_text(self, subscription_id: str, created: int) -> str:
        """The tool result of a RAP subscription's call: what a SUBSCRIBE answered."""
        state = self.field.state
        subscription = {
            k: v
            for k, v in state.subscriptions[subscription_id].items()
            if k not in ("cancel_reason", "ended_position")
        }
        subscription["status"] = "active"  # as it was created, whatever happened since
        subscription["delivery"] = public_delivery(state.deliveries[subscription_id])
        body = {
            "status": "ok",
            "subscription_id": subscription_id,
            "subscription": subscription,
            "cursor": format_cursor(self.hub.tag, created),
        }
        return orjson.dumps(body).decode()

    def loop_later(self, delay: float, callback: Callable[[], None]) -> None:
        timer = asyncio.get_running_loop().call_later(delay, callback)
        self._timers.add(timer)

    # -- what the sinks report, made durable (server jobs: see admission.SERVER_JOBS) ----

    def ack(self, subscription_id: str, position: int) -> None:
        """``position`` was delivered: acknowledge it with the next write."""
        if self._acks_term != self.term:
            # made under an earlier term of this node's: the log, which holds this one
            # already, would refuse them (the next sender resumes from the cursor it holds)
            self._acks, self._acks_term = {}, self.term
        self._acks[subscription_id] = max(position, self._acks.get(subscription_id, 0))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._acks:
                batch, term, self._acks = self._acks, self._acks_term, {}
                try:
                    outcome = await self.service.execute(
                        functools.partial(Field.ack_deliveries, positions=batch, term=term),
                        operation="DELIVERY",
                    )
                except FieldError as error:  # the log refuses writes, or is overloaded
                    logger.warning("acknowledging deliveries failed: %s", error.message)
                    if self._acks_term == term:
                        for subscription_id, position in batch.items():
                            self._acks[subscription_id] = max(
                                position, self._acks.get(subscription_id, 0)
                            )
                    await asyncio.sleep(ACK_RETRY_SECONDS)
                else:
                    self._superseded(outcome.response, term)
        finally:
            self._flusher = None

    async def change(self, sink: Sink, action: str, reason: str | None) -> None:
        """Move a delivery's state, in the log first (the sink follows either way)."""
        after = {"fail": "failing", "recover": "active", "suspend": "suspended", "end": "ended"}
        sink.state = after.get(action, sink.state)
        self.changes[(sink.kind, action)] += 1
        term = self.term
        try:
            outcome = await self.service.execute(
                lambda field: field.change_delivery(sink.subscription_id, action, reason, term),
                operation="DELIVERY",
            )
        except FieldError as error:
            logger.warning(
                "recording that %s is %s failed: %s", sink.subscription_id, sink.state, error
            )
        else:
            self._superseded(outcome.response, term)

    async def cancel_gone(self, sink: Sink) -> None:
        """A RAP runtime no longer knows a subscription (it refused a message with a 4xx):
        the sink stops now, and the subscription is cancelled and its delivery ended, owing
        nothing. Should the log refuse that write, the delivery resumes at the next start
        (the refused message is sent again, and refused again)."""
        sink.close()
        self.forget(sink)
        reason = "the RAP runtime no longer knows the subscription"
        term = self.term
        try:
            outcome = await self.service.execute(
                lambda field: field.forget_rap(sink.subscription_id, reason, term),
                operation="DELIVERY",
            )
        except FieldError as error:
            logger.warning("cancelling %s failed: %s", sink.subscription_id, error.message)
        else:
            self._superseded(outcome.response, term)
