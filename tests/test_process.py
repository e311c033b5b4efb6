"""End-to-end tests of ``field serve`` as a real process.

They start ``python -m field serve`` (the ``server_process`` fixture of
``conftest.py``), talk to it over loopback HTTP with the SDK, stop it with
SIGINT, SIGTERM or SIGKILL, start it again on the same data directory and
check that nothing acknowledged was lost and that the Lamport clock never
goes backwards.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from field import __version__
from field.client import AgentClient, FieldClient, FieldClientError
from field.server.config import Config

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

SpawnServer = Callable[..., ServerProcess]

#: Longest a signalled server may take to exit and still count as prompt.
PROMPT_EXIT_SECONDS = 5.0


def _field_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "field", *args]


def _run_field(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _field_command(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


def _stop_timed(proc: ServerProcess, sig: int) -> tuple[int, float]:
    """Send ``sig``; the exit status and the seconds it took to exit."""
    started = time.monotonic()
    status = proc.stop(sig, timeout=30)
    return status, time.monotonic() - started


def _log(proc: ServerProcess) -> str:
    return "\n".join(proc.lines)


async def _record(agent: AgentClient, memory_type: str, content: str, **options: Any) -> Any:
    """RECORD with the confidence committed units need (spec: score and reasoning)."""
    if options.get("mode", "committed") == "committed":
        options.setdefault("confidence", 0.7)
        options.setdefault("reasoning", "observed in the test")
    return await agent.record(memory_type, content, **options)


def _agent(field: FieldClient, agent_id: str, token: str, role: str) -> AgentClient:
    """A handle on an agent registered before, from its old token; its clock starts at 0."""
    return AgentClient(field, agent_id, token, role=role)


async def _all_units(agent: AgentClient) -> dict[str, int]:
    """Every visible unit (own included) as id → epoch, paging with since_epoch."""
    units: dict[str, int] = {}
    since = 0
    for _ in range(100):
        response = await agent.attune(
            max_units=1000, include_own=True, since_epoch=since, format="ids_only"
        )
        record = response["record"]
        for item in record:
            units[item["memory_unit_id"]] = item["epoch"]
        budget = response["context_budget"]
        if budget["units_returned"] >= budget["units_available"] or not record:
            return units
        since = max(item["epoch"] for item in record)
    raise AssertionError("ATTUNE paging did not finish in 100 pages")


# -- 1. start-up and clean shutdown ------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_signal_stops_promptly_and_logs_stopped(
    server_process: SpawnServer, tmp_path: Path, sig: int
) -> None:
    proc = server_process(tmp_path / "data")
    port = int(proc.url.rsplit(":", 1)[1])
    assert port > 0
    listening = [line for line in proc.lines if "listening on" in line]
    assert len(listening) == 1
    assert f"listening on http://127.0.0.1:{port}" in listening[0]

    async with FieldClient(proc.url) as field:
        agent = await field.register("agent-1", "tester")
        await _record(agent, "finding", "before the signal", purpose="shutdown test")
        assert (await field.status())["status"] == "ok"

    _, elapsed = await asyncio.to_thread(_stop_timed, proc, sig)
    assert elapsed < PROMPT_EXIT_SECONDS
    assert any("stopped" in line for line in proc.lines), _log(proc)
    stopped = next(i for i, line in enumerate(proc.lines) if "stopped" in line)
    listened = next(i for i, line in enumerate(proc.lines) if "listening on" in line)
    assert stopped > listened


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_signal_exits_zero_without_traceback(
    server_process: SpawnServer, tmp_path: Path, sig: int
) -> None:
    proc = server_process(tmp_path / "data")
    async with FieldClient(proc.url) as field:
        await field.register("agent-1", "tester")

    status, elapsed = await asyncio.to_thread(_stop_timed, proc, sig)
    assert elapsed < PROMPT_EXIT_SECONDS
    assert any("stopped" in line for line in proc.lines), _log(proc)
    assert "Traceback" not in _log(proc)
    assert status == 0, _log(proc)


def test_second_server_on_same_data_dir_fails_fast(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_process(data_dir)

    started = time.monotonic()
    second = _run_field(
        "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), timeout=30
    )
    elapsed = time.monotonic() - started
    assert second.returncode != 0, second.stderr
    assert elapsed < 10
    assert re.search(r"data directory is in use", second.stderr, re.IGNORECASE), second.stderr
    assert "listening on" not in second.stderr

    # The first server is unaffected and still owns its log.
    assert first.process.poll() is None

    async def still_serving() -> dict[str, Any]:
        async with FieldClient(first.url) as field:
            agent = await field.register("agent-1", "tester")
            await _record(agent, "finding", "still the owner", purpose="lock test")
            return await field.status()

    status = asyncio.run(still_serving())
    assert status["counts"]["memory_units"] == {"active": 1}


def test_second_server_on_same_data_dir_reports_without_traceback(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    server_process(data_dir)
    second = _run_field(
        "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), timeout=30
    )
    assert second.returncode != 0
    assert "data directory is in use" in second.stderr
    assert "Traceback" not in second.stderr, second.stderr


def test_port_in_use_fails_with_clear_message(server_process: SpawnServer, tmp_path: Path) -> None:
    first = server_process(tmp_path / "one")
    port = first.url.rsplit(":", 1)[1]
    result = _run_field(
        "serve", "--host", "127.0.0.1", "--port", port, "--data-dir", str(tmp_path / "two")
    )
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert first.process.poll() is None


# -- 2. a restart keeps everything -------------------------------------------


async def test_restart_keeps_agents_tokens_units_conflicts_and_clock(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_process(data_dir)
    handed_out: list[int] = []

    async with FieldClient(first.url) as field:
        alice = await field.register("alice", "market_researcher", interests=["market", "saas"])
        bob = await field.register("bob", "analyst", interests=["pricing"])
        handed_out += [alice.registration["epoch"], bob.registration["epoch"]]

        old = await _record(
            alice,
            "finding",
            "EU HR SaaS grows 20% a year",
            purpose="size the market",
            confidence=0.6,
        )
        new = await _record(
            alice,
            "finding",
            "EU HR SaaS grows 23% a year",
            purpose="size the market",
            confidence=0.8,
            reasoning="three analyst reports",
            relations=[{"type": "supersedes", "target_id": old["memory_unit_id"]}],
        )
        pricing = await _record(bob, "decision", "Price at 12 EUR per seat", purpose="pricing")
        against = await _record(
            bob,
            "finding",
            "EU HR SaaS is flat this year",
            purpose="size the market",
            confidence=0.5,
            relations=[{"type": "contradicts", "target_id": new["memory_unit_id"]}],
        )
        draft = await _record(
            bob, "intention", "Survey 20 customers", purpose="pricing", mode="draft"
        )
        for response in (old, new, pricing, against, draft):
            handed_out.append(response["epoch"])
        assert len(against["conflicts_detected"]) == 1
        conflict_id = against["conflicts_detected"][0]

        status_before = await field.status()
        assert status_before["counts"]["memory_units"] == {
            "superseded": 1,
            "contested": 2,
            "active": 1,
            "draft": 1,
        }
        agents_before = await alice.get("/v1/agents")
        conflicts_before = await bob.get("/v1/conflicts")
        assert [c["id"] for c in conflicts_before["conflicts"]] == [conflict_id]

        alice_view = await alice.attune(max_units=1000, include_own=True)
        bob_view = await bob.attune(max_units=1000, include_own=True)
        handed_out += [alice_view["epoch"], bob_view["epoch"]]
        units_before = {
            item["memory_unit"]["id"]: item["memory_unit"] for item in alice_view["record"]
        }
        # Superseded units are hidden from ATTUNE; the others are all visible.
        assert set(units_before) == {
            new["memory_unit_id"],
            pricing["memory_unit_id"],
            against["memory_unit_id"],
            draft["memory_unit_id"],
        }
        assert units_before[new["memory_unit_id"]]["status"] == "contested"
        assert units_before[against["memory_unit_id"]]["status"] == "contested"
        assert units_before[draft["memory_unit_id"]]["status"] == "draft"

        # A read advances the clock too, and is the last thing before the stop.
        last_read = await bob.detect()
        handed_out.append(last_read["epoch"])
        assert last_read["epoch"] == max(handed_out)
        assert [c["id"] for c in last_read["conflicts"]] == [conflict_id]

    await asyncio.to_thread(first.stop, signal.SIGTERM)
    assert any("stopped" in line for line in first.lines), _log(first)

    second = server_process(data_dir)
    async with FieldClient(second.url) as field:
        # Old tokens, no re-register; the clocks of these handles start at 0,
        # so the epochs below come from the restored Field clock alone.
        alice2 = _agent(field, "alice", alice.token, "market_researcher")
        bob2 = _agent(field, "bob", bob.token, "analyst")

        alice_after = await alice2.attune(max_units=1000, include_own=True)
        assert alice_after == alice_view  # the same units, conflicts and epoch (the newest unit)
        detected = await alice2.detect()
        assert detected["epoch"] > max(handed_out)
        bob_after = await bob2.attune(max_units=1000, include_own=True)
        assert bob_after == bob_view

        # the GET reports the clock, which the ATTUNE after the DETECT moved once more
        assert await bob2.get("/v1/conflicts") == {
            **conflicts_before,
            "epoch": detected["epoch"] + 1,
        }
        agents_after = await alice2.get("/v1/agents")
        assert agents_after["agents"] == agents_before["agents"]

        status_after = await field.status()
        assert status_after["field_id"] == status_before["field_id"]
        assert status_after["counts"] == status_before["counts"]
        assert status_after["log"]["last_position"] >= status_before["log"]["last_position"]

        # The agents are still registered: their ids are taken.
        with pytest.raises(FieldClientError) as taken:
            await field.register("alice", "market_researcher")
        assert taken.value.code == "AGENT_ID_TAKEN"

        # Relations to units from before the restart still resolve.
        later = await _record(
            bob2,
            "finding",
            "Growth confirmed by a fourth report",
            purpose="size the market",
            relations=[{"type": "supersedes", "target_id": against["memory_unit_id"]}],
        )
        assert later["epoch"] > bob_after["epoch"]
        assert (await field.status())["counts"]["memory_units"]["superseded"] == 2


# -- 3. SIGKILL under write load loses nothing acknowledged -----------------

WRITERS = 8
ACKS_BEFORE_KILL = 300
CYCLES = 2


async def _write_until_killed(
    proc: ServerProcess, writer: AgentClient, cycle: int
) -> tuple[dict[str, int], int]:
    """Run WRITERS concurrent RECORD loops, SIGKILL the server mid-load.

    Returns the acknowledged units (id → epoch) and how many writers were
    cut off by the kill.
    """
    acked: dict[str, int] = {}
    enough = asyncio.Event()
    cut_off = 0

    async def write(n: int) -> None:
        nonlocal cut_off
        for i in range(100_000):
            try:
                response = await _record(
                    writer,
                    "finding",
                    f"cycle {cycle} writer {n} unit {i}: a fact worth keeping",
                    purpose="crash test",
                    confidence=0.5,
                )
            except (aiohttp.ClientError, ConnectionError):
                cut_off += 1
                return
            acked[response["memory_unit_id"]] = response["epoch"]
            if len(acked) >= ACKS_BEFORE_KILL:
                enough.set()
        raise AssertionError("the server was never killed")

    tasks = [asyncio.create_task(write(n)) for n in range(WRITERS)]
    waiter = asyncio.create_task(enough.wait())
    try:
        await asyncio.wait([waiter, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                task.result()  # a writer failed before the kill: show why
        assert enough.is_set(), f"only {len(acked)} RECORDs acknowledged in 60 s"
        # The writers are still sending: kill now, without any warning.
        proc.process.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    finally:
        for task in (waiter, *tasks):
            task.cancel()
        await asyncio.gather(waiter, *tasks, return_exceptions=True)
    status = await asyncio.to_thread(proc.stop, signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert not any("stopped" in line for line in proc.lines)
    return acked, cut_off


async def test_sigkill_under_write_load_loses_nothing_acknowledged(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    proc = server_process(data_dir)
    async with FieldClient(proc.url) as field:
        registered = await field.register("writer", "crash_tester")
        token = registered.token
        field_id = registered.registration["field_capabilities"]["field_id"]
        # A reader that never writes: it only ever sees others' units.
        reader = await field.register("reader", "auditor")

    acknowledged: dict[str, int] = {}
    for cycle in range(CYCLES):
        async with FieldClient(proc.url) as field:
            writer = _agent(field, "writer", token, "crash_tester")
            acked, cut_off = await _write_until_killed(proc, writer, cycle)
        assert len(acked) >= ACKS_BEFORE_KILL
        assert cut_off == WRITERS  # every writer was still sending at the kill
        assert not acked.keys() & acknowledged.keys()
        acknowledged.update(acked)
        max_acked = max(acknowledged.values())

        proc = server_process(data_dir)
        async with FieldClient(proc.url) as field:
            # The same token still works: no re-register after the crash.
            writer = _agent(field, "writer", token, "crash_tester")
            stored = await _all_units(writer)
            missing = acknowledged.keys() - stored.keys()
            assert not missing, f"{len(missing)} acknowledged units lost: {sorted(missing)[:3]}"
            wrong = {i: (e, stored[i]) for i, e in acknowledged.items() if stored[i] != e}
            assert not wrong, f"epochs changed: {dict(list(wrong.items())[:3])}"
            # At most the requests in flight at the kill were stored unacknowledged.
            assert len(stored.keys() - acknowledged.keys()) <= WRITERS * (cycle + 1)

            # The reader sees the same units, and its token survived too.
            reader_again = _agent(field, "reader", reader.token, "auditor")
            assert (await _all_units(reader_again)).keys() == stored.keys()

            status = await field.status()
            assert status["status"] == "ok"
            assert status["field_id"] == field_id
            assert status["log"]["backend"] == "sqlite"
            assert status["epoch"] >= max_acked
            assert status["counts"]["agents"] == 2
            assert status["counts"]["memory_units"]["active"] == len(stored)

            fresh = await _record(writer, "finding", f"after crash {cycle}", purpose="crash test")
            # The handle's clock is only as new as the pages it read; the Field's
            # own clock must be past everything it acknowledged before the kill.
            assert fresh["epoch"] > max_acked
            acknowledged[fresh["memory_unit_id"]] = fresh["epoch"]

    async with FieldClient(proc.url) as field:
        writer = _agent(field, "writer", token, "crash_tester")
        stored = await _all_units(writer)
        assert acknowledged.keys() <= stored.keys()
    await asyncio.to_thread(proc.stop, signal.SIGTERM)


async def test_new_epoch_after_sigkill_exceeds_epochs_of_reads(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    """Reads write nothing, yet a crash must not let the clock hand their epochs out again."""
    data_dir = tmp_path / "data"
    proc = server_process(data_dir)
    async with FieldClient(proc.url) as field:
        agent = await field.register("reader", "auditor")
        await _record(agent, "finding", "one unit", purpose="clock test")
        # Reads inside the first reservation block: nothing is written for them.
        first_reads = [(await agent.detect())["epoch"] for _ in range(5)]
        assert first_reads == sorted(set(first_reads))
        # An envelope epoch far ahead moves the clock past the block (spec 9:
        # max(local, received) + 1), so the Field must reserve a new one.
        agent.epoch = 5000
        jumped = await agent.detect()
        assert jumped["epoch"] == 5001
        later_reads = [(await agent.detect())["epoch"] for _ in range(5)]
        assert later_reads[0] == 5002
        last = later_reads[-1]
    await asyncio.to_thread(proc.stop, signal.SIGKILL)

    proc = server_process(data_dir)
    async with FieldClient(proc.url) as field:
        again = _agent(field, "reader", agent.token, "auditor")
        assert again.epoch == 0
        response = await again.detect()
        assert response["epoch"] > last
        assert (await field.status())["epoch"] >= response["epoch"]


async def test_sequential_requests_are_not_delayed_by_nagle(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "data", "--in-memory")
    async with FieldClient(proc.url) as field:
        await field.status()  # open the keep-alive connection
        started = time.perf_counter()
        for _ in range(20):
            await field.status()
        elapsed = time.perf_counter() - started
    # ~0.2-0.5 ms each with TCP_NODELAY; ~44 ms each (0.9 s in all) without.
    assert elapsed < 0.4, f"20 sequential GET /v1/field/status took {elapsed:.2f} s"


# -- 4. the command line -------------------------------------------------------


async def test_in_memory_server_reports_no_persistence(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "never-created"
    proc = server_process(data_dir, "--in-memory")
    assert any("in memory" in line for line in proc.lines if "listening on" in line)
    async with FieldClient(proc.url) as field:
        agent = await field.register("agent-1", "tester")
        assert agent.registration["field_capabilities"]["persistence"] is False
        await _record(agent, "finding", "gone after a restart", purpose="in-memory test")
        status = await field.status()
        assert status["persistence"] is False
        assert status["log"]["backend"] == "memory"
    await asyncio.to_thread(proc.stop, signal.SIGTERM)
    assert not data_dir.exists()


def test_version_flag_prints_the_version() -> None:
    result = _run_field("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"field {__version__}"


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_out_of_range_port_is_refused_cleanly(tmp_path: Path, port: str) -> None:
    started = time.monotonic()
    result = _run_field("serve", "--port", port, "--data-dir", str(tmp_path / "data"))
    assert time.monotonic() - started < 10
    assert result.returncode != 0
    assert "port must be between 0 and 65535" in result.stderr
    assert port in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--operator-token-file", "/nonexistent/operator.token"], "No such file"),
        (["--failure-grace", "0"], "failure_grace must be positive"),
        (["--heartbeat-timeout", "-1"], "heartbeat_timeout not negative"),
        (["--outbox-bytes", "65536"], "must be at least max_response_bytes"),
    ],
)
def test_bad_liveness_and_operator_settings_are_refused_cleanly(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = _run_field("serve", "--data-dir", str(tmp_path / "data"), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_short_operator_token_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "operator.token"
    token_file.write_text("short\n")
    result = _run_field(
        "serve", "--data-dir", str(tmp_path / "data"), "--operator-token-file", str(token_file)
    )
    assert result.returncode == 2
    assert "operator_token must be at least 16 characters" in result.stderr
    assert "short" not in result.stderr  # the token itself is never printed


def test_liveness_settings_read_the_environment() -> None:
    config = Config.from_env({"FIELD_FAILURE_GRACE": "2.5", "FIELD_HEARTBEAT_TIMEOUT": "0"})
    assert (config.failure_grace, config.heartbeat_timeout) == (2.5, 0.0)
    assert "x" * 20 not in repr(Config(operator_token="x" * 20))  # never printed
