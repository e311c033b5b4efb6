"""The event log in PostgreSQL: psycopg 3 against asyncpg on the Field's workload.

    python benchmarks/pglog.py [--url postgresql://postgres@127.0.0.1/test]
                               [--seconds 3] [--batches 1 16 128] [--entry-bytes 300]

Each case runs on a fresh database (created from ``--url``'s server, dropped afterwards)
with the tables of :mod:`field.store.postgres`, and does what the Field does:

* **append**: group commits one after the other, each one transaction that takes the next
  positions from the head row and copies in a batch of entries (``--batches`` entries of
  about ``--entry-bytes`` each), committed with ``synchronous_commit = on``; for
  ``--seconds``. Prints commits a second, entries a second and p50/p99 of one commit.
* **read**: every entry, by position range, pages of 1000 (``position > after ORDER BY
  position LIMIT 1000``), decoded into entries; then 2000 reads of 64 random positions
  (``position = ANY(...)``, REPLAY's read). Prints entries a second and reads a second.

The drivers:

* ``psycopg``: :class:`field.store.postgres.PostgresEventLog` itself: psycopg 3's
  synchronous connection, as the Field calls the log (appends in a worker thread).
* ``psycopg-thread``: the same, each call through ``asyncio.to_thread`` from an event
  loop, which is what the Field's writer pays.
* ``asyncpg``: the same on an asyncpg connection, awaited on the loop (its binary COPY,
  ``copy_records_to_table``; ``--asyncpg-unnest``: an INSERT of unnest()ed arrays).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import _common  # noqa: F401 - puts the repository on sys.path
import orjson
import psycopg

from field.store import LogEntry
from field.store.postgres import _HEAD, _SELECT, _SELECT_AT, PostgresEventLog

_ASYNCPG_INSERT = (
    "INSERT INTO field_log (position, epoch, kind, agent_id, ts, data)"
    " SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[],"
    " $5::float8[], $6::bytea[])"
)


def make_batch(size: int, entry_bytes: int, n: int) -> list[LogEntry]:
    text = "x" * max(0, entry_bytes - 120)
    return [
        LogEntry(n, "memory.recorded", {"id": f"unit-{n}-{i}", "content": text}, "agent-1", 1.0)
        for i in range(size)
    ]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Database:
    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.name = f"field_bench_{uuid.uuid4().hex[:12]}"
        base, _, _ = admin.rpartition("/")
        self.url = f"{base}/{self.name}"

    def __enter__(self) -> str:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        PostgresEventLog(self.url).close()  # the tables
        return self.url

    def __exit__(self, *exc: Any) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def report(driver: str, what: str, **figures: Any) -> None:
    parts = " ".join(f"{k}={v}" for k, v in figures.items())
    print(f"{driver:>15} {what:<14} {parts}", flush=True)


async def timed_appends(
    append: Callable[[list[LogEntry]], Awaitable[Any]], size: int, seconds: float, eb: int
) -> tuple[int, list[float]]:
    latencies: list[float] = []
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        batch = make_batch(size, eb, n)
        started = time.perf_counter()
        await append(batch)
        latencies.append(time.perf_counter() - started)
        n += 1
    return n, latencies


async def bench_psycopg(url: str, args: argparse.Namespace, threaded: bool) -> None:
    name = "psycopg-thread" if threaded else "psycopg"
    for size in args.batches:
        with Database(url) as db:
            log = PostgresEventLog(db)

            async def append(batch: list[LogEntry], log: PostgresEventLog = log) -> Any:
                if threaded:
                    return await asyncio.to_thread(log.append, batch)
                return log.append(batch)

            commits, lat = await timed_appends(append, size, args.seconds, args.entry_bytes)
            report(
                name,
                f"append x{size}",
                commits_s=round(commits / sum(lat)),
                entries_s=round(commits * size / sum(lat)),
                p50_ms=round(pct(lat, 0.5) * 1000, 2),
                p99_ms=round(pct(lat, 0.99) * 1000, 2),
            )
            if size == max(args.batches):
                await read_psycopg(name, log, threaded)
            log.close()


async def read_psycopg(name: str, log: PostgresEventLog, threaded: bool) -> None:
    last = log.last_position()
    started = time.perf_counter()
    after, total = 0, 0
    while True:
        page = await asyncio.to_thread(log.read, after, 1000) if threaded else log.read(after)
        if not page:
            break
        total += len(page)
        after = page[-1].position
    elapsed = time.perf_counter() - started
    assert total == last
    rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(2000):
        wanted = rng.sample(range(1, last + 1), 64)
        if threaded:
            await asyncio.to_thread(log.read_positions, wanted)
        else:
            log.read_positions(wanted)
    by_position = time.perf_counter() - started
    report(
        name,
        "read",
        entries=total,
        range_entries_s=round(total / elapsed),
        positions64_s=round(2000 / by_position),
    )


async def bench_asyncpg(url: str, args: argparse.Namespace) -> None:
    import asyncpg

    for size in args.batches:
        with Database(url) as db:
            conn = await asyncpg.connect(db)
            await conn.execute("SET synchronous_commit = on")

            async def append(batch: list[LogEntry], conn: Any = conn) -> list[int]:
                blobs = [orjson.dumps(e.data) for e in batch]
                async with conn.transaction():
                    last = await conn.fetchval(_HEAD.replace("%s", "$1"), len(batch))
                    first = last - len(batch) + 1
                    rows = [
                        (first + i, e.epoch, e.kind, e.agent_id, float(e.ts), blob)
                        for i, (e, blob) in enumerate(zip(batch, blobs, strict=True))
                    ]
                    if args.asyncpg_unnest:
                        await conn.execute(_ASYNCPG_INSERT, *map(list, zip(*rows, strict=True)))
                    else:
                        await conn.copy_records_to_table("field_log", records=rows)
                return list(range(first, last + 1))

            commits, lat = await timed_appends(append, size, args.seconds, args.entry_bytes)
            report(
                "asyncpg",
                f"append x{size}",
                commits_s=round(commits / sum(lat)),
                entries_s=round(commits * size / sum(lat)),
                p50_ms=round(pct(lat, 0.5) * 1000, 2),
                p99_ms=round(pct(lat, 0.99) * 1000, 2),
            )
            if size == max(args.batches):
                await read_asyncpg(conn)
            await conn.close()


async def read_asyncpg(conn: Any) -> None:
    from field.store.base import StoredEntry

    select = _SELECT.replace("%s", "$1", 1).replace("%s", "$2", 1)
    select_at = _SELECT_AT.replace("%s", "$1")
    last = await conn.fetchval("SELECT position FROM field_log_head")
    started = time.perf_counter()
    after, total = 0, 0
    while True:
        rows = await conn.fetch(select, after, 1000)
        if not rows:
            break
        page = [StoredEntry(r[0], r[1], r[2], orjson.loads(r[5]), r[3], r[4]) for r in rows]
        total += len(page)
        after = page[-1].position
    elapsed = time.perf_counter() - started
    rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(2000):
        wanted = rng.sample(range(1, last + 1), 64)
        rows = await conn.fetch(select_at, wanted)
        [StoredEntry(r[0], r[1], r[2], orjson.loads(r[5]), r[3], r[4]) for r in rows]
    by_position = time.perf_counter() - started
    report(
        "asyncpg",
        "read",
        entries=total,
        range_entries_s=round(total / elapsed),
        positions64_s=round(2000 / by_position),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--entry-bytes", type=int, default=300)
    parser.add_argument(
        "--asyncpg-unnest",
        action="store_true",
        help="asyncpg inserts unnest()ed arrays instead of its binary COPY",
    )
    args = parser.parse_args()
    print(
        f"psycopg {psycopg.__version__}, batches {args.batches}, "
        f"~{args.entry_bytes} B entries, {args.seconds}s each",
        flush=True,
    )
    await bench_psycopg(args.url, args, threaded=False)
    await bench_psycopg(args.url, args, threaded=True)
    await bench_asyncpg(args.url, args)


if __name__ == "__main__":
    asyncio.run(main())
