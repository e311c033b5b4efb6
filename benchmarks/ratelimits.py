"""One agent flooding the writer: another agent's RECORD latency with and without the rate.

    python benchmarks/ratelimits.py [--flood 32] [--seconds 8] [--sync full]

Starts a ``field serve`` process (a fresh data directory: a durable SQLite
log) for each case; after ``--warmup`` seconds (3: the flood spends its burst of
2,000 in them), for ``--seconds`` seconds:

* a *flooding* agent sends RECORD after RECORD on ``--flood`` connections at
  once, each in a closed loop;
* a *normal* agent sends one RECORD at a time on its own connection.

The cases: the normal agent alone (the baseline); the per-agent rate at its
defaults (200 operations a second, a burst of 2,000) with a flood that retries
a refusal at once, as a hostile or broken client would; the same with a flood
that first waits the refusal's ``details.retry_after``, as a client should;
and the rate off (``--agent-rate 0``).

Prints the normal agent's p50 and p99 (ms) and RECORDs a second, and what the
flooding agent got: RECORDs accepted a second and refusals (``429
RATE_LIMITED``) a second. With the rate on, the flood takes at most 200
writes a second from the writer once its burst is spent; a refusal never
reaches the writer, but it is still a request the server reads and answers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from _common import bracketed, envelope, pct
from writes import FieldServer, new_loop, record_payload, register


@dataclass
class Tally:
    #: (start, end) of the normal agent's RECORDs, perf_counter seconds
    normal: list[tuple[float, float]] = field(default_factory=list)
    #: the flooding agent's answers in the measured window, by status
    flood: Counter[int] = field(default_factory=Counter)


async def loop_records(
    session: aiohttp.ClientSession,
    url: str,
    agent: str,
    token: str,
    seed: int,
    until: float,
    answered: list[tuple[float, float, int]],
    obey: bool = False,
) -> None:
    """RECORD in a closed loop until ``until``; each answer's (start, end, status).
    ``obey``: after a refusal, wait the ``details.retry_after`` it says."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    rng = random.Random(seed)
    n = 0
    while time.perf_counter() < until:
        body = orjson.dumps(envelope("RECORD", agent, record_payload(rng, n)))
        began = time.perf_counter()
        async with session.post(f"{url}/v1/record", data=body, headers=headers) as response:
            raw = await response.read()
            answered.append((began, time.perf_counter(), response.status))
        n += 1
        if obey and response.status == 429:
            await asyncio.sleep(orjson.loads(raw)["details"]["retry_after"])


async def drive(url: str, args: argparse.Namespace, connections: int, obey: bool) -> Tally:
    connector = aiohttp.TCPConnector(limit=connections + 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        flood_token, _ = await register(session, url, "flooder")
        normal_token, _ = await register(session, url, "normal")
        start = time.perf_counter()
        window = (start + args.warmup, start + args.warmup + args.seconds)
        flood: list[tuple[float, float, int]] = []
        normal: list[tuple[float, float, int]] = []
        await asyncio.gather(
            *(
                loop_records(session, url, "flooder", flood_token, i, window[1], flood, obey)
                for i in range(connections)
            ),
            loop_records(session, url, "normal", normal_token, 999, window[1], normal),
        )
    t0, t1 = window
    tally = Tally()
    tally.normal = [(s, e) for s, e, status in normal if status == 200 and s >= t0 and e <= t1]
    tally.flood.update(status for s, e, status in flood if s >= t0 and e <= t1)
    return tally


def run_case(args: argparse.Namespace, flags: list[str], flood: int, obey: bool) -> Tally:
    with (
        tempfile.TemporaryDirectory() as tmp,
        FieldServer(Path(tmp) / "data", "--sync", args.sync, *flags) as server,
    ):
        loop, _ = new_loop()
        try:
            return loop.run_until_complete(drive(server.url, args, flood, obey))
        finally:
            loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=32, help="the flood's connections (32)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured lead-in per case (3)")
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    args = parser.parse_args()
    if not 1 <= args.flood <= 256 or not 0 < args.seconds <= 60:
        parser.error("--flood must be 1-256 and --seconds in (0, 60]")
    # the defaults, stated: every benchmark server otherwise runs with LOAD_RATES
    defaults = ["--agent-rate", "200", "--agent-burst", "2000"]
    cases: list[tuple[str, list[str], int, bool]] = [
        ("no flood (baseline)", defaults, 0, False),
        ("rate on, flood retries at once", defaults, args.flood, False),
        ("rate on, flood obeys", defaults, args.flood, True),
        ("rate off", ["--agent-rate", "0"], args.flood, False),
    ]
    rows = [(name, run_case(args, flags, flood, obey)) for name, flags, flood, obey in cases]
    _, loop_name = new_loop()
    print(
        f"\nRECORD over HTTP, --sync {args.sync}: one agent flooding on {args.flood} "
        f"connections, another sending one at a time; {args.seconds:g} s measured after "
        f"{args.warmup:g} s (load generator: one Python process, {loop_name})"
    )
    print(
        f"{'case':<32}{'normal p50':>11}{'p99 ms':>8}{'normal/s':>10}"
        f"{'flood ok/s':>12}{'429/s':>9}{'other/s':>9}"
    )
    for name, tally in rows:
        latencies = [(e - s) * 1000 for s, e in tally.normal]
        ok = tally.flood[200] / args.seconds
        refused = tally.flood[429] / args.seconds
        other = (sum(tally.flood.values()) - tally.flood[200] - tally.flood[429]) / args.seconds
        print(
            f"{name:<32}{pct(latencies, 0.5):>11.2f}{pct(latencies, 0.99):>8.2f}"
            f"{len(latencies) / args.seconds:>10.0f}{ok:>12.0f}{refused:>9.0f}{other:>9.0f}"
        )


if __name__ == "__main__":
    bracketed(main)
