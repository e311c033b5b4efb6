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
  key; the holder's session is ended (``pg_terminate_backend``, as when its
  process dies) and the time until the other holds the lease is measured,
  ``--takeovers`` times. Then the same for a clean stop of the holder.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable

import _common  # noqa: F401 - puts the repository on sys.path
import psycopg

from field.store.lease import DELIVERY_LEASE, Lease
from field.store.presence import Presence, Report


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


async def takeovers(url: str, args: argparse.Namespace) -> None:
    def holder() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = %s::oid AND objid = %s::oid",
                (DELIVERY_LEASE >> 32, DELIVERY_LEASE & 0xFFFFFFFF),
            ).fetchone()
        return int(row[0])

    async def until(check: Callable[[], bool]) -> None:
        while not check():
            await asyncio.sleep(0.005)

    for how in ("killed", "stopped"):
        moved: list[float] = []
        for _ in range(args.takeovers):
            a = Lease(
                url,
                key=DELIVERY_LEASE,
                name="a",
                gained=lambda: None,
                lost=lambda: None,
                interval=args.interval,
            )
            b = Lease(
                url,
                key=DELIVERY_LEASE,
                name="b",
                gained=lambda: None,
                lost=lambda: None,
                interval=args.interval,
            )
            a.start()
            await until(lambda a=a: a.holding)
            b.start()
            await asyncio.sleep(args.interval)  # b settles into its tries
            began = time.perf_counter()
            if how == "killed":
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("SELECT pg_terminate_backend(%s)", (holder(),))
            else:
                await a.stop()
            await until(lambda b=b: b.holding)
            moved.append(time.perf_counter() - began)
            await a.stop()
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
