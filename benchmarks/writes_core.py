"""Durable writes in one process: RECORD per second through the Field's service, no HTTP.

    python benchmarks/writes_core.py [--clients 32] [--seconds 10] [--sync full normal]
                                     [--embedder wordllama]

What ``writes.py`` measures over HTTP, without HTTP: for each ``--sync`` mode, a
:class:`~field.engine.service.FieldService` on a fresh SQLite log in this process,
``--clients`` registered writer agents, and one task per agent sending RECORD after
RECORD to the service (``FieldService.execute`` of ``Field.handle``, as the HTTP binding
does once it has parsed and checked a request) in a closed loop, for ``--warmup`` then
``--seconds`` seconds. Each RECORD is answered only once its log entry is committed.

Prints RECORD/s, this process's CPU over the measured window, the CPU per RECORD (the
Field's own cost of a durable write: its envelope checks, state, index and embedding,
the group-committed SQLite append and the writer's hand-offs), and checks that the log
holds exactly the acknowledged units. OpenBLAS's threads are set as ``field serve`` sets
them (the ``field`` command's package is imported before NumPy).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import bracketed, envelope
from writes import new_loop, record_payload

import field.cli  # noqa: F401  (OpenBLAS's settings: before NumPy, which nothing above loads)
from field.core.field import Field
from field.engine.service import FieldService
from field.ranking.embedding import load_embedder
from field.store.sqlite import SQLiteEventLog


def job(message: dict[str, Any], token: str | None) -> Callable[[Field], Any]:
    """What the HTTP binding hands the service for a parsed request."""
    operation = message["operation"]
    return lambda f: f.handle(message, token=token, operation=operation)


async def run(sync: str, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """One ``--sync`` mode: RECORD/s, CPU and the durability check."""
    embedder = load_embedder(args.embedder)
    log = SQLiteEventLog(data / "field.db", synchronous=sync)
    service = FieldService(log, lambda: Field(embedder=embedder))
    await service.start()
    try:
        tokens = []
        for i in range(args.clients):
            payload = {"id": f"w{i}", "role": "market_researcher", "interests": ["market size"]}
            message = envelope("REGISTER", f"w{i}", payload)
            outcome = await service.execute(job(message, None), operation="REGISTER")
            tokens.append(outcome.response["token"])
        gc.collect()
        acknowledged = [0]
        running = [True]

        async def writer(i: int) -> None:
            rng, n = random.Random(i), 0
            while running[0]:
                message = envelope("RECORD", f"w{i}", record_payload(rng, n))
                n += 1
                await service.execute(job(message, tokens[i]), operation="RECORD")
                acknowledged[0] += 1

        tasks = [asyncio.create_task(writer(i)) for i in range(args.clients)]
        await asyncio.sleep(args.warmup)
        done, cpu, began = acknowledged[0], time.process_time(), time.perf_counter()
        await asyncio.sleep(args.seconds)
        done = acknowledged[0] - done
        cpu, seconds = time.process_time() - cpu, time.perf_counter() - began
        running[0] = False
        await asyncio.gather(*tasks)
        total = acknowledged[0]
    finally:
        await service.stop()
    with sqlite3.connect(data / "field.db") as conn:
        (logged,) = conn.execute(
            "SELECT count(*) FROM log WHERE kind = 'memory.recorded'"
        ).fetchone()
    return {
        "rate": done / seconds,
        "cpu": cpu / seconds,
        "per": cpu / done,
        "durable": logged == total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per mode")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per mode")
    parser.add_argument("--sync", nargs="+", choices=["full", "normal"], default=["full", "normal"])
    parser.add_argument("--embedder", default="wordllama", help="as field serve --embedder")
    args = parser.parse_args()
    if not 1 <= args.clients <= 256 or not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 10:
        parser.error("--clients must be in [1, 256], --seconds in (0, 60], --warmup in [0, 10]")
    gc.set_threshold(50_000, 20, 100)  # field serve's
    loop, loop_name = new_loop()
    rows = []
    try:
        for sync in args.sync:
            with tempfile.TemporaryDirectory(prefix="field-writes-core-") as tmp:
                rows.append((sync, loop.run_until_complete(run(sync, args, Path(tmp)))))
    finally:
        loop.close()
    print(
        f"\nRECORD through the service in one process (no HTTP): {args.clients} writers, "
        f"closed loop, {args.seconds:g} s measured after {args.warmup:g} s; "
        f"--embedder {args.embedder}; {loop_name}"
    )
    print(f"{'--sync':<8}{'RECORD/s':>10}{'CPU':>8}{'CPU per RECORD':>16}{'durable':>9}")
    for sync, row in rows:
        print(
            f"{sync:<8}{row['rate']:>10,.0f}{row['cpu']:>8.0%}{row['per'] * 1000:>13.3f} ms"
            f"{'yes' if row['durable'] else 'NO':>9}"
        )
    if not all(row["durable"] for _, row in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    bracketed(main)
