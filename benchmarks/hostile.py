"""A normal client's ATTUNE beside large reads and a flood of slow connections.

    python benchmarks/hostile.py [--units 1000] [--chars 65536] [--heavy 8]
                                 [--slow 3000] [--seconds 10]

Starts ``field serve --in-memory`` with its default deadlines as a child
process and records ``--units`` units of ``--chars`` characters (the set-up
of ``large_reads.py``). A *normal* client, on one kept-alive connection, one
request at a time, ATTUNEs for ``--seconds`` (the top 10 in summary form,
two interests and a context hint: a ranking of every unit), four times:

1. alone: the baseline;
2. beside ``--heavy`` clients looping on maximal ATTUNEs (``max_units``
   1000, full form), in another process;
3. beside ``--slow`` slow connections, in another process, held open all
   the time: a third connect and send nothing, a third send half a request
   head, a third a whole head and half a body; each is reopened as soon as
   the server answers it (``408`` at its deadline) and closes it;
4. beside both.

Prints the normal client's p50 and p99 in each run with their ratios to the
baseline, what the heavy and slow clients got, and the server's peak file
descriptors and memory. A request refused ``503 OVERLOADED`` or ``429
RATE_LIMITED`` is waited out for its ``Retry-After`` and sent again (timed
by its accepted attempt); the last lines count the refusals of the set-up,
of the normal client in each run and (on their lines) of the heavy clients.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import threading
import time
from collections import Counter
from typing import Any

from _common import bracketed, pct
from _refusals import Refusals
from fanout import rss_kb, start_field
from large_reads import REFUSALS, corpus_arguments, heavy_process, normal_client, populate

#: What each kind of slow connection sends, then holds.
SLOW = {
    "connect-only": b"",
    "partial head": b"POST /v1/attune HTTP/1.1\r\nHost: localhost\r\nContent-Ty",
    "partial body": (
        b"POST /v1/attune HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4000\r\n\r\n" + b'{"protocol": "akashik", '
    ),
}


def slow_process(port: int, count: int, ready: Any, stop: Any, out: Any) -> None:
    """``count`` slow connections held open until ``stop`` is set; reports on ``out``."""
    answers: Counter[str] = Counter()
    held = 0
    most = 0

    async def one(data: bytes) -> None:
        nonlocal held, most
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError as exc:
                answers[f"connect failed: {exc.strerror}"] += 1
                await asyncio.sleep(0.1)  # the pace of retries
                continue
            held += 1
            most = max(most, held)
            try:
                if data:
                    writer.write(data)
                answer = await reader.read()  # until the server closes the connection
                answers[answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"] += 1
            except OSError as exc:
                answers[f"reset: {exc.strerror}"] += 1
            finally:
                held -= 1
                writer.close()

    async def run() -> None:
        kinds = list(SLOW.values())
        tasks = [asyncio.create_task(one(kinds[i % len(kinds)])) for i in range(count)]
        ready.set()
        await asyncio.to_thread(stop.wait)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out.put((dict(answers), most))

    asyncio.run(run())


class Peaks:
    """The server's open file descriptors and VmRSS, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds = 0
        self.rss_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            self.rss_kb = max(self.rss_kb, rss_kb(self.pid))

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.fds, self.rss_kb


def measure(args: argparse.Namespace) -> dict[str, Any]:
    server, port = start_field()
    url = f"http://127.0.0.1:{port}"
    context = multiprocessing.get_context("spawn")
    result: dict[str, Any] = {}
    try:
        tokens = asyncio.run(populate(url, args.units, args.chars, args.heavy))
        for run in ("alone", "large reads", "slow connections", "both"):
            children = []
            heavy_out = slow_out = None
            stop = context.Event()
            if run in ("large reads", "both"):
                ready, heavy_out = context.Event(), context.Queue()
                children.append(
                    context.Process(
                        target=heavy_process,
                        args=(url, tokens, args.heavy, "full", ready, stop, heavy_out),
                    )
                )
                children[-1].start()
                ready.wait(60)
            if run in ("slow connections", "both"):
                ready, slow_out = context.Event(), context.Queue()
                children.append(
                    context.Process(
                        target=slow_process, args=(port, args.slow, ready, stop, slow_out)
                    )
                )
                children[-1].start()
                ready.wait(60)
            time.sleep(1)  # the others are under way
            peaks = Peaks(server.pid)
            print(f"measuring the normal client: {run}", flush=True)
            refused = Refusals()
            samples = asyncio.run(normal_client(url, tokens["normal"], args.seconds, refused))
            stop.set()
            result[run] = {
                "samples": samples,
                "refused": refused,
                "heavy": heavy_out.get(timeout=120) if heavy_out is not None else None,
                "slow": slow_out.get(timeout=120) if slow_out is not None else None,
                "peaks": peaks.stop(),
            }
            for child in children:
                child.join(60)
    finally:
        server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    corpus_arguments(parser)
    parser.add_argument("--slow", type=int, default=3000)
    args = parser.parse_args()
    result = measure(args)
    base = result["alone"]["samples"]
    print(
        f"\n{args.units:,} units of {args.chars:,} characters; the normal client: ATTUNE top 10, "
        f"summary form, {args.seconds:g} s per run; {args.heavy} heavy clients, "
        f"{args.slow:,} slow connections"
    )
    print(
        f"{'beside':<20}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}{'x p50':>8}{'x p99':>8}"
        f"{'server fds':>12}{'RSS MB':>9}"
    )
    for run, figures in result.items():
        samples = figures["samples"]
        p50, p99 = pct(samples, 0.5), pct(samples, 0.99)
        fds, rss = figures["peaks"]
        print(
            f"{run:<20}{len(samples):>10}{p50:>9.2f}{p99:>9.2f}{p50 / pct(base, 0.5):>8.2f}"
            f"{p99 / pct(base, 0.99):>8.2f}{fds:>12}{rss / 1024:>9.0f}"
        )
    for run, figures in result.items():
        if figures["heavy"] is not None:
            latencies, sizes, elapsed, heavy_refused = figures["heavy"]
            print(
                f"{run}: heavy clients {len(latencies) / elapsed:.0f} maximal ATTUNEs/s, "
                f"p50 {pct(latencies, 0.5):.1f} ms, {pct([float(s) for s in sizes], 0.5) / 1e6:.2f}"
                f" MB each; refused {Refusals().add(heavy_refused).describe()}"
            )
        if figures["slow"] is not None:
            answers, most = figures["slow"]
            print(f"{run}: slow connections, at most {most:,} held at once; answers {answers}")
    print(f"refused (set-up): {REFUSALS.describe()}")
    for run, figures in result.items():
        print(f"refused (the normal client, {run}): {figures['refused'].describe()}")


if __name__ == "__main__":
    bracketed(main)
