"""``field serve --log postgresql://...`` as a real process: group commit, durability
before acknowledgement, SIGKILL and restart on the same database, a lock held elsewhere.

Each test gets a database of its own, dropped afterwards; without a reachable PostgreSQL
server the tests are skipped, naming the URL tried.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import FieldClient, FieldClientError

from .conftest import ServerProcess
from .postgres_util import fresh_database
from .schema_util import assert_valid
from .test_process import (
    ACKS_BEFORE_KILL,
    WRITERS,
    _agent,
    _all_units,
    _record,
    _write_until_killed,
)

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

pytestmark = pytest.mark.slow

SpawnServer = Callable[..., ServerProcess]


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def with_password(url: str) -> str:
    """``url`` carrying a password (trust authentication ignores it): status and logs
    must never show it."""
    return url.replace("@", ":hunter2-secret@", 1)


async def _batch_sizes(url: str) -> dict[str, float]:
    """The writer's batch histogram from GET /metrics: bucket bound -> count."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        text = await r.text()
    pattern = r'field_writer_batch_operations_bucket\{le="([^"]+)"\} ([0-9.e+]+)'
    return {le: float(n) for le, n in re.findall(pattern, text)}


async def test_sigkill_on_postgres_loses_nothing_acknowledged(
    server_process: SpawnServer, tmp_path: Path, database: str
) -> None:
    url = with_password(database)
    name = database.rsplit("/", 1)[1]
    proc = server_process(tmp_path / "data", "--log", url)
    async with FieldClient(proc.url) as field:
        registered = await field.register("writer", "crash_tester")
        token = registered.token
        status = await field.status()
        assert_valid("field-status.response", status)
        assert status["log"]["backend"] == "postgresql"
        assert status["log"]["database"] == {"host": "127.0.0.1", "port": 5432, "name": name}
        assert "hunter2" not in str(status)
        writer = _agent(field, "writer", token, "crash_tester")
        acked, cut_off = await _write_until_killed(proc, writer, 0)
    assert len(acked) >= ACKS_BEFORE_KILL and cut_off == WRITERS
    assert not any("hunter2" in line for line in proc.lines)
    # nothing of this Field is in the data directory but the webhook key
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["webhook.key"]

    proc = server_process(tmp_path / "data", "--log", url)
    async with FieldClient(proc.url) as field:
        writer = _agent(field, "writer", token, "crash_tester")
        stored = await _all_units(writer)
        missing = acked.keys() - stored.keys()
        assert not missing, f"{len(missing)} acknowledged units lost"
        assert all(stored[i] == e for i, e in acked.items())
        assert len(stored.keys() - acked.keys()) <= WRITERS
        fresh = await _record(writer, "finding", "after the crash", purpose="crash test")
        assert fresh["epoch"] > max(acked.values())
        # the log in the database is dense: positions 1..last, as the status says
        status = await field.status()
        rows = await asyncio.to_thread(
            _query, database, "SELECT count(*), max(position) FROM field_log"
        )
        assert rows == [(status["log"]["last_position"], status["log"]["last_position"])]
        # under load the writer committed several operations at once (group commit)
        buckets = await _batch_sizes(proc.url)
    assert buckets, "no batch histogram in /metrics"
    assert await asyncio.to_thread(proc.stop, signal.SIGTERM) == 0


async def test_group_commit_on_postgres(
    server_process: SpawnServer, tmp_path: Path, database: str
) -> None:
    proc = server_process(tmp_path / "data", "--log", database)
    async with FieldClient(proc.url) as field:
        agent = await field.register("writer", "tester")
        before = await _batch_sizes(proc.url)
        results = await asyncio.gather(
            *(_record(agent, "finding", f"fact {i}", purpose="group") for i in range(64))
        )
        assert len({r["memory_unit_id"] for r in results}) == 64
        after = await _batch_sizes(proc.url)
        # some batch held more than one operation: count of batches of size <= 1 grew
        # by less than the number of operations written
        single = after.get("1.0", 0) - before.get("1.0", 0)
        total = after["+Inf"] - before["+Inf"]
        assert total < 64 + 4 and single < total, (single, total)
    assert await asyncio.to_thread(proc.stop, signal.SIGTERM) == 0


async def test_a_second_server_on_the_same_database_joins_the_field(
    server_process: SpawnServer, tmp_path: Path, database: str
) -> None:
    first = server_process(tmp_path / "one", "--log", with_password(database), "--node-id", "a")
    second = server_process(tmp_path / "two", "--log", with_password(database), "--node-id", "b")
    async with FieldClient(first.url) as one, FieldClient(second.url) as two:
        agent = await one.register("writer", "tester")
        through_two = _agent(two, "writer", agent.token, "tester")
        unit = await _record(through_two, "finding", "written through b", purpose="join")
        statuses = [await one.status(), await two.status()]
    assert statuses[0]["field_id"] == statuses[1]["field_id"]
    assert [s["node"]["id"] for s in statuses] == ["a", "b"]
    for status in statuses:
        assert_valid("field-status.response", status)
        assert status["node"]["log_head"] >= status["node"]["position"] >= 1
        assert status["node"]["lag"] == status["node"]["log_head"] - status["node"]["position"]
    assert unit["epoch"] > 0
    assert first.process.poll() is None and second.process.poll() is None


#: Every table a node uses while it serves, and whether a lock on it stops writes.
LOCKED_TABLES = {
    "field_log": True,
    "field_log_head": True,
    "field_leases": False,
    "field_nodes": False,
    "field_presence": False,
    "field_snapshots": False,
    "field_snapshot_chunks": False,
}
#: Longest a request may take while a table is locked: the documented bound is
#: LOCK_TIMEOUT_MS (2 s); this leaves room for a busy machine, not for a hang.
LOCKED_BOUND_SECONDS = 10.0


@pytest.mark.parametrize("table", sorted(LOCKED_TABLES))
async def test_a_locked_log_refuses_writes_keeps_reads_and_resumes(
    server_process: SpawnServer, tmp_path: Path, database: str, table: str
) -> None:
    """Another client holds ``LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE`` (VACUUM FULL,
    CLUSTER, ALTER TABLE) under a Field of two nodes: on each, a write is refused 503
    LOG_UNAVAILABLE when the lock stops writes, else answered, never hung; ATTUNE and the
    status answer all along; once the lock is released writes resume by themselves, and
    every acknowledged unit is in the log once and seen by both nodes."""
    nodes = [server_process(tmp_path / name, "--log", database, "--node-id", name) for name in "ab"]
    stops_writes = LOCKED_TABLES[table]

    async def bounded(call: Any) -> Any:
        return await asyncio.wait_for(call, LOCKED_BOUND_SECONDS)

    async with FieldClient(nodes[0].url) as one, FieldClient(nodes[1].url) as two:
        fields = [one, two]
        registered = await one.register("agent-a", "analyst")
        agents = [registered, _agent(two, "agent-a", registered.token, "analyst")]
        acknowledged = [
            await _record(agent, "finding", f"before the lock, node {i}", purpose="lock")
            for i, agent in enumerate(agents)
        ]
        other = await asyncio.to_thread(psycopg.connect, database)
        try:
            await asyncio.to_thread(other.execute, f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            for i, agent in enumerate(agents):  # reads go on, before a write as after
                units = await bounded(_all_units(agent))
                assert acknowledged[i]["memory_unit_id"] in units
            writes = [
                _record(agent, "finding", f"in flight {i}", purpose="lock")
                for agent in agents
                for i in range(3)
            ]
            answers = await bounded(asyncio.gather(*writes, return_exceptions=True))
            for answer in answers:
                if stops_writes:
                    assert isinstance(answer, FieldClientError), answer
                    assert answer.code == "LOG_UNAVAILABLE" and answer.status == 503
                    assert answer.body["recoverable"] is True
                else:
                    assert not isinstance(answer, BaseException), answer
                    acknowledged.append(answer)
            for i, (field, agent) in enumerate(zip(fields, agents, strict=True)):
                status = await bounded(field.status())
                assert status["log"]["writable"] is not stops_writes
                if stops_writes:
                    assert status["log"]["refusing"]["code"] == "LOG_UNAVAILABLE"
                units = await bounded(_all_units(agent))
                assert acknowledged[i]["memory_unit_id"] in units
                # REPLAY reads the entries themselves: refused while field_log is locked
                unit_id = acknowledged[i]["memory_unit_id"]
                for _ in range(2):
                    try:
                        replayed = await bounded(agent.replay("memory_unit", unit_id))
                    except FieldClientError as error:
                        assert table == "field_log", error
                        assert error.code == "LOG_UNAVAILABLE" and error.status == 503
                    else:
                        assert table != "field_log" and replayed["timeline"], replayed
        finally:
            await asyncio.to_thread(other.rollback)
            await asyncio.to_thread(other.close)
        for field in fields:
            deadline = time.monotonic() + 15
            while not (await field.status())["log"]["writable"]:
                assert time.monotonic() < deadline, "writes never resumed"
                await asyncio.sleep(0.1)
        for i, agent in enumerate(agents):
            acknowledged.append(
                await _record(agent, "finding", f"after the lock, node {i}", purpose="lock")
            )
        ids = {a["memory_unit_id"] for a in acknowledged}
        for i, agent in enumerate(agents):
            assert ids <= (await _all_units(agent)).keys()
            while True:  # REPLAY reads the log again once it can
                try:
                    replayed = await agent.replay("memory_unit", acknowledged[i]["memory_unit_id"])
                    break
                except FieldClientError as error:
                    assert error.code == "LOG_UNAVAILABLE", error
                    assert time.monotonic() < deadline + 15, "REPLAY never resumed"
                    await asyncio.sleep(0.1)
            assert replayed["timeline"], replayed
    for node in nodes:
        assert await asyncio.to_thread(node.stop, signal.SIGTERM) == 0
    recorded = [
        orjson.loads(data)["unit"]["id"]
        for (data,) in _query(database, "SELECT data FROM field_log WHERE kind = 'memory.recorded'")
    ]
    assert sorted(recorded) == sorted(ids)


def _query(url: str, query: str) -> list[tuple[int, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


async def test_the_status_lists_every_node_with_its_position_lag_and_lease(
    server_process: SpawnServer, tmp_path: Path, database: str
) -> None:
    """Two nodes on one database: each one's status lists both, this one as its ``node``
    says and the other as it last said (every --cluster-interval), with the one that sends
    the deliveries marked on both; a node that stops is listed as not live."""
    quick = ("--log", database, "--cluster-interval", "0.2")
    nodes = {
        name: server_process(tmp_path / name, *quick, "--node-id", name) for name in ("a", "b")
    }
    async with FieldClient(nodes["a"].url) as a, FieldClient(nodes["b"].url) as b:
        writer = await a.register("node-writer", "analyst")
        await _record(writer, "finding", "a unit through a", purpose="moving the log")

        async def settled(field: FieldClient) -> dict[str, Any]:
            """The status once it lists both nodes, each at the log's head."""
            async with asyncio.timeout(60):  # presence is shared every interval: polled
                while True:
                    status = await field.status()
                    listed = {n["id"]: n for n in status["nodes"]}
                    head = status["node"]["log_head"]
                    if listed.keys() == {"a", "b"} and all(
                        n["position"] == head and n["lag"] == 0 for n in listed.values()
                    ):
                        return status
                    await asyncio.sleep(0.1)

        for field, me in ((a, "a"), (b, "b")):
            status = await settled(field)
            assert_valid("field-status.response", status)
            listed = {n["id"]: n for n in status["nodes"]}
            assert listed[me]["seen_seconds_ago"] == 0
            assert all(n["live"] for n in listed.values())
            assert listed[me]["delivery_owner"] == status["node"]["delivery_owner"]
        owners = [
            {n["id"] for n in (await field.status())["nodes"] if n["delivery_owner"]}
            for field in (a, b)
        ]
        assert len(owners[0]) == 1 and owners[0] == owners[1]
        nodes["b"].stop(signal.SIGKILL)
        async with asyncio.timeout(60):  # five intervals without a word from b
            while {n["id"]: n["live"] for n in (await a.status())["nodes"]}.get("b"):
                await asyncio.sleep(0.1)
