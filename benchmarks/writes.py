"""Durable writes: RECORD per second over HTTP, group commit against one commit per write.

    python benchmarks/writes.py [--clients 32] [--seconds 8] [--sync full normal]
                                [--metrics on off] [--rounds 3] [--no-baseline]
                                [--no-jetstream] [--nats-server PATH]
    python benchmarks/writes.py --embedders hashing wordllama [--rounds 2] [--sync full]

For each ``--sync`` mode, starts two ``field serve`` processes on loopback
(each with a fresh data directory, so a durable SQLite log) and drives each
with the same closed-loop load: ``--clients`` clients, each with its own
HTTP connection (aiohttp) and its own writer agent, registered first, send
RECORD after RECORD for ``--warmup`` + ``--seconds`` seconds:

* the server as configured by default (group commit: up to 512 operations
  per transaction);
* the baseline: the same server with a batch size of 1
  (``FIELD_MAX_BATCH=1``: one transaction, one commit, per write);
* the naive loop: no server, one thread of this process inserting a row of
  a RECORD's size and committing it, one transaction per write, in a SQLite
  file with the Field's journal mode and ``synchronous``;
* the durable peer: NATS JetStream (a private ``nats-server -js``, see
  ``_jetstream.py``), one stream on file storage, and ``--clients`` publishers,
  each with its own NATS connection, publishing in the same closed loop and
  awaiting each publish's acknowledgement (``js.publish``). Each message is the
  JSON body of a RECORD like the Field's (about 350 bytes). With ``--sync full``
  the server runs with ``sync_interval: always`` (an fsync after every write,
  before the acknowledgement, as SQLite's FULL flushes each commit), with
  ``--sync normal`` with its default (the write reaches the OS before the
  acknowledgement, an fsync every two minutes: SQLite WAL's NORMAL). A server
  older than 2.10 has no ``always``: it then runs with its default, and the
  script says so. After the run the stream must hold exactly the acknowledged
  publishes, before and after a restart of the server on the same store.

A RECORD is acknowledged (200 ``accepted``) only once its log entry is
committed. After each run the script checks that ``GET /v1/field/status``
counts exactly the acknowledged units and that the SQLite file holds that
many ``memory.recorded`` entries.

Prints RECORD/s, p50/p99 latency (ms, over the measured window), the CPU
the server and the load generator used, the requests the server refused
(``503 OVERLOADED`` or ``429 RATE_LIMITED``), and the ratios group commit /
one commit per write, the Field's group commit / the naive loop's commits, and
the Field's group commit / JetStream's acknowledged publishes. A refused
request (REGISTER or RECORD) is waited out
for its ``Retry-After`` and sent again, the same envelope: the Field changed
nothing for it, so nothing is written twice; the ``refused`` column counts
the refusals, and a line after the table names their kinds. A latency is the
accepted attempt's, without the waits.

``--no-jetstream`` skips the JetStream peer; without nats-py or a
``nats-server`` (both in the ``bench`` extra) it is skipped with a line saying
so. ``--nats-server PATH`` names the server binary.

``--metrics on off`` runs every case with the server's metrics on (the
default) and off (``--no-metrics``), alternating, ``--rounds`` times each
(the order flips every round), and prints the mean RECORD/s and p50 with
metrics on as a ratio of those with them off. ``--no-baseline`` skips the
one-commit-per-write server and the naive loop. ``--embedders hashing wordllama`` instead runs
group commit with each embedder (``--embedder``), alternating, and prints
the cost per write of each against the first's (writes per second of the
first over its own).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _jetstream
import aiohttp
import orjson
from _common import LOAD_RATES, VOCABULARY, bracketed, envelope, pct, progress
from _refusals import Refusals, post

TYPES = ["finding", "decision", "observation", "assumption", "constraint"]
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


# -- a server in a child process ------------------------------------------------------


class FieldServer:
    """``python -m field serve`` on a loopback port; stopped with SIGTERM.

    ``env`` adds ``FIELD_*`` variables; any inherited from this process are
    dropped so that only the flags and ``env`` configure the server.
    """

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.command = [
            sys.executable, "-m", "field", "serve",
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir),
            *LOAD_RATES, *args,
        ]  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("FIELD_")}
        self.env = {**base, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._drain: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60) -> FieldServer:
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        if not self._ready.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError("field serve did not start:\n" + "\n".join(self.lines[-20:]))
        return self

    def _read_stderr(self) -> None:
        """Read stderr to the end (a full pipe would block the server)."""
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            del self.lines[:-200]
            if not self.url:
                match = _LISTENING.search(line)
                if match:
                    self.url = match.group(1)
                    self._ready.set()
        self._ready.set()  # EOF: the server exited

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int | None:
        """SIGTERM, then wait (SIGKILL after 30 s); returns the exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._drain is not None:
            self._drain.join(timeout=5)
        return process.returncode

    def __enter__(self) -> FieldServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def new_loop() -> tuple[asyncio.AbstractEventLoop, str]:
    """uvloop when installed (it is, with uvicorn[standard]): the load generator is
    Python too, on the same machine, and should cost as little CPU as it can."""
    try:
        import uvloop

        return uvloop.new_event_loop(), "uvloop"
    except ImportError:
        return asyncio.new_event_loop(), "asyncio"


# -- the load -------------------------------------------------------------------------


@dataclass
class Run:
    acknowledged: int = 0
    #: (start, end) of every acknowledged RECORD, perf_counter seconds
    samples: list[tuple[float, float]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    #: requests the server refused for now (waited out and sent again)
    refusals: Refusals = field(default_factory=Refusals)
    window: tuple[float, float] = (0.0, 0.0)
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    status_units: int = -1
    log_units: int = -1

    def in_window(self) -> list[tuple[float, float]]:
        t0, t1 = self.window
        return [(s, e) for s, e in self.samples if s >= t0 and e <= t1]

    @property
    def rate(self) -> float:
        t0, t1 = self.window
        return sum(1 for _, e in self.samples if t0 <= e <= t1) / (t1 - t0)

    def latency(self, q: float) -> float:
        return pct([(e - s) * 1000 for s, e in self.in_window()], q)


def record_payload(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "mode": "committed",
        "type": rng.choice(TYPES),
        "content": " ".join(rng.choices(VOCABULARY, k=12)) + f" ({n})",
        "intent": {"purpose": " ".join(rng.choices(VOCABULARY, k=4)), "task_id": "task-1"},
        "confidence": {"score": round(rng.random(), 3), "reasoning": "generated"},
    }


async def register(
    session: aiohttp.ClientSession, url: str, agent: str, refusals: Refusals | None = None
) -> tuple[str, int]:
    """(token, epoch); a refusal for now is sent again after its Retry-After, counted in
    ``refusals`` if given."""
    payload = {"id": agent, "role": "market_researcher", "interests": ["market size"]}
    body = orjson.dumps(envelope("REGISTER", agent, payload))
    headers = {"Content-Type": "application/json"}
    counted = Refusals() if refusals is None else refusals
    reply = await post(session, f"{url}/v1/register", body, headers, counted)
    if reply.status != 200:
        raise RuntimeError(f"REGISTER {agent}: {reply.status} {reply.answer}")
    return reply.answer["token"], reply.answer["epoch"]


async def writer(
    url: str, index: int, run: Run, start: asyncio.Event, deadline: list[float]
) -> None:
    """One client: its own connection and agent; RECORD in a closed loop until the deadline."""
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        agent = f"writer-{index:02d}"
        token, epoch = await register(session, url, agent, run.refusals)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        rng = random.Random(index)
        await start.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            body = orjson.dumps(envelope("RECORD", agent, record_payload(rng, n), epoch))
            # refused (OVERLOADED, RATE_LIMITED): counted, waited out and sent again, unless
            # the wait would end past the deadline (then this RECORD is not made at all)
            reply = await post(
                session, f"{url}/v1/record", body, headers, run.refusals, until=deadline[0]
            )
            n += 1
            answer = reply.answer if isinstance(reply.answer, dict) else {}
            if reply.status == 200 and answer.get("status") == "accepted":
                run.acknowledged += 1
                run.samples.append((reply.began, reply.ended))
                epoch = max(epoch, answer["epoch"])
            elif not reply.refused:
                key = f"{reply.status} {answer.get('code')}"
                run.errors[key] = run.errors.get(key, 0) + 1


async def measure(
    server: Any,
    run: Run,
    tasks: list[asyncio.Task[None]],
    start: asyncio.Event,
    seconds: float,
    label: str,
) -> None:
    """Let the clients go (``start``), show progress until they end, and take the CPU the
    server (``server.cpu_seconds()``) and this process used meanwhile into ``run``."""
    cpu0, client0 = server.cpu_seconds(), time.process_time()
    start.set()
    ticks = int(seconds * 10)
    for tick in range(ticks):
        progress(tick, ticks, label)
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.1)
    await asyncio.gather(*tasks)
    progress(ticks, ticks, label)
    run.server_cpu = server.cpu_seconds() - cpu0
    run.client_cpu = time.process_time() - client0


async def drive(server: FieldServer, args: argparse.Namespace, label: str) -> Run:
    run = Run()
    start = asyncio.Event()
    deadline = [float("inf")]
    tasks = [
        asyncio.create_task(writer(server.url, i, run, start, deadline))
        for i in range(args.clients)
    ]
    await asyncio.sleep(0)
    while run.acknowledged == 0 and not any(t.done() for t in tasks):  # all registered?
        status = await get_json(server.url + "/v1/field/status")
        if status["counts"]["agents"] >= args.clients:
            break
        await asyncio.sleep(0.05)
    now = time.perf_counter()
    run.window = (now + args.warmup, now + args.warmup + args.seconds)
    deadline[0] = run.window[1]
    await measure(server, run, tasks, start, args.warmup + args.seconds, label)
    status = await get_json(server.url + "/v1/field/status")
    run.status_units = sum(status["counts"]["memory_units"].values())
    run.log_units = count_logged_units(server.data_dir)
    return run


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return orjson.loads(await response.read())


def count_logged_units(data_dir: Path) -> int:
    """``memory.recorded`` entries committed to the SQLite log (read from outside)."""
    conn = sqlite3.connect(f"file:{data_dir / 'field.db'}?mode=ro", uri=True)
    try:
        query = "SELECT COUNT(*) FROM log WHERE kind = 'memory.recorded'"
        return int(conn.execute(query).fetchone()[0])
    finally:
        conn.close()


# -- the durable peer: NATS JetStream ---------------------------------------------------

#: The stream and its one subject.
STREAM = "writes"
SUBJECT = "writes.record"


async def publisher(
    url: str, index: int, run: Run, start: asyncio.Event, ready: list[int], deadline: list[float]
) -> None:
    """One publisher: its own NATS connection; the JSON body of a RECORD, published in a closed
    loop until the deadline, each awaiting its acknowledgement (stored in the stream)."""
    nc = await _jetstream.connect(url)
    try:
        js = nc.jetstream()
        agent = f"writer-{index:02d}"
        rng = random.Random(index)
        ready[0] += 1
        await start.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            body = orjson.dumps(envelope("RECORD", agent, record_payload(rng, n), 1))
            n += 1
            began = time.perf_counter()
            try:
                ack = await js.publish(SUBJECT, body, timeout=30)
            except Exception as exc:  # a timeout or an error reply: counted, not retried
                key = type(exc).__name__
                run.errors[key] = run.errors.get(key, 0) + 1
                continue
            ended = time.perf_counter()
            if ack.stream == STREAM and not ack.duplicate:
                run.acknowledged += 1
                run.samples.append((began, ended))
            else:
                run.errors["unexpected ack"] = run.errors.get("unexpected ack", 0) + 1
    finally:
        await nc.close()


async def drive_jetstream(server: _jetstream.JetStreamServer, args: argparse.Namespace) -> Run:
    run = Run()
    await _jetstream.add_stream(server.url, STREAM, SUBJECT)
    start = asyncio.Event()
    ready = [0]
    deadline = [float("inf")]
    tasks = [
        asyncio.create_task(publisher(server.url, i, run, start, ready, deadline))
        for i in range(args.clients)
    ]
    while ready[0] < args.clients and not any(t.done() for t in tasks):  # all connected?
        await asyncio.sleep(0.05)
    now = time.perf_counter()
    run.window = (now + args.warmup, now + args.warmup + args.seconds)
    deadline[0] = run.window[1]
    await measure(server, run, tasks, start, args.warmup + args.seconds, f"js/{server.policy}")
    run.status_units = await _jetstream.stream_messages(server.url, STREAM)
    return run


def jetstream_policy(args: argparse.Namespace, sync: str) -> str:
    """JetStream's sync policy beside the Field's ``--sync``: ``always`` beside ``full`` when
    the server has it, else its default."""
    if sync == "full" and _jetstream.supports_always(args.nats_server):
        return "always"
    return "default"


def run_jetstream(args: argparse.Namespace, sync: str) -> Run:
    """JetStream beside ``--sync``; then the server restarted on the same store, whose
    stream must still hold every acknowledged publish (``log_units``)."""
    policy = jetstream_policy(args, sync)
    with _jetstream.JetStreamServer(args.nats_server, policy, clients=args.clients) as server:
        loop, _ = new_loop()
        try:
            run = loop.run_until_complete(drive_jetstream(server, args))
            server.restart()
            run.log_units = loop.run_until_complete(_jetstream.stream_messages(server.url, STREAM))
            return run
        finally:
            loop.close()


#: the bare loop's name in the table
BARE = "SQLite, commit/write"


def run_bare_sqlite(args: argparse.Namespace, sync: str) -> Run:
    """The naive durable loop: one thread inserting a RECORD-sized row (a log entry's
    columns, the unit as JSON) and committing it, one transaction per write, in a SQLite
    file in WAL mode with ``synchronous`` as the Field sets it, for ``--warmup`` +
    ``--seconds``. No HTTP and no Field: what one commit per write costs the disk."""
    run = Run()
    rng = random.Random(5)
    with tempfile.TemporaryDirectory(prefix="field-writes-bare-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "bare.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {sync.upper()}")
        conn.execute(
            "CREATE TABLE log (position INTEGER PRIMARY KEY, epoch INTEGER, kind TEXT, "
            "data BLOB, actor TEXT, ts REAL)"
        )
        cpu0, start = time.process_time(), time.perf_counter()
        run.window = (start + args.warmup, start + args.warmup + args.seconds)
        n = 0
        while time.perf_counter() < run.window[1]:
            n += 1
            data = orjson.dumps({"unit": record_payload(rng, n)})
            began = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute(
                "INSERT INTO log VALUES (?, ?, ?, ?, ?, ?)",
                (n, n, "memory.recorded", data, "writer-0", time.time()),
            )
            conn.execute("COMMIT")
            run.samples.append((began, time.perf_counter()))
        run.server_cpu = time.process_time() - cpu0
        run.acknowledged = n
        run.status_units = run.log_units = conn.execute("SELECT count(*) FROM log").fetchone()[0]
        conn.close()
    return run


def run_case(
    args: argparse.Namespace,
    sync: str,
    max_batch: int | None,
    label: str,
    metrics: str = "on",
    embedder: str | None = None,
) -> Run:
    with tempfile.TemporaryDirectory(prefix="field-writes-") as tmp:
        flags = ["--sync", sync, "--max-queue", str(args.max_queue), "--log-level", "info"]
        flags += ["--no-metrics"] if metrics == "off" else []
        flags += ["--embedder", embedder] if embedder is not None else []
        env = {"FIELD_MAX_BATCH": str(max_batch)} if max_batch is not None else {}
        with FieldServer(Path(tmp) / "data", *flags, env=env) as server:
            loop, _ = new_loop()
            try:
                return loop.run_until_complete(drive(server, args, label))
            finally:
                loop.close()


def compare_embedders(args: argparse.Namespace) -> None:
    """Group commit with each embedder of ``args.embedders``, alternating every round (the
    order flips), and each one's RECORD/s and p50 against the first's."""
    names = list(dict.fromkeys(args.embedders))
    runs: dict[tuple[str, str], list[Run]] = {}
    for sync in args.sync:
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                run = run_case(args, sync, None, f"{sync}/{name}{round_ + 1}", embedder=name)
                runs.setdefault((sync, name), []).append(run)
    print(
        f"\nRECORD over HTTP, group commit: {args.clients} clients, closed loop; "
        f"{args.seconds:g} s measured after {args.warmup:g} s warm-up, {args.rounds} round(s)"
    )
    print(f"{'--sync':<8}{'embedder':<14}{'RECORD/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'durable':>9}")
    failed = False
    for (sync, name), found in runs.items():
        durable = all(r.status_units == r.acknowledged == r.log_units for r in found)
        failed |= not durable or any(r.errors for r in found)
        print(
            f"{sync:<8}{name:<14}{mean_rate(found):>10,.0f}"
            f"{statistics.median(r.latency(0.5) for r in found):>9.2f}"
            f"{statistics.median(r.latency(0.99) for r in found):>9.2f}"
            f"{'yes' if durable else 'NO':>9}"
        )
    for sync in args.sync:
        first = mean_rate(runs[(sync, names[0])])
        for name in names[1:]:
            rate = mean_rate(runs[(sync, name)])
            print(
                f"--sync {sync}: {name} {rate:,.0f} RECORD/s, {first / rate:.2f}x the cost per "
                f"write of {names[0]} ({first:,.0f})"
            )
    if failed:
        sys.exit(1)


def mean_rate(runs: list[Run]) -> float:
    return sum(run.rate for run in runs) / len(runs)


def cpu_per_ack(metered: list[tuple[str, str, str, Run]], sync: str, name: str) -> float:
    """Microseconds of server CPU per acknowledged write, over the runs of ``sync`` whose
    server's name starts with ``name``: on a shared machine, what each write costs whatever
    share of the cores the server got."""
    runs = [r for s, n, _, r in metered if s == sync and n.startswith(name)]
    return sum(r.server_cpu for r in runs) / max(1, sum(r.acknowledged for r in runs)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per case")
    parser.add_argument("--sync", nargs="+", choices=["full", "normal"], default=["full", "normal"])
    parser.add_argument(
        "--max-queue", type=int, default=10_000, help="--max-queue of both servers (10000)"
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="run with the server's metrics on, off, or both alternating (on)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each case (1)")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the one-commit-per-write server"
    )
    _jetstream.add_arguments(parser)
    parser.add_argument(
        "--embedders",
        nargs="+",
        metavar="NAME",
        help="instead: group commit with each of these embedders, alternating, --rounds "
        "times, the RECORD/s of each against the first's (e.g. hashing wordllama)",
    )
    args = parser.parse_args()
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be between 1 and 20")
    if args.clients < 1 or args.clients > 256:
        parser.error("--clients must be between 1 and 256")
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 10:
        parser.error("--seconds must be in (0, 60] and --warmup in [0, 10]")

    if args.embedders:
        compare_embedders(args)
        return
    jetstream = _jetstream.available(args)
    metered: list[tuple[str, str, str, Run]] = []
    cases = [("group commit", None)] + ([] if args.no_baseline else [("one commit per write", 1)])
    settings = list(dict.fromkeys(args.metrics))
    for sync in args.sync:
        for name, batch in cases:
            for round_ in range(args.rounds):
                # alternate, and flip the order every round: neither goes first every time
                for metrics in settings if round_ % 2 == 0 else settings[::-1]:
                    label = f"{sync}/{'group' if batch is None else 'batch1'}"
                    if len(settings) > 1 or args.rounds > 1:
                        label += f"/{metrics}{round_ + 1}"
                    run = run_case(args, sync, batch, label, metrics)
                    metered.append((sync, name, metrics, run))
        if not args.no_baseline:
            for _ in range(args.rounds):
                metered.append((sync, BARE, "-", run_bare_sqlite(args, sync)))
        if jetstream:
            for _ in range(args.rounds):
                name = f"JetStream ({jetstream_policy(args, sync)})"
                metered.append((sync, name, "-", run_jetstream(args, sync)))

    _, loop_name = new_loop()
    print(
        f"\nRECORD over HTTP: {args.clients} clients, one connection and one writer agent "
        f"each, closed loop; {args.seconds:g} s measured after {args.warmup:g} s warm-up "
        f"(load generator: one Python process, {loop_name})"
    )
    header = (
        f"{'--sync':<8}{'server':<22}{'metrics':<9}{'RECORD/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'srv CPU':>9}{'gen CPU':>9}{'acked':>9}{'refused':>9}{'durable':>9}"
    )
    print(header)
    failed = False
    for sync, name, metrics, run in metered:
        seconds = args.warmup + args.seconds
        durable = run.status_units == run.acknowledged == run.log_units
        failed |= not durable or bool(run.errors)
        print(
            f"{sync:<8}{name:<22}{metrics:<9}{run.rate:>10,.0f}{run.latency(0.5):>9.2f}"
            f"{run.latency(0.99):>9.2f}{run.server_cpu / seconds:>9.0%}"
            f"{run.client_cpu / seconds:>9.0%}{run.acknowledged:>9,}{run.refusals.total:>9,}"
            f"{'yes' if durable else 'NO':>9}"
        )
    for sync in args.sync:
        group = mean_rate([r for s, n, _, r in metered if s == sync and n == "group commit"])
        if not args.no_baseline:
            single = [r for s, n, _, r in metered if s == sync and n == "one commit per write"]
            ratio = group / mean_rate(single)
            print(f"--sync {sync}: group commit is {ratio:.1f}x one commit per write")
            bare = mean_rate([r for s, n, _, r in metered if s == sync and n == BARE])
            print(
                f"--sync {sync}: Field group commit {group:,.0f} RECORD/s is "
                f"{group / bare:.2f}x the bare loop's {bare:,.0f} commits/s (one thread, "
                "one SQLite transaction per write, no HTTP)"
            )
        if jetstream:
            policy = jetstream_policy(args, sync)
            peer = mean_rate(
                [r for s, n, _, r in metered if s == sync and n.startswith("JetStream")]
            )
            print(
                f"--sync {sync}: Field group commit {group:,.0f} RECORD/s is {group / peer:.2f}x "
                f"JetStream's {peer:,.0f} acknowledged publishes/s\n  (JetStream with "
                f"{_jetstream.describe_policy(policy)});\n  server CPU per acknowledged write: "
                f"Field {cpu_per_ack(metered, sync, 'group commit'):,.0f} us, JetStream "
                f"{cpu_per_ack(metered, sync, 'JetStream'):,.0f} us"
            )
    if len(settings) == 2:
        for sync in args.sync:
            for name, _ in cases:
                on = [r for s, n, m, r in metered if (s, n, m) == (sync, name, "on")]
                off = [r for s, n, m, r in metered if (s, n, m) == (sync, name, "off")]
                median_on = statistics.median(r.rate for r in on)
                median_off = statistics.median(r.rate for r in off)
                p50_on = statistics.median(r.latency(0.5) for r in on)
                p50_off = statistics.median(r.latency(0.5) for r in off)
                print(
                    f"--sync {sync}, {name}, {len(on)} runs each: with metrics "
                    f"{mean_rate(on):,.0f} RECORD/s, without {mean_rate(off):,.0f} (means: "
                    f"{mean_rate(on) / mean_rate(off):.3f}x; medians: "
                    f"{median_on / median_off:.3f}x); median p50 {p50_on:.2f} ms against "
                    f"{p50_off:.2f}"
                )
    for sync, name, metrics, run in metered:
        if run.refusals:
            print(f"  {sync}/{name}/metrics {metrics}: refused {run.refusals.describe()}")
    for sync, name, _, run in metered:
        if run.errors or not run.status_units == run.acknowledged == run.log_units:
            print(
                f"  {sync}/{name}: acknowledged {run.acknowledged}, status counts "
                f"{run.status_units}, log holds {run.log_units}; errors {run.errors or 'none'}"
            )
    print(
        "durable: GET /v1/field/status counts, and the memory.recorded entries of the SQLite "
        "log, equal the acknowledged RECORDs;\nrefused: requests answered 503 OVERLOADED or "
        "429 RATE_LIMITED, each sent again after its Retry-After (not an error)"
    )
    if jetstream:
        version = ".".join(map(str, _jetstream.server_version(args.nats_server)))
        print(
            f"JetStream: nats-server {version}, one stream on file storage, {args.clients} "
            "publishers with a connection each, every publish awaiting its acknowledgement; "
            "durable: the stream holds\nexactly the acknowledged publishes, before and after "
            "a restart of the server on the same store"
        )
        if "full" in args.sync and jetstream_policy(args, "full") != "always":
            print(
                f"  nats-server {version} has no sync_interval: always (2.10 and later): "
                "beside --sync full JetStream ran with its default, a weaker durability"
            )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    bracketed(main)
