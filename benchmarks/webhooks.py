"""Webhook delivery end to end: deliveries/s, latency, a dead receiver, memory per idle
webhook subscription; beside a bare aiohttp loop posting the same bodies.

    python benchmarks/webhooks.py [--subscriptions 1000] [--receivers 100] [--procs 2]
                                  [--seconds 10] [--window 8] [--rate 2500]
                                  [--dead hang|refuse] [--idle 10000] [--skip ...]
                                  [--server-flag=--delivery-rate=100 ...]

Receivers: ``--receivers`` HTTP servers in ``--procs`` processes (raw
asyncio protocols, one ``200`` with an empty body per request, kept
alive), receiver ``i`` listening on its own loopback address
127.0.0.(2 + i), as receivers on a network each have their own host (the
delivery client's per-host caps apply per receiver). Each receiver notes
the receive time of every request, the unit it is about and the cursor in
its ``webhook-id``, and counts deliveries that repeat or go back.

The Field: ``field serve --in-memory --webhook-allow-net 127.0.0.0/8`` as a
child process. One agent per receiver holds ``subscriptions / receivers``
webhook subscriptions to ``memory.recorded`` (``min_relevance`` 0, no
debounce), each at its own path of that agent's receiver, so every RECORD
is one delivery per subscription. A writer agent records units over HTTP;
latency is from a RECORD's acknowledgement (``time.time()`` after its HTTP
200) to a delivery's receipt (all processes on one host, one clock). The
phases, one after the other on the same Field:

* **sustained**: for ``--seconds``, the writer records a unit whenever
  fewer than ``--window`` units' deliveries are outstanding, so that every
  delivery always has work queued (and never more than its small outbox
  holds): the rate the Field sustains. Deliveries/s = deliveries / (last
  receipt - first acknowledgement).
* **paced**: RECORDs at fixed times offering ``--rate`` deliveries/s (half
  the 5,000/s target) for ``--seconds``: latency p50 / p99.
* **dead**: the same, with receiver 0 dead (``hang``: it accepts and reads
  requests and never answers, so each of its deliveries holds a request
  until the client's timeout; ``refuse``: its port is closed). The other
  receivers' p99 is compared with theirs in the paced phase.

The baseline, in the same run once the Field has stopped: one process on
the same event loop (uvloop when installed, as ``field serve``) and with
its garbage-collector settings, with one ``aiohttp.ClientSession`` whose
connector has the Field's limits (256 in all, 32 per host), and 256 workers
POSTing a body the Field delivered, with its headers, to the subscriptions'
receivers, each taking the next request as soon as it is free: flat out,
as many as the sustained phase delivered (deliveries/s = deliveries / (last
receipt - first request)), and paced, one request per subscription at the
times of the paced phase's RECORDs (latency from the time a burst starts).

Memory (``--idle``): a fresh ``field serve`` with its log in a temporary
directory (so that the log's entries are on disk, not in the server's
memory), receivers up. The server's VmRSS is read after registering the
agents, after ``--idle`` stream subscriptions (read by their agents; the
reference), after as many webhook subscriptions (idle: nothing recorded),
and once each webhook has delivered one notification and gone idle again
(read when the delivery client has closed its idle connections).

A REGISTER, SUBSCRIBE or RECORD the Field refuses (``503 OVERLOADED``,
``429 RATE_LIMITED``) is waited out for its ``Retry-After`` and sent again,
the same envelope (the Field changed nothing for it, so no unit is recorded
twice), through ``fanout.py``'s clients; a refused RECORD's latencies count
from its accepted attempt. Lines after the table count the refusals of the
set-up and of each phase's RECORDs, by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _common import LOAD_RATES, ROLES, VOCABULARY, bracketed, envelope, pct, progress
from _refusals import Refusals
from fanout import (
    REFUSALS,
    ChildServer,
    FieldWriter,
    _post,
    cpu_seconds,
    paced,
    raise_nofile,
    rss_kb,
)

HOST = "127.0.0.1"
#: Where the Field may deliver (every receiver is on loopback), and every agent registering
#: from this one address at start.
ALLOW = ("--webhook-allow-net", "127.0.0.0/8", "--register-burst", "1000000")
#: The Field's delivery client limits (DeliverySettings defaults), used by the baseline too.
CONCURRENCY, CONCURRENCY_PER_HOST = 256, 32
#: Bytes of a receiver's answer the delivery client reads at most (as the Field).
MAX_RESPONSE_BYTES = 64 << 10
#: Seconds the main process waits for a phase's deliveries.
COLLECT_TIMEOUT = 60.0
#: HTTP requests under way at once while setting up.
SETUP_CONCURRENCY = 16
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
UNIT = b'"memory_unit_id":"'
WEBHOOK_ID = b"\r\nwebhook-id:"
CONTENT_LENGTH = b"\r\ncontent-length:"


def receiver_host(index: int) -> str:
    """Receiver ``index``'s own loopback address."""
    return f"127.0.{(2 + index) >> 8}.{(2 + index) & 255}"


# -- receivers (run in the receiver processes) ---------------------------------------


@dataclass(eq=False)
class Receiver:
    """One receiver: what it got, and whether it answers."""

    index: int
    slot: int
    counts: Any
    #: (receiver, path, unit id, receive time) of every delivery since the last collect
    receipts: list[tuple[int, bytes, bytes, float]]
    anomalies: collections.Counter[str]
    #: per path: the last cursor position received
    last: dict[bytes, int] = field(default_factory=dict)
    #: None: alive; "hang": reads and never answers; "refuse": closed
    dead: str | None = None
    server: Any = None
    hooks: set[Hook] = field(default_factory=set)
    sample: tuple[bytes, dict[str, str]] | None = None

    def received(self, head: bytes, body: bytes, now: float) -> None:
        path = head[head.find(b" ") + 1 : head.find(b" HTTP/")]
        at = body.find(UNIT)
        unit = body[at + len(UNIT) : body.find(b'"', at + len(UNIT))] if at >= 0 else b""
        self.receipts.append((self.index, path, unit, now))
        self.counts[self.slot] += 1
        if not path.startswith(b"/hook/"):
            return  # the baseline posts one body again and again
        lowered = head.lower()
        at = lowered.find(WEBHOOK_ID)
        if at < 0:
            self.anomalies["no webhook-id"] += 1
            return
        cursor = _value(head, at + len(WEBHOOK_ID)).strip()
        position = int(cursor.rpartition(b"-")[2])
        previous = self.last.get(path, 0)
        if position <= previous:
            self.anomalies["repeated" if position == previous else "went back"] += 1
        else:
            self.last[path] = position
        if self.sample is None:
            self.sample = (body, _headers(head))


def _value(head: bytes, start: int) -> bytes:
    """A header's value starting at ``start`` in a request head (its last line has no CRLF)."""
    end = head.find(b"\r\n", start)
    return head[start:] if end < 0 else head[start:end]


def _headers(head: bytes) -> dict[str, str]:
    """The signature and content headers of a request head, to post them again."""
    wanted = ("webhook-id", "webhook-timestamp", "webhook-signature", "x-hub-signature-256")
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() in wanted:
            out[name.strip()] = value.strip()
    return out


class Hook(asyncio.Protocol):
    """A lean HTTP/1.1 server connection: Content-Length bodies, a 200 per request."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.buf = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.receiver.hooks.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.receiver.hooks.discard(self)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf
        buf += data
        receiver = self.receiver
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            lowered = head.lower()
            at = lowered.find(CONTENT_LENGTH)
            length = int(_value(head, at + len(CONTENT_LENGTH))) if at >= 0 else 0
            total = end + 4 + length
            if len(buf) < total:
                return
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            if receiver.dead is None:
                receiver.received(head, body, now)
                self.transport.write(OK)


async def _receivers(pipe: Any, spec: dict[str, Any], counts: Any) -> None:
    loop = asyncio.get_running_loop()
    receipts: list[tuple[int, bytes, bytes, float]] = []
    anomalies: collections.Counter[str] = collections.Counter()
    receivers: dict[int, Receiver] = {}
    for index in spec["indices"]:
        receiver = Receiver(index, spec["slot"], counts, receipts, anomalies)
        receiver.server = await loop.create_server(
            lambda r=receiver: Hook(r), receiver_host(index), 0, backlog=1024
        )
        receivers[index] = receiver
    ports = {i: r.server.sockets[0].getsockname()[1] for i, r in receivers.items()}
    pipe.send(("ok", ports))
    while True:
        command = await loop.run_in_executor(None, pipe.recv)
        op = command[0]
        if op == "collect":
            reply = {
                "receipts": list(receipts),
                "anomalies": dict(anomalies),
            }
            receipts.clear()
            anomalies.clear()
            pipe.send(("ok", reply))
        elif op == "sample":
            found = next((r.sample for r in receivers.values() if r.sample), None)
            pipe.send(("ok", found))
        elif op == "dead":  # ("dead", index, mode or None)
            receiver = receivers.get(command[1])
            if receiver is not None:
                await _set_dead(receiver, command[2], ports[command[1]])
            pipe.send(("ok",))
        elif op == "forget":  # a new Field: cursors start again
            for receiver in receivers.values():
                receiver.last.clear()
            pipe.send(("ok",))
        elif op == "close":
            for receiver in receivers.values():
                receiver.server.close()
                for hook in list(receiver.hooks):
                    hook.transport.abort()
            pipe.send(("ok",))
            return


async def _set_dead(receiver: Receiver, mode: str | None, port: int) -> None:
    """Make a receiver hang, refuse connections, or come back (on its port)."""
    loop = asyncio.get_running_loop()
    if receiver.dead == "refuse" and mode != "refuse":
        receiver.server = await loop.create_server(
            lambda: Hook(receiver), receiver_host(receiver.index), port, backlog=1024
        )
    if mode == "refuse":
        receiver.server.close()
        for hook in list(receiver.hooks):
            hook.transport.abort()
    elif mode is None and receiver.dead == "hang":
        for hook in list(receiver.hooks):  # what hangs is never answered
            hook.transport.abort()
    receiver.dead = mode


def _receiver_main(pipe: Any, spec: dict[str, Any], counts: Any) -> None:
    raise_nofile()
    try:
        _run(_receivers(pipe, spec, counts))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


def _run(main: Any) -> Any:
    """Run a coroutine on uvloop when installed (as ``field serve`` does), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class ReceiverPool:
    """The receiver processes, and what they received."""

    def __init__(self, receivers: int, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.counts = ctx.Array("q", procs, lock=False)
        self.pipes: list[Any] = []
        self.processes: list[Any] = []
        self.urls: dict[int, str] = {}
        for p in range(procs):
            spec = {"indices": list(range(p, receivers, procs)), "slot": p}
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_receiver_main, args=(child, spec, self.counts))
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)
        for pipe in self.pipes:
            reply = self._reply(pipe, 60)
            for index, port in reply[1].items():
                self.urls[index] = f"http://{receiver_host(index)}:{port}"

    def _reply(self, pipe: Any, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise TimeoutError("a receiver process did not answer")
        reply = pipe.recv()
        if reply[0] == "error":
            raise RuntimeError("receiver process failed:\n" + reply[1])
        return reply

    def ask(self, command: tuple[Any, ...], timeout: float = 120) -> list[Any]:
        for pipe in self.pipes:
            pipe.send(command)
        return [self._reply(pipe, timeout) for pipe in self.pipes]

    def total(self) -> int:
        """Deliveries received so far, in all."""
        return sum(self.counts)

    def cpu(self) -> float:
        """CPU seconds the receiver processes have used."""
        return sum(cpu_seconds(process.pid) for process in self.processes)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask(("close",), timeout=10)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()


# -- the Field ----------------------------------------------------------------------


def start_field(*extra: str) -> tuple[ChildServer, int]:
    """``field serve`` on a free loopback port, delivering to loopback: (server, port)."""
    command = [sys.executable, "-m", "field", "serve", "--host", HOST, "--port", "0"]
    server = ChildServer(
        [*command, *ALLOW, *LOAD_RATES, *extra],
        re.compile(r"listening on http://127\.0\.0\.1:(\d+)"),
    )
    assert server.match is not None
    return server, int(server.match.group(1))


class Setup:
    """Agents and subscriptions over HTTP, a bounded number of requests at once."""

    def __init__(self, port: int) -> None:
        self.base = f"http://{HOST}:{port}"
        self.gate = asyncio.Semaphore(SETUP_CONCURRENCY)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=SETUP_CONCURRENCY)
        )
        self.done = 0

    async def register(self, agent: str, seed: int) -> tuple[str, int]:
        rng = random.Random(seed)
        payload = {
            "id": agent,
            "role": ROLES[seed % len(ROLES)],
            "interests": [" ".join(rng.sample(VOCABULARY, 2))],
        }
        async with self.gate:
            body = envelope("REGISTER", agent, payload)
            reply = await _post(self.session, self.base + "/v1/register", body, None)
        return reply["token"], reply["epoch"]

    async def subscribe(self, agent: str, token: str, url: str | None) -> str:
        subscription: dict[str, Any] = {
            "events": ["memory.recorded"],
            "min_relevance": 0,
            "debounce_ms": 0,
        }
        if url is not None:
            subscription["delivery"] = {"type": "webhook", "url": url}
        body = envelope("SUBSCRIBE", agent, {"action": "subscribe", "subscription": subscription})
        async with self.gate:
            reply = await _post(self.session, self.base + "/v1/subscribe", body, token)
        self.done += 1
        return str(reply["subscription_id"])

    async def close(self) -> None:
        await self.session.close()


async def subscribe_all(
    port: int,
    agents: list[str],
    urls: list[list[str | None]],
    label: str,
    tokens: dict[str, str] | None = None,
) -> dict[str, str]:
    """Give agent ``i`` one subscription per ``urls[i]`` (None: a stream), registering
    the agents not in ``tokens`` first; every agent's token."""
    setup = Setup(port)
    tokens = dict(tokens or {})
    total = sum(len(u) for u in urls)
    try:

        async def one(i: int, agent: str) -> None:
            if agent not in tokens:
                tokens[agent] = (await setup.register(agent, i))[0]
            await asyncio.gather(*(setup.subscribe(agent, tokens[agent], u) for u in urls[i]))

        task = asyncio.gather(*(one(i, a) for i, a in enumerate(agents)))
        while not task.done():
            progress(setup.done, total, label)
            await asyncio.wait([task], timeout=0.2)
        await task
        progress(total, total, label)
    finally:
        await setup.close()
    return tokens


async def sustained(
    writer: FieldWriter, pool: ReceiverPool, per_unit: int, window: int, seconds: float
) -> dict[str, float]:
    """Record whenever fewer than ``window`` units' deliveries are outstanding."""
    acks: dict[str, float] = {}
    start = pool.total()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while pool.total() - start < (len(acks) - window + 1) * per_unit:
            await asyncio.sleep(0.001)  # receivers count in other processes: poll
        unit, ack = await writer.one()
        acks[unit] = ack
    return acks


# -- measuring -------------------------------------------------------------------------


@dataclass
class Row:
    phase: str
    units: int
    expected: int
    delivered: int = 0
    rate: float = 0.0
    p50: float = float("nan")
    p99: float = float("nan")
    worst: float = float("nan")
    server_cpu: float = 0.0
    receivers_cpu: float = 0.0
    #: p99 of the receivers other than receiver 0
    others_p99: float = float("nan")
    anomalies: dict[str, int] = field(default_factory=dict)
    #: the phase's RECORDs the Field refused for now (waited out and sent again)
    refused: Refusals = field(default_factory=Refusals)


def wait_for(pool: ReceiverPool, target: int, timeout: float) -> None:
    """Until ``target`` deliveries have been received in all, or ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while pool.total() < target and time.monotonic() < deadline:
        time.sleep(0.005)  # receivers count in other processes: poll


def measure(
    pool: ReceiverPool,
    phase: str,
    acks: dict[str, float],
    expected: int,
    target: int,
    started: tuple[float, float, float],
    server_pid: int,
) -> Row:
    """Wait for a phase's deliveries and compute its row."""
    wait_for(pool, target, COLLECT_TIMEOUT)
    wall0, cpu0, receivers0 = started
    wall = time.monotonic() - wall0
    row = Row(phase, len(acks), expected)
    row.server_cpu = (cpu_seconds(server_pid) - cpu0) / wall * 100
    row.receivers_cpu = (pool.cpu() - receivers0) / wall * 100
    latencies: list[float] = []
    others: list[float] = []
    last = 0.0
    anomalies: collections.Counter[str] = collections.Counter()
    for _, reply in pool.ask(("collect",)):
        anomalies.update(reply["anomalies"])
        for receiver, _path, unit, now in reply["receipts"]:
            ack = acks.get(unit.decode())
            if ack is None:
                anomalies["not of this phase"] += 1
                continue
            latency = (now - ack) * 1000
            latencies.append(latency)
            if receiver:
                others.append(latency)
            last = max(last, now)
    row.delivered = len(latencies)
    row.anomalies = dict(anomalies)
    if latencies:
        row.rate = row.delivered / max(1e-9, last - min(acks.values()))
        row.p50, row.p99, row.worst = pct(latencies, 0.5), pct(latencies, 0.99), max(latencies)
        row.others_p99 = pct(others, 0.99) if others else float("nan")
    return row


def deliveries(args: argparse.Namespace, pool: ReceiverPool) -> tuple[list[Row], Any]:
    """The Field's phases; (rows, a delivered request to post again in the baseline)."""
    server, port = start_field("--in-memory", *args.server_flag)
    rows: list[Row] = []
    spy: subprocess.Popen[bytes] | None = None
    try:
        per_receiver = args.subscriptions // args.receivers
        agents = [f"hooks-{i}" for i in range(args.receivers)]
        urls: list[list[str | None]] = [
            [f"{pool.urls[i]}/hook/{j}" for j in range(per_receiver)] for i in range(args.receivers)
        ]
        asyncio.run(subscribe_all(port, agents, urls, "subscribe"))
        subscriptions = per_receiver * args.receivers
        if args.profile:  # sample the server's stacks during the phases
            spy = subprocess.Popen(
                ["py-spy", "record", "--pid", str(server.pid), "--rate", "250"]
                + ["--format", "raw", "--output", args.profile, "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        writer = FieldWriter(port, topic="webhooks")

        async def phases() -> None:
            await writer.start()
            try:
                # warm up: every delivery opens its connections
                before = pool.total()
                acks = {u: a for u, a in [await writer.one() for _ in range(3)]}
                await asyncio.to_thread(wait_for, pool, before + 3 * subscriptions, 60)
                pool.ask(("collect",))
                for phase in args.phases:
                    if phase == "dead":
                        pool.ask(("dead", 0, args.dead))
                    before = pool.total()
                    started = (time.monotonic(), cpu_seconds(server.pid), pool.cpu())
                    REFUSALS.add(writer.refusals)  # its REGISTER and warm-up: set-up
                    writer.refusals = Refusals()
                    if phase == "sustained":
                        acks = await sustained(
                            writer, pool, subscriptions, args.window, args.seconds
                        )
                    else:
                        units = max(1, round(args.rate / subscriptions * args.seconds))
                        acks = await paced(writer, units, args.rate / subscriptions)
                    expected = len(acks) * subscriptions
                    if phase == "dead":
                        expected = len(acks) * (subscriptions - per_receiver)
                    row = await asyncio.to_thread(
                        measure,
                        pool,
                        phase,
                        acks,
                        expected,
                        before + expected,
                        started,
                        server.pid,
                    )
                    row.refused = writer.refusals
                    rows.append(row)
                    print(
                        f"{phase}: {row.delivered:,}/{row.expected:,} delivered",
                        file=sys.stderr,
                    )
                    if phase == "dead":
                        pool.ask(("dead", 0, None))
            finally:
                await writer.close()

        asyncio.run(phases())
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        sample = next((r[1] for r in pool.ask(("sample",)) if r[1]), None)
    finally:
        server.stop()
        if server.process.returncode not in (0, None):
            print("\n".join(server.lines), file=sys.stderr)
    return rows, sample


# -- the baseline: a bare loop of the same client ------------------------------------------


async def _bare(spec: dict[str, Any]) -> Any:
    """POST the body ``count`` times to every URL: flat out, or (``interval`` set) to all
    URLs at once every ``interval`` seconds, request ``k`` to ``<url>/<k>``; in both,
    :data:`CONCURRENCY` workers take the next request as soon as they are free (the
    client's limit, so that no request waits in aiohttp). (start time, CPU s, failures)."""
    urls, body, count, interval = spec["urls"], spec["body"], spec["count"], spec["interval"]
    connector = aiohttp.TCPConnector(limit=CONCURRENCY, limit_per_host=CONCURRENCY_PER_HOST)
    session = aiohttp.ClientSession(
        connector=connector,
        headers={"User-Agent": "akashik-field benchmark"},
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=15, sock_connect=5),
    )
    sent = {"Content-Type": "application/json", **spec["headers"]}
    failures: collections.Counter[str] = collections.Counter()

    async def worker(jobs: collections.deque[str]) -> None:
        while jobs:
            try:
                post = session.post(jobs.popleft(), data=body, headers=sent, allow_redirects=False)
                async with post as answer:
                    await answer.content.read(MAX_RESPONSE_BYTES)
                    if answer.status != 200:
                        failures[str(answer.status)] += 1
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                failures[type(exc).__name__] += 1

    def run(jobs: list[str]) -> Any:
        queue = collections.deque(jobs)
        return asyncio.gather(*(worker(queue) for _ in range(CONCURRENCY)))

    async with session:
        # open the connections first, as the Field's warm-up does
        await run([f"{url}/warm" for url in urls])
        loop = asyncio.get_running_loop()
        start = time.time()
        cpu = time.process_time()
        if interval is None:
            await run([url for _ in range(count) for url in urls])
        else:
            bursts = []
            began = loop.time()
            for k in range(count):
                await asyncio.sleep(max(0.0, began + k * interval - loop.time()))
                bursts.append(run([f"{url}/{k}" for url in urls]))
            await asyncio.gather(*bursts)
        return start, time.process_time() - cpu, dict(failures)


def _bare_main(pipe: Any, spec: dict[str, Any]) -> None:
    from field.cli.main import _tune_gc

    try:
        _tune_gc()  # the collector's settings of ``field serve``
        pipe.send(("ok", _run(_bare(spec))))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


def baseline(
    args: argparse.Namespace, pool: ReceiverPool, sample: Any, count: int, paced: bool
) -> Row:
    """The bare loop, ``count`` POSTs per subscription, flat out or paced; its row."""
    body, headers = sample
    per_receiver = args.subscriptions // args.receivers
    urls = [f"{pool.urls[i]}/bare/{j}" for i in range(args.receivers) for j in range(per_receiver)]
    interval = len(urls) / args.rate if paced else None
    spec = {"urls": urls, "body": body, "headers": headers, "count": count, "interval": interval}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    before, receivers0 = pool.total(), pool.cpu()
    process = ctx.Process(target=_bare_main, args=(child, spec))
    process.start()
    child.close()
    reply = parent.recv()
    process.join()
    if reply[0] == "error":
        raise RuntimeError("the bare loop failed:\n" + reply[1])
    start, cpu, failures = reply[1]
    wait_for(pool, before + len(urls) * (count + 1), COLLECT_TIMEOUT)
    latencies: list[float] = []
    last = 0.0
    for _, collected in pool.ask(("collect",)):
        for _, path, _unit, now in collected["receipts"]:
            k = path.rpartition(b"/")[2]
            if k == b"warm" or not path.startswith(b"/bare/"):
                continue
            last = max(last, now)
            sent = start + int(k) * interval if interval is not None else start
            latencies.append((now - sent) * 1000)
    row = Row("bare paced" if paced else "bare loop", count, len(urls) * count, len(latencies))
    wall = max(1e-9, last - start)
    row.rate = len(latencies) / wall
    row.server_cpu = cpu / wall * 100
    row.receivers_cpu = (pool.cpu() - receivers0) / wall * 100
    if latencies and paced:
        row.p50, row.p99, row.worst = pct(latencies, 0.5), pct(latencies, 0.99), max(latencies)
    row.anomalies = failures
    return row


# -- memory per idle webhook subscription ---------------------------------------------------


def memory(args: argparse.Namespace, pool: ReceiverPool) -> dict[str, float]:
    """VmRSS of a Field with agents, then stream subscriptions, then webhook ones (kB)."""
    per_agent = 100  # the Field's default cap of subscriptions per agent
    agents = max(1, args.idle // per_agent)
    count = agents * per_agent
    with tempfile.TemporaryDirectory(prefix="field-webhooks-") as data:
        server, port = start_field("--data-dir", data, "--sync", "normal", *args.server_flag)
        readings: dict[str, float] = {"count": count}
        try:
            time.sleep(args.settle)
            readings["fresh"] = rss_kb(server.pid)
            streams = [f"streams-{i}" for i in range(agents)]
            hooks = [f"idle-{i}" for i in range(agents)]

            none: list[list[str | None]] = [[] for _ in range(2 * agents)]
            tokens = asyncio.run(subscribe_all(port, streams + hooks, none, "agents"))
            time.sleep(args.settle)
            readings["agents"] = rss_kb(server.pid)
            nones: list[list[str | None]] = [[None] * per_agent for _ in range(agents)]
            asyncio.run(subscribe_all(port, streams, nones, "streams", tokens))
            time.sleep(args.settle)
            readings["streams"] = rss_kb(server.pid)
            urls: list[list[str | None]] = [
                [f"{pool.urls[i % len(pool.urls)]}/hook/{i}-{j}" for j in range(per_agent)]
                for i in range(agents)
            ]
            asyncio.run(subscribe_all(port, hooks, urls, "webhooks", tokens))
            time.sleep(args.settle)
            readings["webhooks"] = rss_kb(server.pid)

            async def one_each() -> None:
                writer = FieldWriter(port, topic="webhooks")
                await writer.start()
                try:
                    before = pool.total()
                    await writer.one()
                    await asyncio.to_thread(wait_for, pool, before + count, 120)
                finally:
                    await writer.close()

            descriptors = open_fds(server.pid)
            asyncio.run(one_each())
            pool.ask(("collect",))
            # the delivery client keeps connections for a while (aiohttp: 15 s after their
            # last request): read once they are closed, so what is left is the sinks'
            deadline = time.monotonic() + 90
            while open_fds(server.pid) > descriptors + 8 and time.monotonic() < deadline:
                time.sleep(1)  # the server closes them on its own timer: poll
            readings["connections"] = open_fds(server.pid) - descriptors
            time.sleep(args.settle)
            readings["delivered"] = rss_kb(server.pid)
        finally:
            server.stop()
    return readings


def open_fds(pid: int) -> int:
    """How many file descriptors a process holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- main ----------------------------------------------------------------------------


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nWebhook delivery: {args.subscriptions:,} subscriptions over {args.receivers} "
        f"receivers ({args.procs} processes); sustained: at most {args.window} units "
        f"outstanding; paced and dead: {args.rate:,.0f} deliveries/s offered; "
        f"{args.seconds:g} s each; dead receiver: {args.dead}"
    )
    print(
        f"{'phase':<11}{'units':>6}{'delivered':>11}{'deliv./s':>10}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}{'p99 others':>11}{'CPU':>6}{'rcv CPU':>8}"
    )
    for r in rows:
        print(
            f"{r.phase:<11}{r.units:>6}{r.delivered:>11,}{r.rate:>10,.0f}{r.p50:>9.1f}"
            f"{r.p99:>9.1f}{r.worst:>9.1f}{r.others_p99:>11.1f}{r.server_cpu:>5.0f}%"
            f"{r.receivers_cpu:>7.0f}%"
        )
    for r in rows:
        if r.delivered != r.expected or r.anomalies:
            print(
                f"  ! {r.phase}: {r.delivered:,} of {r.expected:,} delivered; {r.anomalies or ''}"
            )
    print(f"refused, set-up (REGISTER, SUBSCRIBE, the first RECORDs): {REFUSALS.describe()}")
    for r in rows:
        if r.refused:
            print(f"refused, {r.phase} RECORDs: {r.refused.describe()}")
    by = {r.phase: r for r in rows}
    if "sustained" in by and "bare loop" in by and by["bare loop"].rate:
        ratio = by["sustained"].rate / by["bare loop"].rate
        print(f"sustained: {ratio:.2f}x the bare loop's deliveries/s")
    if "paced" in by and "bare paced" in by and by["bare paced"].p99:
        ratio = by["paced"].p99 / by["bare paced"].p99
        print(f"paced: p99 {ratio:.2f}x the bare loop's posting the same bursts")
    if "paced" in by and "dead" in by and by["paced"].others_p99:
        ratio = by["dead"].others_p99 / by["paced"].others_p99
        print(f"dead receiver: the others' p99 is {ratio:.2f}x theirs without it")


def report_memory(readings: dict[str, float]) -> None:
    count = int(readings["count"])
    print(
        f"\nServer resident memory (VmRSS, MB), log on disk; {count:,} subscriptions of each "
        "kind; readings after each step"
    )
    for key in ("fresh", "agents", "streams", "webhooks", "delivered"):
        print(f"  {key:<10}{readings[key] / 1024:>8.1f}")
    stream = (readings["streams"] - readings["agents"]) / count
    hook = (readings["webhooks"] - readings["streams"]) / count
    after = (readings["delivered"] - readings["streams"]) / count
    print(f"per stream subscription (reference): {stream:.2f} KB")
    print(f"per idle webhook subscription: {hook:.2f} KB ({hook - stream:+.2f} KB beside a stream)")
    print(
        f"per webhook subscription once it has delivered one notification and the client's "
        f"connections have closed ({readings['connections']:+.0f} descriptors): {after:.2f} KB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--receivers", type=int, default=100)
    parser.add_argument("--procs", type=int, default=2, help="receiver processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--window", type=int, default=8, help="units outstanding (sustained)")
    parser.add_argument("--rate", type=float, default=2500, help="deliveries/s offered (paced)")
    parser.add_argument("--dead", choices=("hang", "refuse"), default="hang")
    parser.add_argument("--idle", type=int, default=10_000, help="idle webhook subscriptions")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before RSS readings")
    parser.add_argument(
        "--phases",
        nargs="*",
        default=["sustained", "paced", "dead"],
        choices=("sustained", "paced", "dead"),
    )
    parser.add_argument(
        "--profile", help="write py-spy's raw samples of the server during the phases here"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=("baseline", "memory"))
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="an extra flag for field serve (repeatable), e.g. --server-flag=--delivery-rate=100",
    )
    args = parser.parse_args()
    if args.subscriptions % args.receivers or args.receivers > 250:
        parser.error("--subscriptions must be a multiple of --receivers (at most 250)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop children on the way out
    raise_nofile()
    pool = ReceiverPool(args.receivers, args.procs)
    try:
        rows: list[Row] = []
        if args.phases:
            found, sample = deliveries(args, pool)
            rows.extend(found)
            pool.ask(("forget",))
            sustained_row = next((r for r in rows if r.phase == "sustained"), None)
            if "baseline" not in args.skip and sample is not None:
                count = sustained_row.units if sustained_row else 20
                rows.append(baseline(args, pool, sample, count, paced=False))
                units = max(1, round(args.rate / args.subscriptions * args.seconds))
                rows.append(baseline(args, pool, sample, units, paced=True))
            report(rows, args)
        if "memory" not in args.skip:
            report_memory(memory(args, pool))
    finally:
        pool.close()
    print(
        "targets: >= 5,000 deliveries/s and >= 0.7x the bare loop; p99 <= 100 ms at 2,500/s; "
        "the others' p99 within 1.5x with a dead receiver; <= 2 KB per idle webhook subscription"
    )


if __name__ == "__main__":
    bracketed(main)
