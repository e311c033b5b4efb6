"""Faults as a habit: a Field of several nodes under faults, checked from outside.

:func:`run_harness` starts ``field serve`` nodes on one fresh PostgreSQL database, each
reaching it through a TCP :class:`Proxy` of its own that the harness controls, and runs
clients against them over plain HTTP, WebSocket and SSE while faults are injected:

* **writers**, one a node: RECORD units whose content starts with a unique marker. A
  ``503`` or ``429`` is retried, the same request, after its ``Retry-After``; a 200 is
  *acknowledged*; a request whose outcome cannot be known (the connection reset or timed out
  after it was sent) is *unknown*: it may be in the log, at most once. A connection that
  cannot be opened sent nothing: the same request goes to the next node. A ``503
  LOG_UNAVAILABLE`` whose message says the outcome is unknown (a commit cut off while the
  database could not be asked whether it landed) is *unknown* too; any other ``503`` said
  nothing was stored, and a retry that stores the unit twice is reported as a duplicate
  with every attempt and the copy that was not acknowledged.
* **pushers**, a WebSocket and an SSE subscriber a node, each its own agent subscribed to
  ``memory.recorded`` with ``min_relevance`` 0. When a connection ends they connect again,
  to the same node first and then to the next, from the cursor of the last notification
  received (``since=<subscription>@<cursor>``, ``Last-Event-ID``).
* **pollers**, two a node, following protocol/README.md's rule: ATTUNE with
  ``since_epoch`` = the previous answer's ``epoch`` (from 0) and ``envelope.epoch`` = the
  highest epoch seen, ``relevance_threshold`` 0. One stays on its node, one moves to the
  next node at every poll.
* a **webhook receiver** with one webhook subscription, deduplicating by ``webhook-id``.

The faults (:data:`FAULT_KINDS`), drawn at random from a seeded generator, one or a few at
a time, each logged with its time: a node SIGKILLed and started again on its port, a node
stopped (SIGSTOP) for seconds, ``pg_terminate_backend`` of a node's backends (found by the
ports its proxy connects from), ``LOCK TABLE field_log`` or ``field_log_head`` ``IN ACCESS
EXCLUSIVE MODE`` held for seconds, and on one node's proxy latency, a drop of every
connection, a partition (nothing passes either way, until it heals) or refusal (every
connection reset, new ones refused). Faults aimed at nodes leave at least one node
untouched at every moment, so that some node always takes writes. A node started again that
exits before it listens is started once or twice more, a second apart, as a supervisor
would; the fault's detail says why it exited.

Once the faults end and every node is healed, the writers stop, one last *sentinel* unit
is written, and everything settles (bounded: ``settle_timeout``). The checks then read
``field_log`` itself: every acknowledged write is there exactly once (with the unit id and
epoch it was answered with), an unknown one at most once, a refused one not at all; the
units' epochs strictly increase with their positions; every pusher's stream holds every
unit after its start cursor once, in log order, each with the log's epoch; every poller saw
every unit once; the webhook got every unit, the first delivery of each ``webhook-id`` in
cursor order; every node applied the whole log. Each anomaly names the unit's position,
epoch, the node it was written through, its neighbours in the log, and the warning lines the
nodes logged around its time (each node's stderr is kept in ``workdir``, with the harness's
own lines between them marking starts, kills, pauses and faults).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import itertools
import os
import random
import signal
import socket
import struct
import sys
import tempfile
import time
import urllib.parse
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg
from aiohttp import web

from .postgres_util import fresh_database

#: Every fault the harness knows, each aimed at one node except the two table locks.
FAULT_KINDS = (
    "kill",
    "pause",
    "terminate",
    "lock_log",
    "lock_head",
    "delay",
    "drop",
    "partition",
    "refuse",
)
_TABLE_FAULTS = {"lock_log": "field_log", "lock_head": "field_log_head"}

#: Bytes a proxy reads at a time, and chunks one direction holds in flight: a full queue
#: stops reading, so the sender waits, as behind a slow network.
CHUNK_BYTES = 65536
IN_FLIGHT_CHUNKS = 64
#: Seconds a RECORD or ATTUNE may take before its outcome counts as unknown; above the
#: longest pause or partition, so that a request held by one completes after it.
REQUEST_TIMEOUT = 20.0
#: Seconds to connect to a node; a connection not made sent nothing.
CONNECT_TIMEOUT = 3.0
#: Seconds between WebSocket pings of a pusher (a node that answers none is left), and
#: seconds an SSE stream may stay silent (the Field comments every 15 s).
WS_HEARTBEAT = 5.0
SSE_IDLE = 25.0
#: Seconds a node has to print that it listens.
START_TIMEOUT = 90.0
#: Node status samples kept (one a node a second).
STATUS_SAMPLES = 20000

ROLE = "analyst"


def say(message: str) -> None:
    """A harness line on stderr, with the wall-clock time."""
    print(f"[faults {_clock(time.time())}] {message}", file=sys.stderr, flush=True)


@dataclass
class HarnessConfig:
    """What one run does. ``duration`` is the seconds of faults; the load runs from the
    nodes' start to the settling."""

    nodes: int = 3
    duration: float = 45.0
    #: RECORDs a second, all writers together
    rate: float = 10.0
    seed: int | None = None
    kinds: tuple[str, ...] = FAULT_KINDS
    #: faults under way at once at most (node faults always spare one node)
    concurrency: int = 1
    #: seconds between one fault's end and the next one's start, drawn uniformly
    gap: tuple[float, float] = (0.5, 2.0)
    #: seconds a pause, lock, delay, partition or refusal lasts, drawn uniformly
    fault_seconds: tuple[float, float] = (1.0, 4.0)
    settle_timeout: float = 60.0
    poll_interval: float = 0.3
    cluster_interval: float = 0.5
    #: where each node's stderr and data directory go (a new temporary directory if None)
    workdir: Path | None = None
    #: extra ``field serve`` flags and environment of every node
    node_args: tuple[str, ...] = ()
    node_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 2 <= self.nodes <= 26:
            raise ValueError(f"nodes must be in [2, 26], got {self.nodes}")
        if not 0 < self.rate <= 1000:
            raise ValueError(f"rate must be in (0, 1000], got {self.rate}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be some of {FAULT_KINDS}, got {self.kinds}")
        if not 1 <= self.concurrency < self.nodes + 2:
            raise ValueError(f"concurrency must be in [1, {self.nodes + 1}]")


# -- the network between a node and the database ---------------------------------------------


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a reset (SO_LINGER 0), as a broken network does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One connection through a proxy: the node's side and the database's."""

    def __init__(
        self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.client = (reader, writer)
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        #: the port this link connects to the database from (``client_port`` there)
        self.backend_port = 0

    async def run(self) -> None:
        reader, writer = self.client
        try:
            await self.proxy.flowing.wait()  # a partition holds new connections too
            self.upstream = await asyncio.open_connection(*self.proxy.target)
        except OSError:
            _reset(writer)
            return
        self.backend_port = self.upstream[1].get_extra_info("sockname")[1]
        pipes = [
            asyncio.ensure_future(self._pipe(reader, self.upstream[1])),
            asyncio.ensure_future(self._pipe(self.upstream[0], writer)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for _, each in (self.client, self.upstream):
                each.close()  # after what it holds: one side closed, so does the other

    def reset(self) -> None:
        for _, writer in filter(None, (self.client, self.upstream)):
            _reset(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward bytes one way, each chunk ``latency`` after it was read, in order, and
        only while the network flows (held, not lost, during a partition)."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(IN_FLIGHT_CHUNKS)

        async def read() -> None:
            while True:
                try:
                    data = await reader.read(CHUNK_BYTES)
                except OSError:
                    data = b""
                await chunks.put((loop.time() + self.proxy.latency, data))
                if not data:
                    return

        reading = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await chunks.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                await self.proxy.flowing.wait()
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            return
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


class Proxy:
    """A TCP proxy between one node and PostgreSQL whose network the harness controls:
    ``latency`` (each chunk delivered that much later, each way, in order), :meth:`drop`
    (every connection reset), :meth:`partition` (nothing passes either way and new
    connections are held, until :meth:`heal`: then what was held flows on) and
    ``refusing`` (new connections reset as soon as they are accepted)."""

    def __init__(self, name: str, target: tuple[str, int]) -> None:
        self.name = name
        self.target = target
        self.latency = 0.0
        self.refusing = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.port = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.heal()
        self.drop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def partition(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def drop(self) -> int:
        """Reset every connection; how many there were."""
        links = list(self._links)
        for link in links:
            link.reset()
        return len(links)

    def backend_ports(self) -> list[int]:
        return [link.backend_port for link in self._links if link.backend_port]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            _reset(writer)
            return
        link = _Link(self, reader, writer)
        self._links.add(link)
        try:
            await link.run()
        except Exception as error:  # a connection's failure is its own, never the proxy's
            say(f"proxy {self.name}: link failed: {error!r}")
            link.reset()
        finally:
            self._links.discard(link)


# -- nodes ------------------------------------------------------------------------------------


def _node_port() -> int:
    """A free port below the kernel's ephemeral range: no outgoing connection takes it while
    its node is down, so the node starts again on it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Node:
    """One ``field serve`` process, its proxy and its stderr (a file of its own: line n of
    the file is ``lines[n - 1]``, with the harness's own lines marked ``== harness``)."""

    def __init__(self, name: str, proxy: Proxy, database: str, config: HarnessConfig) -> None:
        workdir = config.workdir
        assert workdir is not None
        self.name = name
        self.proxy = proxy
        self.port = _node_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = workdir / name
        self.log_path = workdir / f"node-{name}.log"
        #: (wall-clock time read, line) of every line of the log file
        self.lines: list[tuple[float, str]] = []
        self.process: asyncio.subprocess.Process | None = None
        self.paused = False
        self.starts = 0
        #: why each start that did not reach "listening" ended (its last error line)
        self.failed_starts: list[str] = []
        parts = urllib.parse.urlsplit(database)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
        self.log_url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        self._args = (
            *("--log", self.log_url, "--node-id", name),
            *("--cluster-interval", str(config.cluster_interval)),
            *("--webhook-allow-net", "127.0.0.0/8"),
            *("--webhook-key-file", str(workdir / "webhook.key")),
            *("--webhook-retry-base", "0.1", "--webhook-retry-cap", "1"),
            *config.node_args,
        )
        self._env = {**os.environ, **config.node_env, "PYTHONUNBUFFERED": "1"}
        self._file = open(self.log_path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def mark(self, message: str) -> int:
        """Write a harness line into the node's log; its line number."""
        return self._line(f"== harness {time.strftime('%H:%M:%S')}: {message}")

    def _line(self, text: str) -> int:
        self.lines.append((time.time(), text))
        self._file.write(text + "\n")
        return len(self.lines)

    async def start(self) -> None:
        """Start the process on the node's port; return once it listens (a few tries: the
        port of a process just killed may still be held for a moment)."""
        for attempt in range(3):
            try:
                await self._start_once()
                return
            except RuntimeError as error:
                errors = [line for line in str(error).splitlines() if " ERROR " in line]
                self.failed_starts.append((errors or str(error).splitlines())[-1][:300])
                if attempt == 2:
                    raise
                await asyncio.sleep(1.0)

    async def _start_once(self) -> None:
        command = [
            *(sys.executable, "-m", "field", "serve", "--host", "127.0.0.1"),
            *("--port", str(self.port), "--data-dir", str(self.data_dir), *self._args),
        ]
        self.process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
        )
        self.starts += 1
        self.paused = False
        self.mark(f"started pid {self.process.pid} on port {self.port}")
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain = asyncio.ensure_future(self._read_stderr(self.process, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except BaseException:
            with contextlib.suppress(TimeoutError):  # a process that gave up: its exit
                await asyncio.wait_for(asyncio.shield(self.process.wait()), 5)
            await self.kill()
            raise

    async def _read_stderr(
        self, process: asyncio.subprocess.Process, ready: asyncio.Future[None]
    ) -> None:
        assert process.stderr is not None
        while line := await process.stderr.readline():
            text = line.decode(errors="replace").rstrip("\n")
            self._line(text)
            if not ready.done() and "listening on http://" in text:
                ready.set_result(None)
        if not ready.done():
            tail = "\n".join(t for _, t in self.lines[-15:])
            ready.set_exception(RuntimeError(f"node {self.name} exited before listening:\n{tail}"))

    async def kill(self) -> None:
        """SIGKILL (a stopped process dies of it too) and wait for the exit."""
        if self.process is None:
            return
        if self.process.returncode is None:
            self.mark(f"SIGKILL pid {self.process.pid}")
            self.process.kill()
        await self.process.wait()
        if self._drain is not None:
            await self._drain
        self.paused = False

    def pause(self) -> None:
        assert self.process is not None
        self.mark(f"SIGSTOP pid {self.process.pid}")
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.paused and self.process.returncode is None:
            self.process.send_signal(signal.SIGCONT)
            self.mark(f"SIGCONT pid {self.process.pid}")
        self.paused = False

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; the log file is closed."""
        self.resume()
        if self.running:
            assert self.process is not None
            self.mark(f"SIGTERM pid {self.process.pid}")
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                await self.kill()
        if self._drain is not None:
            await self._drain
        self._file.close()

    def warnings_near(self, when: float, window: float = 3.0, most: int = 6) -> list[str]:
        """``<file>:<line>: <text>`` of the ``most`` warnings, errors and harness lines
        logged nearest to ``when``, within ``window`` seconds, in the file's order."""
        found = []
        first = bisect.bisect_left(self.lines, when - window, key=lambda line: line[0])
        for number in range(first, len(self.lines)):
            at, text = self.lines[number]
            if at > when + window:
                break
            if any(word in text for word in (" WARNING ", " ERROR ", " CRITICAL ", "== harness")):
                found.append((abs(at - when), number))
        nearest = sorted(number for _, number in sorted(found)[:most])
        return [f"{self.log_path.name}:{n + 1}: {self.lines[n][1][:200]}" for n in nearest]


# -- the wire ---------------------------------------------------------------------------------

_ids = itertools.count(1)


def envelope(operation: str, agent: str, payload: dict[str, Any], epoch: int = 0) -> bytes:
    return orjson.dumps(
        {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"harness-{next(_ids)}",
            "operation": operation,
            "agent_id": agent,
            "session_id": None,
            "epoch": epoch,
            "payload": payload,
        }
    )


def position_of(cursor: str) -> int:
    return int(cursor.rpartition("-")[2])


def _retry_after(response: aiohttp.ClientResponse) -> float:
    try:
        return max(0.05, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


@dataclass
class Agent:
    name: str
    token: str
    epoch: int = 0

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float = REQUEST_TIMEOUT,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    limits = aiohttp.ClientTimeout(total=timeout, connect=CONNECT_TIMEOUT)
    async with session.post(url, data=body, headers=headers, timeout=limits) as response:
        raw = await response.read()
    try:
        answer = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        answer = raw[:200].decode(errors="replace")  # not the Field's JSON: shown as it is
    return response.status, answer, response


async def _operation(
    session: aiohttp.ClientSession,
    url: str,
    operation: str,
    agent: str,
    payload: Any,
    headers: dict[str, str] | None = None,
) -> Any:
    """One operation set up before the faults, retried until it answers 200."""
    deadline = time.monotonic() + 60
    while True:
        try:
            status, answer, response = await _post(
                session,
                f"{url}/v1/{operation.lower()}",
                envelope(operation, agent, payload),
                headers or {"Content-Type": "application/json"},
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            status, answer, response = 0, repr(error), None
        if status == 200:
            return answer
        if time.monotonic() > deadline:
            raise RuntimeError(f"{operation} of {agent} on {url}: {status} {answer}")
        await asyncio.sleep(_retry_after(response) if response is not None else 0.5)


# -- writers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One request of a RECORD: when it was sent and answered (wall clock), to which node,
    and what came of it (``200``, ``503 LOG_UNAVAILABLE``, ``unknown: ...``, ``not sent:
    ...``)."""

    sent: float
    answered: float
    node: str
    outcome: str

    def __str__(self) -> str:
        return f"{_clock(self.sent)}-{_clock(self.answered)[6:]} {self.node}: {self.outcome}"


@dataclass
class Write:
    """One marker's RECORD: every attempt, and what came of it."""

    marker: str
    writer: str
    attempts: list[Attempt] = field(default_factory=list)
    #: acknowledged, unknown (may be in the log, once at most), refused (the Field said it
    #: did nothing), failed (an answer the harness does not expect)
    status: str = "pending"
    node: str | None = None
    unit: str | None = None
    epoch: int | None = None


class Writer:
    """RECORDs through its node, paced; a connection it cannot open sends the same request
    to the next node (nothing was sent)."""

    def __init__(self, agent: Agent, nodes: list[Node], home: int, interval: float) -> None:
        self.agent = agent
        self.nodes = nodes
        self.home = home
        self.interval = interval
        self.writes: list[Write] = []
        self.stopping = asyncio.Event()
        self._seq = itertools.count(1)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection a request
        async with aiohttp.ClientSession(connector=connector) as session:
            loop = asyncio.get_running_loop()
            due = loop.time() + random.uniform(0, self.interval)
            while not self.stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), max(0.0, due - loop.time()))
                if self.stopping.is_set():
                    break
                due = max(due + self.interval, loop.time())
                await self.write(session, f"{self.agent.name}-{next(self._seq):06d}")

    async def write(
        self, session: aiohttp.ClientSession, marker: str, patience: float = 60.0
    ) -> Write:
        """RECORD ``marker`` until it is acknowledged or its outcome is unknown; once the
        writer is told to stop, refusals are retried for ``patience`` seconds more."""
        write = Write(marker, self.agent.name)
        self.writes.append(write)
        payload = {
            "type": "finding",
            "content": f"{marker} recorded under faults",
            "intent": {"purpose": "fault harness"},
            "confidence": {"score": 0.5, "reasoning": "written by the fault harness"},
        }
        body = envelope("RECORD", self.agent.name, payload, self.agent.epoch)
        node = self.home
        stopped_at: float | None = None
        while True:
            if self.stopping.is_set():
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > patience:
                    write.status = "refused"  # the last answer said nothing was done
                    return write
            target = self.nodes[node % len(self.nodes)]
            at = time.time()
            try:
                status, answer, response = await _post(
                    session, target.url + "/v1/record", body, self.agent.headers
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
                outcome = f"not sent: {type(error).__name__}"
                write.attempts.append(Attempt(at, time.time(), target.name, outcome))
                write.node = target.name
                node += 1  # nothing was sent: the same request goes to the next node
                await asyncio.sleep(0.1)
                continue
            except (aiohttp.ClientError, TimeoutError) as error:
                outcome = f"unknown: {type(error).__name__}"
                write.attempts.append(Attempt(at, time.time(), target.name, outcome))
                write.status, write.node = "unknown", target.name
                return write
            code = answer.get("code", "") if isinstance(answer, dict) else ""
            outcome = f"{status} {code}".strip()
            write.attempts.append(Attempt(at, time.time(), target.name, outcome))
            if status == 200:
                write.status, write.node = "acknowledged", target.name
                write.unit, write.epoch = answer["memory_unit_id"], answer["epoch"]
                self.agent.epoch = max(self.agent.epoch, answer["epoch"])
                return write
            write.node = target.name
            if status not in (429, 503):
                write.status = "failed"
                return write
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            if code == "LOG_UNAVAILABLE" and "is unknown" in message:
                write.status = "unknown"  # the Field could not tell whether it was stored
                return write
            await asyncio.sleep(_retry_after(response))


# -- pushers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    position: int
    unit: str | None
    epoch: int
    at: float
    node: str


@dataclass(frozen=True)
class Connection:
    """One connection of a pusher (wall-clock times; ``ended`` None while it is open)."""

    opened: float
    ended: float | None
    node: str
    since: str
    how: str

    def __str__(self) -> str:
        ended = "open" if self.ended is None else _clock(self.ended)
        return (
            f"node {self.node} from position {position_of(self.since)}, "
            f"{_clock(self.opened)} to {ended}: {self.how}"
        )


class Pusher:
    """A subscriber of ``memory.recorded`` over WebSocket (``ws``) or SSE (``sse``), reading
    its stream from the subscription's creation, through any node."""

    def __init__(
        self, kind: str, agent: Agent, subscribed: dict[str, Any], nodes: list[Node], home: int
    ) -> None:
        self.kind = kind
        self.agent = agent
        self.subscription = subscribed["subscription_id"]
        self.start_cursor: str = subscribed["cursor"]
        self.nodes = nodes
        self.home = home
        self.got: list[Notice] = []
        self.cursor = self.start_cursor
        #: every connection, or attempt at one; the last may be open
        self.connections: list[Connection] = []
        self.problems: list[str] = []
        self._asked = self.start_cursor

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def last_position(self) -> int:
        return self.got[-1].position if self.got else position_of(self.start_cursor)

    async def run(self) -> None:
        node = self.home
        backoff = 0.1
        async with aiohttp.ClientSession() as session:
            while True:
                target = self.nodes[node % len(self.nodes)]
                since = self.cursor
                self._asked = since
                opened = time.time()
                self.connections.append(Connection(opened, None, target.name, since, "open"))
                try:
                    how = await self._connect(session, target, since)
                except (aiohttp.ClientError, TimeoutError, ConnectionError) as error:
                    self.connections[-1] = Connection(
                        opened, time.time(), target.name, since, repr(error)[:160]
                    )
                    status = getattr(error, "status", None)
                    if status is not None and 400 <= status < 500 and status != 429:
                        self.problems.append(f"{self.name}: node {target.name} refused {status}")
                    node += 1  # the node does not answer: the next one
                    await asyncio.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
                    continue
                self.connections[-1] = Connection(opened, time.time(), target.name, since, how)
                backoff = 0.1
                await asyncio.sleep(0.05)  # the stream ended: the same node again first

    def connection_at(self, when: float) -> Connection | None:
        """The connection open at ``when`` (the first that ended after it)."""
        return next((c for c in self.connections if c.ended is None or c.ended >= when), None)

    async def _connect(self, session: aiohttp.ClientSession, node: Node, since: str) -> str:
        if self.kind == "ws":
            return await self._websocket(session, node, since)
        return await self._sse(session, node, since)

    async def _websocket(self, session: aiohttp.ClientSession, node: Node, since: str) -> str:
        query = urllib.parse.urlencode({"since": f"{self.subscription}@{since}"})
        url = node.url.replace("http://", "ws://") + f"/v1/ws?{query}"
        headers = {"Authorization": f"Bearer {self.agent.token}"}
        timeout = aiohttp.ClientWSTimeout(ws_close=5.0)
        async with session.ws_connect(
            url, headers=headers, heartbeat=WS_HEARTBEAT, timeout=timeout
        ) as ws:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                frame = orjson.loads(message.data)
                self._frame(frame["type"], frame.get("data"), node)
            return f"ended: close {ws.close_code}"

    async def _sse(self, session: aiohttp.ClientSession, node: Node, since: str) -> str:
        url = f"{node.url}/v1/subscriptions/{self.subscription}/events"
        headers = {"Authorization": f"Bearer {self.agent.token}"}
        params = {}
        if since == self.start_cursor:
            params["since"] = since
        else:
            headers["Last-Event-ID"] = since
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=SSE_IDLE)
        async with session.get(url, headers=headers, params=params, timeout=timeout) as response:
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
            event, data = "message", list[str]()
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if not line:
                    if data:
                        self._frame(event, orjson.loads("\n".join(data)), node)
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            return "ended"

    def _frame(self, kind: str, data: Any, node: Node) -> None:
        if kind in ("notification", "memory.recorded"):
            position = position_of(data["cursor"])
            notice = Notice(
                position, data.get("memory_unit_id"), data["epoch"], time.time(), node.name
            )
            self.got.append(notice)
            self.cursor = data["cursor"]
        elif kind == "resume" and not data.get("recovered", True):
            self.problems.append(
                f"{self.name}: node {node.name} could not resume from {self._asked}: "
                f"{data.get('reason')}"
            )
        elif kind == "resume" and position_of(data["from"]) != position_of(self._asked):
            self.problems.append(
                f"{self.name}: node {node.name} resumed from {data['from']}, "
                f"asked for {self._asked}"
            )
        elif kind in ("end", "error"):
            self.problems.append(f"{self.name}: {kind} frame from node {node.name}: {data}")


# -- pollers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Poll:
    sent: float
    answered: float
    node: str
    since: int
    epoch: int
    units: int


class Poller:
    """ATTUNE with ``since_epoch``, from 0, as protocol/README.md's polling rule says: on its
    node (``moving`` False) or on the next node at each poll."""

    def __init__(
        self, agent: Agent, nodes: list[Node], home: int, moving: bool, interval: float
    ) -> None:
        self.agent = agent
        self.nodes = nodes
        self.home = home
        self.moving = moving
        self.interval = interval
        self.since = 0
        #: (unit id, epoch, index of the poll in ``polls``)
        self.seen: list[tuple[str, int, int]] = []
        self.polls: list[Poll] = []
        self.failures = 0
        self.problems: list[str] = []

    @property
    def name(self) -> str:
        return self.agent.name

    async def run(self) -> None:
        turn = self.home
        async with aiohttp.ClientSession() as session:
            while True:
                node = self.nodes[turn % len(self.nodes)]
                if self.moving:
                    turn += 1
                try:
                    await self.poll(session, node)
                except (aiohttp.ClientError, TimeoutError):
                    self.failures += 1  # nothing read: the same since_epoch next time
                await asyncio.sleep(self.interval)

    async def poll(self, session: aiohttp.ClientSession, node: Node) -> None:
        scope = {"role": ROLE, "max_units": 50, "relevance_threshold": 0.0}
        payload = {"scope": scope, "since_epoch": self.since, "format": "ids_only"}
        body = envelope("ATTUNE", self.agent.name, payload, self.agent.epoch)
        sent = time.time()
        status, answer, _ = await _post(session, node.url + "/v1/attune", body, self.agent.headers)
        if status != 200:
            self.failures += 1
            if status not in (429, 503):
                self.problems.append(f"{self.name}: ATTUNE on node {node.name} answered {status}")
            return
        epoch = answer["epoch"]
        index = len(self.polls)
        self.polls.append(
            Poll(sent, time.time(), node.name, self.since, epoch, len(answer["record"]))
        )
        if epoch < self.since:
            self.problems.append(
                f"{self.name}: node {node.name} answered epoch {epoch} "
                f"below since_epoch {self.since}"
            )
        for item in answer["record"]:
            if not self.since < item["epoch"] <= max(epoch, self.since):
                self.problems.append(
                    f"{self.name}: node {node.name} returned epoch {item['epoch']} for "
                    f"since_epoch {self.since}, answering epoch {epoch}"
                )
            self.seen.append((item["memory_unit_id"], item["epoch"], index))
        self.since = epoch
        self.agent.epoch = max(self.agent.epoch, epoch)


# -- the webhook receiver ---------------------------------------------------------------------


class WebhookReceiver:
    """Takes every POST with 200; keeps (time, webhook-id, position, unit, epoch)."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, int, str | None, int]] = []
        self.problems: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> WebhookReceiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        webhook_id = request.headers.get("webhook-id", "")
        if body.get("final"):
            self.problems.append(f"webhook: a final POST: {body}")
            return web.Response()
        if webhook_id != body.get("cursor"):
            self.problems.append(
                f"webhook: webhook-id {webhook_id} for cursor {body.get('cursor')}"
            )
        position = position_of(body["cursor"])
        self.received.append(
            (time.time(), webhook_id, position, body.get("memory_unit_id"), body["epoch"])
        )
        return web.Response()

    def distinct(self) -> list[tuple[float, str, int, str | None, int]]:
        """The first arrival of each webhook-id, in arrival order."""
        firsts: dict[str, tuple[float, str, int, str | None, int]] = {}
        for item in self.received:
            firsts.setdefault(item[1], item)
        return list(firsts.values())


# -- node status, sampled ---------------------------------------------------------------------


class Monitor:
    """Every node's ``GET /v1/field/status`` once a second: (time, node, its ``node``
    object, or None when it did not answer), for the report and to find the deliveries'
    owner."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.samples: deque[tuple[float, str, dict[str, Any] | None]] = deque(maxlen=STATUS_SAMPLES)
        self.latest: dict[str, dict[str, Any] | None] = {}

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                await asyncio.gather(*(self.sample(session, node) for node in self.nodes))
                await asyncio.sleep(1.0)

    async def sample(self, session: aiohttp.ClientSession, node: Node) -> dict[str, Any] | None:
        status: dict[str, Any] | None = None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            limits = aiohttp.ClientTimeout(total=2.0)
            async with session.get(node.url + "/v1/field/status", timeout=limits) as response:
                if response.status == 200:
                    status = orjson.loads(await response.read())
        seen = None if status is None else {**status["node"], "writable": status["log"]["writable"]}
        self.samples.append((time.time(), node.name, seen))
        self.latest[node.name] = seen
        return seen

    def owner(self) -> str | None:
        """The node that last said it sends the deliveries."""
        owners = [name for name, node in self.latest.items() if node and node["delivery_owner"]]
        return owners[0] if len(owners) == 1 else None

    def owners_near(self, when: float, window: float = 3.0) -> list[str]:
        """``<time> <node> owner (term t)`` of the samples around ``when`` naming an owner."""
        return [
            f"{time.strftime('%H:%M:%S', time.localtime(at))} {name} owner"
            f" (term {node.get('delivery_term')})"
            for at, name, node in self.samples
            if node and node["delivery_owner"] and abs(at - when) <= window
        ][:6]


# -- faults -----------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float | None = None
    detail: str = ""


class Injector:
    """Draws faults from a seeded generator and injects them: every kind of ``kinds`` once
    first (in a random order), then at random, at most ``concurrency`` at once, until the
    time is up; each heals itself when it ends, whatever ends it."""

    def __init__(
        self,
        nodes: list[Node],
        database: str,
        monitor: Monitor,
        rng: random.Random,
        config: HarnessConfig,
    ) -> None:
        self.nodes = nodes
        self.database = database
        self.monitor = monitor
        self.rng = rng
        self.config = config
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._busy: set[str] = set()

    async def run(self, duration: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration
        first = list(self.config.kinds)
        self.rng.shuffle(first)
        running: set[asyncio.Task[None]] = set()
        try:
            while loop.time() < end or first:  # every kind once, however long that takes
                while len(running) >= self.config.concurrency:
                    _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                await asyncio.sleep(self.rng.uniform(*self.config.gap))
                kind = first[0] if first else self.rng.choice(self.config.kinds)
                target = self._target(kind)
                while target is None and running:  # what it may hit is under other faults
                    _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    target = self._target(kind)
                if target is None:
                    self.errors.append(f"no node to inject {kind} into: none is running")
                    return
                if loop.time() >= end and not first:
                    break
                if first:
                    first.pop(0)
                self._busy.add(target)
                task = asyncio.ensure_future(self._inject(kind, target))
                task.add_done_callback(functools.partial(self._free, target))
                running.add(task)
            await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _free(self, target: str, _: asyncio.Task[None]) -> None:
        self._busy.discard(target)

    def _target(self, kind: str) -> str | None:
        """A node (or table) this fault may hit now, or None: node faults leave at least
        one node alone, and one table lock at a time."""
        if kind in _TABLE_FAULTS:
            table = _TABLE_FAULTS[kind]
            return None if set(_TABLE_FAULTS.values()) & self._busy else table
        idle = [n.name for n in self.nodes if n.name not in self._busy and n.running]
        faulted = sum(n.name in self._busy for n in self.nodes)
        if not idle or faulted >= len(self.nodes) - 1:
            return None
        owner = self.monitor.owner()
        if kind == "pause" and owner in idle and self.rng.random() < 0.5:
            return owner  # the deliveries' sender, paused, is a case of its own
        return self.rng.choice(idle)

    async def _inject(self, kind: str, target: str) -> None:
        fault = Fault(kind, target, time.time())
        self.faults.append(fault)
        node = next((n for n in self.nodes if n.name == target), None)
        marked = [node] if node is not None else self.nodes
        for each in marked:
            each.mark(f"fault {kind} on {target} begins")
        try:
            fault.detail = await getattr(self, f"_{kind}")(target, node)
        except Exception as error:
            fault.detail = f"failed: {error!r}"
            self.errors.append(f"fault {kind} on {target}: {error!r}")
        finally:
            fault.ended = time.time()
            for each in marked:
                each.mark(f"fault {kind} on {target} ends")
        took = fault.ended - fault.started
        say(f"fault {kind:<9} {target:<14} {took:5.1f} s  {fault.detail}")

    def _for(self) -> float:
        return self.rng.uniform(*self.config.fault_seconds)

    async def _kill(self, target: str, node: Node) -> str:
        pid = node.pid
        await node.kill()
        down = self.rng.uniform(0.0, 2.0)
        await asyncio.sleep(down)
        started, failed = time.monotonic(), len(node.failed_starts)
        await node.start()
        took = time.monotonic() - started
        detail = f"pid {pid} killed, down {down:.1f} s, pid {node.pid} listening after {took:.1f} s"
        for reason in node.failed_starts[failed:]:
            detail += f"; a start failed: {reason}"
        return detail

    async def _pause(self, target: str, node: Node) -> str:
        seconds = self._for()
        was_owner = self.monitor.owner() == target
        node.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            node.resume()
        return f"SIGSTOP {seconds:.1f} s" + (" (the deliveries' owner)" if was_owner else "")

    async def _terminate(self, target: str, node: Node) -> str:
        ports = node.proxy.backend_ports()
        async with await psycopg.AsyncConnection.connect(self.database, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND client_port = ANY(%s)"
                " AND pid <> pg_backend_pid()",
                (ports,),
            )
            rows = await cursor.fetchall()
        names = sorted(name for name, _ in rows)
        return f"terminated {sum(done for _, done in rows)} backends {names}"

    async def _lock(self, table: str) -> str:
        seconds = self._for()
        async with await psycopg.AsyncConnection.connect(self.database) as conn:
            await conn.execute("SET lock_timeout = '10s'")
            asked = time.monotonic()
            try:
                await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            except psycopg.errors.LockNotAvailable:
                await conn.rollback()
                return f"not taken within 10 s: {table} stayed locked by the nodes"
            waited = time.monotonic() - asked
            await asyncio.sleep(seconds)
            await conn.rollback()
        return f"held {seconds:.1f} s (taken after {waited:.2f} s)"

    async def _lock_log(self, target: str, node: None) -> str:
        return await self._lock(target)

    async def _lock_head(self, target: str, node: None) -> str:
        return await self._lock(target)

    async def _delay(self, target: str, node: Node) -> str:
        seconds, latency = self._for(), self.rng.uniform(0.02, 0.25)
        node.proxy.latency = latency
        try:
            await asyncio.sleep(seconds)
        finally:
            node.proxy.latency = 0.0
        return f"{latency * 1000:.0f} ms each way for {seconds:.1f} s"

    async def _drop(self, target: str, node: Node) -> str:
        return f"reset {node.proxy.drop()} connections"

    async def _partition(self, target: str, node: Node) -> str:
        seconds = self._for()
        node.proxy.partition()
        try:
            await asyncio.sleep(seconds)
        finally:
            node.proxy.heal()
        return f"nothing passed for {seconds:.1f} s"

    async def _refuse(self, target: str, node: Node) -> str:
        seconds = self._for()
        node.proxy.refusing = True
        dropped = node.proxy.drop()
        try:
            await asyncio.sleep(seconds)
        finally:
            node.proxy.refusing = False
        return f"reset {dropped} connections, refused new ones for {seconds:.1f} s"


# -- the checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One row of ``field_log``; ``unit`` and ``marker`` for ``memory.recorded``."""

    position: int
    epoch: int
    kind: str
    ts: float
    agent: str | None
    unit: str | None = None
    marker: str | None = None


def read_log(database: str) -> list[Entry]:
    """Every entry of the log, in position order."""
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT position, epoch, kind, ts, agent_id,"
            " CASE WHEN kind = 'memory.recorded' THEN"
            "  convert_from(data, 'UTF8')::jsonb -> 'unit' END"
            " FROM field_log ORDER BY position"
        ).fetchall()
    entries = []
    for position, epoch, kind, ts, agent, unit in rows:
        if unit is None:
            entries.append(Entry(position, epoch, kind, ts, agent))
        else:
            marker = str(unit.get("content", "")).split(" ", 1)[0]
            entries.append(Entry(position, epoch, kind, ts, agent, unit["id"], marker))
    return entries


@dataclass
class Anomaly:
    """Something the checks found wrong, with where it is in the log."""

    kind: str
    who: str
    detail: str
    position: int | None = None
    epoch: int | None = None
    #: the node the unit was written through (the harness's record of the request)
    node: str | None = None
    neighbours: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def render(self) -> str:
        where = "" if self.position is None else f" at position {self.position}"
        where += "" if self.epoch is None else f", epoch {self.epoch}"
        where += "" if self.node is None else f", written through node {self.node}"
        lines = [f"{self.kind} [{self.who}]{where}: {self.detail}"]
        lines += [f"    neighbour {n}" for n in self.neighbours]
        lines += [f"    log {line}" for line in self.logs]
        return "\n".join(lines)


class Checker:
    """What the log holds, against what each client saw."""

    def __init__(
        self, entries: list[Entry], writes: list[Write], nodes: list[Node], monitor: Monitor
    ) -> None:
        self.entries = entries
        self.by_position = {e.position: e for e in entries}
        self.units = [e for e in entries if e.unit is not None]
        self.unit_index = {e.unit: i for i, e in enumerate(self.units)}
        self.writes = {w.marker: w for w in writes}
        self.nodes = nodes
        self.monitor = monitor
        self.anomalies: list[Anomaly] = []
        #: a poller's polls by since_epoch, and those since_epochs (for ``_stepped_over``)
        self._by_since: tuple[Poller | None, list[Poll], list[int]] = (None, [], [])

    def add(
        self,
        kind: str,
        who: str,
        detail: str,
        entry: Entry | None = None,
        got: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        if entry is None:
            self.anomalies.append(Anomaly(kind, who, detail))
            return
        self.anomalies.append(
            Anomaly(
                kind,
                who,
                detail,
                entry.position,
                entry.epoch,
                self._through(entry),
                self._neighbours(entry, got),
                [line for node in self.nodes for line in node.warnings_near(entry.ts)],
            )
        )

    def _neighbours(self, entry: Entry, got: frozenset[int] | set[int]) -> list[str]:
        """The log entries on either side, and the units on either side (whether the reader
        got them, when ``got`` is its positions)."""
        found = []
        for position in (entry.position - 1, entry.position + 1):
            other = self.by_position.get(position)
            if other is not None:
                found.append(f"entry {other.position}: {other.kind}, epoch {other.epoch}")
        index = self.unit_index.get(entry.unit)
        for step in (-1, 1):
            if index is not None and 0 <= index + step < len(self.units):
                other = self.units[index + step]
                through = self._through(other)
                seen = "" if not got else (" (got)" if other.position in got else " (missed too)")
                found.append(
                    f"unit {other.position}: epoch {other.epoch}, via {through}, "
                    f"{_clock(other.ts)}{seen}"
                )
        return found

    def _through(self, entry: Entry) -> str | None:
        """The node the unit was written through: that of the last attempt of its marker
        sent before the unit was logged."""
        write = self.writes.get(entry.marker or "")
        if write is None:
            return None
        sent = [a for a in write.attempts if a.sent <= entry.ts and not a.outcome.startswith("not")]
        return sent[-1].node if sent else write.node

    # -- the log and the writes ------------------------------------------------------------

    def check_log(self) -> None:
        positions = [e.position for e in self.entries]
        if positions != list(range(1, len(positions) + 1)):
            gaps = sorted(set(range(1, (positions or [0])[-1] + 1)) - set(positions))
            self.add("log_gap", "log", f"positions missing: {gaps[:20]}")
        for before, after in itertools.pairwise(self.units):
            if after.epoch <= before.epoch:
                self.add(
                    "epoch_order",
                    "log",
                    f"epoch {after.epoch} after unit {before.position}'s {before.epoch}",
                    after,
                )

    def check_writes(self) -> None:
        logged: dict[str, list[Entry]] = {}
        for entry in self.units:
            logged.setdefault(entry.marker or "", []).append(entry)
        for marker, found in logged.items():
            if marker not in self.writes:
                for entry in found:
                    self.add("phantom", "log", f"a unit no writer sent ({marker!r})", entry)
        for write in self.writes.values():
            self._check_write(write, logged.get(write.marker, []))

    def _check_write(self, write: Write, found: list[Entry]) -> None:
        """Acknowledged: logged once, as answered; unknown: at most once; refused: never."""
        attempts = "; ".join(str(attempt) for attempt in write.attempts)
        copies = ", ".join(
            f"{e.position} ({e.unit}, epoch {e.epoch}, {_clock(e.ts)} via {self._through(e)})"
            for e in found
        )
        logged = f"logged at {copies or 'no position'}; attempts: {attempts}"
        # the anomaly names a copy that was not acknowledged, if there is one
        stray = next((e for e in found if e.unit != write.unit), found[-1] if found else None)
        if write.status == "failed":
            self.add("unexpected_answer", write.writer, f"{write.marker}: {logged}", stray)
        elif write.status == "acknowledged" and len(found) != 1:
            kind = "lost" if not found else "duplicate"
            self.add(
                kind, write.writer, f"{write.marker} acknowledged as {write.unit}, {logged}", stray
            )
        elif write.status == "acknowledged":
            entry = found[0]
            if (entry.unit, entry.epoch) != (write.unit, write.epoch):
                detail = (
                    f"{write.marker} acknowledged as {write.unit} epoch {write.epoch}, {logged}"
                )
                self.add("acknowledged_differs", write.writer, detail, entry)
        elif write.status == "unknown" and len(found) > 1:
            self.add("duplicate", write.writer, f"{write.marker} (unknown), {logged}", stray)
        elif write.status == "refused" and found:
            self.add("refused_but_logged", write.writer, f"{write.marker}, {logged}", stray)

    # -- readers -------------------------------------------------------------------------------

    def check_stream(
        self, who: str, got: list[Notice], after: int, pusher: Pusher | None = None
    ) -> None:
        """A stream of notifications: every unit after position ``after`` once, in order,
        with the log's unit and epoch (a pusher's names its connection at the unit's time)."""
        expected = [e for e in self.units if e.position > after]
        positions: set[int] = set()
        for before, notice in zip([None, *got], got, strict=False):
            if before is not None and (
                notice.position in positions or notice.position < before.position
            ):
                what = "repeated" if notice.position in positions else "out_of_order"
                detail = (
                    f"position {notice.position} received at {_clock(notice.at)} from node "
                    f"{notice.node} after {before.position} (from node {before.node})"
                )
                self.add(what, who, detail, self.by_position.get(notice.position))
            positions.add(notice.position)
        for notice in got:
            entry = self.by_position.get(notice.position)
            if entry is None or (entry.unit, entry.epoch) != (notice.unit, notice.epoch):
                logged = None if entry is None else (entry.kind, entry.unit, entry.epoch)
                detail = f"notified {notice.unit} epoch {notice.epoch}, the log holds {logged}"
                self.add("notification_differs", who, detail, entry)
        for entry in expected:
            if entry.position not in positions:
                detail = "never received"
                if pusher is not None:
                    detail += f" ({pusher.kind}; then on {pusher.connection_at(entry.ts)})"
                self.add("missed", who, detail, entry, positions)

    def check_pusher(self, pusher: Pusher) -> None:
        for problem in pusher.problems:
            self.add("stream", pusher.name, problem)
        self.check_stream(pusher.name, pusher.got, position_of(pusher.start_cursor), pusher)

    def check_poller(self, poller: Poller) -> None:
        for problem in poller.problems:
            self.add("poll", poller.name, problem)
        seen: dict[str, int] = {}
        for unit, epoch, index in poller.seen:
            seen[unit] = seen.get(unit, 0) + 1
            entry = self.units[self.unit_index[unit]] if unit in self.unit_index else None
            if entry is None or entry.epoch != epoch:
                poll = poller.polls[index]
                detail = f"{unit} with epoch {epoch} from node {poll.node}"
                self.add("poll_differs", poller.name, detail, entry)
            elif seen[unit] == 2:
                poll = poller.polls[index]
                detail = f"{unit} again, from node {poll.node} (since_epoch {poll.since})"
                self.add("repeated", poller.name, detail, entry)
        got = {self.units[self.unit_index[u]].position for u in seen if u in self.unit_index}
        for entry in self.units:
            if entry.unit not in seen:
                self.add("missed", poller.name, self._stepped_over(poller, entry), entry, got)

    def _stepped_over(self, poller: Poller, entry: Entry) -> str:
        """Which poll passed the unit's epoch without returning it (a poll whose
        ``since_epoch`` was below it, among the 50 nearest, that answered one at least as
        high)."""
        if self._by_since[0] is not poller:
            polls = sorted(poller.polls, key=lambda poll: poll.since)
            self._by_since = (poller, polls, [poll.since for poll in polls])
        _, polls, sinces = self._by_since
        below = bisect.bisect_left(sinces, entry.epoch)
        for poll in reversed(polls[max(0, below - 50) : below]):
            if entry.epoch <= poll.epoch:
                return (
                    f"the poll sent to node {poll.node} at {_clock(poll.sent)} with since_epoch "
                    f"{poll.since} answered epoch {poll.epoch} at {_clock(poll.answered)} "
                    f"without it ({poll.units} units); the unit was logged at {_clock(entry.ts)}"
                )
        return "no poll passed its epoch"

    def check_webhook(self, receiver: WebhookReceiver, after: int) -> None:
        for problem in receiver.problems:
            self.add("webhook", "webhook", problem)
        distinct = receiver.distinct()
        notices = [Notice(p, unit, epoch, at, "?") for at, _, p, unit, epoch in distinct]
        found = len(self.anomalies)
        self.check_stream("webhook", notices, after)
        for anomaly in self.anomalies[found:]:  # who sent the deliveries then
            entry = self.by_position.get(anomaly.position or 0)
            if entry is not None:
                anomaly.logs += self.monitor.owners_near(entry.ts)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


# -- the report -------------------------------------------------------------------------------


@dataclass
class Report:
    """What a run did and found; ``ok`` when it found no anomaly and the harness itself met
    no error (a fault it could not inject, a client that broke)."""

    seed: int
    nodes: int
    duration: float
    workdir: Path
    counts: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.anomalies and not self.errors

    def summary(self) -> Counter[str]:
        """Anomalies by kind and by whom they were seen."""
        return Counter(f"{a.kind} [{a.who}]" for a in self.anomalies)

    def render(self, most: int = 40) -> str:
        """The report as text: counts, every fault, every error, and about ``most``
        anomalies in full (as many of each kind)."""
        kinds = Counter(fault.kind for fault in self.faults)
        lines = [
            f"fault harness: seed {self.seed}, {self.nodes} nodes, {self.duration:g} s of faults, "
            f"{self.wall:.0f} s in all; node logs in {self.workdir}",
            "counts: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()),
            f"faults: {len(self.faults)} (" + ", ".join(f"{k} {v}" for k, v in kinds.items()) + ")",
        ]
        start = self.faults[0].started if self.faults else 0.0
        for fault in self.faults:
            took = (fault.ended or fault.started) - fault.started
            lines.append(
                f"  {_clock(fault.started)} +{fault.started - start:6.1f} s {fault.kind:<9} "
                f"{fault.target:<14} {took:5.1f} s  {fault.detail}"
            )
        lines.append(f"errors: {len(self.errors)}")
        lines += [f"  {error}" for error in self.errors]
        summary = self.summary()
        lines.append(f"anomalies: {len(self.anomalies)}")
        lines += [f"  {key}: {n}" for key, n in summary.items()]
        each = max(1, most // max(1, len(summary)))
        shown: Counter[str] = Counter()
        for anomaly in self.anomalies:
            key = f"{anomaly.kind} [{anomaly.who}]"
            shown[key] += 1
            if shown[key] <= each:
                lines.append("  " + anomaly.render().replace("\n", "\n  "))
        return "\n".join(lines)


# -- a run ------------------------------------------------------------------------------------


async def run_harness(config: HarnessConfig) -> Report:
    """One run on a fresh database, dropped afterwards (see the module docstring); the
    seed is printed first, so that a run can be repeated."""
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="field-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(config, seed=seed, workdir=workdir)
    say(
        f"seed {seed}: {config.nodes} nodes, {config.duration:g} s of faults, "
        f"{config.rate:g} RECORD/s; node logs in {workdir}"
    )
    with fresh_database() as database:
        return await _Run(config, seed, database, workdir).run()


class _Run:
    """The parts of one run, started, faulted, settled, checked and stopped in that order."""

    def __init__(self, config: HarnessConfig, seed: int, database: str, workdir: Path) -> None:
        self.config = config
        self.database = database
        self.rng = random.Random(seed)
        self.report = Report(seed, config.nodes, config.duration, workdir)
        self.nodes: list[Node] = []
        self.writers: list[Writer] = []
        self.pushers: list[Pusher] = []
        self.pollers: list[Poller] = []
        self.receiver = WebhookReceiver()
        self.monitor = Monitor(self.nodes)
        self.hook_after = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._writing: list[asyncio.Task[None]] = []

    async def run(self) -> Report:
        began = time.monotonic()
        try:
            await self._start()
            injector = Injector(self.nodes, self.database, self.monitor, self.rng, self.config)
            self.report.faults = injector.faults
            try:
                await injector.run(self.config.duration)
            finally:
                self.report.errors += injector.errors
            await self._heal()
            sentinel = await self._stop_writing()
            await self._settle(sentinel)
            await self._check()
        finally:
            await self._stop()
            self.report.wall = time.monotonic() - began
        return self.report

    # -- start -----------------------------------------------------------------------------

    async def _start(self) -> None:
        parts = urllib.parse.urlsplit(self.database)
        target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        for i in range(self.config.nodes):
            name = chr(ord("a") + i)
            proxy = await Proxy(name, target).start()
            self.nodes.append(Node(name, proxy, self.database, self.config))
        await self.receiver.start()
        await asyncio.gather(*(node.start() for node in self.nodes))
        say("nodes listening: " + ", ".join(f"{n.name} {n.url}" for n in self.nodes))
        async with aiohttp.ClientSession() as session:
            await self._agents(session)
            behind = await self._caught_up(session, deadline=time.monotonic() + 60)
        if behind:
            raise RuntimeError(f"the nodes did not apply the agents' registrations: {behind}")
        self._spawn("monitor", self.monitor.run())
        for pusher in self.pushers:
            self._spawn(pusher.name, pusher.run())
        for poller in self.pollers:
            self._spawn(poller.name, poller.run())
        self._writing = [self._spawn(w.agent.name, w.run()) for w in self.writers]

    async def _agents(self, session: aiohttp.ClientSession) -> None:
        """Register every client's agent, and subscribe, through its home node."""

        async def register(name: str, node: Node) -> Agent:
            payload = {"id": name, "role": ROLE}
            answer = await _operation(session, node.url, "REGISTER", name, payload)
            return Agent(name, answer["token"], answer["epoch"])

        async def subscribe(agent: Agent, node: Node, **extra: Any) -> dict[str, Any]:
            definition = {"events": ["memory.recorded"], "min_relevance": 0.0, **extra}
            payload = {"action": "subscribe", "subscription": definition}
            answer: dict[str, Any] = await _operation(
                session, node.url, "SUBSCRIBE", agent.name, payload, headers=agent.headers
            )
            return answer

        interval = self.config.nodes / self.config.rate  # each writer's share of the rate
        for i, node in enumerate(self.nodes):
            writer = await register(f"writer-{node.name}", node)
            self.writers.append(Writer(writer, self.nodes, i, interval))
            for kind in ("ws", "sse"):
                agent = await register(f"{kind}-{node.name}", node)
                subscribed = await subscribe(agent, node)
                self.pushers.append(Pusher(kind, agent, subscribed, self.nodes, i))
            for moving in (False, True):
                agent = await register(f"{'move' if moving else 'stay'}-{node.name}", node)
                interval_ = self.config.poll_interval
                self.pollers.append(Poller(agent, self.nodes, i, moving, interval_))
        hook = await register("hook", self.nodes[-1])
        delivery = {"type": "webhook", "url": self.receiver.url}
        subscribed = await subscribe(hook, self.nodes[-1], delivery=delivery)
        self.hook_after = position_of(subscribed["cursor"])

    async def _caught_up(self, session: aiohttp.ClientSession, deadline: float) -> list[str]:
        """Wait until every node applied the log as far as its head was when asked; the
        nodes still behind at ``deadline`` (an empty list: none)."""
        head = await asyncio.to_thread(_head, self.database)
        while True:
            statuses = [await self.monitor.sample(session, node) for node in self.nodes]
            behind = [
                f"node {node.name} at {status and status['position']} of {head}"
                for node, status in zip(self.nodes, statuses, strict=True)
                if status is None or status["position"] < head
            ]
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.1)

    def _spawn(self, name: str, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)

        def ended(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None:
                self.report.errors.append(f"{name} stopped: {done.exception()!r}")

        task.add_done_callback(ended)
        self._tasks.append(task)
        return task

    # -- end -------------------------------------------------------------------------------

    async def _heal(self) -> None:
        """Every node running and reachable (the faults healed themselves; this makes sure)."""
        for node in self.nodes:
            node.resume()
            node.proxy.heal()
            node.proxy.latency, node.proxy.refusing = 0.0, False
            if not node.running:
                self.report.errors.append(f"node {node.name} was down after the faults")
                await node.start()

    async def _stop_writing(self) -> Write:
        """Stop the writers (each finishes the write under way), then write the sentinel
        through the first node that takes it: every reader is done once it has it."""
        for writer in self.writers:
            writer.stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._writing), self.config.settle_timeout)
        writer = self.writers[0]
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            for attempt in range(5):
                sentinel = await writer.write(session, f"sentinel-{attempt}", patience=30)
                if sentinel.status == "acknowledged":
                    say(f"sentinel {sentinel.unit} at epoch {sentinel.epoch}")
                    return sentinel
        raise RuntimeError(f"no sentinel acknowledged: {writer.writes[-5:]}")

    async def _settle(self, sentinel: Write) -> None:
        """Wait, bounded, until every reader has the sentinel and every node applied the
        log; what is late at the deadline is reported."""
        position = await asyncio.to_thread(_position_of_unit, self.database, sentinel.unit)
        deadline = time.monotonic() + self.config.settle_timeout
        async with aiohttp.ClientSession() as session:
            while True:
                late = [p.name for p in self.pushers if p.last_position < position]
                late += [p.name for p in self.pollers if p.since < (sentinel.epoch or 0)]
                if not any(p >= position for _, _, p, _, _ in self.receiver.received):
                    late.append("webhook")
                if not late:
                    behind = await self._caught_up(session, deadline)
                    if not behind:
                        return
                    late += behind
                if time.monotonic() > deadline:
                    detail = f"not settled {self.config.settle_timeout:g} s after the faults"
                    self.report.anomalies.append(
                        Anomaly("stalled", ", ".join(late), detail, position, sentinel.epoch)
                    )
                    return
                await asyncio.sleep(0.2)

    async def _check(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        entries = await asyncio.to_thread(read_log, self.database)
        writes = [w for writer in self.writers for w in writer.writes]
        checker = Checker(entries, writes, self.nodes, self.monitor)
        checker.check_log()
        checker.check_writes()
        for pusher in self.pushers:
            checker.check_pusher(pusher)
        for poller in self.pollers:
            checker.check_poller(poller)
        checker.check_webhook(self.receiver, self.hook_after)
        self.report.anomalies += checker.anomalies
        statuses = [w.status for w in writes]
        attempts = [a.outcome for w in writes for a in w.attempts]
        self.report.counts = {
            "acknowledged": statuses.count("acknowledged"),
            "unknown": statuses.count("unknown"),
            "refused": statuses.count("refused"),
            "failed": statuses.count("failed"),
            "retried 503": sum(o.startswith("503") for o in attempts),
            "retried 429": sum(o.startswith("429") for o in attempts),
            "not sent": sum(o.startswith("not sent") for o in attempts),
            "log entries": len(entries),
            "units": len(checker.units),
            "notifications": sum(len(p.got) for p in self.pushers),
            "push connections": sum(len(p.connections) for p in self.pushers),
            "polls": sum(len(p.polls) for p in self.pollers),
            "polls failed": sum(p.failures for p in self.pollers),
            "webhook posts": len(self.receiver.received),
            "webhook repeats": len(self.receiver.received) - len(self.receiver.distinct()),
            "node starts": sum(n.starts for n in self.nodes),
            "failed starts": sum(len(n.failed_starts) for n in self.nodes),
        }

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(node.stop() for node in self.nodes), return_exceptions=True)
        for node in self.nodes:
            await node.proxy.stop()
        await self.receiver.stop()


def _head(database: str) -> int:
    with psycopg.connect(database) as conn:
        row = conn.execute("SELECT position FROM field_log_head").fetchone()
    return int(row[0]) if row else 0


def _position_of_unit(database: str, unit: str | None) -> int:
    with psycopg.connect(database) as conn:
        row = conn.execute(
            "SELECT position FROM field_log WHERE kind = 'memory.recorded'"
            " AND convert_from(data, 'UTF8')::jsonb #>> '{unit,id}' = %s",
            (unit,),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"the sentinel {unit} was acknowledged but is not in the log")
    return int(row[0])
