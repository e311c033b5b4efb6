"""ATTUNE over HTTP: latency of full rankings and `since_epoch` polls against a real server,
as a multiple of the HTTP floor.

    python benchmarks/attune_http.py [--units 100000] [--runs 50] [--clients 32]
                                     [--before TREE] [--embedder NAME]

Starts ``field serve --in-memory`` as a child process, registers 50 agents
and records ``--units`` units over HTTP with ``--clients`` concurrent
clients (12 random words each, 6 memory types, 200 tasks: the set-up of
``attune.py``). With ``--before TREE`` a second Field is served from the
source tree ``TREE`` (an older checkout) and populated alike, and both are
measured in the same rounds. Then one client, on one kept-alive connection
per server, times in alternating rounds:

* a full ATTUNE (top 10, two interests, a context hint and a task);
* a ``since_epoch`` poll after 3 new units were recorded (not timed);
* the floor: a bare Starlette app on uvicorn (``_floor.py``: the loop and
  HTTP protocol ``field serve`` uses) answering a POST of the same body size
  as each ATTUNE with a JSON body of the same size as its answer;
* ``GET /v1/field/status``: the Field's cheapest round trip.

Prints p50 and p99 in milliseconds and each ATTUNE's p50 over its floor's
p50. A request the server refuses (``503 OVERLOADED`` or ``429
RATE_LIMITED``) is waited out for its ``Retry-After`` and sent again (the
Field changed nothing for it, so no unit is recorded twice); a timed one is
timed by its accepted attempt. The last lines count the refusals of the
set-up and of the measured runs, by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import fanout
import orjson
from _common import ROOT, VOCABULARY, bracketed, envelope, pct, progress, unit_payload
from _refusals import Refusals, send
from _refusals import post as post_body
from fanout import ChildServer, start_field

SCOPE = {
    "role": "strategist",
    "max_units": 10,
    "interests": ["pricing", "churn"],
    "active_task_id": "task-7",
}
FULL = {"scope": SCOPE, "context_hint": "pricing for smb enterprise"}


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
    payloads = [(f"agent-{rng.randrange(1, 51)}", unit_payload(rng)) for _ in range(units)]
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


class Target:
    """One Field measured: its URL, tokens and poll cursor, and its samples."""

    def __init__(self, name: str, url: str, tokens: dict[str, str]) -> None:
        self.name, self.url, self.tokens = name, url, tokens
        self.cursor = 0
        self.samples: dict[str, list[float]] = {"full": [], "poll": [], "status": []}
        #: bytes of the last full and poll request and answer
        self.sizes: dict[str, tuple[int, int]] = {}

    async def full(self, session: aiohttp.ClientSession, refusals: Refusals) -> None:
        reader = "agent-0"
        reply = await send(session, self.url, "ATTUNE", reader, FULL, self.tokens[reader], refusals)
        self.samples["full"].append(reply.ms)
        self.sizes["full"] = (len(orjson.dumps(envelope("ATTUNE", reader, FULL))), len(reply.raw))

    async def poll(self, session: aiohttp.ClientSession, refusals: Refusals) -> None:
        reader, writer = "agent-0", "agent-1"
        for _ in range(3):  # new units since the last poll (not timed)
            unit = {
                "type": "finding",
                "content": "new pricing data",
                "intent": {"purpose": "p"},
                "confidence": {"score": 0.5, "reasoning": "r"},
            }
            await send(session, self.url, "RECORD", writer, unit, self.tokens[writer], refusals)
        poll = {"scope": {**SCOPE, "since_epoch": self.cursor}}
        reply = await send(session, self.url, "ATTUNE", reader, poll, self.tokens[reader], refusals)
        self.samples["poll"].append(reply.ms)
        self.cursor = reply.answer["epoch"]
        self.sizes["poll"] = (len(orjson.dumps(envelope("ATTUNE", reader, poll))), len(reply.raw))

    async def status(self, session: aiohttp.ClientSession) -> None:
        start = time.perf_counter()
        async with session.get(f"{self.url}/v1/field/status") as reply:
            await reply.read()
        self.samples["status"].append((time.perf_counter() - start) * 1000)


async def warm(targets: list[Target]) -> None:
    """One full ATTUNE and one poll on each Field (the sizes the floor answers with)."""
    async with aiohttp.ClientSession() as session:
        for target in targets:
            reader = "agent-0"
            answer = await post(session, target.url, "ATTUNE", reader, FULL, target.tokens[reader])
            target.cursor = answer["epoch"]
            await target.full(session, REFUSALS["set-up"])
            await target.poll(session, REFUSALS["set-up"])
            for samples in target.samples.values():
                samples.clear()


async def measure(targets: list[Target], floor: str, runs: int) -> dict[str, list[float]]:
    """Alternating rounds over the Fields and the floor; the floor's samples."""
    floors: dict[str, list[float]] = {"full": [], "poll": []}
    sizes = targets[0].sizes
    requests = {case: b'{"pad":"' + b"x" * max(0, sizes[case][0] - 10) + b'"}' for case in floors}
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    refusals = REFUSALS["measured"]
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(aiohttp.ClientSession()) for _ in targets]
        floor_session = await stack.enter_async_context(aiohttp.ClientSession())
        for i in range(runs):
            progress(i, runs, "measuring")
            for target, session in zip(targets, sessions, strict=True):
                await target.full(session, refusals)
                await target.poll(session, refusals)
                await target.status(session)
            for case in ("full", "poll"):
                reply = await post_body(
                    floor_session, f"{floor}/{case}", requests[case], headers, refusals
                )
                floors[case].append(reply.ms)
        progress(runs, runs, "measuring")
    return floors


@contextlib.contextmanager
def served_from(tree: str) -> Iterator[None]:
    """``start_field`` runs ``python -m field`` from ``tree`` (its working directory, so
    its ``field`` package is the one imported; unless ``PYTHONPATH`` names a tree:
    :func:`fanout.field_tree`)."""
    saved = fanout.ROOT
    fanout.ROOT = tree
    try:
        yield
    finally:
        fanout.ROOT = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--before", help="also serve and measure the Field of this source tree")
    parser.add_argument("--embedder", help="field serve --embedder (default: the server's)")
    args = parser.parse_args()
    extra = ("--embedder", args.embedder) if args.embedder else ()
    servers: list[ChildServer] = []
    targets: list[Target] = []
    try:
        trees = [("after" if args.before else "field", str(ROOT))]
        if args.before:
            trees.append(("before", args.before))
        for name, tree in trees:
            with served_from(tree):
                server, port = start_field(*extra)
            servers.append(server)
            url = f"http://127.0.0.1:{port}"
            tokens = asyncio.run(populate(url, args.units, args.clients, random.Random(args.seed)))
            targets.append(Target(name, url, tokens))
        asyncio.run(warm(targets))
        sizes = targets[0].sizes
        command = [sys.executable, str(ROOT / "benchmarks" / "_floor.py")]
        command += ["--size", f"full={sizes['full'][1]}", "--size", f"poll={sizes['poll'][1]}"]
        floor_server = ChildServer(
            command, re.compile(r"listening on (http://127\.0\.0\.1:\d+)"), stdout=True
        )
        servers.append(floor_server)
        assert floor_server.match is not None
        floors = measure_all(targets, floor_server.match.group(1), args.runs)
    finally:
        for server in servers:
            server.stop()
    report(args, targets, floors)


def measure_all(targets: list[Target], floor: str, runs: int) -> dict[str, list[float]]:
    return asyncio.run(measure(targets, floor, runs))


def report(args: Any, targets: list[Target], floors: dict[str, list[float]]) -> None:
    print(f"\nATTUNE over HTTP, {args.units:,} units recorded ({args.runs} rounds)")
    for target in targets:
        for case, (request, answer) in target.sizes.items():
            print(f"{target.name}: {case} request {request:,} B, answer {answer:,} B")
    print(f"{'case':<40}{'p50 ms':>10}{'p99 ms':>10}{'x floor':>10}")
    rows: list[tuple[str, list[float], list[float] | None]] = []
    for target in targets:
        rows.append((f"{target.name}: full scope, top 10", target.samples["full"], floors["full"]))
        rows.append((f"{target.name}: since_epoch poll", target.samples["poll"], floors["poll"]))
        rows.append((f"{target.name}: GET /v1/field/status", target.samples["status"], None))
    rows.append(("floor: bare POST, full's sizes", floors["full"], None))
    rows.append(("floor: bare POST, poll's sizes", floors["poll"], None))
    for label, samples, floor in rows:
        p50, p99 = pct(samples, 0.5), pct(samples, 0.99)
        ratio = f"{p50 / pct(floor, 0.5):>10.2f}" if floor else f"{'':>10}"
        print(f"{label:<40}{p50:>10.2f}{p99:>10.2f}{ratio}")
    for phase, refusals in REFUSALS.items():
        print(f"refused ({phase}): {refusals.describe()}")
    print("targets: full <= 3x its floor, a since_epoch poll <= 1.5x its floor (p50)")


if __name__ == "__main__":
    bracketed(main)
