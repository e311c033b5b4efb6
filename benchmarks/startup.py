"""Start-up from a snapshot against a full replay of the log: time and memory.

For each size it builds a log of that many units straight through the log API
(what RECORD writes: 12-word contents from the vocabulary, by 100 agents, with the
clock reservations a server makes), in SQLite or, with ``--postgres``, in a new
PostgreSQL database. It starts ``field serve`` on the whole log, writes a snapshot
with ``field snapshot`` (a process of its own, as the server starts it: its time,
peak memory and the snapshot's size), and starts ``field serve`` again, from the
snapshot. For each start: seconds from the command to its "listening on" line
(interpreter and imports included), the seconds the fold itself took (the server's
own log line), and the server's resident memory then, in all and per unit.

    python benchmarks/startup.py                      # 100,000 units
    python benchmarks/startup.py --units 100000 1000000 --live 1000
    python benchmarks/startup.py --postgres postgresql://postgres@127.0.0.1:5432/test

With ``--live N`` it then serves the largest log with ``--snapshot-entries N`` and times
RECORDs (100 a second) while the server writes snapshots in a process of its own and
while it does not: what writing one costs the live server. A RECORD refused ``503
OVERLOADED`` or ``429 RATE_LIMITED`` is sent again after its ``Retry-After`` (timed by its
accepted attempt), and a line counts the refusals by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import LOAD_RATES, ROLES, ROOT, VOCABULARY, bracketed, envelope, pct, progress
from _refusals import Refusals
from _refusals import post as post_retried

from field.contract.model import LogEntry
from field.store import EventLog, SQLiteEventLog

AGENTS = 100
BATCH = 10_000
#: Epochs a clock reservation covers (field.contract.clock.RESERVATION_BLOCK).
BLOCK = 1024


def build(log: EventLog, units: int) -> float:
    """Append a log of ``units`` units to the empty ``log``; returns the seconds it took."""
    started = time.perf_counter()
    ts = 1_780_000_000.0
    first = [
        LogEntry(0, "field.created", {"field_id": "field-0123456789abcdef0123"}, ts=ts),
        LogEntry(0, "clock.reserved", {"until": BLOCK}, ts=ts),
    ]
    for i in range(AGENTS):
        record = {
            "id": f"agent-{i}",
            "role": ROLES[i % len(ROLES)],
            "interests": [VOCABULARY[i % len(VOCABULARY)]],
            "current_task_id": None,
            "registered_epoch": i + 1,
            "authority": 4,
        }
        data = {"agent": record, "token_hash": f"{i:064x}"}
        first.append(LogEntry(i + 1, "agent.registered", data, f"agent-{i}", ts))
    log.append(first)
    epoch, reserved, batch = AGENTS, BLOCK, []
    for n in range(units):
        epoch += 1
        ts += 0.001
        if epoch >= reserved:
            reserved += BLOCK
            batch.append(LogEntry(epoch, "clock.reserved", {"until": reserved}, ts=ts))
        agent = n % AGENTS
        words = [VOCABULARY[(n * 7 + k * 13) % len(VOCABULARY)] for k in range(12)]
        unit: dict[str, Any] = {
            "id": f"mem-{n:020x}",
            "mode": "committed",
            "type": ("finding", "decision", "observation")[n % 3],
            "content": " ".join(words),
            "intent": {"purpose": "benchmark", "task_id": None, "question": None},
            "confidence": {"score": 0.5 + (n % 50) / 100, "reasoning": "generated"},
            "relations": [],
            "source": {
                "agent_id": f"agent-{agent}",
                "agent_role": ROLES[agent % len(ROLES)],
                "session_id": None,
                "timestamp": "2026-05-28T20:26:40.000Z",
            },
            "status": "active",
            "epoch": epoch,
        }
        batch.append(LogEntry(epoch, "memory.recorded", {"unit": unit}, f"agent-{agent}", ts))
        if len(batch) >= BATCH:
            log.append(batch)
            batch = []
            progress(n + 1, units, "log")
    log.append(batch)
    progress(units, units, "log")
    return time.perf_counter() - started


def where(directory: Path, url: str | None) -> list[str]:
    """The flags that name the log: the data directory's SQLite, or the database."""
    return ["--data-dir", str(directory)] + ([] if url is None else ["--log", url])


def snapshot(directory: Path, url: str | None) -> tuple[float, float, str]:
    """Run ``field snapshot``: its seconds, its peak memory (MB) and what it printed."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "field", "snapshot", *where(directory, url)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None
    report = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"field snapshot failed ({status})")
    return seconds, usage.ru_maxrss / 1024, report.strip()


def serve(
    directory: Path, url: str | None, *, every: int, extra: Sequence[str] = ()
) -> subprocess.Popen[str]:
    """``field serve`` on a free port, writing a snapshot every ``every`` entries (0: never)
    and none by time; its log lines on ``stderr``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "field",
            "serve",
            "--port",
            "0",
            *where(directory, url),
            "--snapshot-entries",
            str(every),
            "--snapshot-seconds",
            "0",
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )


def start(directory: Path, url: str | None) -> tuple[float, float, float, str]:
    """Start ``field serve`` until it listens: (seconds, seconds of the fold, RSS MB,
    its start-up line), then stop it."""
    started = time.perf_counter()
    process = serve(directory, url, every=0)
    assert process.stderr is not None
    told = ""
    for line in process.stderr:
        if "started from" in line:
            told = line.split(": ", 1)[-1].strip()
        if "listening on" in line:
            break
    seconds = time.perf_counter() - started
    rss = _rss_mb(process.pid)
    process.send_signal(signal.SIGTERM)
    process.stderr.read()
    process.wait(timeout=60)
    folded = re.search(r"in ([0-9.]+) s$", told)
    return seconds, float(folded.group(1)) if folded else float("nan"), rss, told


def live(directory: Path, url: str | None, every: int, seconds: float, rate: float) -> None:
    """RECORD latency before, while and after the server writes a snapshot beside itself:
    ``field serve`` with ``--snapshot-entries every`` and one agent recording ``rate``
    times a second for ``seconds``; the server's log lines tell when the snapshot process
    started and ended."""
    process = serve(directory, url, every=every, extra=LOAD_RATES)
    assert process.stderr is not None
    url = ""
    for line in process.stderr:
        found = re.search(r"listening on (http://\S+):", line)
        if found:
            url = found.group(1)
            break
    marks: dict[str, list[float]] = {"writing a snapshot": [], "snapshot written": []}

    def follow() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            for mark, times in marks.items():
                if mark in line:
                    times.append(time.perf_counter())

    threading.Thread(target=follow, daemon=True).start()
    refusals = Refusals()
    samples = asyncio.run(_record_paced(url, seconds, rate, refusals))
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    runs = list(zip(marks["writing a snapshot"], marks["snapshot written"], strict=False))
    print(f"  live: refused {refusals.describe()}")
    if not runs:
        print(f"  live: no snapshot was written in {seconds:.0f} s")
        return

    def writing(at: float) -> bool:
        return any(began <= at < ended for began, ended in runs)

    phases = {
        "no snapshot": [lat for at, lat in samples if not writing(at)],
        "writing one": [lat for at, lat in samples if writing(at)],
    }
    took = ", ".join(f"{ended - began:.1f}" for began, ended in runs)
    print(f"  live, {rate:.0f} RECORD/s for {seconds:.0f} s; snapshot processes ran {took} s:")
    for name, lats in phases.items():
        if lats:
            print(
                f"    {name:>11}: {len(lats):5d} RECORDs, p50 {pct(lats, 0.5) * 1e3:6.2f} ms, "
                f"p99 {pct(lats, 0.99) * 1e3:7.2f} ms, max {max(lats) * 1e3:7.2f} ms"
            )


async def _record_paced(
    url: str, seconds: float, rate: float, refusals: Refusals
) -> list[tuple[float, float]]:
    """(time sent, seconds to the acknowledgement) of RECORDs sent ``rate`` a second; one
    refused (503 OVERLOADED, 429 RATE_LIMITED) is counted in ``refusals`` and sent again
    after its Retry-After, its sample the accepted attempt's."""
    samples: list[tuple[float, float]] = []
    async with aiohttp.ClientSession() as session:
        body = envelope("REGISTER", "live-writer", {"id": "live-writer", "role": "analyst"})
        json = {"Content-Type": "application/json"}
        reply = await post_retried(
            session, url + "/v1/register", orjson.dumps(body), json, refusals
        )
        assert reply.status == 200, reply.status
        token = reply.answer["token"]
        headers = {**json, "Authorization": f"Bearer {token}"}
        started = time.perf_counter()
        n = 0
        while time.perf_counter() - started < seconds:
            payload = {
                "type": "finding",
                "content": f"live unit {n} on {VOCABULARY[n % len(VOCABULARY)]}",
                "intent": {"purpose": "benchmark"},
                "confidence": {"score": 0.7, "reasoning": "generated"},
            }
            body = envelope("RECORD", "live-writer", payload)
            reply = await post_retried(
                session, url + "/v1/record", orjson.dumps(body), headers, refusals
            )
            assert reply.status == 200, reply.status
            samples.append((reply.began, reply.ended - reply.began))
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
    return samples


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(units: int, keep: Path | None, live_every: int | None, postgres: str | None) -> None:
    directory = Path(tempfile.mkdtemp(prefix="field-startup-", dir=keep))
    with contextlib.ExitStack() as stack:
        if keep is None:
            stack.callback(shutil.rmtree, directory, ignore_errors=True)
        url = None if postgres is None else stack.enter_context(_database(postgres))
        log: EventLog
        if url is None:
            log = SQLiteEventLog(directory / "field.db", synchronous="normal")
        else:
            from field.store.postgres import PostgresEventLog

            log = PostgresEventLog(url)
        built = build(log, units)
        log.close()
        backend = "SQLite" if url is None else "PostgreSQL"
        print(f"\n{units:,} units: {backend} log built in {built:.1f} s")
        runs = 2 if units <= 200_000 else 1
        for label in ("whole log", "from the snapshot"):
            if label == "from the snapshot":
                seconds, peak, report = snapshot(directory, url)
                print(f"  field snapshot: {seconds:.1f} s, peak RSS {peak:.0f} MB: {report}")
            for total, fold, rss, told in [start(directory, url) for _ in range(runs)]:
                print(
                    f"  start, {label:>17}: {total:6.2f} s to listening, fold {fold:6.2f} s, "
                    f"RSS {rss:7.0f} MB ({rss * 1024 * 1024 / units:,.0f} bytes/unit); {told}"
                )
        if live_every:
            live(directory, url, live_every, seconds=90.0, rate=100.0)


@contextlib.contextmanager
def _database(admin: str) -> Iterator[str]:
    """A new database on the server ``admin`` names (a postgresql:// URL of a database to
    connect to meanwhile), dropped afterwards."""
    import psycopg

    name = f"field_startup_{os.urandom(6).hex()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        scheme, _, rest = admin.partition("://")
        yield f"{scheme}://{rest.split('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[100_000])
    parser.add_argument("--keep", type=Path, help="build the logs under this directory")
    parser.add_argument(
        "--live",
        type=int,
        metavar="N",
        help="then serve the largest log with --snapshot-entries N and time RECORDs before, "
        "while and after the server writes the snapshot",
    )
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="keep each log in a new database on this PostgreSQL server (URL of a database "
        "to connect to while creating and dropping it), not in SQLite",
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"python {sys.version.split()[0]}, open files {soft}")
    for units in args.units:
        live_every = args.live if units == max(args.units) else None
        run(units, args.keep, live_every, args.postgres)


if __name__ == "__main__":
    bracketed(main)
