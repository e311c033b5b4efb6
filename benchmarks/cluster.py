"""Several nodes on one PostgreSQL log: writes through the cluster, push across nodes, failover.

    python benchmarks/cluster.py [--url postgresql://postgres@127.0.0.1:5432/test]
                                 [--cases throughput delivery failover takeover] [--seconds 10]
                                 [--rounds 1] [--clients 32] [--subscribers 1000] [--rate 20]
                                 [--procs 2] [--failover-subscribers 100] [--failover-rate 10]
                                 [--pause 10]

Every case starts real ``field serve --log postgresql://... --node-id X`` processes on
loopback, all on one fresh database created on ``--url``'s server and dropped afterwards
(each node has a data directory of its own in a temporary directory). Every node runs with
the load flags of ``_common.LOAD_RATES`` and the per-address limits of ``fanout.py`` lifted:
every client here connects from 127.0.0.1.

* **throughput**: one, two and three nodes, and as the baseline one node on the default
  SQLite log (``--sync full``). ``--clients`` coroutines (32), each its own agent on its own
  kept-alive HTTP connection, spread evenly over the nodes (client i on node i mod N),
  register and then RECORD in a closed loop for ``--warmup`` + ``--seconds``. Prints durable
  RECORD/s and the p50/p99 acknowledgement latency over the measured window, the CPU the
  nodes, PostgreSQL (every ``postgres`` process on the host: other databases' too) and the
  load generator used, and the ratios against one node on SQLite and one on PostgreSQL.
  Afterwards every node's ``GET /v1/field/status`` and the log itself must count exactly the
  acknowledged units.
* **delivery**: ``--subscribers`` WebSocket subscribers (1,000: the lean clients of
  ``fanout.py`` in ``--procs`` processes, each subscriber its own agent with one subscription
  to ``memory.recorded``) on node B, and one writer RECORDing through node A at ``--rate``
  (20/s) open loop for ``--seconds``: each RECORD is sent at its time whether or not the
  previous one was answered. Per notification, the time from the RECORD's send on A to its
  receipt on B (one clock: ``time.time()`` in every process of one host); p50/p99/max, and
  the RECORD's own acknowledgement for comparison. The baseline in the same command: the
  same on one node, subscribers and writer both on it. Every unit must reach every
  subscriber, once.
* **failover**: three nodes A, B and C. ``--failover-subscribers`` (100) subscribers on node
  B, each its own agent and WebSocket, reading from its subscription's first cursor; a
  writer RECORDs through A at ``--failover-rate`` (10/s) for ``--seconds``, and halfway
  through node B is SIGKILLed. Each subscriber, as soon as its connection drops, connects to
  node C with ``since=<the last cursor it received>``. Prints, from the kill, when each
  subscriber saw its connection end, when it was live on C and when its first notification
  from C arrived (p50/p99/max; the last waits for the next RECORD when nothing was owed).
  At the end every subscriber's stream must be exactly the log's units, in log order, each
  once, its cursors strictly increasing; and the writer must have had every RECORD
  acknowledged.
* **takeover**: webhook deliveries through the loss of the node that sends them. Three
  nodes sharing one webhook key, at the default ``--cluster-interval`` (1 s); a reader's
  webhook subscription to ``memory.recorded`` delivered to a receiver in this process; a
  writer RECORDs through a node that does not send the deliveries, at ``--failover-rate``
  (10/s) open loop. After ``--seconds / 2`` the sending node (the one whose status says
  ``delivery_owner``) is SIGKILLed (**kill**), or SIGSTOPped for ``--pause`` seconds (10)
  and then let run again (**pause**); the load goes on ``--seconds / 2`` after that. Prints,
  from the signal: **resume**, when the first webhook of a unit sent after the signal
  arrived (the next sender claimed the deliveries and resumed them); **owner**, when
  another node's status first said it sends them; and the longest any unit waited from
  its RECORD's acknowledgement to its webhook. A RECORD refused ``503 LOG_UNAVAILABLE``
  (a node paused amid a batch holds the log's write lock until the database ends its
  session) is counted and sent again. At the end the receiver must have had every unit of
  the log, first deliveries in log order, repeats only with the same ``webhook-id``
  (counted); every delivery entry of the log must carry the newest term before it (the
  paused node, run again, wrote nothing under its old term); and in pause mode the paused
  node's status must say it no longer sends.

A request refused (``503 OVERLOADED``: admission control, on by default, refuses writes
while a node's event loop runs late; ``429 RATE_LIMITED``) is counted and shown, and is not a
failure: the client was told. It waits the ``Retry-After`` and sends the same request again
(the node changed nothing for it, so no unit is written twice; the closed loop does not
when the wait would end past its deadline); a latency is the accepted attempt's. What
fails the run (exit status 1) is a unit lost or delivered twice, or a node that does not
count what the log holds.

``--rounds`` runs every case that many times (a case's configurations in the reverse order
every other round) and prints the range of each figure over the rounds. The nodes,
PostgreSQL and the load generator all share this machine's CPUs, which the output states;
benchmarks/README.md ("Several nodes") says what that means for the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg
from _common import bracketed, envelope, pct
from _refusals import Refusals
from _refusals import post as post_retried
from aiohttp import web
from fanout import CONNECT_TIMEOUT, ONE_CLIENT_ADDRESS, ClientPool, raise_nofile
from pglog import Database
from writes import FieldServer, Run, count_logged_units, new_loop, record_payload, register
from writes import writer as closed_loop_writer

#: Seconds to wait for every subscriber's last notifications once the writer stopped.
COLLECT_TIMEOUT = 60.0
#: Seconds to wait for the failover subscribers' first ``live`` on node B.
LIVE_TIMEOUT = 60.0
#: Seconds to wait for a node to send the deliveries, and for the last webhooks.
TAKEOVER_TIMEOUT = 60.0
NODE_NAMES = "abc"


# -- the machine ----------------------------------------------------------------------


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole host since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of every ``postgres`` process on the host, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{name}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            if head.endswith("(postgres"):
                fields = rest.split()
                found[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


@dataclass
class Meter:
    """CPU used during a window: the nodes, PostgreSQL, this process, the whole host."""

    nodes: list[FieldServer]
    started: float = 0.0
    node0: list[float] = field(default_factory=list)
    pg0: dict[int, float] = field(default_factory=dict)
    self0: float = 0.0
    host0: tuple[int, int] = (0, 0)
    #: fractions of one CPU (1.0 = one core busy), and of the host's capacity
    node_cpu: float = 0.0
    postgres: float = 0.0
    generator: float = 0.0
    host_busy: float = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        self.node0 = [node.cpu_seconds() for node in self.nodes]
        self.pg0 = postgres_cpu()
        self.self0 = time.process_time()
        self.host0 = machine_ticks()

    def stop(self) -> None:
        wall = time.monotonic() - self.started
        used = [
            node.cpu_seconds() - before
            for node, before in zip(self.nodes, self.node0, strict=True)
            if node.process is not None and node.process.poll() is None
        ]
        self.node_cpu = sum(used) / wall
        pg = postgres_cpu()
        self.postgres = sum(t - self.pg0.get(pid, 0.0) for pid, t in pg.items()) / wall
        self.generator = (time.process_time() - self.self0) / wall
        busy, total = machine_ticks()
        self.host_busy = (busy - self.host0[0]) / max(1, total - self.host0[1])


# -- nodes ----------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(
    url: str, count: int, backend: str = "postgresql", *, webhooks: bool = False
) -> Iterator[list[FieldServer]]:
    """``count`` nodes on one fresh database (``backend`` "sqlite": one node on the
    default SQLite log); stopped, and the database dropped, when the block ends. With
    ``webhooks``, they deliver to loopback and share one webhook key (any node may send
    what another sealed)."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="field-cluster-")))
        if backend == "sqlite":
            log = ["--sync", "full"]
        else:
            log = ["--log", stack.enter_context(Database(url))]
        if webhooks:
            log += ["--webhook-allow-net", "127.0.0.0/8"]
            log += ["--webhook-key-file", str(tmp / "webhook.key")]
        nodes: list[FieldServer] = []
        stack.callback(lambda: [node.stop() for node in nodes])
        for name in NODE_NAMES[:count]:
            flags = [*log, "--node-id", name, *ONE_CLIENT_ADDRESS]
            nodes.append(FieldServer(tmp / name, *flags).start())
        yield nodes


def database_of(node: FieldServer) -> str:
    """The ``--log`` URL a node was started with."""
    return node.command[node.command.index("--log") + 1]


def port_of(node: FieldServer) -> int:
    return int(node.url.rpartition(":")[2])


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        return orjson.loads(await response.read())


def logged_units(database: str) -> list[tuple[int, str]]:
    """(position, unit id) of every ``memory.recorded`` entry of a log, in log order."""
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT position, convert_from(data, 'UTF8')::jsonb #>> '{unit,id}'"
            " FROM field_log WHERE kind = 'memory.recorded' ORDER BY position"
        ).fetchall()
    return [(position, unit) for position, unit in rows]


def position_of(cursor: str) -> int:
    return int(cursor.rpartition("-")[2])


# -- throughput -----------------------------------------------------------------------


@dataclass
class Throughput:
    config: str
    run: Run
    meter: Meter
    #: group commits (batches) the nodes' writers ran during the load, and their operations
    batches: float = 0.0
    operations: float = 0.0
    #: units each node's status counts, and the log holds, after the run
    status_units: list[int] = field(default_factory=list)
    log_units: int = -1

    @property
    def durable(self) -> bool:
        return {*self.status_units, self.log_units} == {self.run.acknowledged}

    @property
    def refused(self) -> int:
        return self.run.refusals.total


async def writer_batches(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(batches, operations) a node's writer has run since it started (``GET /metrics``)."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    found = dict.fromkeys(("count", "sum"), 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        kind = name.removeprefix("field_writer_batch_operations_")
        if kind in found and kind != name:
            found[kind] = float(value)
    return found["count"], found["sum"]


async def closed_loop(
    nodes: list[FieldServer], args: argparse.Namespace, label: str, meter: Meter
) -> tuple[Run, float, float]:
    """``--clients`` writers spread over the nodes, RECORD after RECORD until the deadline:
    (the run, batches and operations the nodes' writers ran meanwhile). ``meter`` reads
    the CPU, and the batches are counted, from the start of the load (warm-up included)
    to its end."""
    run = Run()
    start = asyncio.Event()
    deadline = [float("inf")]
    urls = [node.url for node in nodes]
    tasks = [
        asyncio.create_task(closed_loop_writer(urls[i % len(urls)], i, run, start, deadline))
        for i in range(args.clients)
    ]
    async with aiohttp.ClientSession() as session:
        # the status of a node counts the agents registered on every node it has applied
        while not any(t.done() for t in tasks):
            status = await get_json(session, urls[0] + "/v1/field/status")
            if status["counts"]["agents"] >= args.clients:
                break
            await asyncio.sleep(0.05)
        before = [await writer_batches(session, url) for url in urls]
        now = time.perf_counter()
        run.window = (now + args.warmup, now + args.warmup + args.seconds)
        deadline[0] = run.window[1]
        meter.start()
        start.set()
        print(f"  {label}: {args.warmup + args.seconds:g} s ...", file=sys.stderr, flush=True)
        await asyncio.gather(*tasks)
        meter.stop()
        after = [await writer_batches(session, url) for url in urls]
    batches = sum(b - a for (b, _), (a, _) in zip(after, before, strict=True))
    operations = sum(b - a for (_, b), (_, a) in zip(after, before, strict=True))
    return run, batches, operations


async def count_everywhere(nodes: list[FieldServer], head: int) -> list[int]:
    """The memory units each node's status counts once it has applied the log up to
    ``head`` (the status page reads a node's state as it is; a node applies what the
    others appended within milliseconds); -1 for a node still behind after 10 s."""
    counts = []
    async with aiohttp.ClientSession() as session:
        for node in nodes:
            deadline = time.monotonic() + 10
            while True:
                status = await get_json(session, node.url + "/v1/field/status")
                if status["node"]["position"] >= head:
                    counts.append(sum(status["counts"]["memory_units"].values()))
                    break
                if time.monotonic() > deadline:
                    counts.append(-1)
                    break
                await asyncio.sleep(0.02)
    return counts


def log_head(database: str) -> int:
    """The last position of a PostgreSQL log."""
    with psycopg.connect(database) as conn:
        row = conn.execute("SELECT max(position) FROM field_log").fetchone()
    return int(row[0] or 0) if row else 0


def throughput_case(args: argparse.Namespace, backend: str, count: int) -> Throughput:
    config = "1 node, SQLite" if backend == "sqlite" else f"{count} node{'s' * (count > 1)}, PG"
    with cluster(args.url, count, backend) as nodes:
        meter = Meter(nodes)
        loop, _ = new_loop()
        try:
            run, batches, operations = loop.run_until_complete(
                closed_loop(nodes, args, config, meter)
            )
            if backend == "sqlite":
                head = 0  # one node: its status is its log
                log_units = count_logged_units(nodes[0].data_dir)
            else:
                head = log_head(database_of(nodes[0]))
                log_units = len(logged_units(database_of(nodes[0])))
            status_units = loop.run_until_complete(count_everywhere(nodes, head))
        finally:
            loop.close()
    return Throughput(config, run, meter, batches, operations, status_units, log_units)


# -- an open-loop writer --------------------------------------------------------------


@dataclass
class Sent:
    """One RECORD: its unit (None if refused), when it was sent and answered (time.time())."""

    n: int
    sent: float
    answered: float
    unit: str | None
    error: str | None = None


async def open_loop(
    url: str,
    rate: float,
    seconds: float,
    at: Callable[[], None] | None = None,
    refusals: Refusals | None = None,
) -> list[Sent]:
    """Register a writer on ``url``, then send ``rate * seconds`` RECORDs, each at its time
    whether or not the previous one was answered; ``at`` is called halfway through. A
    RECORD refused for now is counted in ``refusals`` and sent again after its Retry-After
    (its ``sent`` is the accepted attempt's)."""
    counted = Refusals() if refusals is None else refusals
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector) as session:
        token, epoch = await register(session, url, "writer", counted)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        rng = random.Random(7)

        async def one(n: int) -> Sent:
            body = orjson.dumps(envelope("RECORD", "writer", record_payload(rng, n), epoch))
            sent = time.time()
            try:
                reply = await post_retried(session, url + "/v1/record", body, headers, counted)
            except (aiohttp.ClientError, OSError) as exc:
                return Sent(n, sent, time.time(), None, f"{type(exc).__name__}: {exc}")
            if reply.status != 200:
                answer = reply.answer if isinstance(reply.answer, dict) else {}
                return Sent(
                    n, reply.sent_at, time.time(), None, f"{reply.status} {answer.get('code')}"
                )
            return Sent(n, reply.sent_at, time.time(), reply.answer["memory_unit_id"])

        total = round(rate * seconds)
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        tasks = []
        for n in range(total):
            if at is not None and n == total // 2:
                at()
            delay = start + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n)))
        return list(await asyncio.gather(*tasks))


def refusals(sent: list[Sent]) -> str:
    """What the RECORDs that were not acknowledged got (refusals aside: sent again), counted."""
    counts: dict[str, int] = {}
    for s in sent:
        if s.error is not None:
            counts[s.error] = counts.get(s.error, 0) + 1
    return ", ".join(f"{n} x {error}" for error, n in counts.items())


# -- delivery -------------------------------------------------------------------------


@dataclass
class Delivery:
    config: str
    subscribers: int
    sent: list[Sent]
    #: send to receipt of every notification, ms
    latencies: list[float] = field(default_factory=list)
    expected: int = 0
    missing: int = 0
    duplicates: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    meter: Meter | None = None
    #: requests refused for now (waited out and sent again)
    refused: Refusals = field(default_factory=Refusals)

    @property
    def acks(self) -> list[float]:
        return [(s.answered - s.sent) * 1000 for s in self.sent if s.unit is not None]

    @property
    def errors(self) -> int:
        return sum(1 for s in self.sent if s.unit is None)

    @property
    def why(self) -> str:
        return refusals(self.sent)

    @property
    def exact(self) -> bool:
        """Every acknowledged unit reached every subscriber, once, and nothing else did."""
        return not (self.missing or self.duplicates or self.anomalies)


def delivery_case(args: argparse.Namespace, count: int) -> Delivery:
    config = "A -> B, 2 nodes" if count == 2 else "1 node"
    with cluster(args.url, count) as nodes:
        writer_node, subscriber_node = nodes[0], nodes[-1]
        pool = ClientPool("ws", args.subscribers, args.procs, port_of(subscriber_node))
        try:
            pool.ask(("setup",), "setup")
            replies = pool.ask(("connect",), "connect", timeout=CONNECT_TIMEOUT + 60)
            live = sum(r[1] for r in replies)
            meter = Meter(nodes)
            loop, _ = new_loop()
            try:
                meter.start()
                print(f"  {config}: {args.seconds:g} s ...", file=sys.stderr, flush=True)
                refused = Refusals()
                sent = loop.run_until_complete(
                    open_loop(writer_node.url, args.rate, args.seconds, refusals=refused)
                )
                meter.stop()
            finally:
                loop.close()
            units = sum(1 for s in sent if s.unit is not None)
            replies = pool.ask(("collect", units, COLLECT_TIMEOUT), timeout=COLLECT_TIMEOUT + 60)
        finally:
            pool.close()
    result = Delivery(config, live, sent, meter=meter, refused=refused)
    sent_at = {s.unit: s.sent for s in sent if s.unit is not None}
    received: dict[str, int] = dict.fromkeys(sent_at, 0)
    anomalies: dict[str, int] = {}
    for _, reply in replies:
        for kind, n in reply["anomalies"].items():
            anomalies[kind] = anomalies.get(kind, 0) + n
        for unit, times in reply["receipts"].items():
            if unit not in sent_at:
                anomalies["unexpected unit"] = anomalies.get("unexpected unit", 0) + len(times)
                continue
            received[unit] += len(times)
            result.latencies.extend((t - sent_at[unit]) * 1000 for t in times)
    result.expected = len(sent_at) * live
    result.missing = sum(max(0, live - n) for n in received.values())
    result.duplicates = sum(max(0, n - live) for n in received.values())
    result.anomalies = anomalies
    return result


# -- failover -------------------------------------------------------------------------


@dataclass(eq=False)
class Follower:
    """One subscriber: its agent, subscription, stream so far, and the times of the move."""

    agent: str
    token: str
    cursor: str
    #: (cursor, unit id, node index) of every notification, as received
    got: list[tuple[str, str | None, int]] = field(default_factory=list)
    live_on_b: asyncio.Event = field(default_factory=asyncio.Event)
    ended_at: float | None = None
    live_at: float | None = None
    first_at: float | None = None
    attempts: int = 0
    problems: list[str] = field(default_factory=list)


async def follow(follower: Follower, urls: list[str], session: aiohttp.ClientSession) -> None:
    """Read the subscriber's stream from ``urls[0]`` (node B); when that connection ends,
    at once from ``urls[1]`` (node C), each time from the last cursor received."""
    node = 0
    headers = {"Authorization": f"Bearer {follower.token}"}
    while True:
        ws_url = urls[node].replace("http", "ws", 1) + "/v1/ws"
        if node == 1:
            follower.attempts += 1
        try:
            async with session.ws_connect(
                ws_url, params={"since": follower.cursor}, headers=headers, max_msg_size=0
            ) as ws:
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    now = time.time()
                    frame = orjson.loads(message.data)
                    kind, data = frame["type"], frame["data"]
                    if kind == "notification":
                        follower.cursor = data["cursor"]
                        follower.got.append((data["cursor"], data["memory_unit_id"], node))
                        if node == 1 and follower.first_at is None:
                            follower.first_at = now
                    elif kind == "live":
                        if node == 0:
                            follower.live_on_b.set()
                        elif follower.live_at is None:
                            follower.live_at = now
                    elif kind == "resume":
                        if not data.get("recovered"):
                            follower.problems.append(f"node {'BC'[node]} did not resume: {data}")
                    else:
                        follower.problems.append(f"{kind} frame on node {'BC'[node]}: {data}")
        except (aiohttp.ClientError, OSError) as exc:
            if node == 0 and not follower.live_on_b.is_set():
                follower.problems.append(f"could not connect to node B: {exc!r}")
                follower.live_on_b.set()  # do not wait for it
                return
            if node == 1:
                await asyncio.sleep(0.05)  # node C refused: try it again
                continue
        if node == 0:
            follower.ended_at = time.time()
            node = 1
        else:
            follower.problems.append("node C closed the stream")
            await asyncio.sleep(0.05)


@dataclass
class Failover:
    subscribers: int
    sent: list[Sent]
    killed_at: float
    followers: list[Follower]
    expected: int = 0
    #: subscribers whose stream was exactly the log's units, in order, each once
    exact: int = 0
    problems: list[str] = field(default_factory=list)
    #: requests refused for now (waited out and sent again)
    refused: Refusals = field(default_factory=Refusals)

    def since_kill(self, attribute: str) -> list[float]:
        """ms from the kill to ``attribute`` of every follower that has it."""
        times = [getattr(f, attribute) for f in self.followers]
        return [(t - self.killed_at) * 1000 for t in times if t is not None]

    @property
    def errors(self) -> int:
        return sum(1 for s in self.sent if s.unit is None)

    @property
    def why(self) -> str:
        return refusals(self.sent)


async def register_subscribers(url: str, count: int) -> list[Follower]:
    """``count`` agents registered on ``url``, each with one subscription to every unit."""
    subscription = {"events": ["memory.recorded"], "min_relevance": 0, "debounce_ms": 0}
    json = {"Content-Type": "application/json"}
    gate = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as session:

        async def one(i: int) -> Follower:
            agent = f"follower-{i:03d}"
            async with gate:
                token, epoch = await register(session, url, agent)
                payload = {"action": "subscribe", "subscription": subscription}
                body = orjson.dumps(envelope("SUBSCRIBE", agent, payload, epoch))
                headers = {**json, "Authorization": f"Bearer {token}"}
                target = url + "/v1/subscribe"
                reply = await post_retried(session, target, body, headers, Refusals())
                if reply.status != 200:
                    raise RuntimeError(f"SUBSCRIBE {agent}: {reply.status} {reply.answer}")
            return Follower(agent, token, reply.answer["cursor"])

        return list(await asyncio.gather(*(one(i) for i in range(count))))


async def failover_run(nodes: list[FieldServer], args: argparse.Namespace) -> Failover:
    a, b, c = nodes
    followers = await register_subscribers(b.url, args.failover_subscribers)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    readers = [asyncio.create_task(follow(f, [b.url, c.url], session)) for f in followers]
    try:
        async with asyncio.timeout(LIVE_TIMEOUT):
            await asyncio.gather(*(f.live_on_b.wait() for f in followers))
        killed_at = [0.0]

        def kill_b() -> None:
            killed_at[0] = time.time()
            assert b.process is not None
            b.process.kill()

        print(f"  failover: {args.seconds:g} s ...", file=sys.stderr, flush=True)
        refused = Refusals()
        sent = await open_loop(a.url, args.failover_rate, args.seconds, kill_b, refused)
        units = await asyncio.to_thread(logged_units, database_of(a))
        wanted = len(units)
        deadline = time.monotonic() + COLLECT_TIMEOUT
        while time.monotonic() < deadline and any(len(f.got) < wanted for f in followers):
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # anything more (a duplicate) would arrive by now
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await session.close()
    result = Failover(len(followers), sent, killed_at[0], followers, expected=wanted)
    result.refused = refused
    acknowledged = {s.unit for s in sent if s.unit is not None}
    if not acknowledged <= {unit for _, unit in units}:
        result.problems.append("acknowledged units are missing from the log")
    for f in followers:
        stream = [(position_of(cursor), unit) for cursor, unit, _ in f.got]
        if stream == units and f.first_at is not None:
            result.exact += 1
            continue
        have = [unit for _, unit in stream]
        missing = len({u for _, u in units} - set(have))
        twice = len(have) - len(set(have))
        f.problems.append(
            f"{len(stream)} notifications for {len(units)} units: {missing} missing, "
            f"{twice} twice" + ("" if f.first_at else ", none from node C")
        )
    return result


def failover_case(args: argparse.Namespace) -> Failover:
    with cluster(args.url, 3) as nodes:
        loop, _ = new_loop()
        try:
            return loop.run_until_complete(failover_run(nodes, args))
        finally:
            loop.close()


# -- takeover: webhook deliveries when their sender dies or hangs -----------------------


@dataclass
class Hook:
    """One POST the receiver got: when (``time.time()``), its webhook-id, its unit."""

    at: float
    message_id: str
    cursor: str
    unit: str


class Hooks:
    """A webhook receiver on loopback: every POST is noted and answered 200 at once."""

    def __init__(self) -> None:
        self.got: list[Hook] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        message_id = request.headers.get("webhook-id", "")
        self.got.append(Hook(time.time(), message_id, body["cursor"], body["memory_unit_id"]))
        return web.Response(status=200)


@dataclass
class Takeover:
    how: str
    sent: list[Sent]
    #: when the sender was signalled (time.time()), and when another node said it sends
    signalled: float
    owner_at: float | None
    hooks: list[Hook]
    #: (position, unit id) of every unit the log holds
    units: list[tuple[int, str]]
    refused: Refusals = field(default_factory=Refusals)
    problems: list[str] = field(default_factory=list)

    def _first(self) -> dict[str, Hook]:
        first: dict[str, Hook] = {}
        for hook in self.hooks:
            first.setdefault(hook.unit, hook)
        return first

    @property
    def resume(self) -> float:
        """Seconds from the signal to the first webhook of a unit sent after it."""
        after = {s.unit for s in self.sent if s.unit is not None and s.sent > self.signalled}
        times = [h.at for h in self.hooks if h.unit in after]
        return min(times) - self.signalled if times else float("nan")

    @property
    def owner(self) -> float:
        return float("nan") if self.owner_at is None else self.owner_at - self.signalled

    @property
    def longest_wait(self) -> float:
        """Seconds, the longest from a RECORD's acknowledgement to its unit's webhook."""
        first = self._first()
        waits = [
            first[s.unit].at - s.answered
            for s in self.sent
            if s.unit is not None and s.unit in first
        ]
        return max(waits, default=float("nan"))

    @property
    def duplicates(self) -> int:
        return len(self.hooks) - len({h.message_id for h in self.hooks})

    @property
    def exact(self) -> bool:
        """Every unit of the log delivered, first deliveries in log order, each repeat with
        its first's webhook-id."""
        first = list(self._first().values())
        return [position_of(h.cursor) for h in first] == [p for p, _ in self.units] and all(
            h.message_id == h.cursor for h in self.hooks
        )

    @property
    def errors(self) -> int:
        return sum(1 for s in self.sent if s.unit is None)


async def steady_writer(
    url: str,
    rate: float,
    seconds: float,
    signals: list[tuple[float, Callable[[], None]]],
    refused: Refusals,
) -> list[Sent]:
    """Register a writer on ``url``, then RECORD at ``rate`` a second for ``seconds``, open
    loop; each of ``signals`` (seconds from the start, what to call) is called at its time.
    A RECORD refused for now is sent again, counted in ``refused``: ``503 OVERLOADED`` and
    ``429 RATE_LIMITED`` after their Retry-After, ``503 LOG_UNAVAILABLE`` (nothing written:
    the log's write lock is held elsewhere) after 0.1 s."""
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector) as session:
        token, epoch = await register(session, url, "writer", refused)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        rng = random.Random(7)

        async def one(n: int) -> Sent:
            body = orjson.dumps(envelope("RECORD", "writer", record_payload(rng, n), epoch))
            sent = time.time()
            deadline = time.monotonic() + TAKEOVER_TIMEOUT
            try:
                while True:
                    reply = await post_retried(session, url + "/v1/record", body, headers, refused)
                    answer = reply.answer if isinstance(reply.answer, dict) else {}
                    code = answer.get("code")
                    if reply.status != 503 or code != "LOG_UNAVAILABLE":
                        break
                    if time.monotonic() > deadline:
                        break
                    refused.note("503 LOG_UNAVAILABLE", 0.1)
                    await asyncio.sleep(0.1)
            except (aiohttp.ClientError, OSError) as exc:
                return Sent(n, sent, time.time(), None, f"{type(exc).__name__}: {exc}")
            if reply.status != 200:
                return Sent(n, reply.sent_at, time.time(), None, f"{reply.status} {code}")
            return Sent(n, reply.sent_at, time.time(), reply.answer["memory_unit_id"])

        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        for at, call in signals:
            loop.call_at(start + at, call)
        tasks = []
        for n in range(round(rate * seconds)):
            delay = start + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n)))
        return list(await asyncio.gather(*tasks))


async def delivery_owner(
    session: aiohttp.ClientSession, nodes: list[FieldServer]
) -> FieldServer | None:
    """The one node of ``nodes`` whose status says it sends the deliveries, if any."""
    owners = [
        node
        for node in nodes
        if (await get_json(session, node.url + "/v1/field/status"))["node"]["delivery_owner"]
    ]
    return owners[0] if len(owners) == 1 else None


def delivery_entries(database: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, data) of every ``delivery.*`` entry of a log, in log order."""
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT kind, data FROM field_log WHERE kind LIKE 'delivery.%' ORDER BY position"
        ).fetchall()
    return [(kind, orjson.loads(bytes(data))) for kind, data in rows]


def stale_entries(entries: list[tuple[str, dict[str, Any]]]) -> int:
    """Delivery entries written under a term below the newest claimed before them."""
    newest, stale = 0, 0
    for kind, data in entries:
        if kind == "delivery.term":
            newest = max(newest, data["term"])
        elif data.get("term", newest) < newest:
            stale += 1
    return stale


async def takeover_run(nodes: list[FieldServer], args: argparse.Namespace, how: str) -> Takeover:
    hooks = Hooks()
    await hooks.start()
    refused = Refusals()
    paused: list[int] = []  # the pid of a node stopped and not yet let run again
    session = aiohttp.ClientSession()
    try:
        token, epoch = await register(session, nodes[0].url, "reader", refused)
        subscription = {
            "events": ["memory.recorded"],
            "delivery": {"type": "webhook", "url": hooks.url},
        }
        body = orjson.dumps(
            envelope(
                "SUBSCRIBE", "reader", {"action": "subscribe", "subscription": subscription}, epoch
            )
        )
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        reply = await post_retried(session, nodes[0].url + "/v1/subscribe", body, headers, refused)
        if reply.status != 200:
            raise RuntimeError(f"SUBSCRIBE: {reply.status} {reply.answer}")
        deadline = time.monotonic() + TAKEOVER_TIMEOUT
        while (owner := await delivery_owner(session, nodes)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no node sends the deliveries")
            await asyncio.sleep(0.05)
        others = [node for node in nodes if node is not owner]
        signalled = [0.0]
        owner_at: list[float | None] = [None]

        async def watch() -> None:
            while owner_at[0] is None:
                found = await delivery_owner(session, others)
                if found is not None:
                    owner_at[0] = time.time()
                await asyncio.sleep(0.02)

        watcher: list[asyncio.Task[None]] = []

        def signal_owner() -> None:
            signalled[0] = time.time()
            if how == "pause":
                os.kill(owner.pid, signal.SIGSTOP)
                paused.append(owner.pid)
            else:
                os.kill(owner.pid, signal.SIGKILL)
            watcher.append(asyncio.create_task(watch()))

        def resume_owner() -> None:
            os.kill(paused.pop(), signal.SIGCONT)

        half = args.seconds / 2
        signals = [(half, signal_owner)]
        if how == "pause":
            signals.append((half + args.pause, resume_owner))
        seconds = args.seconds + (args.pause if how == "pause" else 0)
        print(f"  takeover ({how}): {seconds:g} s ...", file=sys.stderr, flush=True)
        sent = await steady_writer(others[0].url, args.failover_rate, seconds, signals, refused)
        database = database_of(others[0])
        units = await asyncio.to_thread(logged_units, database)
        wanted = {unit for _, unit in units}
        deadline = time.monotonic() + TAKEOVER_TIMEOUT
        while time.monotonic() < deadline and not wanted <= {h.unit for h in hooks.got}:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # anything more (a repeat) would arrive by now
        for task in watcher:
            task.cancel()
        result = Takeover(how, sent, signalled[0], owner_at[0], list(hooks.got), units, refused)
        acknowledged = {s.unit for s in sent if s.unit is not None}
        if not acknowledged <= wanted:
            result.problems.append("acknowledged units are missing from the log")
        stale = stale_entries(await asyncio.to_thread(delivery_entries, database))
        if stale:
            result.problems.append(f"{stale} delivery entries under a term older than the log's")
        if how == "pause":
            status = await get_json(session, owner.url + "/v1/field/status")
            if status["node"]["delivery_owner"]:
                result.problems.append("the paused node, run again, still says it sends")
        return result
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        await session.close()
        await hooks.stop()


def takeover_case(args: argparse.Namespace, how: str) -> Takeover:
    with cluster(args.url, 3, webhooks=True) as nodes:
        loop, _ = new_loop()
        try:
            return loop.run_until_complete(takeover_run(nodes, args, how))
        finally:
            loop.close()


# -- report ---------------------------------------------------------------------------


def span(values: list[float], form: str) -> str:
    """``low-high`` of the rounds' figures (one figure for one round)."""
    low, high = min(values), max(values)
    if format(low, form) == format(high, form):
        return format(low, form)
    return f"{low:{form}}-{high:{form}}"


def report_throughput(rows: list[Throughput], args: argparse.Namespace) -> None:
    print(
        f"\nThroughput: {args.clients} clients (one agent and one kept-alive connection each) "
        f"spread evenly over the nodes, RECORD in a closed loop; {args.seconds:g} s measured "
        f"after {args.warmup:g} s warm-up. batch/s: group commits a second, all nodes "
        "together; ops/b: operations per commit. CPU in cores (1.0 = one busy core) and in "
        "us per acknowledged RECORD, of all nodes together and of PostgreSQL (every postgres "
        "process on the host); gen: the load generator; host: the whole host busy"
    )
    print(
        f"{'config':<16}{'RECORD/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'batch/s':>9}{'ops/b':>7}"
        f"{'nodes':>7}{'us/op':>7}{'PG':>6}{'us/op':>7}{'gen':>6}{'host':>6}{'acked':>8}"
        f"{'refused':>8}{'durable':>8}"
    )
    for r in rows:
        m = r.meter
        wall = args.warmup + args.seconds
        per_op = wall * 1e6 / max(1, r.run.acknowledged)  # cores -> us of CPU per RECORD
        print(
            f"{r.config:<16}{r.run.rate:>10,.0f}{r.run.latency(0.5):>9.2f}"
            f"{r.run.latency(0.99):>9.2f}{r.batches / wall:>9,.0f}"
            f"{r.operations / max(1, r.batches):>7.1f}{m.node_cpu:>7.2f}"
            f"{m.node_cpu * per_op:>7.0f}{m.postgres:>6.2f}{m.postgres * per_op:>7.0f}"
            f"{m.generator:>6.2f}{m.host_busy:>6.0%}{r.run.acknowledged:>8,}{r.refused:>8,}"
            f"{'yes' if r.durable else 'NO':>8}"
        )
        if not r.durable:
            print(
                f"  ! {r.config}: acknowledged {r.run.acknowledged}, the nodes count "
                f"{r.status_units}, the log holds {r.log_units}"
            )
        if r.run.refusals:
            print(f"  {r.config}: refused {r.run.refusals.describe()}")
        if r.run.errors:
            print(f"  ! {r.config}: not acknowledged {r.run.errors}")
    configs = list(dict.fromkeys(r.config for r in rows))
    by = {c: [r for r in rows if r.config == c] for c in configs}
    sqlite, pg1 = by.get("1 node, SQLite", []), by.get("1 node, PG", [])
    print(f"over {args.rounds} round{'s' * (args.rounds > 1)}:")
    for config in configs:
        runs = by[config]
        line = (
            f"  {config:<16}{span([r.run.rate for r in runs], ',.0f')} RECORD/s, "
            f"p50 {span([r.run.latency(0.5) for r in runs], '.2f')} ms, "
            f"p99 {span([r.run.latency(0.99) for r in runs], '.2f')} ms"
        )
        bases = {"1 node, SQLite": (), "1 node, PG": (("SQLite", sqlite),)}.get(
            config, (("SQLite", sqlite), ("1 node on PG", pg1))
        )
        for name, base in bases:
            if base:  # round by round
                ratios = [r.run.rate / b.run.rate for r, b in zip(runs, base, strict=False)]
                line += f"; {span(ratios, '.2f')}x {name}"
        print(line)


def report_delivery(rows: list[Delivery], args: argparse.Namespace) -> None:
    print(
        f"\nDelivery: {args.subscribers:,} WebSocket subscribers on node B ({args.procs} "
        f"client processes), one writer RECORDing through node A at {args.rate:g}/s open "
        f"loop for {args.seconds:g} s; latency = RECORD sent on A -> notification received "
        "on B (1 node: both on it)"
    )
    print(
        f"{'config':<17}{'subscr.':>8}{'notif.':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'ack p50':>9}{'ack p99':>9}{'refused':>8}{'nodes':>7}{'PG':>6}{'host':>6}{'exact':>7}"
    )
    for r in rows:
        lat, acks = r.latencies or [float("nan")], r.acks or [float("nan")]
        m = r.meter
        assert m is not None
        print(
            f"{r.config:<17}{r.subscribers:>8,}{len(r.latencies):>9,}{pct(lat, 0.5):>9.1f}"
            f"{pct(lat, 0.99):>9.1f}{max(lat):>9.1f}{pct(acks, 0.5):>9.1f}{pct(acks, 0.99):>9.1f}"
            f"{r.refused.total:>8}{m.node_cpu:>7.2f}{m.postgres:>6.2f}{m.host_busy:>6.0%}"
            f"{'yes' if r.exact else 'NO':>7}"
        )
        if not r.exact:
            print(
                f"  ! {r.config}: {r.expected - r.missing:,} of {r.expected:,} delivered, "
                f"{r.duplicates} twice; {r.anomalies or ''}"
            )
        if r.refused:
            print(f"  {r.config}: refused {r.refused.describe()}")
        if r.errors:
            print(f"  ! {r.config}: RECORDs not acknowledged: {r.why}")
    print(f"over {args.rounds} round{'s' * (args.rounds > 1)}:")
    for config in dict.fromkeys(r.config for r in rows):
        runs = [r for r in rows if r.config == config and r.latencies]
        if runs:
            print(
                f"  {config:<17}p50 {span([pct(r.latencies, 0.5) for r in runs], '.1f')} ms, "
                f"p99 {span([pct(r.latencies, 0.99) for r in runs], '.1f')} ms, "
                f"max {span([max(r.latencies) for r in runs], '.1f')} ms"
            )
    print("target: p99 <= 50 ms, RECORD sent on A to notification received on B", end="")
    print("" if args.seconds >= 10 else f" (on 10 s sustained or more: {args.seconds:g} s here)")


def report_failover(rows: list[Failover], args: argparse.Namespace) -> None:
    print(
        f"\nFailover: three nodes; {args.failover_subscribers} WebSocket subscribers on node B "
        f"receiving {args.failover_rate:g} RECORD/s written through node A; node B SIGKILLed "
        f"after {args.seconds / 2:g} s, each subscriber then connects to node C from its last "
        "cursor. ms from the kill:"
    )
    print(
        f"{'round':<7}{'event':<26}{'p50':>8}{'p99':>8}{'max':>8}{'exact':>10}{'RECORDs':>9}"
        f"{'refused':>9}{'ack max':>9}"
    )
    events = (
        ("connection to B ended", "ended_at"),
        ("live on C", "live_at"),
        ("first notification from C", "first_at"),
    )
    for n, r in enumerate(rows, 1):
        acks = [(s.answered - s.sent) * 1000 for s in r.sent if s.unit is not None] or [0.0]
        for i, (name, attribute) in enumerate(events):
            times = r.since_kill(attribute) or [float("nan")]
            tail = (
                f"{f'{r.exact}/{r.subscribers}':>10}{len(r.sent):>9}{r.refused.total:>9}"
                f"{max(acks):>9.1f}"
                if i == 0
                else ""
            )
            print(
                f"{n if i == 0 else '':<7}{name:<26}{pct(times, 0.5):>8.0f}{pct(times, 0.99):>8.0f}"
                f"{max(times):>8.0f}{tail}"
            )
        if r.refused:
            print(f"  refused {r.refused.describe()}")
        if r.errors:
            print(f"  ! RECORDs not acknowledged: {r.why}")
        for problem in r.problems:
            print(f"  ! {problem}")
        shown = [f for f in r.followers if f.problems][:5]
        for f in shown:
            print(f"  ! {f.agent}: {'; '.join(f.problems)}")
    first = [r.since_kill("first_at") for r in rows if r.since_kill("first_at")]
    if first:
        print(
            f"over {len(rows)} round{'s' * (len(rows) > 1)}: first notification from C "
            f"p50 {span([pct(t, 0.5) for t in first], '.0f')} ms, "
            f"p99 {span([pct(t, 0.99) for t in first], '.0f')} ms, "
            f"max {span([max(t) for t in first], '.0f')} ms"
        )
    print(
        "exact: subscribers whose stream was the log's units, in log order, each once, across "
        "the move; target: first notification from C <= 2 s after the kill"
    )


def report_takeover(rows: list[Takeover], args: argparse.Namespace) -> None:
    print(
        f"\nTakeover: three nodes (--cluster-interval 1), one webhook subscription, "
        f"{args.failover_rate:g} RECORD/s through a node that does not send the deliveries; "
        f"after {args.seconds / 2:g} s the sending node is SIGKILLed (kill) or SIGSTOPped for "
        f"{args.pause:g} s (pause). Seconds from the signal: resume = the first webhook of a "
        "unit sent after it; owner = another node's status says it sends; longest = the "
        "longest a unit waited from its RECORD's acknowledgement to its webhook"
    )
    print(
        f"{'mode':<7}{'resume s':>10}{'owner s':>9}{'longest s':>11}{'RECORDs':>9}"
        f"{'refused':>9}{'repeats':>9}{'exact':>7}"
    )
    for r in rows:
        print(
            f"{r.how:<7}{r.resume:>10.2f}{r.owner:>9.2f}{r.longest_wait:>11.2f}{len(r.sent):>9}"
            f"{r.refused.total:>9}{r.duplicates:>9}{'yes' if r.exact else 'NO':>7}"
        )
        if r.refused:
            print(f"  refused {r.refused.describe()}")
        if r.errors:
            print(f"  ! RECORDs not acknowledged: {refusals(r.sent)}")
        for problem in r.problems:
            print(f"  ! {problem}")
    for how in dict.fromkeys(r.how for r in rows):
        runs = [r for r in rows if r.how == how]
        resumes = [r.resume for r in runs]
        print(
            f"over {len(runs)} run{'s' * (len(runs) > 1)}, {how}: resume "
            f"p50 {pct(resumes, 0.5):.2f} s, max {max(resumes):.2f} s; longest wait "
            f"max {max(r.longest_wait for r in runs):.2f} s"
        )
    print(
        "exact: every unit of the log reached the receiver, first deliveries in log order, "
        "repeats with the same webhook-id; target: resume <= 2.5 s (2.5 intervals)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=["throughput", "delivery", "failover", "takeover"],
        default=["throughput", "delivery", "failover", "takeover"],
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="load per run (10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="throughput lead-in (1)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every case (1)")
    parser.add_argument("--clients", type=int, default=32, help="throughput writers (32)")
    parser.add_argument("--subscribers", type=int, default=1000, help="delivery (1000)")
    parser.add_argument("--rate", type=float, default=20, help="delivery RECORD/s (20)")
    parser.add_argument("--procs", type=int, default=2, help="delivery client processes (2)")
    parser.add_argument("--failover-subscribers", type=int, default=100)
    parser.add_argument("--failover-rate", type=float, default=10, help="RECORD/s (10)")
    parser.add_argument("--pause", type=float, default=10, help="takeover: SIGSTOP s (10)")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 10 or not 1 <= args.clients <= 256:
        parser.error("--rounds must be in [1, 10] and --clients in [1, 256]")
    if not 1 <= args.seconds <= 300 or not 0 <= args.warmup <= 10:
        parser.error("--seconds must be in [1, 300] and --warmup in [0, 10]")
    if not 1 <= args.subscribers <= 10_000 or not 1 <= args.failover_subscribers <= 1000:
        parser.error("--subscribers must be in [1, 10000], --failover-subscribers [1, 1000]")
    if not 0 < args.rate <= 1000 or not 0 < args.failover_rate <= 1000:
        parser.error("--rate and --failover-rate must be in (0, 1000]")
    if not 0 < args.pause <= 120:
        parser.error("--pause must be in (0, 120]")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the nodes on the way out
    limit = raise_nofile()
    if limit < args.subscribers + 200:
        parser.error(f"the open-file limit is {limit}; {args.subscribers + 200} are needed")

    print(
        f"{os.cpu_count()} CPUs on this host run everything: every node, PostgreSQL, the load "
        "generator (and the delivery case's client processes), and whatever else the host runs; "
        "a second or third node takes CPU from the first rather than adding its own, so the "
        "multi-node figures here show what the cluster costs, not how it scales",
        flush=True,
    )
    throughput: list[Throughput] = []
    delivery: list[Delivery] = []
    failover: list[Failover] = []
    takeover: list[Takeover] = []
    configs = [("sqlite", 1), ("postgresql", 1), ("postgresql", 2), ("postgresql", 3)]
    for round_ in range(args.rounds):
        if "throughput" in args.cases:
            # the reverse order every other round: no configuration always goes first
            for backend, count in configs if round_ % 2 == 0 else configs[::-1]:
                throughput.append(throughput_case(args, backend, count))
        if "delivery" in args.cases:
            for count in (2, 1) if round_ % 2 == 0 else (1, 2):
                delivery.append(delivery_case(args, count))
        if "failover" in args.cases:
            failover.append(failover_case(args))
        if "takeover" in args.cases:
            for how in ("kill", "pause") if round_ % 2 == 0 else ("pause", "kill"):
                takeover.append(takeover_case(args, how))

    order = {"1 node, SQLite": 0, "1 node, PG": 1, "2 nodes, PG": 2, "3 nodes, PG": 3}
    if throughput:
        report_throughput(sorted(throughput, key=lambda r: order[r.config]), args)
    if delivery:
        report_delivery(sorted(delivery, key=lambda r: r.config), args)
    if failover:
        report_failover(failover, args)
    if takeover:
        report_takeover(sorted(takeover, key=lambda r: r.how), args)
    failed = (
        any(not r.durable for r in throughput)
        or any(not r.exact for r in delivery)
        or any(r.exact != r.subscribers or r.problems for r in failover)
        or any(not r.exact or r.problems or r.errors for r in takeover)
    )
    if failed:
        print("! some runs lost or duplicated something: see the lines marked !")
        sys.exit(1)


if __name__ == "__main__":
    bracketed(main)
