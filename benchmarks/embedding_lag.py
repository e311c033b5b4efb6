"""Embedding after the commit: push latency pays for a sentence model, writes and the loop do not.

    python benchmarks/embedding_lag.py [--embedders hashing minilm] [--rate 20] [--seconds 10]
                                       [--rounds 1] [--burst 2000] [--clients 16]
                                       [--blas-threads N]

For each embedder of ``--embedders`` (alternating, the order flipped every
round), starts a ``field serve --embedder NAME`` on loopback with a fresh
data directory (a durable SQLite log), registers a writer agent and a reader
agent (interests ``market prices`` and ``customer churn``); the reader
SUBSCRIBEs to ``memory.recorded`` with ``min_relevance`` 0 and reads its
notifications over WebSocket with the SDK (``field.client``). The contents
are the 1,340 units of ``data/relevance.json`` (sentences as colleagues
would record them, 85 characters on average), shuffled, each made unique
with a counter. Two phases, a probe beside both:

* **paced**: the writer sends RECORD open loop at ``--rate`` per second for
  ``--warmup`` + ``--seconds`` seconds (the first unit, before, is waited
  for: the stream is connected and the model has run once). Measured over
  the RECORDs sent in the last ``--seconds``: the **push latency** (the
  accepted RECORD's sending to its notification's arrival, matched by
  ``memory_unit_id``), the **RECORD latency** (sending to acknowledgement),
  and how many notifications arrived; after the writes stop, the stragglers
  are waited for ``--straggle`` seconds at most and any still missing fail
  the run.
* **burst**: ``--burst`` RECORDs as fast as ``--clients`` HTTP clients
  (closed loop, one connection and one writer agent each) can have them
  acknowledged: RECORD/s, then how long until ``embedding.queued`` of the
  status page is 0 again (sampled by the probe) and every notification has
  arrived (``--drain-timeout`` at most), from the burst's first RECORD.
* **probe**: ``GET /v1/field/status`` every 50 ms on its own connection, one
  at a time (the next is sent at once after a late answer), the whole run:
  its latency in each phase (the event loop's responsiveness) and the most
  units queued for embedding (``embedding.queued``) and entries held back
  (``embedding.held_entries``) it saw.

Prints one table, a column per embedder (the median over the rounds) and
the ratio of every other embedder to the first (the baseline, run in the
same command), then the machine's readings. ``--blas-threads N`` sets the
servers' ``OPENBLAS_NUM_THREADS`` (and ``OMP_``, ``MKL_``): a sentence
model's products run on the BLAS's threads, one per CPU by default. A RECORD the Field refuses for
now (``503 OVERLOADED``, ``429 RATE_LIMITED``) is waited out for its
``Retry-After`` and sent again (``_refusals.py``); its latencies are the
accepted attempt's, and the refusals are counted per phase. After each run
the script checks that the status page counts every acknowledged unit, that
nothing is left queued or held, and what ``field_embedding_queue_units``
of ``/metrics`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import bracketed, envelope, pct, progress
from _refusals import Refusals, post
from writes import TYPES, FieldServer, new_loop, register

from field.client import AgentClient, FieldClient, Notification, Subscription

#: Seconds between two probes of the status page.
PROBE_PERIOD = 0.05
READER_INTERESTS = ["market prices", "customer churn"]
#: Seconds to wait for the first unit's notification (the stream connecting, the model's
#: first run).
PRIME_TIMEOUT = 120.0
#: What sets how many threads NumPy's BLAS runs a product on (``--blas-threads``).
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_FAILURE = re.compile(r"ERROR|CRITICAL|Traceback|Error:|failed", re.IGNORECASE)
_TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\d |^INFO:|^WARNING:")
_METRIC = re.compile(r"^field_embedding_queue_units(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


# -- what is written ------------------------------------------------------------------


def load_contents() -> list[dict[str, Any]]:
    """The units of the relevance set: (type, content, purpose, confidence), shuffled."""
    data = json.loads((Path(__file__).resolve().parent / "data" / "relevance.json").read_text())
    units = [
        {
            # types that need more than a content (a question, a correction) are observations
            "type": unit["type"] if unit["type"] in TYPES else "observation",
            "content": unit["content"],
            "purpose": unit.get("purpose") or "share what was seen",
            "confidence": float(unit.get("confidence") or 0.7),
        }
        for unit in data["units"]
    ]
    random.Random(7).shuffle(units)
    return units


class Contents:
    """RECORD payloads over the relevance set's units, in turn, each unique."""

    def __init__(self, units: list[dict[str, Any]]) -> None:
        self.units = units
        self.made = 0

    def payload(self) -> dict[str, Any]:
        unit = self.units[self.made % len(self.units)]
        self.made += 1
        return {
            "mode": "committed",
            "type": unit["type"],
            "content": f"{unit['content']} ({self.made})",
            "intent": {"purpose": unit["purpose"], "task_id": "task-1"},
            "confidence": {"score": unit["confidence"], "reasoning": "benchmark"},
        }


# -- one run --------------------------------------------------------------------------


@dataclass
class Sent:
    """One acknowledged RECORD: its accepted attempt's sending and answer (perf_counter)."""

    unit: str
    began: float
    ended: float


@dataclass
class ProbeSample:
    sent: float
    seconds: float
    queued: int
    held: int


@dataclass
class Phase:
    sent: list[Sent] = field(default_factory=list)
    refusals: Refusals = field(default_factory=Refusals)
    errors: Counter[str] = field(default_factory=Counter)
    window: tuple[float, float] = (0.0, 0.0)
    server_cpu: float = 0.0


@dataclass
class Run:
    embedder: str
    paced: Phase = field(default_factory=Phase)
    burst: Phase = field(default_factory=Phase)
    #: memory_unit_id -> perf_counter when its notification arrived (the first time)
    arrivals: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    #: stream events other than notifications (overflow, disconnected, gap, ended)
    stream_events: Counter[str] = field(default_factory=Counter)
    probes: list[ProbeSample] = field(default_factory=list)
    probe_failures: Counter[str] = field(default_factory=Counter)
    #: perf_counter of the burst's last acknowledgement, of the queue seen empty after it,
    #: and of the last notification of the burst (None: never, within the bound)
    burst_acked: float = 0.0
    burst_embedded: float | None = None
    burst_pushed: float | None = None
    #: checks at the end
    acknowledged: int = 0
    status_units: int = -1
    after_commit: bool | None = None
    left_queued: int = -1
    left_held: int = -1
    metric_queue: str = "?"
    #: the server's last lines on stderr that tell of a failure
    server_errors: list[str] = field(default_factory=list)
    #: the server's CPU seconds so far
    server_cpu: Callable[[], float] = lambda: 0.0
    figures: dict[str, float | None] = field(default_factory=dict)

    def missing(self, phase: Phase) -> list[Sent]:
        return [s for s in phase.sent if s.unit not in self.arrivals]

    def measured(self) -> list[Sent]:
        t0, t1 = self.paced.window
        return [s for s in self.paced.sent if t0 <= s.began < t1]

    def probes_in(self, t0: float, t1: float) -> list[ProbeSample]:
        return [p for p in self.probes if t0 <= p.sent < t1]

    @property
    def failures(self) -> list[str]:
        found = []
        for name, phase in (("paced", self.paced), ("burst", self.burst)):
            if phase.errors:
                found.append(f"{name}: RECORDs failed: {dict(phase.errors)}")
            missing = self.missing(phase)
            if missing:
                found.append(f"{name}: {len(missing):,} of {len(phase.sent):,} notifications "
                             f"never arrived (e.g. {missing[0].unit})")  # fmt: skip
        if self.status_units != self.acknowledged:
            found.append(
                f"the status page counts {self.status_units:,} units, "
                f"{self.acknowledged:,} were acknowledged"
            )
        if self.left_queued or self.left_held:
            found.append(
                f"at the end {self.left_queued} units still queued for embedding, "
                f"{self.left_held} entries held"
            )
        if self.duplicates:
            found.append(f"{self.duplicates} notifications came twice")
        return found


async def status(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/field/status") as response:
        answer: dict[str, Any] = orjson.loads(await response.read())
        return answer


async def probe(url: str, run: Run, stop: asyncio.Event) -> None:
    """GET the status page every PROBE_PERIOD, one request at a time, until ``stop``."""
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        due = time.perf_counter()
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                async with session.get(f"{url}/v1/field/status") as response:
                    raw = await response.read()
                    code = response.status
            except aiohttp.ClientError as error:
                run.probe_failures[type(error).__name__] += 1
                code, raw = 0, b""
            ended = time.perf_counter()
            if code == 200:
                embedding = orjson.loads(raw).get("embedding") or {}
                queued, held = embedding.get("queued", 0), embedding.get("held_entries", 0)
                run.probes.append(ProbeSample(sent, ended - sent, queued, held))
            elif code:
                run.probe_failures[f"HTTP {code}"] += 1
            due = max(due + PROBE_PERIOD, ended)  # late: the next at once, no catching up
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), due - time.perf_counter())


async def read(agent: AgentClient, subscription: Subscription, run: Run) -> None:
    """The reader's WebSocket stream: when each unit's notification arrived."""
    async with agent.notifications(subscription, control=True) as stream:
        async for item in stream:
            now = time.perf_counter()
            if isinstance(item, Notification):
                unit = item.memory_unit_id
                if unit is None:
                    continue
                if unit in run.arrivals:
                    run.duplicates += 1
                else:
                    run.arrivals[unit] = now
            else:
                reason = getattr(item, "reason", "")
                run.stream_events[f"{item.kind} ({reason})" if reason else item.kind] += 1


class Writer:
    """One writer agent's RECORDs over ``session``, refusals waited out and counted."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, agent: str, contents: Contents
    ) -> None:
        self.session, self.url, self.agent, self.contents = session, url, agent, contents
        self.token, self.epoch = "", 0

    async def register(self, refusals: Refusals) -> None:
        self.token, self.epoch = await register(self.session, self.url, self.agent, refusals)

    async def record(self, phase: Phase) -> Sent | None:
        body = orjson.dumps(envelope("RECORD", self.agent, self.contents.payload(), self.epoch))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        reply = await post(self.session, f"{self.url}/v1/record", body, headers, phase.refusals)
        answer = reply.answer if isinstance(reply.answer, dict) else {}
        if reply.status != 200 or answer.get("status") != "accepted":
            phase.errors[f"{reply.status} {answer.get('code')}"] += 1
            return None
        self.epoch = max(self.epoch, answer["epoch"])
        sent = Sent(answer["memory_unit_id"], reply.began, reply.ended)
        phase.sent.append(sent)
        return sent


async def wait_until(done: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    deadline = time.perf_counter() + timeout
    while not done():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(step)
    return True


async def paced(writer: Writer, run: Run, args: argparse.Namespace, label: str) -> None:
    """RECORD open loop at ``args.rate`` per second for warm-up + measured seconds."""
    phase = run.paced
    start = time.perf_counter()
    phase.window = (start + args.warmup, start + args.warmup + args.seconds)
    total = int((args.warmup + args.seconds) * args.rate)
    tasks: list[asyncio.Task[Sent | None]] = []
    cpu = 0.0
    for i in range(total):
        due = start + i / args.rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        if i == int(args.warmup * args.rate):
            cpu = run.server_cpu()
        tasks.append(asyncio.create_task(writer.record(phase)))
        progress(i, total, label)
    await asyncio.sleep(max(0.0, phase.window[1] - time.perf_counter()))
    phase.server_cpu = run.server_cpu() - cpu
    await asyncio.gather(*tasks)
    progress(total, total, label)


async def burst(writers: list[Writer], run: Run, args: argparse.Namespace, label: str) -> None:
    """``args.burst`` RECORDs, closed loop, one client per writer."""
    phase = run.burst
    indices: Iterator[int] = iter(range(args.burst))

    async def client(writer: Writer) -> None:
        for i in indices:  # shared: each index is taken once
            await writer.record(phase)
            progress(i, args.burst, label)

    start = time.perf_counter()
    cpu = run.server_cpu()
    await asyncio.gather(*(client(w) for w in writers))
    run.burst_acked = time.perf_counter()
    progress(args.burst, args.burst, label)
    units = [s.unit for s in phase.sent]
    pushed = await wait_until(
        lambda: all(u in run.arrivals for u in units), args.drain_timeout, step=0.01
    )
    embedded = [p for p in run.probes if p.sent >= run.burst_acked and p.queued == 0]
    run.burst_embedded = embedded[0].sent if embedded else None
    if pushed and units:
        run.burst_pushed = max(run.arrivals[u] for u in units)
    end = time.perf_counter()
    if run.burst_embedded is None:  # not seen empty yet: the probe's next answer
        seen = len(run.probes)
        await wait_until(lambda: len(run.probes) > seen, 10.0)
        embedded = [p for p in run.probes[seen:] if p.queued == 0]
        run.burst_embedded = embedded[0].sent if embedded else None
    phase.window = (start, end)
    phase.server_cpu = run.server_cpu() - cpu


async def drive(server: FieldServer, run: Run, args: argparse.Namespace) -> None:
    url = server.url
    contents = Contents(load_contents())
    setup = Refusals()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session, FieldClient(url) as sdk:
        writer = Writer(session, url, "writer", contents)
        await writer.register(setup)
        burst_sessions = [
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            for _ in range(args.clients)
        ]
        try:
            writers = [
                Writer(s, url, f"burst-{i:02d}", contents) for i, s in enumerate(burst_sessions)
            ]
            for w in writers:
                await w.register(setup)
            reader = await sdk.register("reader", "analyst", interests=READER_INTERESTS)
            news = await reader.subscribe(["memory.recorded"], min_relevance=0)
            reading = asyncio.create_task(read(reader, news, run))
            probing = asyncio.create_task(probe(url, run, stop))
            try:
                await run_phases(writer, writers, run, args)
            finally:
                stop.set()
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
                await probing
        finally:
            for s in burst_sessions:
                await s.close()
        if setup:
            print(f"  {run.embedder}: set-up refused {setup.describe()}", file=sys.stderr)
        answer = await status(session, url)
        run.status_units = sum(answer["counts"]["memory_units"].values())
        embedding = answer.get("embedding") or {}
        run.after_commit = embedding.get("after_commit")
        run.left_queued = embedding.get("queued", -1)
        run.left_held = embedding.get("held_entries", -1)
        async with session.get(f"{url}/metrics") as response:
            found = _METRIC.search(await response.text())
            run.metric_queue = found.group(1) if found else "absent"


async def run_phases(
    writer: Writer, writers: list[Writer], run: Run, args: argparse.Namespace
) -> None:
    label = f"{run.embedder}"
    prime = Phase()
    first = await writer.record(prime)
    if first is None or not await wait_until(lambda: first.unit in run.arrivals, PRIME_TIMEOUT):
        raise RuntimeError(f"{run.embedder}: the first unit's notification never came")
    await paced(writer, run, args, f"{label}/paced")
    units = [s.unit for s in run.paced.sent]
    await wait_until(lambda: all(u in run.arrivals for u in units), args.straggle)
    # the burst starts on an empty embedding queue
    await wait_until(lambda: bool(run.probes) and run.probes[-1].queued == 0, args.straggle)
    await burst(writers, run, args, f"{label}/burst")
    run.acknowledged = 1 + len(run.paced.sent) + len(run.burst.sent)


def failures_of(lines: list[str]) -> list[str]:
    """The lines of ``lines`` that tell of a failure, each with its traceback."""
    found: list[str] = []
    inside = False
    for line in lines:
        if _TIMESTAMPED.match(line):
            inside = bool(_FAILURE.search(line))
        elif _FAILURE.search(line):
            inside = True
        if inside:
            found.append(line)
    return found


def run_case(args: argparse.Namespace, embedder: str) -> Run:
    run = Run(embedder)
    with tempfile.TemporaryDirectory(prefix="field-embedding-lag-") as tmp:
        flags = ["--embedder", embedder, "--sync", args.sync, "--log-level", "info"]
        env: dict[str, str] = {}
        if args.blas_threads is not None:
            env = {name: str(args.blas_threads) for name in BLAS_THREADS}
        with FieldServer(Path(tmp) / "data", *flags, env=env) as server:
            run.server_cpu = server.cpu_seconds
            loop, _ = new_loop()
            try:
                loop.run_until_complete(drive(server, run, args))
            finally:
                loop.close()
        server.stop()
        run.server_errors = failures_of(server.lines)
    run.figures = figures(run, args)
    return run


# -- figures --------------------------------------------------------------------------

#: (key, label, format) of each row of the table; a None value prints as "-".
ROWS: list[tuple[str, str, str]] = [
    ("push_p50", "paced: push latency p50 ms", ",.1f"),
    ("push_p99", "paced: push latency p99 ms", ",.1f"),
    ("push_max", "paced: push latency max ms", ",.1f"),
    ("received", "paced: notifications received %", ".1f"),
    ("record_p50", "paced: RECORD latency p50 ms", ",.2f"),
    ("record_p99", "paced: RECORD latency p99 ms", ",.2f"),
    ("probe_p50", "paced: status probe p50 ms", ",.2f"),
    ("probe_p99", "paced: status probe p99 ms", ",.2f"),
    ("probe_max", "paced: status probe max ms", ",.2f"),
    ("queued_max", "paced: most units queued", ",.0f"),
    ("held_max", "paced: most entries held", ",.0f"),
    ("cpu", "paced: server CPU %", ",.0f"),
    ("burst_rate", "burst: RECORD/s", ",.0f"),
    ("burst_record_p50", "burst: RECORD latency p50 ms", ",.1f"),
    ("burst_record_p99", "burst: RECORD latency p99 ms", ",.1f"),
    ("burst_acked", "burst: all acknowledged, s", ",.2f"),
    ("burst_embedded", "burst: queue empty again, s", ",.2f"),
    ("burst_pushed", "burst: all notifications in, s", ",.2f"),
    ("burst_drain", "burst: drain after last ack, s", ",.2f"),
    ("burst_push_p50", "burst: push latency p50 ms", ",.0f"),
    ("burst_push_p99", "burst: push latency p99 ms", ",.0f"),
    ("burst_probe_p50", "burst: status probe p50 ms", ",.2f"),
    ("burst_probe_p99", "burst: status probe p99 ms", ",.2f"),
    ("burst_probe_max", "burst: status probe max ms", ",.2f"),
    ("burst_queued_max", "burst: most units queued", ",.0f"),
    ("burst_cpu", "burst: server CPU %", ",.0f"),
    ("refused", "RECORDs refused (both phases)", ",.0f"),
]


def figures(run: Run, args: argparse.Namespace) -> dict[str, float | None]:
    ms = 1000.0
    measured = run.measured()
    pushes = [(run.arrivals[s.unit] - s.began) * ms for s in measured if s.unit in run.arrivals]
    records = [(s.ended - s.began) * ms for s in measured]
    probes = run.probes_in(*run.paced.window)
    paced_seconds = run.paced.window[1] - run.paced.window[0]
    found: dict[str, float | None] = {
        "push_p50": pct(pushes, 0.5) if pushes else None,
        "push_p99": pct(pushes, 0.99) if pushes else None,
        "push_max": max(pushes) if pushes else None,
        "received": 100.0 * len(pushes) / len(measured) if measured else None,
        "record_p50": pct(records, 0.5) if records else None,
        "record_p99": pct(records, 0.99) if records else None,
        "probe_p50": pct([p.seconds * ms for p in probes], 0.5) if probes else None,
        "probe_p99": pct([p.seconds * ms for p in probes], 0.99) if probes else None,
        "probe_max": max(p.seconds for p in probes) * ms if probes else None,
        "queued_max": max((p.queued for p in probes), default=0),
        "held_max": max((p.held for p in probes), default=0),
        "cpu": 100.0 * run.paced.server_cpu / paced_seconds,
    }
    phase = run.burst
    start, end = phase.window
    sent = phase.sent
    records = [(s.ended - s.began) * ms for s in sent]
    pushes = [(run.arrivals[s.unit] - s.began) * ms for s in sent if s.unit in run.arrivals]
    probes = run.probes_in(start, end)
    acked = run.burst_acked - start
    embedded = None if run.burst_embedded is None else max(0.0, run.burst_embedded - start)
    pushed = None if run.burst_pushed is None else run.burst_pushed - start
    drain = None
    if embedded is not None and pushed is not None:
        drain = max(0.0, max(embedded, pushed) - acked)
    found |= {
        "burst_rate": len(sent) / acked if acked > 0 else None,
        "burst_record_p50": pct(records, 0.5) if records else None,
        "burst_record_p99": pct(records, 0.99) if records else None,
        "burst_acked": acked,
        "burst_embedded": embedded,
        "burst_pushed": pushed,
        "burst_drain": drain,
        "burst_push_p50": pct(pushes, 0.5) if pushes else None,
        "burst_push_p99": pct(pushes, 0.99) if pushes else None,
        "burst_probe_p50": pct([p.seconds * ms for p in probes], 0.5) if probes else None,
        "burst_probe_p99": pct([p.seconds * ms for p in probes], 0.99) if probes else None,
        "burst_probe_max": max(p.seconds for p in probes) * ms if probes else None,
        "burst_queued_max": max((p.queued for p in probes), default=0),
        "burst_cpu": 100.0 * phase.server_cpu / (end - start) if end > start else None,
        "refused": run.paced.refusals.total + run.burst.refusals.total,
    }
    return found


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def show(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def blas_threads(args: argparse.Namespace) -> str:
    if args.blas_threads is not None:
        return f"{args.blas_threads} (--blas-threads)"
    found = [f"{name}={os.environ[name]}" for name in BLAS_THREADS if name in os.environ]
    return ", ".join(found) or "the library's default (one per CPU)"


def report(runs: dict[str, list[Run]], args: argparse.Namespace) -> bool:
    names = list(runs)
    base = names[0]
    table = {name: {k: median([r.figures[k] for r in found]) for k, _, _ in ROWS}
             for name, found in runs.items()}  # fmt: skip
    _, loop_name = new_loop()
    print(
        f"\nEmbedding after the commit, `field serve --embedder NAME` on SQLite (--sync "
        f"{args.sync}); reader: min_relevance 0, WebSocket (SDK); probe: GET "
        f"/v1/field/status every {PROBE_PERIOD * 1000:.0f} ms\n"
        f"paced: one writer, open loop at {args.rate:g} RECORD/s, {args.seconds:g} s measured "
        f"after {args.warmup:g} s warm-up; burst: {args.burst:,} RECORDs, {args.clients} "
        f"clients closed loop (times from its first RECORD); median of {args.rounds} "
        f"round(s); load generator: one Python process, {loop_name}; server BLAS "
        f"threads: {blas_threads(args)}"
    )
    width = max(12, *(len(n) + 2 for n in names))
    ratios = [f"{n}/{base}" for n in names[1:]]
    header = f"{'figure':<34}" + "".join(f"{n:>{width}}" for n in names)
    header += "".join(f"{r:>{max(12, len(r) + 2)}}" for r in ratios)
    print(header)
    for key, label, spec in ROWS:
        line = f"{label:<34}" + "".join(f"{show(table[n][key], spec):>{width}}" for n in names)
        first = table[base][key]
        for name, ratio in zip(names[1:], ratios, strict=True):
            value = table[name][key]
            shown = f"{value / first:.2f}x" if value is not None and first else "-"
            line += f"{shown:>{max(12, len(ratio) + 2)}}"
        print(line)

    failed = False
    for name, found in runs.items():
        for i, run in enumerate(found, 1):
            where = f"  {name} round {i}"
            print(
                f"{where}: after_commit {run.after_commit}; acknowledged {run.acknowledged:,}, "
                f"status counts {run.status_units:,}; left queued {run.left_queued}, held "
                f"{run.left_held}; /metrics field_embedding_queue_units {run.metric_queue}"
            )
            for phase_name, phase in (("paced", run.paced), ("burst", run.burst)):
                if phase.refusals:
                    print(f"{where}: {phase_name} RECORDs refused {phase.refusals.describe()}")
            if run.stream_events:
                print(f"{where}: the stream also yielded {dict(run.stream_events)}")
            if run.probe_failures:
                print(f"{where}: status probes failed {dict(run.probe_failures)}")
            for line in run.server_errors[-40:]:
                print(f"{where}: server stderr: {line[:300]}")
            for failure in run.failures:
                print(f"{where}: FAILED: {failure}")
                failed = True
    print(
        "push latency: the accepted RECORD's sending to its notification's arrival; "
        "queue empty: the first probe after the burst's last acknowledgement that saw "
        "embedding.queued 0;\ndrain: the later of that and the last notification, after the "
        "last acknowledgement; refused: 503 OVERLOADED or 429 RATE_LIMITED, each sent again "
        "after its Retry-After"
    )
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedders", nargs="+", default=["hashing", "minilm"])
    parser.add_argument("--rate", type=float, default=20.0, help="paced RECORDs per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="paced, measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="paced, not measured")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--burst", type=int, default=2000, help="RECORDs of the burst")
    parser.add_argument("--clients", type=int, default=16, help="clients of the burst")
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument(
        "--blas-threads", type=int, default=None,
        help="threads of the servers' BLAS (OPENBLAS_NUM_THREADS...; default: as inherited)",
    )  # fmt: skip
    parser.add_argument(
        "--straggle", type=float, default=30.0,
        help="seconds to wait for the paced phase's last notifications",
    )  # fmt: skip
    parser.add_argument(
        "--drain-timeout", type=float, default=300.0,
        help="seconds to wait for the burst's notifications after its last acknowledgement",
    )  # fmt: skip
    args = parser.parse_args()
    if not 0 < args.rate <= 1000 or not 0 < args.seconds <= 600 or not 0 <= args.warmup <= 60:
        parser.error("--rate must be in (0, 1000], --seconds in (0, 600], --warmup in [0, 60]")
    if args.rounds < 1 or args.burst < 1 or not 1 <= args.clients <= 256:
        parser.error("--rounds and --burst must be positive, --clients in [1, 256]")

    names = list(dict.fromkeys(args.embedders))
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            runs[name].append(run_case(args, name))
    if report(runs, args):
        print("FAILED: see the lines above")
        FAILED.append(True)


#: set by main when a run failed (the exit status, after the machine's readings)
FAILED: list[bool] = []

if __name__ == "__main__":
    bracketed(main)
    sys.exit(1 if FAILED else 0)
