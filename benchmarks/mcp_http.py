"""MCP over Streamable HTTP (``/mcp``): tool-call round trips, push lag, memory per session.

    python benchmarks/mcp_http.py [--calls 500] [--sessions 300] [--rate 100] [--seconds 5]

Starts ``field serve`` (a fresh data directory: a durable SQLite log) and
registers agents over HTTP; the MCP side is the official SDK's client
(``streamable_http_client`` + ``ClientSession``) in this process. Then:

1. **Round trip.** ``--calls`` RECORDs one after the other as ``akashik_record``
   over one MCP session (the SDK's ``call_tool``, an SSE answer per POST), as a
   stateless MCP POST (raw, one JSON answer), and as ``POST /v1/record``.
2. **Push.** One session subscribes to a subscription resource; a writer records
   ``--rate`` units a second for ``--seconds`` over HTTP. For each unit, the time
   from its RECORD's 200 to the ``notifications/resources/updated`` that tells of
   it, and to the read that returns it (the session reads on every update, as a
   host would). Checks that every unit was read once, in order.
3. **Memory.** ``--sessions`` sessions, each of its own agent, opened with the
   SDK's client (which keeps a GET stream open, as hosts do), idle; then the same
   sessions each reading one subscription resource (a feed: a push connection).
   The server's VmRSS before, with them, with the feeds, and after they ended.
4. **Import.** What importing the MCP SDK (and this binding) costs ``field
   serve``'s start-up: seconds and RSS in a fresh interpreter.

Prints p50/p99 latencies (ms) and kB. Server and load share the machine.
A plain HTTP POST (REGISTER, RECORD, the stateless MCP call) refused ``503
OVERLOADED`` or ``429 RATE_LIMITED`` is sent again after its ``Retry-After``
(the Field changed nothing for it), timed by its accepted attempt; the last
lines count the refusals of each part by kind. The SDK's session calls are
the SDK's own, and are not retried.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import orjson
from _common import envelope, machine_line, pct
from _refusals import Refusals, Reply
from _refusals import post as post_retried
from fanout import raise_nofile, rss_kb
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from writes import FieldServer

RECORD = {
    "type": "finding",
    "content": "The market size grows 23% a year in the SMB segment.",
    "intent": {"purpose": "size the market"},
    "confidence": {"score": 0.8, "reasoning": "three analyst reports agree"},
}
ACCEPT = "application/json, text/event-stream"
#: plain HTTP POSTs refused for now (waited out and sent again), by part of the run
REFUSALS = {part: Refusals() for part in ("round trip", "push", "memory")}


async def post_json(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str], part: str
) -> Reply:
    """POST ``body`` as JSON, sent again after each refusal's Retry-After; must be a 200."""
    headers = {**headers, "Content-Type": "application/json"}
    reply = await post_retried(http, url, orjson.dumps(body), headers, REFUSALS[part])
    assert reply.status == 200, (reply.status, reply.answer)
    return reply


async def register(http: aiohttp.ClientSession, url: str, agent_id: str, part: str) -> str:
    body = envelope("REGISTER", agent_id, {"id": agent_id, "role": "analyst"})
    reply = await post_json(http, f"{url}/v1/register", body, {}, part)
    return str(reply.answer["token"])


@contextlib.asynccontextmanager
async def session_of(url: str, token: str, handler: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as client,
        streamable_http_client(f"{url}/mcp", http_client=client) as (read, write),
        ClientSession(read, write, message_handler=handler) as session,
    ):
        await session.initialize()
        yield session


def ms(samples: list[float]) -> str:
    return f"p50 {pct(samples, 0.5) * 1000:.2f} ms, p99 {pct(samples, 0.99) * 1000:.2f} ms"


async def round_trips(url: str, calls: int) -> None:
    async with aiohttp.ClientSession() as http:
        token = await register(http, url, "rt", "round trip")
        headers = {"Authorization": f"Bearer {token}"}
        async with session_of(url, token) as session:
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                result = await session.call_tool("akashik_record", RECORD)
                samples.append(time.perf_counter() - start)
                assert not result.is_error
            print(f"  MCP session tool call   {ms(samples)}")
        raw = {**headers, "Content-Type": "application/json", "Accept": ACCEPT}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        call["params"] = {"name": "akashik_record", "arguments": RECORD}
        samples = []
        for _ in range(calls):
            reply = await post_json(http, f"{url}/mcp", call, raw, "round trip")
            samples.append(reply.ended - reply.began)
            assert not reply.answer["result"]["isError"]
        print(f"  MCP stateless POST      {ms(samples)}")
        samples = []
        for _ in range(calls):
            body = envelope("RECORD", "rt", RECORD)
            reply = await post_json(http, f"{url}/v1/record", body, headers, "round trip")
            samples.append(reply.ended - reply.began)
        print(f"  POST /v1/record         {ms(samples)}")


async def push(url: str, rate: float, seconds: float) -> None:
    async with aiohttp.ClientSession() as http:
        reader_token = await register(http, url, "reader", "push")
        writer_token = await register(http, url, "writer", "push")
        updated: asyncio.Queue[float] = asyncio.Queue()

        async def handler(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updated.put_nowait(time.perf_counter())

        async with session_of(url, reader_token, handler) as session:
            made = await session.call_tool("akashik_subscribe", {"events": ["memory.recorded"]})
            uri = json.loads(made.content[0].text)["resource"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await session.subscribe_resource(uri)
            acked: dict[str, float] = {}
            told: dict[str, float] = {}
            read_at: dict[str, float] = {}
            order: list[str] = []
            done = asyncio.Event()
            total = int(rate * seconds)

            async def reader() -> None:
                while len(order) < total:
                    at = await updated.get()
                    more = True
                    while more:
                        result = await session.read_resource(uri)
                        now = time.perf_counter()
                        page = json.loads(result.contents[0].text)
                        for notification in page["notifications"]:
                            unit = notification["memory_unit_id"]
                            order.append(unit)
                            told[unit], read_at[unit] = at, now
                        more = page["more"]
                done.set()

            task = asyncio.create_task(reader())
            headers = {"Authorization": f"Bearer {writer_token}"}
            start = time.perf_counter()
            for i in range(total):
                due = start + i / rate
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                body = envelope("RECORD", "writer", RECORD)
                reply = await post_json(http, f"{url}/v1/record", body, headers, "push")
                acked[reply.answer["memory_unit_id"]] = reply.ended
            await asyncio.wait_for(done.wait(), 60)
            task.cancel()
            assert sorted(order) == sorted(acked) and len(order) == len(set(order))
            to_update = [max(0.0, told[u] - acked[u]) for u in acked]
            to_read = [max(0.0, read_at[u] - acked[u]) for u in acked]
            print(f"  {total} units at {rate:g}/s, every one read once, in order")
            print(f"  RECORD 200 -> updated   {ms(to_update)}")
            print(f"  RECORD 200 -> read      {ms(to_read)}")


async def memory(url: str, pid: int, sessions: int) -> None:
    async with aiohttp.ClientSession() as http:
        tokens = [await register(http, url, f"m{i}", "memory") for i in range(sessions)]
    await asyncio.sleep(2)
    before = rss_kb(pid)
    stack = contextlib.AsyncExitStack()
    opened: list[ClientSession] = []
    async with stack:
        for token in tokens:
            opened.append(await stack.enter_async_context(session_of(url, token)))
        await asyncio.sleep(2)
        idle = rss_kb(pid)
        for session in opened:
            made = await session.call_tool("akashik_subscribe", {"events": ["memory.recorded"]})
            await session.read_resource(json.loads(made.content[0].text)["resource"])
        await asyncio.sleep(2)
        feeds = rss_kb(pid)
    await asyncio.sleep(2)
    after = rss_kb(pid)
    print(f"  RSS {before} kB; {sessions} idle sessions {idle} kB; each with a subscription")
    print(f"  it reads {feeds} kB; after they ended {after} kB")
    print(f"  per idle session {(idle - before) / sessions:.1f} kB (its GET stream open),")
    print(f"  per subscription and its feed {(feeds - idle) / sessions:.1f} kB")


def imports() -> None:
    code = (
        "import resource, time\n"
        "t = time.perf_counter(); import field.transports.http; a = time.perf_counter() - t\n"
        "r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t = time.perf_counter(); import field.transports.mcp.streamable_http\n"
        "b = time.perf_counter() - t\n"
        "print(a, b, r, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    base, extra, rss_base, rss_all = (float(x) for x in out.stdout.split())
    print(f"  import field.transports.http {base:.2f} s, {rss_base / 1024:.0f} MB")
    print(
        f"  then the MCP SDK and this binding +{extra:.2f} s, +{(rss_all - rss_base) / 1024:.0f} MB"
    )


async def run(args: argparse.Namespace, url: str, pid: int) -> None:
    print("round trip (one after the other):")
    await round_trips(url, args.calls)
    print("push through a subscription resource:")
    await push(url, args.rate, args.seconds)
    print("memory:")
    await memory(url, pid, args.sessions)
    print("refused (plain HTTP POSTs, each sent again after its Retry-After):")
    for part, refusals in REFUSALS.items():
        print(f"  {part}: {refusals.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    raise_nofile()
    print(machine_line())
    print("import:")
    imports()
    with tempfile.TemporaryDirectory() as data:
        server = FieldServer(
            Path(data),
            "--mcp-max-sessions",
            str(args.sessions + 10),
            "--mcp-max-sessions-per-client",  # every session comes from this one address
            str(args.sessions + 10),
            "--register-rate",
            "100000",
            "--register-burst",
            "100000",
        ).start()
        try:
            asyncio.run(run(args, server.url, server.pid))
        finally:
            server.stop()
    print(machine_line())


if __name__ == "__main__":
    main()
