"""ATTUNE over HTTP: latency of full rankings and `since_epoch` polls against a real server.

    python benchmarks/attune_http.py [--units 100000] [--runs 50] [--clients 32]

Starts ``field serve --in-memory`` as a child process, registers 50 agents
and records ``--units`` units over HTTP with ``--clients`` concurrent
clients (12 random words each, 6 memory types, 200 tasks: the set-up of
``attune.py``). Then one client, on one kept-alive connection, times:

* a full ATTUNE (top 10, two interests, a context hint and a task);
* a ``since_epoch`` poll after 3 new units were recorded (not timed);
* ``GET /v1/field/status``: the floor of one HTTP round trip here.

Prints p50 and p99 in milliseconds, and the core's share: ATTUNE minus the
round-trip floor. A request the server refuses (``503 OVERLOADED`` or ``429
RATE_LIMITED``) is waited out for its ``Retry-After`` and sent again (the
Field changed nothing for it, so no unit is recorded twice); a timed one is
timed by its accepted attempt. The last lines count the refusals of the
set-up and of the measured runs, by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import aiohttp
from _common import VOCABULARY, bracketed, pct, progress
from _refusals import Refusals, send
from fanout import start_field

TYPES = ["finding", "decision", "observation", "assumption", "constraint", "question"]


#: refusals met while populating and while measuring
REFUSALS = {"set-up": Refusals(), "measured": Refusals()}


async def post(
    session: aiohttp.ClientSession, url: str, operation: str, agent: str, payload: Any, token: str
) -> Any:
    """Set-up: the answer of the operation."""
    reply = await send(session, url, operation, agent, payload, token, REFUSALS["set-up"])
    return reply.answer


async def populate(url: str, units: int, clients: int, rng: random.Random) -> dict[str, str]:
    """50 agents and ``units`` units, recorded by ``clients`` concurrent clients."""
    tokens: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        for i in range(51):
            agent = f"agent-{i}"
            payload = {"id": agent, "role": ["strategist", "analyst"][i % 2]}
            payload["interests"] = rng.sample(VOCABULARY, 3)
            tokens[agent] = (await post(session, url, "REGISTER", agent, payload, ""))["token"]
    payloads = [
        (
            f"agent-{rng.randrange(1, 51)}",
            {
                "type": rng.choice(TYPES),
                "content": " ".join(rng.choices(VOCABULARY, k=12)),
                "intent": {
                    "purpose": " ".join(rng.choices(VOCABULARY, k=4)),
                    "task_id": f"task-{rng.randrange(200)}",
                },
                "confidence": {"score": rng.random(), "reasoning": "generated"},
            },
        )
        for _ in range(units)
    ]
    done = 0

    async def worker(mine: list[tuple[str, dict[str, Any]]]) -> None:
        nonlocal done
        async with aiohttp.ClientSession() as session:
            for agent, payload in mine:
                await post(session, url, "RECORD", agent, payload, tokens[agent])
                done += 1
                progress(done, units, "recording")

    await asyncio.gather(*(worker(payloads[i::clients]) for i in range(clients)))
    return tokens


async def measure(url: str, tokens: dict[str, str], runs: int) -> dict[str, list[float]]:
    reader, writer = "agent-0", "agent-1"
    scope = {
        "role": "strategist",
        "max_units": 10,
        "interests": ["pricing", "churn"],
        "active_task_id": "task-7",
    }
    samples: dict[str, list[float]] = {"full": [], "poll": [], "status": []}
    async with aiohttp.ClientSession() as session:
        full = {"scope": scope, "context_hint": "pricing for smb enterprise"}
        cursor = (await post(session, url, "ATTUNE", reader, full, tokens[reader]))["epoch"]
        refusals = REFUSALS["measured"]
        for i in range(runs):
            progress(i, runs, "measuring")
            reply = await send(session, url, "ATTUNE", reader, full, tokens[reader], refusals)
            samples["full"].append(reply.ms)
            for _ in range(3):  # new units since the last poll (not timed)
                unit = {
                    "type": "finding",
                    "content": "new pricing data",
                    "intent": {"purpose": "p"},
                    "confidence": {"score": 0.5, "reasoning": "r"},
                }
                await send(session, url, "RECORD", writer, unit, tokens[writer], refusals)
            poll = {"scope": {**scope, "since_epoch": cursor}}
            reply = await send(session, url, "ATTUNE", reader, poll, tokens[reader], refusals)
            samples["poll"].append(reply.ms)
            cursor = reply.answer["epoch"]
            start = time.perf_counter()
            async with session.get(f"{url}/v1/field/status") as reply:
                await reply.read()
            samples["status"].append((time.perf_counter() - start) * 1000)
        progress(runs, runs, "measuring")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    server, port = start_field()
    url = f"http://127.0.0.1:{port}"
    try:
        tokens = asyncio.run(populate(url, args.units, args.clients, random.Random(args.seed)))
        samples = asyncio.run(measure(url, tokens, args.runs))
    finally:
        server.stop()
    floor = pct(samples["status"], 0.5)
    print(f"\nATTUNE over HTTP, {args.units:,} units recorded ({args.runs} runs each)")
    print(f"{'case':<34}{'p50 ms':>10}{'p99 ms':>10}{'p50 - floor':>14}")
    for key, label in (
        ("full", "full scope, top 10"),
        ("poll", "since_epoch poll, 3 new units"),
        ("status", "GET /v1/field/status (floor)"),
    ):
        p50, p99 = pct(samples[key], 0.5), pct(samples[key], 0.99)
        print(f"{label:<34}{p50:>10.2f}{p99:>10.2f}{p50 - floor:>14.2f}")
    for phase, refusals in REFUSALS.items():
        print(f"refused ({phase}): {refusals.describe()}")
    print("targets: p50 <= 10 ms full, <= 2 ms for a since_epoch poll")


if __name__ == "__main__":
    bracketed(main)
