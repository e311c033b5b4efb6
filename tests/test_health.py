"""``GET /healthz`` and ``GET /readyz`` of a real server, through what makes it unready.

A log another process holds locked makes the Field refuse writes (``LOG_UNAVAILABLE``)
and ``/readyz`` say so; when the lock goes, writes resume by themselves and so does
readiness. Admission control shedding writes makes it unready too. Neither probe
needs a token, and neither waits for the writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from field.client import FieldClient, FieldClientError
from field.transports.health import CHECKS, readiness
from field.transports.runtime import Runtime

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_metrics import on_server_loop, shed_writes
from .test_push import record

StartServer = Callable[..., ThreadedServer]
#: Failure guard for a state the server reaches by itself (never a pacing delay).
TIMEOUT = 15.0


async def probe(url: str, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as r:
        assert r.headers["Content-Type"] == "application/json"
        assert r.headers["Cache-Control"] == "no-store"
        body: dict[str, Any] = await r.json()
        return r.status, body


def assert_not_ready(status: int, body: dict[str, Any], reason: str, code: str) -> None:
    assert status == 503, body
    assert_valid("error", body)  # the spec's error body, with the reason in its details
    assert body["code"] == code and body["recoverable"] is True, body
    assert body["details"] == {"reason": reason} and reason in CHECKS
    assert body["message"] and body["suggested_action"]


async def until_ready(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while True:
        status, body = await probe(url, "/readyz")
        if status == 200:
            return body
        assert time.monotonic() < deadline, f"never ready again: {body}"
        await asyncio.sleep(0.05)


async def test_a_running_field_is_healthy_and_ready(field_server: ThreadedServer) -> None:
    assert await probe(field_server.url, "/healthz") == (200, {"status": "ok"})
    status, body = await probe(field_server.url, "/readyz")
    assert status == 200
    assert body["status"] == "ok"
    assert body["checks"]["log"] == "writable" and body["checks"]["writer"] == "running"
    async with aiohttp.ClientSession() as session:
        async with session.head(field_server.url + "/readyz") as r:
            assert r.status == 200
        async with session.post(field_server.url + "/healthz") as r:
            assert r.status == 405
            assert (await r.json())["code"] == "METHOD_NOT_ALLOWED"


async def test_a_locked_log_is_not_ready_until_writes_resume(
    server_factory: StartServer, tmp_path: Path
) -> None:
    server = server_factory(data_dir=tmp_path / "data", sync="normal")
    async with FieldClient(server.url) as field:
        agent = await field.register("agent-a", "analyst")
        await record(agent, "before the lock")
        other = sqlite3.connect(tmp_path / "data" / "field.db", isolation_level=None, timeout=5)
        try:
            other.execute("BEGIN EXCLUSIVE")  # another process takes the write lock
            with pytest.raises(FieldClientError) as refused:
                await record(agent, "refused")
            assert refused.value.code == "LOG_UNAVAILABLE"
            status, body = await probe(server.url, "/readyz")
            assert_not_ready(status, body, "log_refusing", "LOG_UNAVAILABLE")
            # the process still answers, and so do reads
            assert await probe(server.url, "/healthz") == (200, {"status": "ok"})
            assert (await field.status())["log"]["writable"] is False
        finally:
            other.execute("ROLLBACK")
            other.close()
        ready = await until_ready(server.url)
        assert ready["checks"]["log"] == "writable"
        await record(agent, "after the lock")


async def test_shedding_writes_is_not_ready(field_server: ThreadedServer) -> None:
    await on_server_loop(field_server, shed_writes)
    status, body = await probe(field_server.url, "/readyz")
    assert_not_ready(status, body, "overloaded", "OVERLOADED")
    assert await probe(field_server.url, "/healthz") == (200, {"status": "ok"})


async def test_probes_need_no_token_even_when_metrics_do(server_factory: StartServer) -> None:
    server = server_factory(
        metrics_token="metrics-" + "y" * 24,
        registration="closed",
        operator_token="operator-" + "z" * 24,
    )
    assert (await probe(server.url, "/healthz"))[0] == 200
    assert (await probe(server.url, "/readyz"))[0] == 200


def test_a_field_not_yet_started_is_not_ready() -> None:
    reason, error = readiness(Runtime())
    assert reason == "starting" and error is not None and error.code == "OVERLOADED"


@pytest.mark.parametrize(
    ("unreadable", "code"), [(None, "INTERNAL_ERROR"), ("the server is gone", "LOG_UNAVAILABLE")]
)
def test_a_broken_state_is_not_ready_with_why_it_cannot_be_rebuilt(
    unreadable: str | None, code: str
) -> None:
    service = SimpleNamespace(running=True, field=SimpleNamespace(broken=True))
    service.unreadable = unreadable
    runtime = SimpleNamespace(current=SimpleNamespace(service=service, hub=object()))
    reason, error = readiness(runtime)  # type: ignore[arg-type]
    assert reason == "state_broken" and error is not None and error.code == code
    assert error.recoverable and (unreadable is None or unreadable in error.message)
