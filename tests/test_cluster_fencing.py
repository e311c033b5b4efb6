"""The deliveries' sender is fenced by its term: one that outlived its lease writes nothing.

With several nodes on one PostgreSQL log, the node holding the deliveries' lease sends
them, under the lease's term. It claims the term in the log (``delivery.term``) before
it sends, every entry it writes as the sender carries the term, and the Field refuses
one whose term is below the newest the log holds.

* The core, with no event loop: a newer claim fences the writes of every earlier term
  (acknowledgements, state changes, claims), a Field of one node is never fenced, and
  logs written before terms existed replay.
* Two services on one log: a write is checked against the other node's claim even before
  this node applied it (the check runs under the log's lock, after catching up).
* Real processes: three ``field serve`` nodes on one database and a webhook receiver; the
  sending node is paused (SIGSTOP) or killed (SIGKILL) while units are recorded through
  another; another node claims a newer term and the receiver gets every unit, in order,
  duplicates only with the same ``webhook-id``; the paused node, let run again, no longer
  sends, and every delivery entry in the log carries the newest term before it.

How fast the deliveries move is measured in ``benchmarks/cluster.py``, not asserted here.
Each PostgreSQL test gets a database of its own, dropped afterwards; without a reachable
PostgreSQL server those tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from field.client import FieldClient, FieldClientError
from field.core.context import Outcome
from field.core.field import Field
from field.engine.service import FieldService

from .conftest import UNLOADED_POLICY, ServerProcess
from .core_util import Harness
from .postgres_util import fresh_database
from .schema_util import assert_valid
from .test_process import _agent, _record
from .test_service import operate
from .test_webhooks import Receiver, in_order_without_loss, webhook

SpawnServer = Callable[..., ServerProcess]

#: Failure guard for one awaited change (never a pacing delay).
TIMEOUT = 30.0
#: Failure guard for the Field's writes to resume under a node paused amid an append: the
#: database ends its session after 5 s idle in its transaction, or at the writer's 30 s
#: statement timeout if it was paused amid the append's COPY.
WRITES_RESUME = 60.0
#: The nodes' --cluster-interval: the lease lasts two of them.
INTERVAL = 0.5
HOOK = "https://hooks.example.com/in"


# -- the core ---------------------------------------------------------------------------------


def _with_a_webhook() -> tuple[Harness, str]:
    """A Field with a writer, a reader whose webhook delivers ``memory.recorded``, and three
    units recorded: (the harness, the subscription's id)."""
    h = Harness()
    h.register("writer")
    h.register("reader")
    subscription = {"events": ["memory.recorded"], "delivery": {"type": "webhook", "url": HOOK}}
    subscribed = h.send(
        "SUBSCRIBE", "reader", {"action": "subscribe", "subscription": subscription}
    )
    for i in range(3):
        h.record("writer", f"finding {i}")
    return h, str(subscribed["subscription_id"])


def _written(h: Harness, outcome: Outcome) -> dict[str, Any]:
    h.entries.extend(outcome.entries)
    return outcome.response


def test_a_newer_term_in_the_log_fences_every_write_of_the_earlier_ones() -> None:
    h, subscription_id = _with_a_webhook()
    field = h.field
    record = field.state.deliveries[subscription_id]
    head = field.state.applied_position

    assert _written(h, field.claim_deliveries(1, "a"))["status"] == "ok"
    assert h.entries[-1].kind == "delivery.term" and h.entries[-1].data == {"term": 1, "node": "a"}
    assert _written(h, field.ack_deliveries({subscription_id: head - 1}, term=1))["status"] == "ok"
    assert h.entries[-1].data == {"cursors": {subscription_id: head - 1}, "term": 1}
    assert _written(h, field.claim_deliveries(2, "b"))["status"] == "ok"
    assert (field.state.delivery_term, field.state.delivery_node) == (2, "b")

    written = len(h.entries)
    stale = [
        field.ack_deliveries({subscription_id: head}, term=1),
        field.change_delivery(subscription_id, "fail", "no answer", term=1),
        field.forget_rap(subscription_id, "gone", term=1),
        field.claim_deliveries(1, "a"),  # a claim that comes late
    ]
    for outcome in stale:
        assert outcome.response == {"status": "superseded", "term": 2}
        assert outcome.entries == []
    assert len(h.entries) == written
    assert (record["acked"], record["state"]) == (head - 1, "active")
    assert field.claim_deliveries(2, "b").response["status"] == "unchanged"  # claimed once

    assert _written(h, field.ack_deliveries({subscription_id: head}, term=2))["status"] == "ok"
    assert (
        _written(h, field.change_delivery(subscription_id, "fail", "x", term=2))["status"] == "ok"
    )
    assert h.entries[-1].data["term"] == 2
    assert (record["acked"], record["state"]) == (head, "failing")

    replayed = h.replayed().state
    assert (replayed.delivery_term, replayed.delivery_node) == (2, "b")
    assert replayed.deliveries[subscription_id] == record


def test_a_field_of_one_node_is_never_fenced_and_entries_without_a_term_replay() -> None:
    h, subscription_id = _with_a_webhook()
    field = h.field
    head = field.state.applied_position
    assert _written(h, field.ack_deliveries({subscription_id: head - 1}))["status"] == "ok"
    assert h.entries[-1].data == {"cursors": {subscription_id: head - 1}}  # as logs always had
    assert _written(h, field.change_delivery(subscription_id, "fail", "down"))["status"] == "ok"
    assert "term" not in h.entries[-1].data
    # a node of several that claimed a term does not fence the writes that have none
    assert _written(h, field.claim_deliveries(3, "a"))["status"] == "ok"
    assert _written(h, field.ack_deliveries({subscription_id: head}))["status"] == "ok"

    replayed = h.replayed().state
    assert replayed.deliveries[subscription_id]["acked"] == head
    assert replayed.deliveries[subscription_id]["state"] == "failing"
    assert replayed.delivery_term == 3


# -- two services on one log ------------------------------------------------------------------


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:  # skips, naming the URL tried, without a server or psycopg
        yield url


class Node:
    """One service on the shared log."""

    def __init__(self, url: str, name: str) -> None:
        from field.store.postgres import PostgresEventLog

        self.name = name
        self.service = FieldService(
            PostgresEventLog(url), Field, node_id=name, admission=UNLOADED_POLICY
        )
        self.tokens: dict[str, str] = {}

    async def send(self, operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        response = await operate(self.service, operation, agent, payload, self.tokens.get(agent))
        if operation == "REGISTER":
            self.tokens[agent] = response["token"]
        return response

    async def run(self, job: Callable[[Field], Outcome]) -> dict[str, Any]:
        return (await self.service.execute(job, operation="DELIVERY")).response


@pytest.fixture
async def services(database: str) -> AsyncIterator[tuple[Node, Node]]:
    a, b = Node(database, "a"), Node(database, "b")
    await a.service.start()
    await b.service.start()
    yield a, b
    await a.service.stop()
    await b.service.stop()


async def test_a_write_is_fenced_by_a_claim_the_writing_node_has_not_applied_yet(
    services: tuple[Node, Node], database: str
) -> None:
    a, b = services
    await a.send("REGISTER", "reader", {"id": "reader", "role": "analyst"})
    subscription = {"events": ["memory.recorded"], "delivery": {"type": "webhook", "url": HOOK}}
    payload = {"action": "subscribe", "subscription": subscription}
    subscription_id = (await a.send("SUBSCRIBE", "reader", payload))["subscription_id"]
    assert (await a.run(lambda f: f.claim_deliveries(1, "a")))["status"] == "ok"
    assert (await b.run(lambda f: f.claim_deliveries(2, "b")))["status"] == "ok"
    # whatever a applied so far, its write is checked under the log's lock, after b's claim
    position = a.service.field.state.last_position
    ack = await a.run(lambda f: f.ack_deliveries({subscription_id: position}, term=1))
    assert ack == {"status": "superseded", "term": 2}
    assert a.service.field.state.delivery_term == 2
    kinds = [kind for kind, _ in await asyncio.to_thread(_delivery_entries, database)]
    assert kinds == ["delivery.term", "delivery.term"]


def _delivery_entries(url: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, data) of every ``delivery.*`` entry of a log, in log order."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT kind, data FROM field_log WHERE kind LIKE 'delivery.%' ORDER BY position"
        ).fetchall()
    return [(kind, orjson.loads(bytes(data))) for kind, data in rows]


def _unit_positions(url: str) -> list[int]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT position FROM field_log WHERE kind = 'memory.recorded' ORDER BY position"
        ).fetchall()
    return [position for (position,) in rows]


# -- real processes ---------------------------------------------------------------------------


class Cluster:
    """Three ``field serve`` nodes on one database, and a client of each."""

    def __init__(self, spawn: SpawnServer, tmp_path: Path, database: str) -> None:
        flags = [
            "--log",
            database,
            "--cluster-interval",
            str(INTERVAL),
            "--webhook-allow-net",
            "127.0.0.0/8",
            # every node opens the webhook secrets another sealed: one key for all
            "--webhook-key-file",
            str(tmp_path / "webhook.key"),
            "--webhook-retry-base",
            "0.05",
            "--webhook-retry-cap",
            "0.2",
        ]
        self.nodes = {
            name: spawn(tmp_path / name, *flags, "--node-id", name) for name in ("a", "b", "c")
        }
        self.clients = {name: FieldClient(node.url) for name, node in self.nodes.items()}

    def told(self, problem: str, lines: int = 15) -> str:
        """``problem``, and each node's last log lines: what a failure message shows."""
        logs = [
            f"--- node {name}:\n" + "\n".join(node.lines[-lines:])
            for name, node in self.nodes.items()
        ]
        return "\n".join([problem, *logs])

    async def status(self, name: str) -> dict[str, Any]:
        status = await self.clients[name].status()
        assert_valid("field-status.response", status)
        return status

    async def owner(self, among: list[str]) -> tuple[str, int]:
        """The one node of ``among`` that sends the deliveries, and the term it claimed
        (polled: a node tells no one when it takes the lease)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            statuses = {name: (await self.status(name))["node"] for name in among}
            owners = [name for name, node in statuses.items() if node["delivery_owner"]]
            if len(owners) == 1:
                return owners[0], statuses[owners[0]]["delivery_term"]
            assert len(owners) < 2, f"two nodes send at once: {statuses}"
            assert time.monotonic() < deadline, f"no node sends the deliveries: {statuses}"
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for client in self.clients.values():
            with contextlib.suppress(FieldClientError, OSError):
                await client.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pause", "kill"])
async def test_a_paused_or_killed_sender_is_fenced_and_another_node_delivers_everything(
    server_process: SpawnServer, tmp_path: Path, database: str, receiver: Receiver, how: str
) -> None:
    cluster = Cluster(server_process, tmp_path, database)
    paused: int | None = None  # the pid of a node stopped and not yet let run again
    try:
        first = await cluster.clients["a"].register("writer", "analyst")
        reader = await cluster.clients["a"].register("reader", "analyst")
        subscribed = await webhook(reader, receiver.url)
        owner, term = await cluster.owner(["a", "b", "c"])
        others = [name for name in "abc" if name != owner]
        writers = {
            name: _agent(cluster.clients[name], "writer", first.token, "analyst") for name in "abc"
        }
        recorded = 0

        async def record(through: str, count: int) -> None:
            """``count`` units through a node, then until the receiver has them all. A node
            paused between a batch's lock and its commit holds every write of the Field
            until the database ends its session (LOG_UNAVAILABLE meanwhile: sent again)."""
            nonlocal recorded
            for _ in range(count):
                content = f"market {recorded}"
                deadline = time.monotonic() + WRITES_RESUME
                while True:
                    try:
                        await _record(writers[through], "finding", content, purpose="fence")
                        break
                    except FieldClientError as error:
                        assert error.code == "LOG_UNAVAILABLE", error
                        assert time.monotonic() < deadline, cluster.told(
                            f"writes through {through} never resumed: {error}"
                        )
                        await asyncio.sleep(0.1)
                recorded += 1
            await receiver.until(
                lambda: len({r.cursor for r in receiver.delivered}) >= recorded,
                f"{recorded} units delivered",
            )

        await record(others[0], 5)
        if how == "pause":
            paused = cluster.nodes[owner].process.pid
            os.kill(paused, signal.SIGSTOP)
        else:
            cluster.nodes[owner].stop(signal.SIGKILL)
        # units recorded meanwhile reach the receiver: another node took the deliveries over
        await record(others[0], 5)
        successor, newer = await cluster.owner(others)
        assert newer > term
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
            paused = None
            # the paused node, run again, found its lease lost before sending anything
            status = (await cluster.status(owner))["node"]
            assert status["delivery_owner"] is False
            assert await cluster.owner(["a", "b", "c"]) == (successor, newer)
            await record(owner, 5)  # it serves everything else as before
        await record(successor, 5)

        first_deliveries = list(dict.fromkeys(r.cursor for r in receiver.delivered))
        in_order_without_loss(receiver, first_deliveries)
        positions = await asyncio.to_thread(_unit_positions, database)
        assert [int(c.rpartition("-")[2]) for c in first_deliveries] == positions
        # every delivery entry was written under the newest term the log held before it,
        # and the acknowledged cursor only moved forward, up to the last unit
        deadline = time.monotonic() + TIMEOUT
        while True:
            entries = await asyncio.to_thread(_delivery_entries, database)
            acked = [
                data["cursors"][subscribed["subscription_id"]]
                for kind, data in entries
                if kind == "delivery.acked"
            ]
            if acked and acked[-1] == positions[-1]:
                break
            assert time.monotonic() < deadline, f"acknowledged up to {acked[-1:]} only"
            await asyncio.sleep(0.05)
        assert acked == sorted(set(acked))
        newest, claimed = 0, []
        for kind, data in entries:
            if kind == "delivery.term":
                assert data["term"] > newest
                newest = data["term"]
                claimed.append((data["term"], data["node"]))
            else:
                assert data.get("term") == newest, (kind, data, newest)
        assert claimed[0] == (term, owner) and claimed[-1] == (newer, successor)
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        await cluster.close()
