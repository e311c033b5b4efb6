"""Presence shared through PostgreSQL: an agent connected on one node is live for the others.

Two :class:`Presence` objects on one database are two nodes; each node's
:class:`Liveness` runs over a service of its own holding the same agents
(as every node's does, following one log). Clocks are moved by hand: the
nodes' shared wall clock and each monitor's own, so nothing waits for time
to pass; each exchange is an explicit :meth:`Presence.flush`.

Each test gets a database of its own, dropped afterwards; without a
reachable PostgreSQL server the tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from field.client import FieldClient
from field.core.field import Field
from field.engine.liveness import Liveness, PresenceReport
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog

from .conftest import UNLOADED_POLICY, ThreadedServer
from .postgres_util import fresh_database
from .schema_util import assert_valid
from .test_push import open_ws

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from field.store.presence import RESYNC_SECONDS, TOMBSTONE_SECONDS, Presence  # noqa: E402

AGENTS = ("alice", "bob", "carol")


class Clock:
    """A clock moved by hand: the nodes' wall clock, or a monitor's own."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Node:
    """One node: a service with the Field's agents, its Liveness, its Presence."""

    def __init__(self, url: str, node_id: str, wall: Clock, *, heartbeat_timeout: float) -> None:
        self.service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
        self.wall = wall
        self.clock = Clock(50.0)  # a monitor's clock: its own origin, like loop.time()
        self.presence = Presence(url, node_id, clock=wall)
        self.stopped = False
        self.tokens: dict[str, str] = {}
        self.liveness = Liveness(
            self.service,
            failure_grace=30,
            heartbeat_timeout=heartbeat_timeout,
            clock=self.clock,
            remote=self.presence,
        )

    async def start(self) -> None:
        await self.service.start()
        for agent_id in AGENTS:
            envelope = {
                "protocol": "akashik",
                "version": "0.1.0",
                "id": f"msg-{agent_id}",
                "operation": "REGISTER",
                "agent_id": agent_id,
                "session_id": None,
                "epoch": 0,
                "payload": {"id": agent_id, "role": "analyst"},
            }
            outcome = await self.service.execute(
                lambda field, e=envelope: field.handle(e, token=None)
            )
            self.tokens[agent_id] = outcome.response["token"]
        await self.presence.start(self.liveness.drain_changes)

    async def subscribe(self, agent_id: str, timeout: str) -> None:
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"msg-sub-{agent_id}",
            "operation": "SUBSCRIBE",
            "agent_id": agent_id,
            "session_id": None,
            "epoch": 0,
            "payload": {
                "action": "subscribe",
                "subscription": {"events": ["memory.recorded"], "timeout": timeout},
            },
        }
        token = self.tokens[agent_id]
        await self.service.execute(lambda field: field.handle(envelope, token=token))

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.presence.stop()
            await self.service.stop()

    def due(self) -> dict[str, str]:
        return dict(self.liveness.due())


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
async def nodes(database: str) -> AsyncIterator[tuple[Node, Node, Clock]]:
    wall = Clock(1_700_000_000.0)
    a = Node(database, "node-a", wall, heartbeat_timeout=300)
    b = Node(database, "node-b", wall, heartbeat_timeout=300)
    await a.start()
    await b.start()
    yield a, b, wall
    for node in (a, b):
        await node.stop()


def advance(seconds: float, wall: Clock, *nodes: Node) -> None:
    """Time passes for everyone: the shared wall clock and each monitor's clock."""
    wall.now += seconds
    for node in nodes:
        node.clock.now += seconds


async def exchange(*nodes: Node) -> None:
    """Every node flushes once, in turn, then once more: each has read what all wrote."""
    for _ in range(2):
        for node in nodes:
            assert await node.presence.flush()


async def test_a_connection_on_one_node_keeps_the_agent_live_for_another(
    nodes: tuple[Node, Node, Clock],
) -> None:
    a, b, wall = nodes
    a.liveness.connected("alice")
    await exchange(a, b)
    connections, heard_ago, dropped_ago = b.presence.presence("alice")
    assert (connections, dropped_ago) == (1, None)
    assert heard_ago is not None and 0 <= heard_ago < 1
    advance(400, wall, a, b)
    await exchange(a, b)
    # bob and carol were heard from by no one for 400 s; alice holds a connection on A
    assert set(b.due()) == {"bob", "carol"}
    assert set(a.due()) == {"bob", "carol"}


async def test_what_one_node_heard_counts_on_every_node(nodes: tuple[Node, Node, Clock]) -> None:
    a, b, wall = nodes
    advance(250, wall, a, b)
    a.liveness.seen("bob")  # a request of bob's, on A
    await exchange(a, b)
    advance(100, wall, a, b)
    await exchange(a, b)
    assert set(b.due()) == {"alice", "carol"}  # bob: heard 100 s ago, on A
    assert b.presence.presence("bob")[1] == pytest.approx(100)


async def test_activity_on_one_node_keeps_a_subscription_from_expiring_on_another(
    nodes: tuple[Node, Node, Clock],
) -> None:
    a, b, wall = nodes
    await b.subscribe("alice", "30m")  # as every node holds it, following the log
    advance(1500, wall, a, b)
    a.liveness.seen("alice")  # alice works on A
    await exchange(a, b)
    advance(1000, wall, a, b)
    await exchange(a, b)
    assert b.liveness.expiring() == []  # 1000 s since alice's last request, on A
    advance(800, wall, a, b)
    await exchange(a, b)
    assert [agent for agent, _ in b.liveness.expiring()] == ["alice"]


async def test_a_dead_nodes_connections_stop_counting_and_their_grace_begins(
    nodes: tuple[Node, Node, Clock],
) -> None:
    a, b, wall = nodes
    a.liveness.connected("alice")
    await exchange(a, b)
    advance(400, wall, a, b)
    await exchange(a, b)
    assert "alice" not in b.due()
    # A dies: it flushes no more. Past node_timeout, B no longer counts its connection,
    # which closed, for B, when A was last alive: failure_grace runs from then.
    advance(a.presence.node_timeout + 1, wall, a, b)
    assert await b.presence.flush()
    connections, _, dropped_ago = b.presence.presence("alice")
    assert connections == 0
    assert dropped_ago == pytest.approx(a.presence.node_timeout + 1)
    assert "alice" not in b.due()  # within failure_grace (30 s) of A's death
    advance(30, wall, a, b)
    assert await b.presence.flush()
    reason = b.due()["alice"]
    assert "since its last push connection closed" in reason
    assert "failure_grace 30 s" in reason


async def test_the_smallest_live_node_decides_and_a_stale_view_decides_nothing(
    nodes: tuple[Node, Node, Clock],
) -> None:
    a, b, wall = nodes
    await exchange(a, b)
    assert (a.presence.decides(), b.presence.decides()) == (True, False)
    assert b.presence.live_nodes() == ["node-a", "node-b"]
    advance(a.presence.node_timeout + 1, wall, a, b)  # A is silent: dead for B
    assert await b.presence.flush()
    assert b.presence.decides() and b.presence.live_nodes() == ["node-b"]
    # A's own view is as old: it decides nothing until it reads again
    assert not a.presence.decides()
    await exchange(a, b)
    assert (a.presence.decides(), b.presence.decides()) == (True, False)


async def test_a_node_that_stops_closes_its_connections_at_once(
    nodes: tuple[Node, Node, Clock],
) -> None:
    a, b, wall = nodes
    a.liveness.connected("alice")
    a.liveness.seen("bob")
    await exchange(a, b)
    advance(10, wall, a, b)
    await a.stop()
    assert await b.presence.flush()
    connections, heard_ago, dropped_ago = b.presence.presence("alice")
    assert connections == 0 and dropped_ago == pytest.approx(0)
    assert b.presence.presence("bob")[1] == pytest.approx(10)  # what A heard still counts
    assert b.presence.live_nodes() == ["node-b"]


async def test_a_restarted_node_id_drops_what_its_former_life_held(
    database: str, nodes: tuple[Node, Node, Clock]
) -> None:
    a, b, wall = nodes
    a.liveness.connected("alice")
    await exchange(a, b)
    # A is killed (no clean stop) and starts again under the same id
    again = Node(database, "node-a", wall, heartbeat_timeout=300)
    advance(3, wall, a, b, again)
    await again.start()
    assert await b.presence.flush()
    connections, _, dropped_ago = b.presence.presence("alice")
    assert connections == 0 and dropped_ago == pytest.approx(3)  # closed when A was last seen
    # the new life's rows are read after the old ones: versions go on from the stored one
    again.liveness.connected("carol")
    assert await again.presence.flush()
    assert await b.presence.flush()
    assert b.presence.presence("carol")[0] == 1
    await again.stop()


async def test_forgotten_agents_leave_the_others_view(database: str) -> None:
    wall = Clock(1_700_000_000.0)
    reports: dict[str, PresenceReport] = {"dave": (2, 0.0, None)}
    a = Presence(database, "node-a", clock=wall)
    b = Presence(database, "node-b", clock=wall)

    def drain() -> dict[str, PresenceReport]:
        taken = dict(reports)
        reports.clear()
        return taken

    await a.start(drain)
    await b.start(None)
    try:
        assert await b.flush()
        assert b.presence("dave")[0] == 2
        reports["dave"] = None  # deregistered: a tombstone
        assert await a.flush()
        assert await b.flush()
        assert b.presence("dave") == (0, None, None)
        # a reader that read nothing for a while reads everything again
        wall.now += RESYNC_SECONDS + 1
        assert await a.flush()
        assert await b.flush()
        assert b.presence("dave") == (0, None, None)
        # tombstones are swept once every reader has had time to read them
        wall.now += TOMBSTONE_SECONDS
        assert await a.sweep()
        with psycopg.connect(database) as conn:
            left = conn.execute("SELECT agent_id FROM field_presence").fetchall()
        assert left == []
    finally:
        await a.stop()
        await b.stop()


async def test_changes_a_failed_flush_could_not_send_go_with_the_next(database: str) -> None:
    wall = Clock(1_700_000_000.0)
    reports: dict[str, PresenceReport] = {"erin": (1, 0.0, None)}
    a = Presence(database, "node-a", clock=wall)
    b = Presence(database, "node-b", clock=wall)
    await a.start(lambda: {})
    await b.start(None)
    try:
        # the database ends A's connection: that flush fails, the next opens a new one
        with psycopg.connect(database, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'field-presence' AND pid <> pg_backend_pid()"
            )
        a._take(reports)
        assert not await a.flush()
        assert await a.flush()
        assert not await b.flush()  # B's connection was ended too
        assert await b.flush()
        assert b.presence("erin")[0] == 1
    finally:
        await a.stop()
        await b.stop()


# -- a server on a PostgreSQL log -------------------------------------------------------------


def delivery_owner(status: dict[str, Any]) -> bool:
    """Whether a status says its server sends the deliveries: ``delivery_owner`` beside
    the other fields, or in ``node`` where the status has one."""
    return bool(status.get("node", status)["delivery_owner"])


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds: the server tells no one when it flushed (deadline)."""
    deadline = time.monotonic() + 15
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_server_on_a_postgresql_log_shares_presence_and_sends_deliveries(
    database: str, server_factory: Callable[..., ThreadedServer]
) -> None:
    server = server_factory(log=database, cluster_interval=0.25)

    def rows(query: str) -> list[Any]:
        with psycopg.connect(database) as conn:
            return conn.execute(query).fetchall()

    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "analyst")

        async def owner() -> bool:
            status = await field.status()
            assert_valid("field-status.response", status)
            return delivery_owner(status)

        await _until(owner, "the server to hold the deliveries' lease")
        async with open_ws(server, alice.token) as ws:
            await ws.request("SUBSCRIBE", "alice", {"action": "list"})

            async def connected() -> bool:
                query = "SELECT node_id, connections FROM field_presence WHERE agent_id = 'alice'"
                return [c for _, c in rows(query)] == [1]

            await _until(connected, "alice's connection in field_presence")
        # one node: this server, under its node id (``<host>:<pid>`` unless it has one)
        (node,) = [n for (n,) in rows("SELECT node_id FROM field_nodes")]
        assert node.startswith(f"{socket.gethostname()}:")
        assert rows("SELECT DISTINCT node_id FROM field_presence") == [(node,)]


async def test_a_server_on_sqlite_or_memory_always_sends_deliveries(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field:
        status = await field.status()
    assert_valid("field-status.response", status)
    assert delivery_owner(status) is True
