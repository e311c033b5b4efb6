"""Several services on one PostgreSQL log are one Field (in one process, each with its own
connections, as separate nodes have): writes through any of them are validated against
every earlier entry, epochs never go back in the log, and each node applies and
publishes what the others wrote.

Each test gets a database of its own, dropped afterwards; without a reachable PostgreSQL
server the tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from field.contract.errors import FieldError, LogUnavailable
from field.contract.model import StoredEntry
from field.core.field import Field
from field.engine.service import FieldService

from .conftest import UNLOADED_POLICY
from .postgres_util import fresh_database
from .test_service import operate

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from field.store.postgres import PostgresEventLog  # noqa: E402


class Node:
    """One service on the shared log, and the entries it published, in order."""

    def __init__(self, url: str, name: str) -> None:
        self.service = FieldService(
            PostgresEventLog(url), Field, node_id=name, admission=UNLOADED_POLICY
        )
        self.published: list[StoredEntry] = []
        self.service.listeners.add(self.published.extend)
        self.changed = asyncio.Event()
        self.service.listeners.add(lambda _: self.changed.set())

    @property
    def state(self) -> Any:
        return self.service.field.state

    async def send(
        self, operation: str, agent: str, payload: dict[str, Any], token: str | None = None
    ) -> dict[str, Any]:
        return await operate(self.service, operation, agent, payload, token)

    async def register(self, agent: str) -> str:
        response = await self.send("REGISTER", agent, {"id": agent, "role": "researcher"})
        return str(response["token"])

    async def record(self, agent: str, token: str, content: str) -> dict[str, Any]:
        payload = {
            "type": "finding",
            "content": content,
            "intent": {"purpose": "cluster test"},
            "confidence": {"score": 0.8, "reasoning": "measured"},
        }
        return await self.send("RECORD", agent, payload, token)

    async def wait_for(self, position: int) -> None:
        """Until this node has applied the log up to ``position`` (a bounded wait)."""
        async with asyncio.timeout(10):
            while self.state.last_position < position:
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
async def nodes(database: str) -> AsyncIterator[list[Node]]:
    made = [Node(database, f"node-{i}") for i in range(3)]
    await asyncio.gather(*(n.service.start() for n in made))
    yield made
    for node in made:
        await node.service.stop()


def _stored(url: str) -> list[tuple[int, int, str]]:
    with psycopg.connect(url) as conn:
        query = "SELECT position, epoch, kind FROM field_log ORDER BY position"
        return conn.execute(query).fetchall()


async def test_nodes_starting_together_make_one_field(nodes: list[Node], database: str) -> None:
    field_ids = {n.state.field_id for n in nodes}
    assert len(field_ids) == 1 and None not in field_ids
    kinds = [kind for _, _, kind in await asyncio.to_thread(_stored, database)]
    assert kinds.count("field.created") == 1


async def test_an_agent_registered_on_one_node_acts_on_another(nodes: list[Node]) -> None:
    a, b, c = nodes
    token = await a.register("alice")
    unit = await b.record("alice", token, "the market grows")  # b caught up under the lock
    assert unit["status"] == "accepted"
    reader = await c.register("bea")  # ATTUNE shows an agent what others recorded
    attuned = await c.send(
        "ATTUNE", "bea", {"scope": {"role": "researcher", "max_units": 10}}, reader
    )
    assert unit["memory_unit_id"] in [u["memory_unit"]["id"] for u in attuned["record"]]


async def test_a_write_is_validated_against_every_earlier_entry(nodes: list[Node]) -> None:
    """The same id registered on two nodes at once: one succeeds, the other is refused,
    as on one node; neither node acknowledges both."""
    a, b, _ = nodes
    results = await asyncio.gather(a.register("bob"), b.register("bob"), return_exceptions=True)
    refused = [r for r in results if isinstance(r, FieldError)]
    assert len(refused) == 1 and refused[0].code == "AGENT_ID_TAKEN"


async def test_concurrent_writes_on_every_node(nodes: list[Node], database: str) -> None:
    tokens = [await node.register(f"writer-{i}") for i, node in enumerate(nodes)]

    async def write(i: int) -> list[dict[str, Any]]:
        return [
            await nodes[i].record(f"writer-{i}", tokens[i], f"fact {n} from node {i}")
            for n in range(40)
        ]

    written = await asyncio.gather(*(write(i) for i in range(3)))
    ids = {r["memory_unit_id"] for rs in written for r in rs}
    assert len(ids) == 120
    stored = await asyncio.to_thread(_stored, database)
    assert [p for p, _, _ in stored] == list(range(1, len(stored) + 1))
    # epochs never go back in the log, and each operation's epoch is new
    epochs = [e for _, e, kind in stored if kind == "memory.recorded"]
    assert all(x < y for x, y in itertools.pairwise(epochs)), epochs
    # every node applies and publishes the whole log, in order, whoever wrote it
    last = stored[-1][0]
    for node in nodes:
        await node.wait_for(last)
        assert ids <= node.state.units.keys()
        assert [e.position for e in node.published] == list(
            range(node.published[0].position, last + 1)
        )


async def test_an_idle_node_applies_what_others_write(nodes: list[Node]) -> None:
    """No request reaches node c: the log's notification wakes it, and its listeners get
    the entries (what its push streams and deliveries read)."""
    a, _, c = nodes
    token = await a.register("carol")
    unit = await a.record("carol", token, "seen everywhere")
    position = a.state.last_position
    await c.wait_for(position)
    assert unit["memory_unit_id"] in c.state.units
    assert [e.kind for e in c.published if e.kind == "memory.recorded"] == ["memory.recorded"]
    assert c.service.lag == 0
    assert c.service.log_head >= position


async def test_a_node_joining_later_catches_up(nodes: list[Node], database: str) -> None:
    a = nodes[0]
    token = await a.register("dave")
    for n in range(5):
        await a.record("dave", token, f"before the new node {n}")
    late = Node(database, "late")
    await late.service.start()
    try:
        assert late.state.field_id == a.state.field_id
        assert late.state.last_position == a.state.last_position
        unit = await late.record("dave", token, "through the new node")
        await a.wait_for(late.state.last_position)
        assert unit["memory_unit_id"] in a.state.units
    finally:
        await late.service.stop()


async def test_a_node_cut_off_from_the_database_serves_reads_and_refuses_writes(
    nodes: list[Node], database: str
) -> None:
    """While its database cannot be reached, a node answers reads from what it holds and
    refuses writes up front (LOG_UNAVAILABLE, recoverable); once the database answers
    again, writes resume by themselves, after whatever other nodes wrote meanwhile."""
    a, b, _ = nodes
    token = await a.register("erin")
    await a.record("erin", token, "before the cut")
    log = a.service.log
    assert isinstance(log, PostgresEventLog)
    log.url = "postgresql://postgres@127.0.0.1:1/unreachable"  # new connections fail
    for conn in (log._writer, log._reader):
        if conn is not None:
            conn.close()  # and the open ones are gone
    error = await _refused(a.record("erin", token, "during the cut"))
    assert error.code == "LOG_UNAVAILABLE" and error.recoverable
    attuned = await a.send(
        "ATTUNE", "erin", {"scope": {"role": "researcher", "max_units": 10}}, token
    )
    assert "record" in attuned  # served from the node's state
    elsewhere = await b.record("erin", token, "written elsewhere meanwhile")
    log.url = database
    async with asyncio.timeout(10):  # the probe (every second) finds the database again
        while a.service.refusing is not None:
            await asyncio.sleep(0.05)
    after = await a.record("erin", token, "after the cut")
    assert elsewhere["memory_unit_id"] in a.state.units
    assert after["memory_unit_id"] in a.state.units


async def _refused(call: Any) -> FieldError:
    try:
        await call
    except FieldError as error:
        return error
    raise AssertionError("the write was accepted")


async def test_a_batch_stored_though_its_commit_failed_is_published(nodes: list[Node]) -> None:
    """A commit whose outcome is unknown (the connection lost as it committed) is
    answered LOG_UNAVAILABLE and the state rebuilt from the log; when the batch was stored
    all the same, the node publishes it after the rebuild, as it publishes what other
    nodes append: its streams and deliveries do not go on past it."""
    a, b, _ = nodes
    token = await a.register("frank")
    log = a.service.log
    append = log.append
    failed: list[list[int]] = []

    def stored_then_lost(entries: Any) -> list[int]:
        if failed:
            return append(entries)
        failed.append(append(entries))  # committed...
        raise LogUnavailable("the connection was lost during COMMIT")  # ...as far as we know

    log.append = stored_then_lost  # type: ignore[method-assign]
    error = await _refused(a.record("frank", token, "stored, though the node cannot know it"))
    assert error.code == "LOG_UNAVAILABLE"
    [positions] = failed
    unit = next(u for u in a.state.units.values() if u["content"].startswith("stored, though"))
    for node in (a, b):
        await node.wait_for(positions[-1])
        recorded = [
            e for e in node.published if e.kind == "memory.recorded" and e.position in positions
        ]
        assert [e.data["unit"]["id"] for e in recorded] == [unit["id"]], node.service.node_id
    # published once, in log order, with nothing before it left out
    mine = [e.position for e in a.published]
    assert mine == sorted(set(mine)) and mine[-1] >= positions[-1]


async def test_a_node_starting_while_the_log_is_locked_waits_for_it(
    nodes: list[Node], database: str
) -> None:
    """A node that starts while ``field_log`` is locked elsewhere (``VACUUM FULL``,
    ``LOCK TABLE``) says so and starts once it can read the log, from all of it."""
    a = nodes[0]
    token = await a.register("gina")
    written = await a.record("gina", token, "before the lock")
    waiting = asyncio.Event()
    loop = asyncio.get_running_loop()

    class Told(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cannot be read yet" in record.getMessage():
                loop.call_soon_threadsafe(waiting.set)

    told = Told()
    logging.getLogger("field.service").addHandler(told)
    try:
        with psycopg.connect(database) as conn:
            conn.execute("LOCK TABLE field_log IN ACCESS EXCLUSIVE MODE")
            starting = asyncio.ensure_future(asyncio.to_thread(Node, database, "late"))
            async with asyncio.timeout(30):
                await waiting.wait()
            conn.rollback()  # the lock goes
        async with asyncio.timeout(30):
            late = await starting
    finally:
        logging.getLogger("field.service").removeHandler(told)
    try:
        assert written["memory_unit_id"] in late.state.units
    finally:
        late.service.log.close()
