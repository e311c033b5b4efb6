"""The deliveries' lease: one node acts at a time, under a term, and a hung holder is fenced.

:class:`Lease` objects on one database are nodes. A *paused* node is a lease on an
event loop of its own, in a thread of its own, whose loop is then blocked whole, as
SIGSTOP blocks a process: it renews nothing, another node takes the lease once it
expires, and the paused one, let run again, finds its lease lost before it acts. A
node that stops cleanly lets go of the lease, and the next try of another takes it.
The engine tests run two :class:`DeliveryEngine` objects over one service (the one log
every node follows), each with its own push hub and lease, and a real webhook receiver
on loopback: exactly one engine runs sinks, and when the holder's lease runs out the
other claims its term in the log and resumes every delivery from its acknowledged
cursor, after the first stopped. How fast the role moves is measured in
``benchmarks/presence.py`` and ``benchmarks/cluster.py``, not asserted here; real
processes paused and killed are in ``tests/test_cluster_fencing.py``.

Each test gets a database of its own, dropped afterwards; without a reachable PostgreSQL
server the tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pytest

from field.core.egress import EgressPolicy, parse_networks
from field.core.field import Field
from field.core.secrets import SecretBox
from field.engine.delivery import DeliveryEngine, DeliverySettings
from field.engine.push import PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.stream import parse_cursor

from .conftest import UNLOADED_POLICY
from .postgres_util import fresh_database
from .test_service import operate
from .test_webhooks import Receiver, in_order_without_loss

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from field.store.lease import DELIVERY_LEASE, TRANSITIONS, Lease, Role  # noqa: E402

T = TypeVar("T")

#: Failure guard for one awaited change (never a pacing delay).
TIMEOUT = 15.0
INTERVAL = 0.25
LOOPBACK = EgressPolicy(parse_networks(["127.0.0.0/8"]))


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


class Events:
    """What the leases did, in order, with the term of each gain; each change wakes the
    waiters. A lease on a loop of its own tells it from its thread: it is noted here, on
    the test's loop, in the order told."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread()
        self.log: list[tuple[str, str, int | None]] = []
        self._changed = asyncio.Event()

    def note(self, who: str, what: str, then: Callable[..., None] | None = None) -> Any:
        def noted(*term: int) -> None:
            if then is not None:
                then(*term)
            entry = (who, what, term[0] if term else None)
            if threading.current_thread() is self.thread:
                self._add(entry)
            else:
                self.loop.call_soon_threadsafe(self._add, entry)

        return noted

    def _add(self, entry: tuple[str, str, int | None]) -> None:
        self.log.append(entry)
        self._changed.set()

    def kinds(self) -> list[tuple[str, str]]:
        return [(who, what) for who, what, _ in self.log]

    def gained(self) -> list[tuple[str, int | None]]:
        return [(who, term) for who, what, term in self.log if what == "gained"]

    async def until(self, done: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(TIMEOUT):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}: {self.log}") from None


def lease(
    url: str, events: Events, who: str, *, interval: float = INTERVAL, **options: Any
) -> Lease:
    roles = {k: options.pop(k) for k in ("gained", "lost") if k in options}
    return Lease(
        url,
        name=DELIVERY_LEASE,
        holder=who,
        gained=events.note(who, "gained", roles.get("gained")),
        lost=events.note(who, "lost", roles.get("lost")),
        interval=interval,
        **options,
    )


def row(url: str) -> tuple[int, str | None, bool]:
    """The deliveries' lease as the database holds it: (term, holder, expired)."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT term, holder, expires_at <= clock_timestamp() FROM field_leases"
            " WHERE name = %s",
            (DELIVERY_LEASE,),
        ).fetchone()
    assert found is not None, "the lease has no row"
    return int(found[0]), found[1], bool(found[2])


async def polled(check: Callable[[], bool], what: str) -> None:
    """Until ``check()`` holds, for what tells no one (a try that found the lease held, an
    engine that resumed its sinks)."""
    async with asyncio.timeout(TIMEOUT):
        while not check():
            await asyncio.sleep(INTERVAL / 8)


class Node:
    """A lease on an event loop of its own, in a thread of its own: a node that can be
    paused whole, as SIGSTOP pauses a process (its loop blocks; nothing of it runs)."""

    def __init__(self, make: Callable[[], Lease]) -> None:
        self._make = make
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._gate: threading.Event | None = None
        self.lease: Lease | None = None

    async def start(self) -> Lease:
        def started() -> Lease:
            made = self._make()
            made.start()
            return made

        self.lease = await self.call(started)
        return self.lease

    async def call(self, work: Callable[[], T]) -> T:
        """``work()`` on the node's loop; its result."""

        async def run() -> T:
            return work()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    def pause(self) -> None:
        self._gate = threading.Event()
        self.loop.call_soon_threadsafe(self._gate.wait)

    def resume(self) -> None:
        if self._gate is not None:
            self._gate.set()

    async def close(self) -> None:
        self.resume()
        if self.lease is not None:
            held = self.lease
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(held.stop(), self.loop))
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join, TIMEOUT)
        self.loop.close()


# -- the state machine ------------------------------------------------------------------------


def test_every_state_but_stopped_can_stop_and_only_a_holder_can_lose() -> None:
    states = {state for state, _ in TRANSITIONS}
    assert states == {Role.STANDBY, Role.HOLDING}
    assert all(TRANSITIONS[(state, "stop")] is Role.STOPPED for state in states)
    assert [s for s, event in TRANSITIONS if event == "lost"] == [Role.HOLDING]
    assert TRANSITIONS[(Role.STANDBY, "taken")] is Role.HOLDING


# -- leases on one database ---------------------------------------------------------------------


async def test_a_paused_holder_is_fenced_and_the_lease_moves_back_and_forth(
    database: str,
) -> None:
    """Two nodes; each round the holder's whole loop is blocked: it renews nothing, the
    other takes the lease under a higher term once it expired, and the paused one, let
    run again, finds its lease lost before it acts and never holds it beside the other."""
    events = Events()
    nodes = {who: Node(lambda who=who: lease(database, events, who)) for who in "ab"}
    try:
        a = await nodes["a"].start()
        await events.until(lambda: events.kinds() == [("a", "gained")], "a holds")
        b = await nodes["b"].start()
        # b tries, again and again, while a renews: it never holds
        await polled(lambda: b.tries >= 3, "three tries of b")
        assert events.kinds() == [("a", "gained")]
        assert row(database) == (a.term, "a", False)

        holder, other = "a", "b"
        for round_ in range(1, 4):
            nodes[holder].pause()  # nothing of the holder runs: no renewal, no action
            await events.until(lambda o=other: events.kinds()[-1] == (o, "gained"), "takeover")
            taken = nodes[other].lease
            assert taken is not None and await nodes[other].call(taken.valid)
            assert row(database) == (taken.term, other, False)
            nodes[holder].resume()
            paused = nodes[holder].lease
            assert paused is not None
            assert await nodes[holder].call(paused.valid) is False  # lost before acting
            await events.until(lambda h=holder: events.kinds()[-1] == (h, "lost"), "the loss")
            # the lost holder let go of nothing of the new term's
            assert row(database) == (taken.term, other, False)
            assert len(events.log) == 1 + 2 * round_
            holder, other = other, holder

        terms = [term for _, term in events.gained()]
        assert terms == sorted(set(terms)) and len(terms) == 4  # each gain a new, higher term
        assert [who for who, _ in events.gained()] == ["a", "b", "a", "b"]
    finally:
        for node in nodes.values():
            await node.close()


async def test_a_holder_that_stops_lets_go_and_the_next_try_takes_the_lease(
    database: str,
) -> None:
    """A long interval (the lease lasts 10 s): only a holder's letting go lets the other's
    first try succeed."""
    events = Events()
    a = lease(database, events, "a", interval=5.0)
    b = lease(database, events, "b", interval=5.0)
    a.start()
    try:
        await events.until(lambda: a.holding, "a holds")
        assert row(database) == (1, "a", False)
        await a.stop()  # the role ends first, then the row is let go
        assert events.kinds() == [("a", "gained"), ("a", "lost")]
        assert row(database) == (1, "a", True)
        b.start()
        await events.until(lambda: b.holding, "b holds")
        assert b.tries == 1 and b.term == 2
        assert events.gained() == [("a", 1), ("b", 2)]
    finally:
        await a.stop()
        await b.stop()


async def test_a_validity_run_out_unseen_loses_the_lease_before_acting(database: str) -> None:
    """The event loop was held past the lease's duration (a clock moved on under it): the
    next ``valid()`` loses the lease there, the row is let go, and the lease is taken
    again later under a new term."""
    events = Events()
    skew = [0.0]
    a = lease(database, events, "a", clock=lambda: time.monotonic() + skew[0])
    a.start()
    try:
        await events.until(lambda: a.holding, "a holds")
        assert a.valid()
        skew[0] += 10 * a.duration  # the event loop was held that long: no renewal ran
        assert not a.valid()  # lost here, before any action
        assert events.kinds() == [("a", "gained"), ("a", "lost")]
        await events.until(lambda: a.holding, "a holds again")
        assert events.gained() == [("a", 1), ("a", 2)]
    finally:
        await a.stop()


async def test_a_newer_term_known_loses_the_lease_and_the_next_take_goes_above_it(
    database: str,
) -> None:
    """The role learns of a term above the holder's (the log holds one: a table reset
    under it, say): the holder has lost; it takes the lease again above that term."""
    events = Events()
    newest = [0]
    a = lease(database, events, "a", newest=lambda: newest[0])
    a.start()
    try:
        await events.until(lambda: a.holding, "a holds")
        assert a.term == 1
        newest[0] = 7
        assert not a.valid()
        await events.until(lambda: a.holding, "a holds again")
        assert events.gained() == [("a", 1), ("a", 8)]
        assert row(database) == (8, "a", False)
    finally:
        await a.stop()


# -- two delivery engines ---------------------------------------------------------------------


class Engine:
    """One node's deliveries over the shared service: its hub, engine and lease (with a
    clock that can be moved on: a loop held past the lease's duration)."""

    def __init__(self, name: str, service: FieldService, box: SecretBox, url: str, events: Events):
        self.name = name
        self.hub = PushHub(service)
        self.engine = DeliveryEngine(
            service, self.hub, DeliverySettings(), policy=LOOPBACK, secret_box=box
        )
        #: (sinks of the other node, whether it owned) when this one gained the lease
        self.other: Engine | None = None
        self.at_gain: list[tuple[int, bool]] = []
        self.skew = 0.0
        self.lease = lease(
            url,
            events,
            name,
            gained=self._gained,
            lost=self.engine.disown,
            newest=self.engine.newest_term,
            clock=lambda: time.monotonic() + self.skew,
        )

    def _gained(self, term: int) -> None:
        assert self.other is not None
        self.at_gain.append((len(self.other.engine.sinks), self.other.engine.owner))
        self.engine.own(term)

    async def start(self) -> None:
        await self.engine.start(own=False, sending=self.lease.valid)
        self.lease.start()

    async def stop(self) -> None:
        await self.engine.stop()
        await self.lease.stop()


class Shared:
    """The one Field both nodes follow: a service, its agents, a webhook subscription."""

    def __init__(self) -> None:
        self.box = SecretBox(secrets.token_bytes(32))
        self.service = FieldService(
            MemoryEventLog(),
            lambda: Field(egress=LOOPBACK, secret_box=self.box),
            admission=UNLOADED_POLICY,
        )
        self.tokens: dict[str, str] = {}
        self.published = asyncio.Event()
        self.service.listeners.add(lambda _: self.published.set())

    async def send(self, operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await operate(self.service, operation, agent, payload, self.tokens.get(agent))

    async def start(self, receiver_url: str) -> str:
        """Two agents, and the reader's webhook subscription (its id)."""
        await self.service.start()
        for agent in ("writer", "reader"):
            registered = await self.send("REGISTER", agent, {"id": agent, "role": "analyst"})
            self.tokens[agent] = registered["token"]
        subscription = {
            "events": ["memory.recorded"],
            "delivery": {"type": "webhook", "url": receiver_url},
        }
        payload = {"action": "subscribe", "subscription": subscription}
        return str((await self.send("SUBSCRIBE", "reader", payload))["subscription_id"])

    async def note(self, i: int) -> None:
        payload = {
            "type": "finding",
            "content": f"market finding {i}",
            "intent": {"purpose": "p"},
            "confidence": {"score": 0.5, "reasoning": "r"},
        }
        await self.send("RECORD", "writer", payload)

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Until ``done()`` holds of the Field's state (each write wakes the check)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                while not done():
                    self.published.clear()
                    await self.published.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture
async def shared() -> AsyncIterator[Shared]:
    field = Shared()
    yield field
    await field.service.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()


async def test_one_engine_sends_and_the_next_claims_its_term_and_resumes_from_the_cursor(
    database: str, shared: Shared, receiver: Receiver
) -> None:
    subscription_id = await shared.start(receiver.url)
    state = shared.service.field.state
    events = Events()
    a = Engine("a", shared.service, shared.box, database, events)
    b = Engine("b", shared.service, shared.box, database, events)
    a.other, b.other = b, a
    try:
        await a.start()
        await polled(lambda: a.engine.owner, "a owns the deliveries")  # once its claim is durable
        # the claim came first: the log holds a's term before a sent anything
        assert state.delivery_term == a.lease.term
        assert a.engine.term == a.lease.term
        await b.start()
        for i in range(3):
            await shared.note(i)
        await receiver.until(lambda: len(receiver.delivered) == 3, "3 deliveries, from a")
        assert (a.engine.owner, b.engine.owner) == (True, False)
        assert list(a.engine.sinks) == [subscription_id] and b.engine.sinks == {}
        last, _ = parse_cursor(receiver.delivered[-1].cursor, a.hub.tag)
        assert last is not None
        deliveries = state.deliveries
        await shared.until(lambda: deliveries[subscription_id]["acked"] >= last, "a's ack")

        a.skew = 10 * a.lease.duration  # a's loop was held past its lease: no renewal ran
        await polled(lambda: b.engine.owner, "b owns the deliveries")
        assert events.kinds() == [("a", "gained"), ("a", "lost"), ("b", "gained")]
        assert b.at_gain == [(0, False)]  # a had stopped every sink before b began
        assert b.lease.term > a.lease.term
        assert state.delivery_term == b.lease.term

        for i in range(3, 6):
            await shared.note(i)
        await receiver.until(lambda: len(receiver.delivered) == 6, "3 more, from b")
        cursors = [r.cursor for r in receiver.delivered]
        in_order_without_loss(receiver, cursors)
        # b resumed after what a acknowledged: nothing was sent twice
        assert len(receiver.received) == 6 and len(set(cursors)) == 6
        contents = [r.body.decode() for r in receiver.delivered]
        assert all(f"market finding {i}" in body for i, body in enumerate(contents))
        assert list(b.engine.sinks) == [subscription_id] and a.engine.sinks == {}
    finally:
        await a.stop()
        await b.stop()
