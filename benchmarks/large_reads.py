"""Large reads beside a normal client: does a maximal ATTUNE stall everyone else?

    python benchmarks/large_reads.py [--units 1000] [--chars 65536] [--heavy 8]
                                     [--seconds 10] [--format full]

Starts ``field serve --in-memory`` as a child process and records ``--units``
units of ``--chars`` characters of random words over HTTP. Then a *normal*
client, on one kept-alive connection, one request at a time, ATTUNEs for
``--seconds``: the top 10 units in summary form, with its role, two
interests and a context hint (a full ranking of every unit). It does so

1. alone: the baseline;
2. beside ``--heavy`` clients in another process, each on its own
   connection in a loop of maximal ATTUNEs (``max_units`` 1000, ``--format``),
   reading every response whole.

Prints the normal client's p50 and p99 in both runs and their ratios, the
heavy clients' rate, p50 and response size, the first maximal ATTUNE after
the units were recorded (the one that used to embed them all), and the
server's resident memory (VmRSS, sampled every 50 ms, and its peak VmHWM).
A request the server refuses (``503 OVERLOADED``, ``429 RATE_LIMITED``) is
waited out for its ``Retry-After`` and sent again, timed by its accepted
attempt; the last lines count the refusals of the set-up, of the normal
client in each run and of the heavy clients, by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import threading
import time
from typing import Any

import aiohttp
import orjson
from _common import VOCABULARY, bracketed, pct, progress
from _refusals import Refusals, send
from fanout import rss_kb, start_field

NORMAL_SCOPE = {
    "role": "strategist",
    "max_units": 10,
    "interests": ["pricing", "churn"],
}


def content(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters of words, a third of them with a number (distinct words)."""
    words = []
    length = 0
    while length < chars:
        word = rng.choice(VOCABULARY)
        if rng.random() < 0.3:
            word += str(rng.randrange(1000))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:chars]


#: requests of this process refused for now (the set-up's, unless a caller counts its own)
REFUSALS = Refusals()


async def post(
    session: aiohttp.ClientSession, url: str, operation: str, agent: str, payload: Any, token: str
) -> bytes:
    """The answer's bytes."""
    return (await send(session, url, operation, agent, payload, token, REFUSALS)).raw


async def populate(url: str, units: int, chars: int, heavy: int) -> dict[str, str]:
    """A writer, the normal reader and ``heavy`` readers; ``units`` units by the writer."""
    rng = random.Random(7)
    tokens: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        readers = [("normal", "strategist"), *((f"heavy-{i}", "analyst") for i in range(heavy))]
        for agent, role in [("writer", "market_researcher"), *readers]:
            payload = {"id": agent, "role": role, "interests": ["pricing", "churn"]}
            raw = await post(session, url, "REGISTER", agent, payload, "")
            tokens[agent] = orjson.loads(raw)["token"]
        done = 0

        async def worker(count: int) -> None:
            nonlocal done
            for _ in range(count):
                unit = {
                    "type": rng.choice(["finding", "decision", "observation"]),
                    "content": content(rng, chars),
                    "intent": {"purpose": "measure large reads"},
                    "confidence": {"score": rng.random(), "reasoning": "generated"},
                }
                await post(session, url, "RECORD", "writer", unit, tokens["writer"])
                done += 1
                progress(done, units, "recording")

        clients = 4
        await asyncio.gather(*(worker(units // clients + (i < units % clients)) for i in range(4)))
    return tokens


def maximal(fmt: str) -> dict[str, Any]:
    return {"scope": {"role": "analyst", "max_units": 1000}, "format": fmt}


async def first_maximal(url: str, tokens: dict[str, str], fmt: str) -> tuple[float, int]:
    """The first maximal ATTUNE after the units were recorded: (ms, bytes)."""
    async with aiohttp.ClientSession() as session:
        heavy = maximal(fmt)
        reply = await send(session, url, "ATTUNE", "heavy-0", heavy, tokens["heavy-0"], REFUSALS)
        return reply.ms, len(reply.raw)


async def normal_client(
    url: str, token: str, seconds: float, refusals: Refusals | None = None
) -> list[float]:
    """The normal client's ATTUNE latencies (ms) over ``seconds``; its refusals counted in
    ``refusals`` (default: this process's REFUSALS)."""
    payload = {"scope": NORMAL_SCOPE, "context_hint": "pricing for smb", "format": "summary"}
    samples: list[float] = []
    async with aiohttp.ClientSession() as session:
        await post(session, url, "ATTUNE", "normal", payload, token)  # warm the connection
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            reply = await send(
                session, url, "ATTUNE", "normal", payload, token, refusals or REFUSALS
            )
            samples.append(reply.ms)
    return samples


def heavy_process(
    url: str, tokens: dict[str, str], count: int, fmt: str, ready: Any, stop: Any, out: Any
) -> None:
    """``count`` heavy clients in this process until ``stop`` is set; reports on ``out``
    (latencies, sizes, seconds, and the refusals as :meth:`Refusals.as_dict`)."""

    async def one(agent: str, latencies: list[float], sizes: list[int]) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                reply = await send(
                    session, url, "ATTUNE", agent, maximal(fmt), tokens[agent], REFUSALS
                )
                latencies.append(reply.ms)
                sizes.append(len(reply.raw))

    async def run() -> None:
        latencies: list[float] = []
        sizes: list[int] = []
        ready.set()
        start = time.perf_counter()
        await asyncio.gather(*(one(f"heavy-{i}", latencies, sizes) for i in range(count)))
        out.put((latencies, sizes, time.perf_counter() - start, REFUSALS.as_dict()))

    asyncio.run(run())


class RssSampler:
    """The server's VmRSS every 50 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_kb(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def hwm_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for {pid}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    server, port = start_field()
    url = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {}
    try:
        tokens = asyncio.run(populate(url, args.units, args.chars, args.heavy))
        result["rss_loaded"] = rss_kb(server.pid)
        result["first"] = asyncio.run(first_maximal(url, tokens, args.format))
        print("measuring the normal client alone", flush=True)
        result["refused"] = {"set-up": REFUSALS, "alone": Refusals(), "beside": Refusals()}
        alone = normal_client(url, tokens["normal"], args.seconds, result["refused"]["alone"])
        result["alone"] = asyncio.run(alone)
        context = multiprocessing.get_context("spawn")
        ready, stop, out = context.Event(), context.Event(), context.Queue()
        child = context.Process(
            target=heavy_process,
            args=(url, tokens, args.heavy, args.format, ready, stop, out),
        )
        child.start()
        ready.wait(60)
        time.sleep(1)  # the heavy clients are under way
        sampler = RssSampler(server.pid)
        print(f"measuring it beside {args.heavy} heavy clients", flush=True)
        beside = normal_client(url, tokens["normal"], args.seconds, result["refused"]["beside"])
        result["beside"] = asyncio.run(beside)
        stop.set()
        result["heavy"] = out.get(timeout=120)
        child.join(60)
        result["rss_peak"] = sampler.stop()
        result["hwm"] = hwm_kb(server.pid)
    finally:
        server.stop()
    return result


def corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The set-up's options: the units recorded, the heavy clients, the length of a run."""
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--chars", type=int, default=65536)
    parser.add_argument("--heavy", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    corpus_arguments(parser)
    parser.add_argument("--format", default="full", choices=["full", "summary", "ids_only"])
    args = parser.parse_args()
    result = measure(args)
    alone, beside = result["alone"], result["beside"]
    latencies, sizes, elapsed, heavy_refused = result["heavy"]
    first_ms, first_bytes = result["first"]
    print(
        f"\n{args.units:,} units of {args.chars:,} characters; the normal client: ATTUNE top 10, "
        f"summary form, {args.seconds:g} s per run"
    )
    print(f"{'normal client':<36}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for label, samples in (("alone", alone), (f"beside {args.heavy} heavy clients", beside)):
        row = f"{label:<36}{len(samples):>10}{pct(samples, 0.5):>10.2f}{pct(samples, 0.99):>10.2f}"
        print(row)
    p50_ratio = pct(beside, 0.5) / pct(alone, 0.5)
    p99_ratio = pct(beside, 0.99) / pct(alone, 0.99)
    print(f"{'ratio (beside / alone)':<36}{'':>10}{p50_ratio:>10.2f}{p99_ratio:>10.2f}")
    print(
        f"heavy clients: {len(latencies)} maximal ATTUNEs ({args.format}) in {elapsed:.1f} s = "
        f"{len(latencies) / elapsed:.1f}/s, p50 {pct(latencies, 0.5):.1f} ms, "
        f"p99 {pct(latencies, 0.99):.1f} ms, {pct([float(s) for s in sizes], 0.5) / 1e6:.2f} MB "
        "each"
    )
    print(
        f"first maximal ATTUNE once the units were in: {first_ms:.1f} ms, "
        f"{first_bytes / 1e6:.2f} MB"
    )
    print(
        f"server memory: {result['rss_loaded'] / 1024:.0f} MB with the units loaded, peak "
        f"{result['rss_peak'] / 1024:.0f} MB beside the heavy clients (VmHWM "
        f"{result['hwm'] / 1024:.0f} MB)"
    )
    result["refused"]["heavy clients"] = Refusals().add(heavy_refused)
    for phase, refusals in result["refused"].items():
        print(f"refused ({phase}): {refusals.describe()}")


if __name__ == "__main__":
    bracketed(main)
