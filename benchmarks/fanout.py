"""Push fan-out end to end: delivered notifications/s and latency, beside Redis pub/sub.

    python benchmarks/fanout.py [--subscribers 1000 10000] [--sse 1000] [--procs 3]
                                [--units N] [--rate 50000] [--deflate] [--no-redis]
                                [--no-jetstream] [--jetstream-sync always|default]
                                [--nats-server PATH]
                                [--metrics on off] [--rounds 2] [--no-admission]

For each subscriber count S, starts ``field serve --in-memory`` as a child
process and ``--procs`` client processes (one asyncio loop each). Every
subscriber is its own agent, registered over HTTP, with one subscription
to ``memory.recorded`` (``min_relevance`` 0, ``debounce_ms`` 0), and holds
one WebSocket (``/v1/ws``) or SSE stream until its ``live`` frame (event)
has arrived. Then a writer agent records ``--units`` units over HTTP in two
phases:

* **paced**: RECORDs sent at a steady rate, so that the offered load is
  ``--rate`` notifications/s (S x RECORDs/s; 50,000 is the target), each
  at its scheduled time whether or not the previous one was acknowledged;
* **flat-out**: each RECORD sent as soon as the previous one was
  acknowledged: the rate the server sustains.

The writer takes each RECORD's acknowledgement time (``time.time()`` right
after its HTTP 200); each client takes the receive time of every
notification (matched by ``memory_unit_id``). Delivered notifications/s =
notifications / (last receipt - first acknowledgement); latency = receipt
- acknowledgement of the unit (all processes on one host, one clock). The
last column, "p99 from send", counts from the moment the RECORD (or PUBLISH)
was sent instead: it does not move with when the server answers the writer
relative to the fan-out.

The baseline, in the same run: a ``redis-server`` on a free loopback port
with S subscriber connections (same client processes) SUBSCRIBEd to one
channel, and a publisher PUBLISHing the same number of messages of the
size of a real notification, in the same two phases (the acknowledgement
is PUBLISH's reply).

The durable peer, in the same run: NATS JetStream (a private ``nats-server -js``
on a free loopback port, see ``_jetstream.py``), one stream on file storage
(``--jetstream-sync always``, the default: an fsync after every write, before
the publish is acknowledged; ``default``: the server's, an fsync every two
minutes), S subscribers in the same client processes, each with its own NATS
connection and its own ordered push consumer on the stream (see
``JetStreamSubscriber`` for why that kind), and a publisher publishing the same
messages as Redis's in the same two phases, each awaiting its acknowledgement
(``js.publish``); the latency counts from that acknowledgement, as the Field's
from the RECORD's. ``--no-jetstream`` skips it; without nats-py or a
``nats-server`` (nats-py is in the ``bench`` extra; the server is the host's) it
is skipped with a line saying so. The Field itself runs ``--in-memory`` here, as
before: its durable writes are ``writes.py``'s.

Every Redis and JetStream subscriber checks that each message is the one after
the last it received (the publisher numbers them): a gap is counted as lost, a
number not above the last as repeated or out of order. For every transport,
the delivered count must equal units x subscribers.

The clients are deliberately lean (raw asyncio protocols: WebSocket
frames, chunked SSE and RESP parsed by hand, one ``orjson.loads`` per
message), the same for the Field and for Redis, so that on a small machine
they take as little CPU from the servers as possible. ``--deflate`` makes
the WebSocket clients offer permessage-deflate, as browsers and the
``websockets`` library do by default, and starts the server with
``--ws-deflate`` so that it accepts (it declines by default).

Prints one row per transport, size and phase, and the Field's throughput
as a ratio of Redis's. A request the Field refuses (``503 OVERLOADED`` or
``429 RATE_LIMITED``: a REGISTER or SUBSCRIBE of the set-up, a RECORD of a
phase) is waited out for its ``Retry-After`` and sent again, the same
envelope (the Field changed nothing for it, so no unit is recorded twice);
the ``refused`` column counts a phase's refused RECORDs, and a line after the
table names the kinds, the set-up's included. A refused RECORD's latencies
count from its accepted attempt.

``--metrics on off`` runs every Field case with the server's metrics on (the
default) and off (``--no-metrics``), alternating, ``--rounds`` times each (the
order flips every round), and prints the mean delivered notifications/s and
p99 with metrics on as a ratio of those with them off. ``--no-admission``
starts the Field with admission control off (``--overload-write-target 0
--overload-write-budget 0``):
flat out, a slow machine's event loop lags past the write target and the
writer's RECORDs would be refused (``overload.py`` measures that).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any

import _jetstream
import aiohttp
import orjson
from _common import (
    LOAD_RATES,
    NO_ADMISSION,
    ROLES,
    ROOT,
    VOCABULARY,
    bracketed,
    cpu_seconds,
    envelope,
    pct,
    progress,
)
from _refusals import Refusals
from _refusals import post as post_retried

HOST = "127.0.0.1"
SUBSCRIPTION = {"events": ["memory.recorded"], "min_relevance": 0, "debounce_ms": 0}
#: Seconds a client process waits for its connections' ``live`` frames.
CONNECT_TIMEOUT = 180.0
#: Seconds a client process waits for a phase's notifications.
COLLECT_TIMEOUT = 30.0
#: Connections a client process opens at once.
CONNECT_CONCURRENCY = 64
#: HTTP requests a client process has in flight while registering.
SETUP_CONCURRENCY = 16
CHANNEL = b"fanout"
#: The JetStream peer's stream and its one subject.
JS_STREAM = "fanout"
JS_SUBJECT = "fanout.notifications"
#: Client kinds that are a broker peer: no agents to register, numbered copies.
BROKERS = ("redis", "jetstream")
#: Requests of this process that the Field refused for now (see ``_post``).
REFUSALS = Refusals()


def raise_nofile() -> int:
    """Raise this process's open-file limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- processes ------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident memory of a process in kB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class ChildServer:
    """A server child process whose stderr is drained by a thread (last lines kept)."""

    def __init__(
        self,
        command: list[str],
        ready: re.Pattern[str],
        *,
        timeout: float = 60,
        stdout: bool = False,
        cwd: str | None = None,
    ) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if stdout else subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT if cwd is None else cwd,
        )
        self.output = self.process.stdout if stdout else self.process.stderr
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.match: re.Match[str] | None = None
        watchdog = threading.Timer(timeout, self.process.kill)
        watchdog.start()
        try:
            assert self.output is not None
            for line in self.output:
                self.lines.append(line.rstrip("\n"))
                self.match = ready.search(line)
                if self.match:
                    break
        finally:
            watchdog.cancel()
        if self.match is None:
            self.stop()
            raise RuntimeError(f"{command[0]} did not start:\n" + "\n".join(self.lines))
        threading.Thread(target=self._drain, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _drain(self) -> None:
        assert self.output is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.output:
                self.lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


#: Every subscriber connects from 127.0.0.1: lift the per-client cap (5,000 by default).
ONE_CLIENT_ADDRESS = (
    "--max-connections-per-client",
    "1000000",
    "--register-burst",
    "1000000",  # every subscriber registers from this one address, at start
)


def field_tree() -> str:
    """The source tree whose ``field`` package a served Field runs: ``python -m field``
    imports it from its working directory first, so the server runs from this tree:
    the first ``PYTHONPATH`` entry that holds a ``field`` package (``PYTHONPATH=<tree>
    python benchmarks/fanout.py`` times that tree, as the scripts run in this process
    do), else :data:`ROOT` (this checkout, or the tree ``attune_http.py --before``
    sets there)."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isfile(os.path.join(entry, "field", "__init__.py")):
            return entry
    return str(ROOT)


def start_field(*extra: str, data_dir: str | None = None) -> tuple[ChildServer, int]:
    """``field serve`` on a free loopback port, ``--in-memory`` unless given a
    ``data_dir`` (a SQLite log there): (server, port). It runs :func:`field_tree`'s
    ``field``."""
    command = [sys.executable, "-m", "field", "serve", "--host", HOST, "--port", "0"]
    log = ["--in-memory"] if data_dir is None else ["--data-dir", data_dir]
    server = ChildServer(
        [*command, *log, *ONE_CLIENT_ADDRESS, *LOAD_RATES, *extra],
        re.compile(r"listening on http://127\.0\.0\.1:(\d+)"),
        cwd=field_tree(),
    )
    assert server.match is not None
    return server, int(server.match.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start_redis(clients: int) -> tuple[ChildServer, int]:
    """A private ``redis-server`` (no persistence) with room for ``clients`` clients."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    command += ["--daemonize", "no", "--maxclients", str(clients + 64), "--loglevel", "notice"]
    server = ChildServer(command, re.compile(r"Ready to accept connections"), stdout=True)
    return server, port


# -- lean clients (run in the client processes) ----------------------------------------


@dataclass(eq=False)
class Sink:
    """What one client process received."""

    receipts: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    total: int = 0
    anomalies: collections.Counter[str] = field(default_factory=collections.Counter)
    sample: bytes | None = None

    def notified(self, client: Any, notification: bytes, now: float) -> str:
        """Count a notification received by ``client``; its memory_unit_id."""
        data = orjson.loads(notification)
        unit: str = data["memory_unit_id"]
        self.receipts[unit].append(now)
        self.total += 1
        client.received += 1
        if self.sample is None:
            self.sample = bytes(notification)
        return unit

    def in_sequence(self, client: Any, unit: str) -> None:
        """A broker peer's message must be the one after the last that ``client`` received:
        its publisher numbers the copies 1, 2, 3... (``mem-<serial in hex>``) across both
        phases, so a gap is a loss, and a number not above the last a repeat or a reordering."""
        serial = int(unit[4:], 16)
        if serial > client.last + 1:
            self.anomalies["gap (lost)"] += 1
        elif serial <= client.last:
            self.anomalies["repeated or out of order"] += 1
        client.last = max(client.last, serial)

    def take(self) -> dict[str, list[float]]:
        receipts, self.receipts = self.receipts, collections.defaultdict(list)
        return dict(receipts)


class _Client(asyncio.Protocol):
    """Common part: a ``ready`` future (live / subscribed) and a receive counter."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0
        #: the last serial received from a broker peer's publisher (see Sink.in_sequence)
        self.last = 0
        self.buf = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request())

    def request(self) -> bytes:
        raise NotImplementedError

    def fail(self, why: str) -> None:
        self.sink.anomalies[why] += 1
        if not self.ready.done():
            self.ready.set_exception(RuntimeError(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("connection lost before live"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def response_head(self, expect: str) -> str | None:
        """The HTTP response head once it has arrived (removed from ``buf``), else None.

        A head that does not start with ``expect`` fails the client (None).
        """
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[: end + 4]
        if not head.startswith(expect):
            self.fail("response: " + head.split("\r\n", 1)[0])
            return None
        return head


class WSClient(_Client):
    """A WebSocket client: handshake, unmasked server frames, pongs, optional deflate."""

    def __init__(self, sink: Sink, port: int, token: str, deflate: bool) -> None:
        super().__init__(sink)
        self.port, self.token, self.deflate = port, token, deflate
        self.open = False
        self.inflate: Any = None
        self.fragments: list[bytes] | None = None
        self.fragment_rsv1 = False

    def request(self) -> bytes:
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /v1/ws HTTP/1.1",
            f"Host: {HOST}:{self.port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"Authorization: Bearer {self.token}",
        ]
        if self.deflate:
            lines.append("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf
        buf += data
        if not self.open:
            head = self.response_head("HTTP/1.1 101")
            if head is None:
                return
            if "permessage-deflate" in head.lower():
                self.inflate = zlib.decompressobj(-15)
            self.open = True
        pos, size = 0, len(buf)
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, head_len = b1 & 0x7F, 2
            if length == 126:
                if size - pos < 4:
                    break
                length, head_len = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, head_len = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if size - pos < head_len + length:
                break
            payload = bytes(buf[pos + head_len : pos + head_len + length])
            pos += head_len + length
            self._frame(b0, payload, now)
        if pos:
            del buf[:pos]

    def _frame(self, b0: int, payload: bytes, now: float) -> None:
        opcode, fin, rsv1 = b0 & 0x0F, b0 & 0x80, bool(b0 & 0x40)
        if opcode in (1, 2):
            if fin:
                self._message(payload, rsv1, now)
            else:
                self.fragments, self.fragment_rsv1 = [payload], rsv1
        elif opcode == 0 and self.fragments is not None:
            self.fragments.append(payload)
            if fin:
                message, self.fragments = b"".join(self.fragments), None
                self._message(message, self.fragment_rsv1, now)
        elif opcode == 9:  # ping: answer with a masked pong
            self._send(0xA, payload)
        elif opcode == 8:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.fail(f"closed {code}")

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        assert self.transport is not None and len(payload) < 126
        self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def _message(self, payload: bytes, compressed: bool, now: float) -> None:
        if compressed and self.inflate is not None:
            payload = self.inflate.decompress(payload + b"\x00\x00\xff\xff")
        if payload.startswith(b'{"type":"notification","data":'):
            self.sink.notified(self, payload[30:-1], now)
        elif payload.startswith(b'{"type":"live"'):
            if not self.ready.done():
                self.ready.set_result(None)
        elif not payload.startswith(b'{"type":"resume"'):
            self.sink.anomalies[orjson.loads(payload).get("type", "?")] += 1


class SSEClient(_Client):
    """An SSE client: HTTP/1.1 GET, chunked transfer decoding, event blocks."""

    def __init__(self, sink: Sink, port: int, token: str, subscription_id: str) -> None:
        super().__init__(sink)
        self.port, self.token, self.subscription_id = port, token, subscription_id
        self.open = False
        self.chunked = False
        self.chunk_left = 0  # data bytes left in the current chunk
        self.skip = 0  # CRLF bytes after a chunk still to skip
        self.body = bytearray()

    def request(self) -> bytes:
        return (
            f"GET /v1/subscriptions/{self.subscription_id}/events HTTP/1.1\r\n"
            f"Host: {HOST}:{self.port}\r\nAuthorization: Bearer {self.token}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf
        buf += data
        if not self.open:
            head = self.response_head("HTTP/1.1 200")
            if head is None:
                return
            self.chunked = "transfer-encoding: chunked" in head.lower()
            self.open = True
        if not self.chunked:
            self.body += buf
            buf.clear()
        else:
            self._dechunk()
        self._events(now)

    def _dechunk(self) -> None:
        buf, pos, size = self.buf, 0, len(self.buf)
        while pos < size:
            if self.skip:
                step = min(self.skip, size - pos)
                self.skip -= step
                pos += step
            elif self.chunk_left:
                step = min(self.chunk_left, size - pos)
                self.body += buf[pos : pos + step]
                self.chunk_left -= step
                pos += step
                if not self.chunk_left:
                    self.skip = 2
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                self.chunk_left = int(bytes(buf[pos:eol]).split(b";")[0], 16)
                pos = eol + 2
                if not self.chunk_left:
                    self.fail("stream ended")
                    break
        del buf[:pos]

    def _events(self, now: float) -> None:
        body, pos = self.body, 0
        while True:
            end = body.find(b"\r\n\r\n", pos)
            sep = 4
            if end < 0:
                end, sep = body.find(b"\n\n", pos), 2
                if end < 0:
                    break
            block = bytes(body[pos:end])
            pos = end + sep
            name, data = b"message", []
            for line in block.replace(b"\r\n", b"\n").split(b"\n"):
                if line.startswith(b"event:"):
                    name = line[6:].strip()
                elif line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
            if not data:
                continue  # a comment (keep-alive)
            if name == b"memory.recorded":
                self.sink.notified(self, b"\n".join(data), now)
            elif name == b"live":
                if not self.ready.done():
                    self.ready.set_result(None)
            elif name != b"resume":
                self.sink.anomalies[name.decode()] += 1
        if pos:
            del body[:pos]


class RedisSubscriber(_Client):
    """A RESP2 client SUBSCRIBEd to one channel; ready once the subscription is confirmed."""

    def request(self) -> bytes:
        return b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(CHANNEL), CHANNEL)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self.buf
        buf += data
        pos = 0
        while True:
            parsed = _resp_array(buf, pos)
            if parsed is None:
                break
            items, pos = parsed
            if items[0] == b"message":
                self.sink.in_sequence(self, self.sink.notified(self, items[2], now))
            elif items[0] == b"subscribe":
                if not self.ready.done():
                    self.ready.set_result(None)
            else:
                self.sink.anomalies[repr(items[0])] += 1
        if pos:
            del buf[:pos]


def _resp_array(buf: bytearray, pos: int) -> tuple[list[Any], int] | None:
    """One RESP2 array of bulk strings / integers at ``pos``, or None if incomplete."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    if buf[pos] != ord("*"):
        raise ValueError(f"unexpected RESP reply {bytes(buf[pos:eol])!r}")
    count, pos = int(buf[pos + 1 : eol]), eol + 2
    items: list[Any] = []
    for _ in range(count):
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        kind, value = buf[pos], bytes(buf[pos + 1 : eol])
        pos = eol + 2
        if kind == ord("$"):
            length = int(value)
            if len(buf) < pos + length + 2:
                return None
            items.append(bytes(buf[pos : pos + length]))
            pos += length + 2
        else:
            items.append(value)
    return items, pos


class JetStreamSubscriber:
    """One subscriber of the JetStream peer: its own NATS connection (nats-py) and its own
    ordered push consumer on the stream, created when it connects.

    An ordered push consumer is what a JetStream deployment gives each of many independent
    readers that all want every message: ephemeral, in the server's memory, no
    acknowledgement per message, flow control and idle heartbeats, and the client checks the
    consumer's sequence and recreates the consumer from the last message it had on a gap
    (so it neither loses nor repeats). That is the closest peer to a Field subscriber, which
    acknowledges no notification either and resumes from its cursor. The receive time is
    taken when nats-py has parsed the message off the socket and queues it for the callback
    (:meth:`_stamp`), as the hand-parsed clients take it on the socket read: not after the
    queue's hop to the callback's task, which a loaded client process would add to the
    latency.
    """

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.received = 0
        self.last = 0
        self.nc: Any = None

    async def open(self, url: str) -> None:
        self.nc = await _jetstream.connect(url)
        js = self.nc.jetstream(timeout=CONNECT_TIMEOUT)
        sub = await js.subscribe(
            JS_SUBJECT, stream=JS_STREAM, cb=self._message, ordered_consumer=True
        )
        self._stamp(sub)
        await self.nc.flush()  # the SUB has reached the server

    @staticmethod
    def _stamp(sub: Any) -> None:
        """Stamp each message with the time nats-py queues it for the callback (its read
        loop, right after parsing it). Without that queue (another nats-py than the pinned
        one) :meth:`_message` takes the time itself."""
        queue = getattr(sub, "_pending_queue", None)
        if queue is None:
            return
        put = queue.put_nowait

        def stamped(msg: Any) -> None:
            msg.received_at = time.time()
            put(msg)

        queue.put_nowait = stamped

    async def _message(self, msg: Any) -> None:
        now = getattr(msg, "received_at", None) or time.time()
        self.sink.in_sequence(self, self.sink.notified(self, msg.data, now))

    async def aclose(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = None


# -- the client process -----------------------------------------------------------


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    token: str | None,
    refusals: Refusals | None = None,
) -> Any:
    """The answer to ``body``; a refusal for now (503 OVERLOADED, 429 RATE_LIMITED) is waited
    out and the same body sent again, counted in ``refusals`` (this process's REFUSALS)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    counted = REFUSALS if refusals is None else refusals
    reply = await post_retried(session, url, orjson.dumps(body), headers, counted)
    if reply.status != 200:
        raise RuntimeError(f"{url}: {reply.status} {reply.answer}")
    return reply.answer


async def _setup(spec: dict[str, Any], counter: Any) -> list[tuple[str, str, str]]:
    """Register ``spec["count"]`` agents, each with one subscription: (agent, token, sub)."""
    rng = random.Random(spec["seed"])
    base = f"http://{HOST}:{spec['port']}"
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=SETUP_CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> tuple[str, str, str]:
            agent = f"{spec['prefix']}-{i}"
            payload = {
                "id": agent,
                "role": ROLES[i % len(ROLES)],
                "interests": [" ".join(rng.sample(VOCABULARY, 2))],
            }
            async with gate:
                reg = await _post(
                    session, base + "/v1/register", envelope("REGISTER", agent, payload), None
                )
                body = envelope(
                    "SUBSCRIBE",
                    agent,
                    {"action": "subscribe", "subscription": SUBSCRIPTION},
                    epoch=reg["epoch"],
                )
                sub = await _post(session, base + "/v1/subscribe", body, reg["token"])
            with counter.get_lock():
                counter.value += 1
            return agent, reg["token"], sub["subscription_id"]

        return await asyncio.gather(*(one(i) for i in range(spec["count"])))


async def _connect(
    spec: dict[str, Any], agents: list[tuple[str, str, str]], sink: Sink, counter: Any
) -> tuple[list[Any], int]:
    """Open one connection per subscriber; wait for each one's ``live`` (or subscribe, or
    the JetStream consumer's creation)."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    kind, port = spec["kind"], spec["port"]

    async def subscriber() -> JetStreamSubscriber | None:
        async with gate:
            client = JetStreamSubscriber(sink)
            try:
                await asyncio.wait_for(client.open(f"nats://{HOST}:{port}"), CONNECT_TIMEOUT)
            except Exception as exc:  # nats-py's errors, a timeout
                sink.anomalies[f"connect: {type(exc).__name__} {exc}"] += 1
                await client.aclose()
                return None
        with counter.get_lock():
            counter.value += 1
        return client

    if kind == "jetstream":
        subscribers = await asyncio.gather(*(subscriber() for _ in range(spec["count"])))
        opened = [c for c in subscribers if c is not None]
        return opened, spec["count"] - len(opened)

    def factory(agent: tuple[str, str, str] | None) -> _Client:
        if kind == "ws":
            assert agent is not None
            return WSClient(sink, port, agent[1], spec["deflate"])
        if kind == "sse":
            assert agent is not None
            return SSEClient(sink, port, agent[1], agent[2])
        return RedisSubscriber(sink)

    async def one(agent: tuple[str, str, str] | None) -> _Client | None:
        async with gate:
            client = factory(agent)
            try:
                await loop.create_connection(lambda: client, HOST, port)
                await asyncio.wait_for(client.ready, CONNECT_TIMEOUT)
            except (OSError, RuntimeError, TimeoutError) as exc:
                sink.anomalies[f"connect: {exc}"] += 1
                client.close()
                return None
        with counter.get_lock():
            counter.value += 1
        return client

    targets: list[Any] = list(agents) if kind not in BROKERS else [None] * spec["count"]
    opened = await asyncio.gather(*(one(a) for a in targets))
    clients = [c for c in opened if c is not None]
    return clients, len(targets) - len(clients)


async def _client(pipe: Any, spec: dict[str, Any], counter: Any) -> None:
    loop = asyncio.get_running_loop()
    sink = Sink()
    agents: list[tuple[str, str, str]] = []
    clients: list[Any] = []  # _Client, or JetStreamSubscriber
    while True:
        command = await loop.run_in_executor(None, pipe.recv)
        op = command[0]
        if op == "setup":
            if spec["kind"] not in BROKERS:
                agents = await _setup(spec, counter)
            pipe.send(("ok", len(agents), REFUSALS.as_dict()))
            REFUSALS.counts.clear()
            REFUSALS.waited = 0.0
        elif op == "connect":
            clients, failed = await _connect(spec, agents, sink, counter)
            pipe.send(("ok", len(clients), failed, time.process_time()))
        elif op == "collect":  # wait for ``command[1]`` notifications per connection in all
            expected = command[1] * len(clients)
            deadline = loop.time() + command[2]
            while sink.total < expected and loop.time() < deadline:
                await asyncio.sleep(0.002)
            # on a timeout, late notifications show up as "unexpected unit" in the next phase
            reply = {
                "receipts": sink.take(),
                "total": sink.total,
                "anomalies": dict(sink.anomalies),
                "sample": sink.sample,
                "cpu": time.process_time(),
            }
            pipe.send(("ok", reply))
        elif op == "close":
            if spec["kind"] == "jetstream":
                await asyncio.gather(*(client.aclose() for client in clients))
            else:
                for client in clients:
                    client.close()
            await asyncio.sleep(0.2)
            pipe.send(("ok",))
            return


def _client_main(pipe: Any, spec: dict[str, Any], counter: Any) -> None:
    raise_nofile()
    try:
        try:
            import uvloop

            uvloop.run(_client(pipe, spec, counter))
        except ImportError:
            asyncio.run(_client(pipe, spec, counter))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


class ClientPool:
    """``procs`` client processes sharing ``count`` subscribers of one server."""

    def __init__(self, kind: str, count: int, procs: int, port: int, *, deflate: bool = False):
        ctx = mp.get_context("spawn")
        self.counter = ctx.Value("l", 0)
        self.count = count
        self.pipes: list[Any] = []
        self.processes: list[Any] = []
        tag = f"{kind}{count}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        for p in range(procs):
            share = count // procs + (p < count % procs)
            spec = {
                "kind": kind,
                "port": port,
                "count": share,
                "prefix": f"{tag}-{p}",
                "seed": p,
                "deflate": deflate,
            }
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_client_main, args=(child, spec, self.counter))
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)

    def ask(
        self, command: tuple[Any, ...], label: str | None = None, timeout: float = 300
    ) -> list[Any]:
        """Send ``command`` to every client process; their replies (progress while waiting)."""
        with self.counter.get_lock():
            self.counter.value = 0
        for pipe in self.pipes:
            pipe.send(command)
        replies: list[Any] = [None] * len(self.pipes)
        deadline = time.monotonic() + timeout
        step = max(1, self.count // 50)
        shown = -1
        while any(r is None for r in replies):
            for i, pipe in enumerate(self.pipes):
                if replies[i] is None and pipe.poll(0.05):
                    reply = pipe.recv()
                    if reply[0] == "error":
                        raise RuntimeError("client process failed:\n" + reply[1])
                    replies[i] = reply
            done = min(self.counter.value, self.count)
            if label is not None and done - done % step != shown:
                shown = done - done % step
                progress(shown, self.count, label)
            if time.monotonic() > deadline:
                raise TimeoutError(f"client processes did not answer {command[0]!r}")
            for i, process in enumerate(self.processes):
                if replies[i] is None and not process.is_alive() and not self.pipes[i].poll():
                    raise RuntimeError(f"client process {process.pid} died")
        if label is not None and shown != self.count:
            progress(self.count, self.count, label)
        return replies

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask(("close",), timeout=30)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()


# -- writers ------------------------------------------------------------------------


class FieldWriter:
    """An agent recording units over HTTP; returns {memory_unit_id: ack time}, and keeps
    each unit's send time in ``sent``."""

    def __init__(self, port: int, *, topic: str = "fanout") -> None:
        self.base = f"http://{HOST}:{port}"
        self.sent: dict[str, float] = {}
        self.rng = random.Random(3)
        self.session: aiohttp.ClientSession | None = None
        self.token = ""
        self.intent = {"purpose": f"{topic} benchmark", "task_id": f"task-{topic}"}
        #: requests refused for now, waited out and sent again
        self.refusals = Refusals()

    async def start(self) -> None:
        """A fresh session (the server drops connections idle for 30 s), registered once."""
        await self.close()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        if not self.token:
            payload = {"id": "writer", "role": "market_researcher", "interests": ["market size"]}
            body = envelope("REGISTER", "writer", payload)
            registered = await _post(
                self.session, self.base + "/v1/register", body, None, self.refusals
            )
            self.token = registered["token"]
        else:  # open the connection before the phase
            async with self.session.get(self.base + "/v1/field/status") as response:
                await response.read()

    async def one(self) -> tuple[str, float]:
        assert self.session is not None
        payload = {
            "type": "finding",
            "content": " ".join(self.rng.choices(VOCABULARY, k=12)),
            "intent": self.intent,
            "confidence": {"score": 0.8, "reasoning": "generated"},
        }
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        body = orjson.dumps(envelope("RECORD", "writer", payload))
        url = self.base + "/v1/record"
        reply = await post_retried(self.session, url, body, headers, self.refusals)
        ack = time.time()
        if reply.status != 200:
            raise RuntimeError(f"{url}: {reply.status} {reply.answer}")
        unit = reply.answer["memory_unit_id"]
        self.sent[unit] = reply.sent_at  # the accepted attempt's
        return unit, ack

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


class RedisPublisher:
    """PUBLISHes copies of a notification with a fresh memory_unit_id each."""

    def __init__(self, port: int, sample: bytes) -> None:
        self.port = port
        unit = orjson.loads(sample)["memory_unit_id"].encode()
        self.head, _, self.tail = sample.partition(unit)
        self.serial = 0
        self.sent: dict[str, float] = {}
        self.refusals = Refusals()  # none: Redis refuses nothing for load
        self.lock = asyncio.Lock()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def start(self) -> None:
        await self.close()
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)

    async def one(self) -> tuple[str, float]:
        assert self.reader is not None and self.writer is not None
        self.serial += 1
        unit = f"mem-{self.serial:020x}"
        message = self.head + unit.encode() + self.tail
        command = b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(CHANNEL),
            CHANNEL,
            len(message),
            message,
        )
        async with self.lock:
            self.sent[unit] = time.time()
            self.writer.write(command)
            reply = await self.reader.readline()
            ack = time.time()
        if not reply.startswith(b":"):
            raise RuntimeError(f"PUBLISH failed: {reply!r}")
        return unit, ack

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.writer = None


class JetStreamPublisher:
    """Publishes copies of a notification with a fresh memory_unit_id each to the stream,
    each awaiting its acknowledgement (``js.publish``: stored, and with ``sync_interval:
    always`` flushed to disk); sent concurrently on one connection when paced."""

    def __init__(self, port: int, sample: bytes) -> None:
        self.url = f"nats://{HOST}:{port}"
        unit = orjson.loads(sample)["memory_unit_id"].encode()
        self.head, _, self.tail = sample.partition(unit)
        self.serial = 0
        self.sent: dict[str, float] = {}
        self.refusals = Refusals()  # none: JetStream refuses nothing for load here
        self.nc: Any = None
        self.js: Any = None

    async def start(self) -> None:
        await self.close()
        self.nc = await _jetstream.connect(self.url)
        self.js = self.nc.jetstream(timeout=30)

    async def one(self) -> tuple[str, float]:
        self.serial += 1
        unit = f"mem-{self.serial:020x}"
        message = self.head + unit.encode() + self.tail
        self.sent[unit] = time.time()
        ack = await self.js.publish(JS_SUBJECT, message)
        acked = time.time()
        if ack.stream != JS_STREAM or ack.duplicate:
            raise RuntimeError(f"publish not stored: {ack}")
        return unit, acked

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = self.js = None


def start_jetstream(args: argparse.Namespace, clients: int) -> tuple[Any, int]:
    """A private ``nats-server -js`` (file storage in a fresh directory, removed on stop)
    with the stream created: (server, port)."""
    server = _jetstream.JetStreamServer(args.nats_server, args.jetstream_sync, clients=clients)
    server.start()
    try:
        asyncio.run(_jetstream.add_stream(server.url, JS_STREAM, JS_SUBJECT))
    except BaseException:
        server.stop()
        raise
    return server, server.port


async def paced(writer: Any, units: int, per_second: float) -> dict[str, float]:
    """Send ``units`` at a steady rate, each at its time (open loop)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.02
    tasks = []
    for i in range(units):
        delay = start + i / per_second - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(writer.one()))
    return dict(await asyncio.gather(*tasks))


async def flat_out(writer: Any, units: int) -> dict[str, float]:
    """Send ``units`` one after the other, each as soon as the previous is acknowledged."""
    return dict([await writer.one() for _ in range(units)])


# -- one case ---------------------------------------------------------------------------


@dataclass
class Row:
    transport: str
    subscribers: int
    phase: str
    units: int
    expected: int
    delivered: int = 0
    throughput: float = 0.0
    p50: float = float("nan")
    p99: float = float("nan")
    worst: float = float("nan")
    #: p99 latency from the RECORD's send instead of its acknowledgement
    p99_sent: float = float("nan")
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    anomalies: dict[str, int] = field(default_factory=dict)
    #: the server's metrics: "on", "off" (``--no-metrics``), "" for Redis
    metrics: str = ""
    #: the phase's RECORDs the Field refused for now, and the case's set-up's
    refused: Refusals = field(default_factory=Refusals)
    setup_refused: Refusals = field(default_factory=Refusals)


def _measure(
    pool: ClientPool,
    server_pid: int,
    transport: str,
    subscribers: int,
    phase: str,
    acks: dict[str, float],
    sent: dict[str, float],
    started: tuple[float, float, float],
    done_per_conn: int,
) -> tuple[Row, bytes | None, float]:
    """Collect the receipts of one phase: (its row, a notification, clients' CPU seconds)."""
    replies = pool.ask(("collect", done_per_conn, COLLECT_TIMEOUT))
    wall0, server0, client0 = started
    wall = time.monotonic() - wall0
    row = Row(transport, subscribers, phase, len(acks), len(acks) * subscribers)
    latencies: list[float] = []
    from_send: list[float] = []
    last = 0.0
    sample = None
    anomalies: collections.Counter[str] = collections.Counter()
    for _, reply in replies:
        sample = sample or reply["sample"]
        anomalies.update(reply["anomalies"])
        for unit, times in reply["receipts"].items():
            ack = acks.get(unit)
            if ack is None:
                anomalies["unexpected unit"] += len(times)
                continue
            latencies.extend((t - ack) * 1000 for t in times)
            from_send.extend((t - sent[unit]) * 1000 for t in times)
            last = max(last, max(times))
    row.delivered = len(latencies)
    row.anomalies = dict(anomalies)
    if latencies:
        first_ack = min(acks.values())
        row.throughput = row.delivered / max(1e-9, last - first_ack)
        row.p50, row.p99, row.worst = pct(latencies, 0.5), pct(latencies, 0.99), max(latencies)
        row.p99_sent = pct(from_send, 0.99)
    row.server_cpu = (cpu_seconds(server_pid) - server0) / wall * 100
    client_cpu = sum(r["cpu"] for _, r in replies)
    row.client_cpu = (client_cpu - client0) / wall * 100
    return row, sample, client_cpu


def run_case(
    transport: str,
    subscribers: int,
    units: int,
    args: argparse.Namespace,
    sample: bytes | None,
    metrics: str = "on",
) -> tuple[list[Row], bytes | None]:
    """Start a server and clients, run the paced and flat-out phases, stop everything."""
    kind = {"websocket": "ws", "sse": "sse", "redis": "redis", "jetstream": "jetstream"}[transport]
    server: Any
    if kind == "redis":
        server, port = start_redis(subscribers)
    elif kind == "jetstream":
        server, port = start_jetstream(args, subscribers)
    else:
        flags = ["--ws-deflate"] if args.deflate else []
        flags += ["--no-metrics"] if metrics == "off" else []
        flags += NO_ADMISSION if args.no_admission else []
        server, port = start_field(*flags)
    pool: ClientPool | None = None
    rows: list[Row] = []
    try:
        pool = ClientPool(kind, subscribers, args.procs, port, deflate=args.deflate)
        label = f"{kind} {subscribers / 1000:g}k"
        setup_refused = Refusals()
        for reply in pool.ask(("setup",), f"{label} setup" if kind not in BROKERS else None):
            setup_refused.add(reply[2])
        replies = pool.ask(("connect",), f"{label} conn", timeout=CONNECT_TIMEOUT + 60)
        failed = sum(r[2] for r in replies)
        if failed:
            print(f"\n{failed} of {subscribers} connections failed", file=sys.stderr)
        client_cpu = sum(r[3] for r in replies)
        live = sum(r[1] for r in replies)
        if kind == "redis":
            assert sample is not None
            writer: Any = RedisPublisher(port, sample)
        elif kind == "jetstream":
            assert sample is not None
            writer = JetStreamPublisher(port, sample)
        else:
            writer = FieldWriter(port)

        async def phases() -> None:
            nonlocal client_cpu, sample
            try:
                per_conn = 0
                for phase in ("paced", "flat-out"):
                    await writer.start()
                    if phase == "paced":  # the writer's REGISTER
                        setup_refused.add(writer.refusals)
                    writer.refusals = Refusals()
                    writer.sent.clear()
                    started = (time.monotonic(), cpu_seconds(server.pid), client_cpu)
                    if phase == "paced":
                        acks = await paced(writer, units, args.rate / subscribers)
                    else:
                        acks = await flat_out(writer, units)
                    per_conn += units
                    row, found, client_cpu = await asyncio.get_running_loop().run_in_executor(
                        None,
                        _measure,
                        pool,
                        server.pid,
                        transport,
                        live,
                        phase,
                        acks,
                        writer.sent,
                        started,
                        per_conn,
                    )
                    sample = sample or found
                    row.metrics = "" if kind in BROKERS else metrics
                    row.refused, row.setup_refused = writer.refusals, setup_refused
                    rows.append(row)
                    print(
                        f"\r{label:>12} {phase}: {row.delivered:,}/{row.expected:,} delivered",
                        file=sys.stderr,
                    )
            finally:
                await writer.close()

        asyncio.run(phases())
    finally:
        if pool is not None:
            pool.close()
        server.stop()
        if server.process.returncode not in (0, None) and kind not in BROKERS:
            print("\n".join(server.lines), file=sys.stderr)
    return rows, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--sse", type=int, nargs="*", default=[1000], help="subscriber counts also run over SSE"
    )
    parser.add_argument("--procs", type=int, default=3, help="client processes")
    parser.add_argument(
        "--units", type=int, help="units per phase (default 100 up to 1,000 subscribers, else 20)"
    )
    parser.add_argument(
        "--rate", type=float, default=50_000, help="offered notifications/s in the paced phase"
    )
    parser.add_argument("--deflate", action="store_true", help="offer permessage-deflate (WS)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis baseline")
    _jetstream.add_arguments(parser)
    parser.add_argument(
        "--jetstream-sync",
        choices=_jetstream.SYNC_POLICIES,
        default="always",
        help="JetStream's file store: fsync every write before its acknowledgement (always, "
        "server 2.10 and later) or the server's default (every 2 min)",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="run the Field with its metrics on, off, or both alternating (on)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each Field case (1)")
    parser.add_argument(
        "--no-admission", action="store_true", help="start the Field with admission control off"
    )
    args = parser.parse_args()
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be between 1 and 20")
    settings = list(dict.fromkeys(args.metrics))

    def field_cases(transport: str, size: int, units: int) -> None:
        nonlocal sample
        for round_ in range(args.rounds):
            # alternate, and flip the order every round: neither goes first every time
            for metrics in settings if round_ % 2 == 0 else settings[::-1]:
                found, sample = run_case(transport, size, units, args, sample, metrics)
                rows.extend(found)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop children on the way out
    jetstream = _jetstream.available(args)
    always = jetstream and args.jetstream_sync == "always"
    if always and not _jetstream.supports_always(args.nats_server):
        print(
            "this nats-server has no sync_interval: always (2.10 and later): JetStream runs "
            "with its default sync",
            file=sys.stderr,
        )
        args.jetstream_sync = "default"
    limit = raise_nofile()
    need = max([*args.subscribers, *args.sse]) + 200
    if limit < need:
        parser.error(f"the open-file limit is {limit}; {need} are needed")
    rows: list[Row] = []
    sample: bytes | None = None
    for size in args.subscribers:
        units = args.units or (100 if size <= 1000 else 20)
        transports = ["websocket"] + (["sse"] if size in args.sse else [])
        for transport in transports:
            field_cases(transport, size, units)
        if not args.no_redis:
            rows.extend(run_case("redis", size, units, args, sample)[0])
        if jetstream:
            rows.extend(run_case("jetstream", size, units, args, sample)[0])
    for size in args.sse:  # SSE sizes not among --subscribers
        if size not in args.subscribers:
            units = args.units or (100 if size <= 1000 else 20)
            field_cases("sse", size, units)

    size_bytes = len(sample) if sample else 0
    print(
        f"\nPush fan-out: {args.procs} client processes, one subscription per agent, "
        f"notification {size_bytes} bytes; paced = offered {args.rate:,.0f} notifications/s"
        + (", WebSocket permessage-deflate offered" if args.deflate else "")
        + f"; the Field served from {field_tree()}"
    )
    print(
        f"{'transport':<10}{'subscr.':>8} {'phase':<9}{'metrics':<8}{'units':>6}{'delivered':>11}"
        f"{'deliv./s':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'srv CPU':>9}{'cli CPU':>9}"
        f"{'p99 from send':>15}{'refused':>9}"
    )
    for r in rows:
        print(
            f"{r.transport:<10}{r.subscribers:>8,} {r.phase:<9}{r.metrics:<8}{r.units:>6}"
            f"{r.delivered:>11,}{r.throughput:>10,.0f}{r.p50:>9.1f}{r.p99:>9.1f}{r.worst:>9.1f}"
            f"{r.server_cpu:>8.0f}%{r.client_cpu:>8.0f}%{r.p99_sent:>15.1f}{r.refused.total:>9,}"
        )
    for r in rows:
        name = f"{r.transport} {r.subscribers:,} {r.metrics}".rstrip()
        if r.setup_refused and r.phase == "paced":
            print(f"  refused, {name} set-up: {r.setup_refused.describe()}")
        if r.refused:
            print(f"  refused, {name} {r.phase} RECORDs: {r.refused.describe()}")
    problems = [r for r in rows if r.delivered != r.expected or r.anomalies]
    for r in problems:
        print(
            f"  ! {r.transport} {r.subscribers:,} {r.phase}: {r.delivered:,} of {r.expected:,} "
            f"delivered; {r.anomalies or ''}"
        )
    for peer, name in (("redis", "Redis"), ("jetstream", "JetStream")):
        baseline = {(r.subscribers, r.phase): r for r in rows if r.transport == peer}
        for r in rows:
            base = baseline.get((r.subscribers, r.phase))
            if r.transport not in BROKERS and base is not None and base.throughput:
                # a p99 at or below zero (received before the writer read its answer) has no ratio
                p99 = f"{r.p99 / base.p99:.2f}x" if r.p99 > 0 and base.p99 > 0 else "no ratio"
                print(
                    f"{r.transport} {r.subscribers:,} {r.phase}: "
                    f"{r.throughput / base.throughput:.2f}x {name}'s delivered msgs/s; p99 "
                    f"{r.p99:.1f} ms vs {base.p99:.1f} ms ({p99})"
                )
    if len(settings) == 2:
        compare_metrics(rows)
    if jetstream:
        version = ".".join(map(str, _jetstream.server_version(args.nats_server)))
        print(
            f"JetStream: nats-server {version}, one stream on file storage with "
            f"{_jetstream.describe_policy(args.jetstream_sync)};\n  one connection and one "
            "ordered push consumer per subscriber; latency from the publish's acknowledgement"
        )
    print(
        "targets: >= 50,000 delivered notifications/s, p99 <= 50 ms with 1,000 subscribers; "
        "p99 paced at 20,000/s <= 2x Redis's"
    )


def compare_metrics(rows: list[Row]) -> None:
    """Each Field case with metrics on beside the same case with them off (means)."""
    cases = dict.fromkeys((r.transport, r.subscribers, r.phase) for r in rows if r.metrics)
    for transport, subscribers, phase in cases:
        same = [
            r
            for r in rows
            if (r.transport, r.subscribers, r.phase) == (transport, subscribers, phase)
        ]
        on = [r for r in same if r.metrics == "on"]
        off = [r for r in same if r.metrics == "off"]
        rate_on = statistics.mean(r.throughput for r in on)
        rate_off = statistics.mean(r.throughput for r in off)
        median_on = statistics.median(r.throughput for r in on)
        median_off = statistics.median(r.throughput for r in off)
        p99_on = statistics.median(r.p99 for r in on)
        p99_off = statistics.median(r.p99 for r in off)
        print(
            f"{transport} {subscribers:,} {phase}, {len(on)} runs each: with metrics "
            f"{rate_on:,.0f}/s, without {rate_off:,.0f}/s (means: {rate_on / rate_off:.3f}x; "
            f"medians: {median_on / median_off:.3f}x); median p99 {p99_on:.1f} ms against "
            f"{p99_off:.1f} ms"
        )


if __name__ == "__main__":
    bracketed(main)
