"""The deliveries' lease: one node sends at a time, and the role moves when it dies.

Two :class:`Lease` objects on one database are two nodes. The engine
tests run two :class:`DeliveryEngine` objects over one service (the one
log every node follows), each with its own push hub and lease, and a real
webhook receiver on loopback: exactly one engine runs sinks, and when the
holder's connection ends the other resumes every delivery from its
acknowledged cursor, after the first stopped. How fast the role moves is
measured in ``benchmarks/presence.py``, not asserted here.

Each test gets a database of its own, dropped afterwards; without a
reachable PostgreSQL server the tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from field.core.egress import EgressPolicy, parse_networks
from field.core.field import Field
from field.core.secrets import SecretBox
from field.engine.delivery import DeliveryEngine, DeliverySettings
from field.engine.push import PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.stream import parse_cursor

from .postgres_util import fresh_database
from .test_webhooks import Receiver, in_order_without_loss

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from field.store.lease import DELIVERY_LEASE, Lease, Role  # noqa: E402

#: Failure guard for one awaited change (never a pacing delay).
TIMEOUT = 15.0
INTERVAL = 0.25
LOOPBACK = EgressPolicy(parse_networks(["127.0.0.0/8"]))


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


class Events:
    """What the leases did, in order, with when; each change wakes the waiters."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, float]] = []
        self._changed = asyncio.Event()

    def note(
        self, who: str, what: str, then: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        def noted() -> None:
            if then is not None:
                then()
            self.log.append((who, what, time.monotonic()))
            self._changed.set()

        return noted

    def kinds(self) -> list[tuple[str, str]]:
        return [(who, what) for who, what, _ in self.log]

    async def until(self, done: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(TIMEOUT):
            while not done():
                self._changed.clear()
                await self._changed.wait()


def lease(url: str, events: Events, who: str, **roles: Callable[[], None]) -> Lease:
    return Lease(
        url,
        key=DELIVERY_LEASE,
        name="deliveries",
        gained=events.note(who, "gained", roles.get("gained")),
        lost=events.note(who, "lost", roles.get("lost")),
        interval=INTERVAL,
    )


def holder_pid(url: str) -> int:
    """The backend holding the deliveries' lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s::oid AND objid = %s::oid",
            (DELIVERY_LEASE >> 32, DELIVERY_LEASE & 0xFFFFFFFF),
        ).fetchone()
    assert row is not None, "no one holds the lease"
    return int(row[0])


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


# -- two leases ----------------------------------------------------------------------------


async def test_one_of_two_holds_the_lease_and_the_other_takes_it_when_it_dies(
    database: str,
) -> None:
    events = Events()
    a, b = lease(database, events, "a"), lease(database, events, "b")
    a.start()
    await events.until(lambda: a.holding, "a holds")
    b.start()
    # b tries, again and again, while a holds: it never holds
    async with asyncio.timeout(TIMEOUT):
        while b.tries < 3:
            await asyncio.sleep(INTERVAL / 4)  # polled: a try tells no one
    assert (a.state, b.state) == (Role.HOLDING, Role.STANDBY)
    assert events.kinds() == [("a", "gained")]
    killed = time.monotonic()
    terminate(database, holder_pid(database))  # a's session ends, its lock with it
    await events.until(lambda: b.holding, "b holds")
    assert events.kinds() == [("a", "gained"), ("a", "lost"), ("b", "gained")]
    gained_at = events.log[2][2]
    assert gained_at - killed >= b.term  # b fenced for a whole term after taking the lock
    assert a.state in (Role.STANDBY, Role.FENCING) and not a.holding
    await a.stop()
    await b.stop()
    assert events.kinds()[-1] == ("b", "lost")  # stopping lets go of the role first


async def test_a_term_run_out_unseen_loses_the_lease_before_acting(database: str) -> None:
    events = Events()
    skew = [0.0]
    a = Lease(
        database,
        key=DELIVERY_LEASE,
        name="deliveries",
        gained=events.note("a", "gained"),
        lost=events.note("a", "lost"),
        interval=INTERVAL,
        clock=lambda: time.monotonic() + skew[0],
    )
    a.start()
    try:
        await events.until(lambda: a.holding, "a holds")
        assert a.valid()
        skew[0] += 10 * a.term  # the event loop was held that long: no check ran
        assert not a.valid()  # lost here, before any action
        assert events.kinds() == [("a", "gained"), ("a", "lost")]
        # its connection is closed, the lock free: it is taken again after a fence
        await events.until(lambda: a.holding, "a holds again")
        assert events.kinds()[-1] == ("a", "gained")
    finally:
        await a.stop()


# -- two delivery engines ---------------------------------------------------------------------


class Node:
    """One node's deliveries over the shared service: its hub, engine and lease."""

    def __init__(self, name: str, service: FieldService, box: SecretBox, url: str, events: Events):
        self.name = name
        self.hub = PushHub(service)
        self.engine = DeliveryEngine(
            service, self.hub, DeliverySettings(), policy=LOOPBACK, secret_box=box
        )
        #: (sinks of the other node, whether it owned) when this one gained the lease
        self.other: Node | None = None
        self.at_gain: list[tuple[int, bool]] = []
        self.lease = lease(url, events, name, gained=self._gained, lost=self.engine.disown)

    def _gained(self) -> None:
        assert self.other is not None
        self.at_gain.append((len(self.other.engine.sinks), self.other.engine.owner))
        self.engine.own()

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
            MemoryEventLog(), lambda: Field(egress=LOOPBACK, secret_box=self.box)
        )
        self.tokens: dict[str, str] = {}
        self.published = asyncio.Event()
        self.service.listeners.add(lambda _: self.published.set())

    async def send(self, operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"msg-{secrets.token_hex(4)}",
            "operation": operation,
            "agent_id": agent,
            "session_id": None,
            "epoch": 0,
            "payload": payload,
        }
        token = self.tokens.get(agent)
        outcome = await self.service.execute(
            lambda field: field.handle(envelope, token=token, operation=operation),
            operation=operation,
        )
        return outcome.response

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

    async def until_acked(self, subscription_id: str, position: int) -> None:
        """Until the delivery is acknowledged up to ``position`` (each write wakes it)."""
        deliveries = self.service.field.state.deliveries
        async with asyncio.timeout(TIMEOUT):
            while deliveries[subscription_id]["acked"] < position:
                self.published.clear()
                await self.published.wait()


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


async def test_one_engine_sends_and_the_other_resumes_from_the_acked_cursor(
    database: str, shared: Shared, receiver: Receiver
) -> None:
    subscription_id = await shared.start(receiver.url)
    events = Events()
    a = Node("a", shared.service, shared.box, database, events)
    b = Node("b", shared.service, shared.box, database, events)
    a.other, b.other = b, a
    try:
        await a.start()
        await events.until(lambda: a.engine.owner, "a owns the deliveries")
        await b.start()
        for i in range(3):
            await shared.note(i)
        await receiver.until(lambda: len(receiver.delivered) == 3, "3 deliveries, from a")
        assert (a.engine.owner, b.engine.owner) == (True, False)
        assert list(a.engine.sinks) == [subscription_id] and b.engine.sinks == {}
        last, _ = parse_cursor(receiver.delivered[-1].cursor, a.hub.tag)
        assert last is not None
        await shared.until_acked(subscription_id, last)

        terminate(database, holder_pid(database))  # a's lease session ends
        await events.until(lambda: b.engine.owner, "b owns the deliveries")
        assert events.kinds() == [("a", "gained"), ("a", "lost"), ("b", "gained")]
        assert b.at_gain == [(0, False)]  # a had stopped every sink before b began

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
