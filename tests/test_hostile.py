"""Hostile clients against a real ``field serve`` process.

Each test sends what an attacker sent (only the public API), while a
watchdog reads ``GET /v1/field/status`` throughout and requires an answer
within 1 s every time; afterwards the Field must hold exactly what it held
before, its log must hold no traceback, and SIGTERM must still stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from field.client import AgentClient, FieldClient, FieldClientError

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

#: Longest the status page may take to answer while the Field is attacked (seconds).
STATUS_DEADLINE = 1.0
JSON = {"Content-Type": "application/json"}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def envelope_text(operation: str, *, payload: str = "{}", agent_id: str = "mallory") -> str:
    return (
        '{"protocol":"akashik","version":"0.1.0","id":"evil","operation":' + operation + ","
        '"agent_id":"' + agent_id + '","session_id":null,"epoch":0,"payload":' + payload + "}"
    )


class Watchdog:
    """Reads the status page every 50 ms; remembers the slowest answer and any failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.reads = 0
        self.failures: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=STATUS_DEADLINE * 5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.monotonic()
                try:
                    async with session.get(self.url + "/v1/field/status") as reply:
                        await reply.read()
                        if reply.status != 200:
                            self.failures.append(f"status {reply.status}")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.failures.append(repr(exc))
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.reads += 1
                await asyncio.sleep(0.05)  # the pace of the reads, not a wait for anything

    async def __aenter__(self) -> Watchdog:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, kind: object, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if kind is not None:
            return  # the body failed: let its error through
        assert self.reads > 0
        assert not self.failures, self.failures
        assert self.slowest < STATUS_DEADLINE, f"the status page took {self.slowest:.2f} s"


async def snapshot(url: str) -> tuple[Any, ...]:
    """What a Field holds, as the status page tells it."""
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/field/status") as r:
        status = await r.json()
    return status["epoch"], status["counts"], status["log"]["last_position"]


def assert_clean_exit(server: ServerProcess) -> None:
    """SIGTERM stops the server promptly, and nothing it logged was a traceback."""
    assert server.stop(signal.SIGTERM, timeout=30) == 0
    log = "\n".join(server.lines)
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture
async def hostile(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, FieldClient, AgentClient]]:
    server = server_process(tmp_path / "data", "--sync", "normal")
    async with FieldClient(server.url, timeout=30) as field:
        mallory = await field.register("mallory", "attacker")
        yield server, field, mallory


# -- one message, one request ----------------------------------------------------------

DEPTHS = [33, 100, 990, 1000, 1023, 1024, 1025, 5000]


async def test_deeply_nested_messages_over_the_websocket_are_answered(hostile: Any) -> None:
    server, field, mallory = hostile
    before = await snapshot(server.url)
    headers = {"Authorization": f"Bearer {mallory.token}"}
    async with (
        Watchdog(server.url),
        aiohttp.ClientSession() as session,
        session.ws_connect(server.url + "/v1/ws", headers=headers) as ws,
    ):
        for depth in DEPTHS:
            for text in (
                envelope_text(nested(depth)),
                envelope_text('"RECORD"', payload='{"type":' + nested(depth) + "}"),
                nested(depth),
            ):
                await ws.send_str(text)
                frame = await ws.receive_json(timeout=10)
                assert frame["type"] == "response" and frame["status"] == 400, frame
                assert frame["body"]["code"] == "INVALID_JSON"
                assert frame["body"]["recoverable"] is True
                assert "[[" not in str(frame)
            await ws.send_bytes(envelope_text(nested(depth)).encode())
            frame = await ws.receive_json(timeout=10)
            assert frame["body"]["code"] == "INVALID_JSON"
        # the same socket, and the Field, still work
        await ws.send_str(
            envelope_text('"ATTUNE"', payload='{"scope":{"role":"attacker","max_units":1}}')
        )
        frame = await ws.receive_json(timeout=10)
        assert frame["status"] == 200, frame
    after = await snapshot(server.url)
    assert after[1:] == before[1:] and after[0] == before[0] + 1  # the one ATTUNE
    assert_clean_exit(server)


async def test_deeply_nested_bodies_over_http_are_answered(hostile: Any) -> None:
    server, field, mallory = hostile
    before = await snapshot(server.url)
    auth = {**JSON, "Authorization": f"Bearer {mallory.token}"}
    async with Watchdog(server.url), aiohttp.ClientSession() as session:
        for depth in DEPTHS:
            deep_type = '{"type":' + nested(depth) + "}"
            for headers in (JSON, auth):
                for path, body in (
                    ("/v1/record", envelope_text(nested(depth))),
                    ("/v1/attune", envelope_text(nested(depth))),
                    ("/v1/record", envelope_text('"RECORD"', payload=deep_type)),
                    ("/v1/register", nested(depth)),
                ):
                    async with session.post(server.url + path, data=body, headers=headers) as r:
                        error = await r.json()
                        assert r.status == 400, (path, depth, error)
                        assert error["code"] == "INVALID_JSON"
                        assert set(error) >= {"code", "message", "recoverable", "suggested_action"}
        # too many values, each shallow
        wide = envelope_text('"RECORD"', payload='{"x":[' + ",".join(["0"] * 20_000) + "]}")
        async with session.post(server.url + "/v1/record", data=wide, headers=auth) as r:
            assert r.status == 413 and (await r.json())["code"] == "PAYLOAD_TOO_LARGE"
    assert await snapshot(server.url) == before, "no clock move, no entry"
    assert_clean_exit(server)


async def test_the_clock_cannot_be_pushed_to_its_end(hostile: Any) -> None:
    """The attack that used to take an hour: every request as far ahead as allowed."""
    server, field, mallory = hostile
    started = time.monotonic()
    epoch = (await snapshot(server.url))[0]
    accepted = refused = 0
    async with Watchdog(server.url):
        for _ in range(300):
            mallory.epoch = epoch + 2**32  # the old bound, now far past the new one
            with pytest.raises(FieldClientError) as info:
                await mallory.detect()
            assert info.value.code == "INVALID_EPOCH" and info.value.body["recoverable"]
            mallory.epoch = epoch + 2**20  # one request's most
            try:
                epoch = (await mallory.detect())["epoch"]
                accepted += 1
            except FieldClientError as error:
                assert error.code == "INVALID_EPOCH"
                refused += 1
    elapsed = time.monotonic() - started
    # at most skew + rate * age, plus one epoch per operation served (registration included)
    bound = 2**20 + 2**16 * (elapsed + 10) + accepted + 10
    assert epoch <= bound
    assert refused > 0, "the age bound stopped the jumps"
    # a client that resynchronises is served again
    mallory.epoch = 0
    assert (await mallory.detect())["epoch"] == epoch + 1
    assert_clean_exit(server)


async def test_a_client_leaving_mid_upload_leaves_no_traceback(hostile: Any) -> None:
    server, field, mallory = hostile
    before = await snapshot(server.url)
    host, port = server.url.removeprefix("http://").split(":")
    for _ in range(5):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"protocol": "akashik", ' * 10
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    assert await snapshot(server.url) == before
    assert_clean_exit(server)


# -- slow and idle connections ---------------------------------------------------------


async def _hold(
    host: str, port: int, data: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer  # the writer too: dropping it would close the connection


async def test_slow_and_idle_connections_are_answered_and_let_go(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Hundreds of connect-only, partial-head and partial-body connections at once: each is
    answered 408 and closed at its deadline, while everyone else is served."""
    server = server_process(
        tmp_path / "data", "--header-timeout", "1", "--body-timeout", "1", "--idle-timeout", "1"
    )
    host, port = server.url.removeprefix("http://").split(":")
    kinds = {
        "connect-only": b"",
        "partial-head": b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nContent-Ty",
        "partial-body": (
            b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 5000\r\n\r\n{"protocol"'
        ),
    }
    async with FieldClient(server.url, timeout=30) as field, Watchdog(server.url):
        agent = await field.register("patient", "analyst")
        readers = {
            kind: await asyncio.gather(*(_hold(host, int(port), data) for _ in range(300)))
            for kind, data in kinds.items()
        }
        for i in range(10):  # a normal client is served while they are held
            await note(agent, f"normal {i}")
        for kind, held in readers.items():
            answers = await asyncio.wait_for(
                asyncio.gather(*(reader.read() for reader, _ in held)), timeout=30
            )
            for _, writer in held:
                writer.close()
            assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), kind
            assert all(b'"REQUEST_TIMEOUT"' in answer for answer in answers), kind
        # a complete POST asking to upgrade to a WebSocket is answered
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"protocol":"akashik"}'
        writer.write(
            b"POST /v1/record HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        assert answer.startswith(b"HTTP/1.1 400") and b"INVALID_ENVELOPE" in answer
        writer.close()
        # one agent cannot hold more than its share of push connections
        headers = {"Authorization": f"Bearer {agent.token}"}
        async with aiohttp.ClientSession() as session:
            sockets = [
                await session.ws_connect(server.url + "/v1/ws", headers=headers) for _ in range(16)
            ]
            extra = await session.ws_connect(server.url + "/v1/ws", headers=headers)
            frame = await extra.receive_json(timeout=10)
            assert frame["data"]["code"] == "TOO_MANY_CONNECTIONS"
            await extra.receive(timeout=10)
            assert extra.close_code == 4429
            for ws in sockets:
                await ws.close()
    assert_clean_exit(server)


# -- a log that cannot be written ------------------------------------------------------


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Any:
    """A tmpfs of ``size`` at ``path`` (a real ENOSPC), or None where mounting is refused."""
    path.mkdir(parents=True)
    mount = shutil.which("mount")
    command = [mount or "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    mounted = mount is not None and subprocess.run(command, capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> Path:
    """Take every byte left on ``path``'s filesystem with one file (another process
    filling the disk); return the file."""
    ballast = path / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = 1 << 20
        while chunk:
            try:
                os.write(fd, b"\0" * chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return ballast


async def note(agent: AgentClient, content: str) -> dict[str, Any]:
    return await agent.record("finding", content, purpose="p", confidence=0.5, reasoning="r")


async def reads_go_on(field: FieldClient, reader: AgentClient, units: set[str]) -> None:
    """ATTUNE, a poll, REPLAY and the GET endpoints all answer while writes are refused."""
    seen = await reader.attune(max_units=5)
    assert seen["record"]
    poll = await reader.attune(max_units=1000, since_epoch=0)
    assert {r["memory_unit"]["id"] for r in poll["record"]} <= units
    await reader.get("/v1/agents")
    await reader.get("/v1/conflicts")
    await reader.subscriptions()


async def test_a_full_disk_refuses_writes_keeps_reads_and_recovers(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "small", "4m") as small:
        data = (small or tmp_path) / "data"
        server = server_process(data)
        async with FieldClient(server.url, timeout=30) as field:
            writer = await field.register("writer", "analyst")
            reader = await field.register("reader", "analyst")
            subscription = await reader.subscribe(["memory.recorded"])
            units = {(await note(writer, f"kept {i}"))["memory_unit_id"] for i in range(5)}
            # The disk fills from outside, between two commits: what the log holds
            # beyond its last commit is less than one page, so no write fits, however
            # small (a write that failed half-way would leave room for a smaller one).
            if small is not None:
                ballast, expected = fill(small), "STORAGE_FULL"
            else:  # no mounting here: a file-size limit at the WAL's end fails the writes
                ballast, expected = None, "LOG_UNAVAILABLE"
                size = (data / "field.db-wal").stat().st_size
                resource.prlimit(
                    server.process.pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY)
                )
            async with Watchdog(server.url):
                with pytest.raises(FieldClientError) as refused:
                    await note(writer, "x" * 8000)
                error = refused.value
                assert error.code == expected and error.body["recoverable"] is True
                assert "COMPACT" not in (error.body["suggested_action"] or "")
                before = await snapshot(server.url)
                for _ in range(50):
                    await reads_go_on(field, reader, units)
                    with pytest.raises(FieldClientError) as info:
                        await note(writer, "refused")
                    assert info.value.code == expected and info.value.status in (503, 507)
                status = await field.status()
                assert status["log"]["writable"] is False
                assert status["log"]["refusing"]["code"] == expected
                # push still serves a resume from the subscription's first cursor
                url = f"{server.url}/v1/subscriptions/{subscription['subscription_id']}/events"
                headers = {"Authorization": f"Bearer {reader.token}"}
                params = {"since": str(subscription["cursor"])}
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(url, headers=headers, params=params) as stream,
                ):
                    assert stream.status == 200
                    events = [await stream.content.readuntil(b"\r\n\r\n") for _ in range(3)]
                    assert events[0].startswith(b"event: resume")
                    assert b'"recovered":true' in events[0]
                    assert all(b"event: memory.recorded" in event for event in events[1:])
                after = await snapshot(server.url)
                assert after[1:] == before[1:], "nothing was written"
                # space returns: writes resume by themselves
                if ballast is not None:
                    ballast.unlink()
                else:
                    resource.prlimit(
                        server.process.pid,
                        resource.RLIMIT_FSIZE,
                        (resource.RLIM_INFINITY, resource.RLIM_INFINITY),
                    )
                deadline = time.monotonic() + 15
                while not (await field.status())["log"]["writable"]:
                    assert time.monotonic() < deadline, "writes never resumed"
                    await asyncio.sleep(0.1)
                unit = await note(writer, "after")
                assert unit["status"] == "accepted"
        assert_clean_exit(server)


async def test_a_locked_log_refuses_writes_and_keeps_reads(hostile: Any, tmp_path: Path) -> None:
    server, field, mallory = hostile
    reader = await field.register("reader", "analyst")
    await note(mallory, "kept")
    database = tmp_path / "data" / "field.db"
    other = sqlite3.connect(database, isolation_level=None, timeout=5)
    try:
        async with Watchdog(server.url):
            other.execute("BEGIN EXCLUSIVE")  # another process takes the write lock
            with pytest.raises(FieldClientError) as info:
                await note(mallory, "refused")
            assert info.value.code == "LOG_UNAVAILABLE" and info.value.status == 503
            assert info.value.body["recoverable"] is True
            for _ in range(20):
                await reads_go_on(field, reader, set(await _unit_ids(reader)))
                with pytest.raises(FieldClientError) as info:
                    await note(mallory, "refused")
                assert info.value.code == "LOG_UNAVAILABLE"
            other.execute("ROLLBACK")
            deadline = time.monotonic() + 15
            while not (await field.status())["log"]["writable"]:
                assert time.monotonic() < deadline, "writes never resumed"
                await asyncio.sleep(0.1)
            await note(mallory, "after")
    finally:
        other.close()
    assert_clean_exit(server)


async def _unit_ids(agent: AgentClient) -> list[str]:
    response = await agent.attune(max_units=1000, since_epoch=0)
    return [r["memory_unit"]["id"] for r in response["record"]]


# -- start-up --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["under-a-file", "a-file"])
def test_an_unusable_data_directory_ends_with_one_line(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / f"file-{uuid.uuid4().hex}"
    blocker.write_text("not a directory")
    data_dir = blocker / "data" if kind == "under-a-file" else blocker
    result = subprocess.run(
        [sys.executable, "-m", "field", "serve", "--port", "0", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot create the data directory" in errors[0], errors
