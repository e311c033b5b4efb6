"""The official MCP TypeScript SDK follows a subscription resource of ``field serve``
across a SIGKILL and a restart, on the 2025 revision, and misses nothing.

``tests/mcp_conformance/follow.mjs`` is the client: the SDK's ``Client`` over Streamable
HTTP with an agent's bearer token, a session, ``resources/subscribe`` to
``field://subscriptions/{id}``, a read on each ``notifications/resources/updated`` (again
while ``more``), keeping the cursor of its last read. When the Field is gone it opens a new
session, subscribes again and reads once with ``?since=<cursor>``
(``protocol/README.md``, "MCP binding"). The SDK comes with the conformance suite's
install (``npm ci --prefix tests/mcp_conformance``, pinned by its lock file); without
Node.js or that install the test says so and is skipped.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .conftest import ServerProcess, spawn_server
from .test_mcp_conformance import SUITE, needs_npm
from .test_service import envelope

FOLLOW = SUITE / "follow.mjs"
SDK = SUITE / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
HANG_GUARD = 60  # seconds; only ever reached when something hangs

pytestmark = [pytest.mark.slow]


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    operation: str,
    agent: str,
    payload: dict[str, Any],
    token: str | None = None,
) -> dict[str, Any]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    body = envelope(operation, agent, payload)
    async with session.post(f"{url}/v1/{operation.lower()}", json=body, headers=headers) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
        return answer


class Follower:
    """follow.mjs as a child process, its lines read as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.units: list[str] = []
        self.cursors: list[str] = []
        self.connections = 0
        self.protocols: list[str | None] = []

    async def until(self, *, units: int = 0, connections: int = 0) -> None:
        """Read lines until ``units`` notifications and ``connections`` sessions were seen."""
        assert self.process.stdout is not None
        while len(self.units) < units or self.connections < connections:
            line = await asyncio.wait_for(self.process.stdout.readline(), HANG_GUARD)
            assert line, f"the follower ended: {await self._errors()}"
            seen = json.loads(line)
            if "connected" in seen:
                self.connections = seen["connected"]
                self.protocols.append(seen["protocol"])
            else:
                self.units.append(seen["unit"])
                self.cursors.append(seen["cursor"])

    async def _errors(self) -> str:
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode(errors="replace")


async def test_the_typescript_sdk_misses_nothing_across_a_kill_and_restart(
    tmp_path: Path,
) -> None:
    needs_npm(SDK, "MCP TypeScript SDK")
    data = tmp_path / "field"
    server: ServerProcess = spawn_server(data)
    port = int(server.url.rpartition(":")[2])
    follower: Follower | None = None
    written: list[str] = []
    try:
        # a connection per request: the Field is killed and started again on the same port
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            tokens = {}
            for agent in ("writer", "reader"):
                payload = {"id": agent, "role": "analyst", "interests": ["launch dates"]}
                tokens[agent] = (await _post(http, server.url, "REGISTER", agent, payload))["token"]
            subscription = {"events": ["memory.recorded"], "min_relevance": 0}
            created = await _post(
                http, server.url, "SUBSCRIBE", "reader",
                {"action": "subscribe", "subscription": subscription}, tokens["reader"],
            )  # fmt: skip

            async def record(n: int) -> None:
                payload = {
                    "type": "finding",
                    "content": f"the launch moves to week {n}",
                    "intent": {"purpose": "following the launch"},
                    "confidence": {"score": 0.8, "reasoning": "the plan says so"},
                }
                answer = await _post(
                    http, server.url, "RECORD", "writer", payload, tokens["writer"]
                )
                written.append(answer["memory_unit_id"])

            process = await asyncio.create_subprocess_exec(
                "node", str(FOLLOW), f"{server.url}/mcp", tokens["reader"],
                created["subscription_id"], "15",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            follower = Follower(process)
            await follower.until(connections=1)
            for n in range(5):
                await record(n)
            await follower.until(units=5)

            # killed: nothing acknowledged is lost, and the follower's session with it
            server.stop(signal.SIGKILL)
            server = spawn_server(data, port=port)
            # recorded while the follower has no session yet, or while it opens one
            for n in range(5, 10):
                await record(n)
            await follower.until(connections=2)
            for n in range(10, 15):
                await record(n)
            await follower.until(units=15)
        assert follower.units == written  # each once, in order
        assert follower.protocols == ["2025-11-25"] * 2  # the SDK's newest, with sessions
        positions = [int(cursor.rpartition("-")[2]) for cursor in follower.cursors]
        assert positions == sorted(set(positions))
        assert await asyncio.wait_for(process.wait(), HANG_GUARD) == 0
    finally:
        if follower is not None and follower.process.returncode is None:
            follower.process.kill()
            await follower.process.wait()
        server.stop()
