"""Overload, open loop: writers offering more than the server sustains, with push fan-out.

    python benchmarks/overload.py [--subscribers 1000] [--procs 3] [--seconds 20]
                                  [--factor 2] [--rate R] [--writers 8] [--in-memory]
                                  [--no-baseline] [--server-arg=--flag ...]

Starts ``field serve`` (a durable SQLite log in a temporary directory unless
``--in-memory``) as a child process, ``--procs`` client processes holding
``--subscribers`` WebSocket subscribers (the clients of ``fanout.py``: every
subscriber its own agent with one subscription to every ``memory.recorded``),
and ``--writers`` writer agents in this process. Then:

1. **Capacity.** Writers record flat out (64 in flight) for 5 s: the RECORDs/s
   the server sustains with this fan-out (the 100% line).
2. **Overload.** For ``--seconds``, RECORDs are sent on schedule at
   ``--factor`` times that rate (or at ``--rate``), spread over the writers,
   each at its time whether or not earlier ones were answered (open loop).
   Every answer is timed from its send: accepted (200), refused (503 with
   ``Retry-After``) or anything else. Meanwhile every 100 ms a probe opens a
   **new** connection and reads ``GET /v1/agents?limit=1`` (a read through the
   writer's queue), timed from the connect.
3. **Drain.** Once the load stops, the clients wait for one notification per
   accepted RECORD per subscriber; the backlog's drain time is the last
   receipt minus the moment the last request was answered.

The server's RSS is sampled every 0.5 s; "flat" compares the mean of the last
quarter of the overload with the first. The writers' process keeps its own garbage
collector off during the overload (its full collections would count in the server's
times) and reports its own loop's lag, the part of every time above that is its own.

Two runs in one command: first a **baseline** server without admission control
(``--overload-write-target 0 --overload-read-target 0 --overload-write-budget 0``: only
the queue's bound),
whose measured capacity sets the offered rate, then a server with the defaults
(plus any ``--server-arg``) at that same offered rate.

Targets: p99 acknowledgement of accepted writes <= 250 ms, every refusal within
50 ms, new-connection probes p99 <= 500 ms, backlog drained within 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import aiohttp
import orjson
from _common import NO_ADMISSION, VOCABULARY, envelope, machine_line, pct
from fanout import HOST, ClientPool, _post, raise_nofile, rss_kb, start_field

#: Seconds of the capacity measurement.
CAPACITY_SECONDS = 5.0
#: RECORDs in flight while measuring capacity.
CAPACITY_CONCURRENCY = 64
#: Seconds between new-connection probes.
PROBE_EVERY = 0.1
#: Seconds the clients may take to receive the backlog.
DRAIN_TIMEOUT = 60.0
#: Seconds of the writer process's loop-lag probe's sleeps.
LAG_TICK = 0.001


class Writers:
    """``count`` registered writer agents recording over HTTP, round robin."""

    def __init__(self, port: int, count: int) -> None:
        self.base = f"http://{HOST}:{port}"
        self.count = count
        self.tokens: list[str] = []
        self.session: aiohttp.ClientSession | None = None
        self.serial = 0

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2000))
        for i in range(self.count):
            payload = {"id": f"writer-{i}", "role": "analyst", "interests": ["market size"]}
            body = envelope("REGISTER", f"writer-{i}", payload)
            registered = await _post(self.session, self.base + "/v1/register", body, None)
            self.tokens.append(registered["token"])

    def _body(self) -> tuple[bytes, str]:
        self.serial += 1
        i = self.serial % self.count
        words = [VOCABULARY[(self.serial * 7 + k) % len(VOCABULARY)] for k in range(12)]
        payload = {
            "type": "finding",
            "content": f"{self.serial} " + " ".join(words),
            "intent": {"purpose": "overload benchmark", "task_id": "task-overload"},
            "confidence": {"score": 0.8, "reasoning": "generated"},
        }
        return orjson.dumps(envelope("RECORD", f"writer-{i}", payload)), self.tokens[i]

    async def one(self) -> tuple[int, float, float, str | None, str | None]:
        """(status, sent, answered, memory unit id, Retry-After) of one RECORD."""
        assert self.session is not None
        body, token = self._body()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        sent = time.time()
        try:
            async with self.session.post(
                self.base + "/v1/record", data=body, headers=headers
            ) as response:
                raw = await response.read()
                answered = time.time()
                unit = orjson.loads(raw).get("memory_unit_id") if response.status == 200 else None
                return response.status, sent, answered, unit, response.headers.get("Retry-After")
        except aiohttp.ClientError as exc:
            return -1, sent, time.time(), None, type(exc).__name__

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


async def capacity(writers: Writers) -> tuple[float, int]:
    """RECORDs/s sustained with ``CAPACITY_CONCURRENCY`` in flight (closed loop), and
    how many were recorded."""
    done = 0
    end = time.monotonic() + CAPACITY_SECONDS

    async def lane() -> None:
        nonlocal done
        while time.monotonic() < end:
            status, *_ = await writers.one()
            done += status == 200

    start = time.monotonic()
    await asyncio.gather(*(lane() for _ in range(CAPACITY_CONCURRENCY)))
    return done / (time.monotonic() - start), done


async def probe(base: str, token: str) -> float | None:
    """Seconds to read one page of agents on a new connection (None: it failed)."""
    start = time.time()
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(
                base + "/v1/agents?limit=1", headers={"Authorization": f"Bearer {token}"}
            ) as response,
        ):
            await response.read()
            return time.time() - start if response.status == 200 else None
    except aiohttp.ClientError:
        return None


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """No garbage collection in this process while it measures: its full collections
    (30-75 ms with every answer kept) would count in the server's latencies."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def loop_lag(lags: list[float]) -> None:
    """Append, until cancelled, how late (ms) each ``LAG_TICK`` sleep of this process's own
    loop wakes: the share of a measured latency that is the measuring side's."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(LAG_TICK)
        lags.append((loop.time() - start - LAG_TICK) * 1000)


async def overload(
    writers: Writers, per_second: float, seconds: float, lags: list[float]
) -> tuple[list[tuple[int, float, float, str | None, str | None]], list[float | None]]:
    loop = asyncio.get_running_loop()
    monitor = asyncio.create_task(loop_lag(lags))
    try:
        start = loop.time() + 0.05
        count = int(per_second * seconds)
        tasks = []
        probes = []
        next_probe = start
        for i in range(count):
            at = start + i / per_second
            while next_probe <= at:
                probes.append(asyncio.create_task(probe(writers.base, writers.tokens[0])))
                next_probe += PROBE_EVERY
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(writers.one()))
        return list(await asyncio.gather(*tasks)), list(await asyncio.gather(*probes))
    finally:
        monitor.cancel()


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.samples.append((time.time(), rss_kb(self.pid)))
            except (OSError, RuntimeError):
                return

    def between(self, start: float, end: float) -> list[int]:
        return [kb for t, kb in self.samples if start <= t <= end]


def report(
    results: list[tuple[int, float, float, str | None, str | None]],
    probes: list[float | None],
    drained: float | None,
    rss: tuple[float, float],
    sustained: float,
    offered: float,
    seconds: float,
    lags: list[float],
) -> None:
    accepted = [(a - s) * 1000 for status, s, a, _, _ in results if status == 200]
    refused = [(a - s) * 1000 for status, s, a, _, _ in results if status == 503]
    retry_after = collections.Counter(r for status, *_, r in results if status == 503)
    other = collections.Counter(str(status) for status, *_ in results if status not in (200, 503))
    probe_ms = [p * 1000 for p in probes if p is not None]
    print(
        f"\nsustained {sustained:.0f} RECORD/s; offered {offered:.0f}/s for {seconds:g} s "
        f"({offered / sustained:.1f}x): {len(results)} RECORDs"
    )
    if accepted:
        print(
            f"accepted {len(accepted)} ({len(accepted) / seconds:.0f}/s): ack p50 "
            f"{pct(accepted, 0.5):.0f} ms, p99 {pct(accepted, 0.99):.0f} ms, "
            f"max {max(accepted):.0f} ms   (target p99 <= 250)"
        )
    if refused:
        print(
            f"refused  {len(refused)}: p50 {pct(refused, 0.5):.1f} ms, p99 "
            f"{pct(refused, 0.99):.1f} ms, max {max(refused):.1f} ms   (target all <= 50); "
            f"Retry-After {dict(retry_after)}"
        )
    if other:
        print(f"other answers: {dict(other)}")
    if probe_ms:
        print(
            f"new-connection reads: {len(probe_ms)}/{len(probes)} answered, p50 "
            f"{pct(probe_ms, 0.5):.0f} ms, p99 {pct(probe_ms, 0.99):.0f} ms, "
            f"max {max(probe_ms):.0f} ms   (target p99 <= 500)"
        )
    shown = "not drained" if drained is None else f"{drained * 1000:.0f} ms"
    print(f"backlog drained {shown} after the last answer   (target <= 1000)")
    if lags:
        print(
            f"the writers' own loop lag: p99 {pct(lags, 0.99):.1f} ms, max {max(lags):.1f} ms "
            "(part of every time above)"
        )
    print(f"server RSS: first quarter {rss[0] / 1024:.0f} MB, last quarter {rss[1] / 1024:.0f} MB")


def run_case(args: argparse.Namespace, label: str, server_args: list[str], offered: float) -> float:
    """One server, its subscribers and writers; the overload phase at ``offered`` RECORD/s
    (0: ``--factor`` times the capacity measured first). Returns the offered rate."""
    data_dir = None if args.in_memory else tempfile.mkdtemp(prefix="field-overload-")
    server, port = start_field(*server_args, data_dir=data_dir)
    pool: ClientPool | None = None
    sampler = RssSampler(server.pid)
    print(f"\n== {label} ==", file=sys.stderr)
    try:
        pool = ClientPool("ws", args.subscribers, args.procs, port)
        pool.ask(("setup",), "setup")
        pool.ask(("connect",), "connect", timeout=300)
        writers = Writers(port, args.writers)
        sampler.start()

        async def run() -> float:
            lags: list[float] = []
            await writers.start()
            try:
                sustained, before = await capacity(writers)
                # the capacity phase's notifications first, so that they do not count below
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: pool.ask(("collect", before, DRAIN_TIMEOUT))
                )
                rate = offered or args.rate or sustained * args.factor
                began = time.time()
                with quiet_collector():
                    results, probes = await overload(writers, rate, args.seconds, lags)
                ended = time.time()
            finally:
                await writers.close()
            accepted = {unit: s for status, s, _, unit, _ in results if status == 200 and unit}
            last_answer = max(a for _, _, a, _, _ in results)
            replies = await asyncio.get_running_loop().run_in_executor(
                None,
                lambda: pool.ask(
                    ("collect", before + len(accepted), DRAIN_TIMEOUT), timeout=DRAIN_TIMEOUT + 30
                ),
            )
            mine = [
                times
                for _, reply in replies
                for unit, times in reply["receipts"].items()
                if unit in accepted
            ]
            got = sum(len(times) for times in mine)
            expected = len(accepted) * args.subscribers
            drained = None
            if mine and got >= expected:
                drained = max(max(times) for times in mine) - last_answer
            else:
                print(f"\nonly {got} of {expected} notifications arrived", file=sys.stderr)
            quarter = (ended - began) / 4
            first = sampler.between(began, began + quarter) or [0]
            last = sampler.between(ended - quarter, ended) or [0]
            rss = (sum(first) / len(first), sum(last) / len(last))
            print(f"\n{label}")
            report(results, probes, drained, rss, sustained, rate, args.seconds, lags)
            return rate

        return asyncio.run(run())
    finally:
        sampler.stopped.set()
        if pool is not None:
            pool.close()
        server.stop()
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=3, help="client processes")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--factor", type=float, default=2.0, help="offered / sustained")
    parser.add_argument("--rate", type=float, help="offered RECORD/s (instead of --factor)")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--in-memory", action="store_true", help="no SQLite log")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run without admission control"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="a flag for field serve (repeatable)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise_nofile()
    print(machine_line())
    offered = 0.0
    if not args.no_baseline:
        offered = run_case(
            args, "baseline: no admission control (queue bound only)", [*NO_ADMISSION], 0.0
        )
    run_case(args, "admission control (defaults)", args.server_arg, offered)
    print(machine_line())


if __name__ == "__main__":
    main()
