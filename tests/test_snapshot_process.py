"""``field serve`` writes snapshots beside itself and starts from them, as a real process.

A server with ``--snapshot-entries`` writes a snapshot (in a process of its
own) once that many entries were appended; stopped and started again, it
says in its log and its status that it started from that snapshot, and it
answers as before. A damaged snapshot is passed over with a warning and the
server replays the whole log instead. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from field.client import AgentClient, FieldClient

from .conftest import ServerProcess
from .postgres_util import fresh_database
from .schema_util import assert_valid
from .test_process import _agent, _all_units, _record

pytestmark = pytest.mark.slow

SpawnServer = Callable[..., ServerProcess]
#: Seconds a snapshot process may take on these few entries, with room for a slow machine.
SNAPSHOT_SECONDS = 60.0
SNAPSHOT_FLAGS = ("--snapshot-entries", "40", "--snapshot-seconds", "0")


@pytest.fixture(params=["sqlite", "postgresql"])
def log_flags(request: pytest.FixtureRequest) -> Iterator[tuple[str, ...]]:
    """The ``--log`` flags of the backend (none: SQLite in the data directory)."""
    if request.param == "sqlite":
        yield ()
        return
    pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")
    with fresh_database() as url:
        yield ("--log", url)


async def _until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Ask ``check`` until it answers something true (another process is at work)."""
    deadline = time.monotonic() + SNAPSHOT_SECONDS
    while not (found := await check()):
        assert time.monotonic() < deadline, f"{what} did not happen"
        await asyncio.sleep(0.1)
    return found


async def _snapshot_of(field: FieldClient) -> Any:
    return (await field.status())["snapshot"]


async def _reads(agent: AgentClient) -> Any:
    """What an agent reads: every unit, and a ranked ATTUNE page with a hint."""
    ranked = await agent.attune(max_units=20, context_hint="market pricing in europe")
    page = [(r["memory_unit"]["id"], r["relevance_score"]) for r in ranked["record"]]
    return await _all_units(agent), page


async def test_a_restarted_server_starts_from_its_snapshot(
    server_process: SpawnServer, tmp_path: Path, log_flags: tuple[str, ...]
) -> None:
    flags = (*log_flags, *SNAPSHOT_FLAGS)
    first = server_process(tmp_path / "data", *flags)
    async with FieldClient(first.url) as field:
        writer = await field.register("writer", "market_researcher")
        reader = await field.register("reader", "strategist", interests=["pricing"])
        tokens = writer.token, reader.token
        assert await _snapshot_of(field) is None
        for i in range(45):
            await _record(writer, "finding", f"unit {i}: pricing in europe grows", purpose="p")
        written = await _until(lambda: _snapshot_of(field), "a snapshot")
        assert written["position"] >= 40 and written["started_from"] is None
        assert_valid("field-status.response", await field.status())
        for i in range(5):  # entries after the snapshot: replayed on top of it
            await _record(writer, "decision", f"after the snapshot {i}", purpose="p")
        before = await _reads(reader)
        last = (await field.status())["log"]["last_position"]
    assert first.stop(signal.SIGTERM) == 0
    assert any("snapshot written at position" in line for line in first.lines)

    second = server_process(tmp_path / "data", *flags)
    started = [line for line in second.lines if "started from the snapshot" in line]
    assert len(started) == 1, "\n".join(second.lines)
    position = int(re.search(r"at position (\d+)", started[0]).group(1))  # type: ignore[union-attr]
    assert f"then {last - position} entries after it" in started[0]
    async with FieldClient(second.url) as field:
        status = await field.status()
        assert_valid("field-status.response", status)
        assert status["snapshot"]["started_from"] == position == written["position"]
        # on PostgreSQL the restarted node, the only one, claims the deliveries' lease in
        # the log (delivery.term, with a clock reservation if its epoch needs one)
        assert last <= status["log"]["last_position"] <= last + 2
        reader = _agent(field, "reader", tokens[1], "strategist")
        assert await _reads(reader) == before
        writer = _agent(field, "writer", tokens[0], "market_researcher")
        await _record(writer, "finding", "written after the restart", purpose="p")
        assert len((await _reads(reader))[0]) == len(before[0]) + 1
    assert second.stop(signal.SIGTERM) == 0


async def test_a_damaged_snapshot_is_passed_over_for_the_whole_log(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = server_process(data, *SNAPSHOT_FLAGS)
    async with FieldClient(first.url) as field:
        writer = await field.register("writer", "market_researcher")
        token = writer.token
        for i in range(45):
            await _record(writer, "finding", f"unit {i} of the damaged test", purpose="p")
        await _until(lambda: _snapshot_of(field), "a snapshot")
        before = await _all_units(writer)
    assert first.stop(signal.SIGTERM) == 0
    (only,) = (data / "snapshots").iterdir()
    damaged = bytearray(only.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    only.write_bytes(bytes(damaged))

    # nothing is written after the start: the time writes a snapshot the next start can use
    second = server_process(data, "--snapshot-entries", "0", "--snapshot-seconds", "1")
    told = [line for line in second.lines if "is not used" in line]
    assert len(told) == 1 and "checksum" in told[0], "\n".join(second.lines)
    assert any("started from the whole log" in line for line in second.lines)
    async with FieldClient(second.url) as field:
        status = await field.status()
        assert status["snapshot"]["started_from"] is None
        assert await _all_units(_agent(field, "writer", token, "market_researcher")) == before

        async def rewritten() -> bool:
            now = await _snapshot_of(field)
            return now["written_at"] != status["snapshot"]["written_at"]

        await _until(rewritten, "a snapshot in place of the damaged one")
    assert second.stop(signal.SIGTERM) == 0
    third = server_process(data, "--snapshot-entries", "0", "--snapshot-seconds", "0")
    assert any("started from the snapshot" in line for line in third.lines)
    assert third.stop(signal.SIGTERM) == 0
