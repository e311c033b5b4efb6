"""Idle connections against ``field serve`` with its default connection limits.

    python benchmarks/connections.py [--idle 2000] [--sources 1] [--probe-every 0.1]
                                     [--probe-from 127.0.0.1] [-- <field serve flags>]

Starts ``field serve --in-memory`` (default limits unless flags follow ``--``),
then opens ``--idle`` connect-only sockets, spread over ``--sources``
loopback addresses (127.0.0.1, 127.0.0.2, ...), that never send a byte, and
reads each until the server closes it. Throughout, a normal client on a
fresh connection from ``--probe-from`` asks ``GET /v1/field/status`` every
``--probe-every`` seconds. Prints how the idle sockets were answered (408
after the header timeout, 429 or 503 past a cap, or reset), when they were
closed, the server's open file descriptors before, at the peak and after,
and the normal client's answers and latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import sys
import time

from _common import machine_line, pct
from fanout import ChildServer, raise_nofile

HOST = "127.0.0.1"
PROBE = b"GET /v1/field/status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
#: Sockets opened at once.
OPEN_CONCURRENCY = 256


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def idle_socket(
    port: int, source: str, started: float, gate: asyncio.Semaphore
) -> tuple[str, float, float]:
    """Connect, send nothing, read to the end: (answer, seconds to open, seconds open)."""
    async with gate:
        reader, writer = await asyncio.open_connection(HOST, port, local_addr=(source, 0))
    opened = time.monotonic()
    try:
        data = await reader.read()
        answer = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1") else "closed"
    except ConnectionResetError:
        answer = "reset"
    finally:
        writer.close()
    return answer, opened - started, time.monotonic() - opened


async def probe(
    port: int, source: str, every: float, stop: asyncio.Event, out: list[tuple[str, float]]
) -> None:
    """One request on a fresh connection every ``every`` seconds: (status, seconds)."""
    while not stop.is_set():
        began = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(HOST, port, local_addr=(source, 0))
            writer.write(PROBE)
            data = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            status = data.split(b" ", 2)[1].decode() if data else "closed"
        except (OSError, TimeoutError) as exc:
            status = type(exc).__name__
        out.append((status, time.monotonic() - began))
        await asyncio.sleep(max(0.0, every - (time.monotonic() - began)))


async def run(port: int, pid: int, args: argparse.Namespace) -> None:
    sources = [f"127.0.0.{i + 1}" for i in range(args.sources)]
    stop = asyncio.Event()
    probes: list[tuple[str, float]] = []
    fds_before = open_fds(pid)
    prober = asyncio.create_task(probe(port, args.probe_from, args.probe_every, stop, probes))
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    started = time.monotonic()

    idle = [
        asyncio.create_task(idle_socket(port, sources[i % len(sources)], started, gate))
        for i in range(args.idle)
    ]
    peak = fds_before
    while not all(task.done() for task in idle):
        peak = max(peak, open_fds(pid))
        await asyncio.sleep(0.05)
    results = [task.result() for task in idle]
    finished = time.monotonic() - started
    await asyncio.sleep(1)  # the server's side of the last closes
    fds_after = open_fds(pid)
    stop.set()
    await prober

    answers = collections.Counter(answer for answer, _, _ in results)
    all_opened = max(opened for _, opened, _ in results)
    held = [seconds for _, _, seconds in results]
    print(f"\n{args.idle:,} connect-only sockets from {len(sources)} address(es):")
    print(f"  answers: {dict(answers)}")
    print(f"  all opened within {all_opened:.2f} s; all closed {finished:.2f} s after the first")
    print(
        f"  seconds each was held open: min {min(held):.2f}, p50 {pct(held, 0.5):.2f}, "
        f"max {max(held):.2f}"
    )
    print(f"  server file descriptors: before {fds_before}, peak {peak}, after {fds_after}")
    statuses = collections.Counter(status for status, _ in probes)
    latencies = [seconds * 1000 for status, seconds in probes if status == "200"]
    print(
        f"normal client from {args.probe_from} meanwhile: {len(probes)} requests, "
        f"answers {dict(statuses)}"
    )
    if latencies:
        print(
            f"  latency ms: p50 {pct(latencies, 0.5):.1f}, p99 {pct(latencies, 0.99):.1f}, "
            f"max {max(latencies):.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=2000, help="connect-only sockets")
    parser.add_argument("--sources", type=int, default=1, help="loopback source addresses")
    parser.add_argument("--probe-every", type=float, default=0.1, help="seconds between probes")
    parser.add_argument("--probe-from", default=HOST, help="the normal client's address")
    parser.add_argument("serve", nargs="*", help="extra field serve flags (after --)")
    args = parser.parse_args()
    limit = raise_nofile()
    if limit < args.idle + 100:
        parser.error(f"the open-file limit is {limit}; {args.idle + 100} are needed")
    print(machine_line(), file=sys.stderr)
    command = [sys.executable, "-m", "field", "serve", "--host", HOST, "--port", "0"]
    server = ChildServer(
        [*command, "--in-memory", *args.serve],
        re.compile(r"listening on http://127\.0\.0\.1:(\d+)"),
    )
    assert server.match is not None
    try:
        asyncio.run(run(int(server.match.group(1)), server.pid, args))
    finally:
        server.stop()
        problems = [line for line in server.lines if "Traceback" in line or "ERROR" in line]
        print(f"server log: {len(server.lines)} lines kept, {len(problems)} errors or tracebacks")
        for line in problems[:5]:
            print("  " + line)
    print(machine_line(), file=sys.stderr)


if __name__ == "__main__":
    main()
