"""Presence shared through PostgreSQL, and the deliveries' lease moving between nodes.

    python benchmarks/presence.py [--url postgresql://postgres@127.0.0.1/test]
                                 [--nodes 3] [--agents 10000] [--changed 0 100 1000 10000]
                                 [--flushes 20] [--takeovers 5] [--interval 1.0]

Runs on a fresh database (created from ``--url``'s server, dropped afterwards).

* **flush**: ``--nodes`` :class:`field.store.presence.Presence` objects, each
  knowing ``--agents`` agents. For each ``--changed`` count, every node in turn
  reports that many agents changed and flushes (one round trip: its own rows
  written, the others' news read); ``--flushes`` rounds. Prints p50/p99 of one
  flush and the rows it read.
* **lookup**: :meth:`Presence.presence` for every agent (what
  :meth:`Liveness.due` asks for each agent not connected locally), per second.
* **takeover**: two :class:`field.store.lease.Lease` objects on the deliveries'
  lease, the holder's on an event loop of its own in a thread; that loop is
  held (the holder renews nothing, as when its process dies or is paused) and
  the time until the other holds the lease is measured, ``--takeovers`` times.
  Then the same for a clean stop of the holder (it lets go of the lease).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import _common  # noqa: F401 - puts the repository on sys.path
import psycopg

from field.store.lease import DELIVERY_LEASE, Lease
from field.store.presence import Presence, Report

T = TypeVar("T")


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def database_url(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def flushes(url: str, args: argparse.Namespace) -> None:
    reports: list[dict[str, Report]] = [{} for _ in range(args.nodes)]

    def source(i: int) -> Callable[[], dict[str, Report]]:
        def drain() -> dict[str, Report]:
            taken, reports[i] = reports[i], {}
            return taken

        return drain

    nodes = [Presence(url, f"node-{i}") for i in range(args.nodes)]
    agents = [f"agent-{n}" for n in range(args.agents)]
    for i, node in enumerate(nodes):
        reports[i] = {a: (1, 0.0, None) for a in agents}  # every agent, once
        await node.start(source(i))
    for node in nodes:
        await node.flush()
    print(f"flush: {args.nodes} nodes, {args.agents} agents each")
    for changed in args.changed:
        times: list[float] = []
        for round_ in range(args.flushes):
            for i, node in enumerate(nodes):
                start = (round_ * changed) % max(1, args.agents)
                picked = [agents[(start + k) % args.agents] for k in range(changed)]
                reports[i] = {a: (round_ % 3, 0.5, 1.0) for a in picked}
                began = time.perf_counter()
                assert await node.flush()
                times.append(time.perf_counter() - began)
        read = changed * (args.nodes - 1)
        print(
            f"  {changed:>6} changed/node: flush p50 {pct(times, 0.5) * 1e3:7.2f} ms,"
            f" p99 {pct(times, 0.99) * 1e3:7.2f} ms (writes {changed} rows, reads up to {read})"
        )
    began = time.perf_counter()
    for agent in agents:
        nodes[0].presence(agent)
    spent = time.perf_counter() - began
    print(
        f"lookup: {len(agents) / spent:,.0f} presence() a second"
        f" ({spent / len(agents) * 1e6:.2f} µs each, {args.nodes - 1} other nodes)"
    )
    for node in nodes:
        await node.stop()


class OwnLoop:
    """An event loop in a thread of its own: a node whose every task can be held at once."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def hold(self) -> threading.Event:
        """Hold the loop (nothing of it runs) until the event returned is set."""
        gate = threading.Event()
        self.loop.call_soon_threadsafe(gate.wait)
        return gate

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def takeovers(url: str, args: argparse.Namespace) -> None:
    async def until(check: Callable[[], bool]) -> None:
        while not check():
            await asyncio.sleep(0.005)

    def lease(who: str) -> Lease:
        return Lease(
            url,
            name=DELIVERY_LEASE,
            holder=who,
            gained=lambda term: None,
            lost=lambda: None,
            interval=args.interval,
        )

    async def started(who: str) -> Lease:
        made = lease(who)
        made.start()
        return made

    for how in ("hung", "stopped"):
        moved: list[float] = []
        for _ in range(args.takeovers):
            own = OwnLoop()
            a = await own.run(started("a"))
            await until(lambda a=a: a.holding)
            b = lease("b")
            b.start()
            await asyncio.sleep(args.interval)  # b settles into its tries
            began = time.perf_counter()
            gate = own.hold() if how == "hung" else None
            if gate is None:
                await own.run(a.stop())
            await until(lambda b=b: b.holding)
            moved.append(time.perf_counter() - began)
            if gate is not None:
                gate.set()
            await own.run(a.stop())
            own.close()
            await b.stop()
        print(
            f"takeover, holder {how} (interval {args.interval:g} s): "
            f"p50 {pct(moved, 0.5):.2f} s, max {max(moved):.2f} s over {len(moved)}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--changed", type=int, nargs="+", default=[0, 100, 1000, 10_000])
    parser.add_argument("--flushes", type=int, default=20)
    parser.add_argument("--takeovers", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    name = f"field_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = database_url(args.url, name)
        await flushes(url, args)
        await takeovers(url, args)
    finally:
        with psycopg.connect(args.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    asyncio.run(main())
