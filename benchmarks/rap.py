"""The RAP binding: tool-call round trips, invocations per second, subscription events.

    python benchmarks/rap.py [--calls 500] [--clients 16] [--seconds 8] [--rate 200]

Starts ``field serve`` (a fresh data directory: a durable SQLite log, with
``--webhook-allow-net 127.0.0.0/8`` so that it may call back to loopback)
and a RAP runtime's callback server in this process (aiohttp, answering 200
at once). One agent is registered over HTTP; then:

1. **Round trip.** ``--calls`` RECORDs one after the other, each as a RAP
   invocation (from the POST to ``/rap/invoke`` until its tool result reaches
   the callback) and, for comparison, as ``POST /v1/record`` (until its 200).
2. **Throughput.** ``--clients`` closed loops, each invoking ``akashik_record``
   and waiting for its tool result, for ``--seconds``; then the same with
   ``POST /v1/record``.
3. **Subscription events.** One ``akashik_subscribe``; a writer records
   ``--rate`` units a second for ``--seconds`` over HTTP; for each unit, the
   time from its RECORD's 200 to its ``subscription_event`` at the runtime.
   Checks that every unit arrived once, in order. The delivery rate limit is
   raised for this (``--delivery-rate``, ``--delivery-burst``) so that it
   measures the path, not the bucket.

Prints p50/p99 latencies (ms) and rates. Server and load share the machine.
A request refused ``503 OVERLOADED`` (the server's invocations are all
running, admission control) or ``429 RATE_LIMITED`` is sent again after its
``Retry-After``, the same invocation or envelope (the Field changed nothing
for it), timed from its accepted attempt; the last line counts the refusals
of each part by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import envelope, machine_line, pct
from _refusals import Refusals, Reply
from _refusals import post as post_retried
from aiohttp import web
from writes import FieldServer, new_loop

RECORD = {
    "type": "finding",
    "content": "The market size grows 23% a year in the SMB segment.",
    "intent": {"purpose": "size the market"},
    "confidence": {"score": 0.8, "reasoning": "three analyst reports agree"},
}
#: requests refused for now, by part of the run
REFUSALS = {
    part: Refusals() for part in ("round trip", "RAP invocations", "HTTP RECORDs", "events")
}


class Runtime:
    """The callback side of a RAP runtime: resolves a future per awaited message."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.events: list[tuple[str, float]] = []
        self.url = ""

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/cb", self.callback)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/cb"
        return runner

    async def callback(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        message = orjson.loads(await request.read())
        if message["type"] == "tool_result":
            future = self.waiting.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(now)
        elif not message.get("final"):
            self.events.append((orjson.loads(message["text"])["memory_unit_id"], now))
        return web.Response()


async def invoke(
    http: aiohttp.ClientSession,
    base: str,
    token: str,
    runtime: Runtime,
    tool: str,
    call: str,
    arguments: dict[str, Any],
    refusals: Refusals,
) -> float:
    """One invocation; seconds from its accepted POST until its tool result arrived."""
    future = runtime.waiting[call] = asyncio.get_running_loop().create_future()
    body = {"operation": tool, "arguments": arguments, "id": call, "group_id": "bench",
            "callback_url": runtime.url}  # fmt: skip
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    reply = await post_retried(http, base + "/rap/invoke", orjson.dumps(body), headers, refusals)
    assert reply.status == 200, reply.answer
    return await asyncio.wait_for(future, 30) - reply.began


async def record_http(
    http: aiohttp.ClientSession, base: str, token: str, agent: str, refusals: Refusals
) -> Reply:
    """One RECORD over HTTP (sent again after each refusal's Retry-After)."""
    body = orjson.dumps(envelope("RECORD", agent, RECORD))
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    reply = await post_retried(http, base + "/v1/record", body, headers, refusals)
    assert reply.status == 200, reply.answer
    return reply


async def closed_loops(clients: int, seconds: float, one: Any) -> int:
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < deadline:
            await one(i, n)
            n += 1
            done += 1

    await asyncio.gather(*(loop(i) for i in range(clients)))
    return done


def line(label: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{label:<34} n={len(ms):>6}  p50 {pct(ms, 0.5):7.2f} ms  p99 {pct(ms, 0.99):7.2f} ms"


async def run(args: argparse.Namespace, server: FieldServer) -> None:
    base = server.url
    runtime = Runtime()
    runner = await runtime.start()
    async with aiohttp.ClientSession() as http:
        body = orjson.dumps(envelope("REGISTER", "bench-1", {"id": "bench-1", "role": "analyst"}))
        json = {"Content-Type": "application/json"}
        round_trip = REFUSALS["round trip"]
        reply = await post_retried(http, base + "/v1/register", body, json, round_trip)
        token = reply.answer["token"]

        rap = [await invoke(http, base, token, runtime, "akashik_record", f"c{i}", RECORD,
                            round_trip)
               for i in range(args.calls)]  # fmt: skip
        direct = []
        for _ in range(args.calls):
            reply = await record_http(http, base, token, "bench-1", round_trip)
            direct.append(reply.ended - reply.began)
        print(line("RECORD as a RAP call, round trip", rap))
        print(line("RECORD over HTTP, round trip", direct))

        async def rap_one(i: int, n: int) -> None:
            await invoke(http, base, token, runtime, "akashik_record", f"t{i}-{n}", RECORD,
                         REFUSALS["RAP invocations"])  # fmt: skip

        async def http_one(i: int, n: int) -> None:
            await record_http(http, base, token, "bench-1", REFUSALS["HTTP RECORDs"])

        for label, one in (("RAP invocations", rap_one), ("HTTP RECORDs", http_one)):
            cpu = server.cpu_seconds()
            count = await closed_loops(args.clients, args.seconds, one)
            per_call = (server.cpu_seconds() - cpu) / count * 1000
            print(
                f"{label:<34} {count / args.seconds:8.0f}/s  ({args.clients} clients; "
                f"server CPU {per_call:.3f} ms each)"
            )

        events = REFUSALS["events"]
        await invoke(http, base, token, runtime, "akashik_subscribe",
                     "sub", {"events": ["memory.recorded"], "include_own": True},
                     events)  # fmt: skip
        sent: dict[str, float] = {}
        total = int(args.rate * args.seconds)
        start = time.perf_counter()
        for i in range(total):
            reply = await record_http(http, base, token, "bench-1", events)
            sent[str(reply.answer["memory_unit_id"])] = reply.ended
            await asyncio.sleep(max(0.0, start + (i + 1) / args.rate - time.perf_counter()))
        deadline = time.perf_counter() + 30
        while len(runtime.events) < total and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        units = [unit for unit, _ in runtime.events]
        assert units == list(sent), "events missing, repeated or out of order"
        lags = [at - sent[unit] for unit, at in runtime.events]
        print(line(f"event lag at {args.rate:g}/s (200 -> event)", lags))
        print("refused: " + "; ".join(f"{part} {r.describe()}" for part, r in REFUSALS.items()))
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rate", type=float, default=200)
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        flags = ("--webhook-allow-net", "127.0.0.0/8", "--delivery-rate", "10000",
                 "--delivery-burst", "10000", "--log-level", "info")  # fmt: skip
        with FieldServer(Path(tmp) / "data", *flags) as server:
            loop, _ = new_loop()
            loop.run_until_complete(run(args, server))
            loop.close()
    print(machine_line())


if __name__ == "__main__":
    main()
