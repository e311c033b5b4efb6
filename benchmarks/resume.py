"""Resume: how fast a reconnecting subscriber is replayed the notifications it is owed.

    python benchmarks/resume.py [--owed 100000] [--rounds 1] [--live 20] [--profile DIR]

Starts one ``field serve`` process on loopback (fresh data directory,
durable SQLite log, default settings), registers a writer and a
subscriber, and subscribes the subscriber to ``memory.recorded``
(``min_relevance`` 0, ``debounce_ms`` 0), keeping the response's
``cursor``. The writer then records ``--owed`` units over ``--clients``
concurrent connections (set-up, not timed): every one of them is owed to
the subscription (the SQLite file, read directly, says at which log
positions: clock reservations take positions in between).

Then, timed, with the subscriber reconnecting from that cursor:

* Server-Sent Events: ``GET /v1/subscriptions/{id}/events`` with
  ``Last-Event-ID: <cursor>``, until the ``live`` event;
* WebSocket: ``/v1/ws?since=<cursor>&token=...``, until the ``live`` frame
  (the SSE stream stays open, idle, meanwhile).

With ``--rounds N`` both are done N times over, each round on new connections from
the same cursor (an earlier round's streams are closed once checked), so that the
replays are timed over a sustained stretch; the table has a row per replay and a
last row per transport with all its rounds together.

Each replay must deliver exactly the owed notifications: ``replayed`` =
``--owed``, and the cursors exactly the owed positions, in order (so no
gap and no duplicate). Finally the
writer records ``--live`` more units one at a time, and both streams must
receive exactly those, after ``live``, continuing from its cursor.

Prints the time from the request to ``live``, the time to the first
notification, notifications per second, and the CPU the server and this
client used during each replay. A POST the server refuses (``503
OVERLOADED`` or ``429 RATE_LIMITED``) is waited out for its ``Retry-After``
and sent again, the same envelope (the Field changed nothing for it, so no
unit is recorded twice and the owed count holds); a line says how many were
refused, by kind. With ``--profile DIR``, ``py-spy record``
(which must be installed and allowed to attach) samples the server during
each replay; the collapsed stacks go to DIR and the functions with the
most samples are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import bracketed, envelope, progress
from _refusals import Refusals
from _refusals import post as post_retried
from writes import FieldServer, new_loop, record_payload

JSON = {"Content-Type": "application/json"}
#: POSTs the server refused for now, waited out and sent again
REFUSALS = Refusals()


@dataclass
class Received:
    """What one push connection delivered, as it arrived."""

    #: positions of the notifications before ``live``
    replayed: list[int] = field(default_factory=list)
    #: (position, notification) after ``live``
    after_live: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    controls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    first_at: float | None = None
    live_at: float | None = None
    live: dict[str, Any] | None = None
    went_live: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    problems: list[str] = field(default_factory=list)
    #: progress bar: the owed count and its label
    owed: int = 0
    label: str = ""

    def control(self, kind: str, data: dict[str, Any]) -> None:
        self.controls.append((kind, data))
        if kind == "live":
            self.live_at = time.perf_counter()
            self.live = data
            self.went_live.set()
        elif kind != "resume":
            self.problems.append(f"unexpected {kind} frame: {data}")
            self.went_live.set()  # do not wait for a live that will not come
            self.arrived.set()

    def notification(self, position: int, data: dict[str, Any] | None) -> None:
        if self.live is None:
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.replayed.append(position)
            progress(len(self.replayed), self.owed, self.label)
        else:
            self.after_live.append((position, data or {}))
            self.arrived.set()


def position_of(cursor: str | bytes) -> int:
    text = cursor.decode() if isinstance(cursor, bytes) else cursor
    return int(text.rpartition("-")[2])


# -- the two transports ---------------------------------------------------------------


async def read_sse(response: aiohttp.ClientResponse, got: Received) -> None:
    """Parse ``text/event-stream`` by hand (lines end in CRLF or LF).

    Before ``live`` only the ``id:`` (the cursor) of a notification is read;
    after it the data is decoded and checked too.
    """
    buffer = b""
    event_id: bytes | None = None
    kind = b"message"
    data = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                name, _, value = line.partition(b":")
                if value.startswith(b" "):
                    value = value[1:]
                if name == b"id":
                    event_id = value
                elif name == b"event":
                    kind = value
                elif name == b"data":
                    data = value if not data else data + b"\n" + value
                continue  # a comment (": ping") has an empty name and is ignored
            if event_id is not None:  # a notification
                body = orjson.loads(data) if got.live is not None else None
                got.notification(position_of(event_id), body)
            elif data:
                got.control(kind.decode(), orjson.loads(data))
            event_id, kind, data = None, b"message", b""


async def read_ws(ws: aiohttp.ClientWebSocketResponse, got: Received) -> None:
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            if message.type == aiohttp.WSMsgType.ERROR:
                got.problems.append(f"WebSocket error: {ws.exception()}")
            break
        frame = orjson.loads(message.data)
        if frame["type"] == "notification":
            got.notification(position_of(frame["data"]["cursor"]), frame["data"])
        else:
            got.control(frame["type"], frame.get("data") or {})
    if ws.close_code not in (None, 1000):
        got.problems.append(f"WebSocket closed with {ws.close_code}")


# -- set-up ---------------------------------------------------------------------------


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, token: str | None = None
) -> dict[str, Any]:
    headers = JSON if token is None else {**JSON, "Authorization": f"Bearer {token}"}
    reply = await post_retried(session, url, orjson.dumps(body), headers, REFUSALS)
    if reply.status != 200:
        raise RuntimeError(f"{url}: {reply.status} {reply.answer}")
    answer: dict[str, Any] = reply.answer
    return answer


async def register(session: aiohttp.ClientSession, base: str, agent: str, role: str) -> str:
    payload = {"id": agent, "role": role, "interests": ["market size", "pricing"]}
    answer = await post(session, f"{base}/v1/register", envelope("REGISTER", agent, payload))
    return str(answer["token"])


async def record_many(base: str, token: str, total: int, clients: int) -> int:
    """``total`` RECORDs by the writer over ``clients`` connections; returns the highest epoch."""
    left = [total]
    done = [0]
    top = [0]

    async def client(index: int) -> None:
        rng = random.Random(index)
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            while left[0] > 0:
                left[0] -= 1
                body = envelope("RECORD", "writer", record_payload(rng, done[0]), top[0])
                answer = await post(session, f"{base}/v1/record", body, token)
                top[0] = max(top[0], answer["epoch"])
                done[0] += 1
                progress(done[0], total, "recording")

    await asyncio.gather(*(client(i) for i in range(min(clients, total))))
    return top[0]


# -- profiling ------------------------------------------------------------------------


class Profiler:
    """``py-spy record`` attached to the server for one phase, as collapsed stacks."""

    def __init__(self, pid: int, out: Path) -> None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.out = out
        self.command = [
            py_spy, "record", "--pid", str(pid), "--rate", "200", "--nonblocking",
            "--nolineno", "--format", "raw", "--output", str(out),
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> Profiler:
        with open(self.out.with_suffix(".log"), "wb") as log:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        await asyncio.sleep(1.0)  # let it attach before the phase starts
        if self.process.poll() is not None:
            raise RuntimeError(f"py-spy exited; see {self.out.with_suffix('.log')}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            await asyncio.to_thread(self.process.wait, 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


#: Frames every sample of the server passes through (process start, event loop, threads).
_WRAPPERS = ("runpy", "field/__main__.py", "field/cli/main.py", "uvicorn/server.py", "_compat.py",
             "asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py",
             "threading.py", "concurrent/futures/thread.py")  # fmt: skip


def summarize_profile(path: Path, top: int) -> list[str]:
    """Where the samples went: functions inclusive (on the stack) and self (the leaf),
    and self time by source file. Frames read ``function (file)``."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        n = int(count)
        total += n
        own[frames[-1]] += n
        by_file[frames[-1].rpartition(" (")[2].rstrip(")")] += n
        for frame in set(frames):
            if not any(wrapper in frame for wrapper in _WRAPPERS):
                inclusive[frame] += n
    if not total:
        return [f"  {path}: no samples"]
    lines = [f"  {total:,} samples (200/s, all threads, idle excluded)"]
    views = (("inclusive", inclusive), ("self", own), ("self, by file", by_file))
    for title, counter in views:
        lines.append(f"  top {top} by {title} share:")
        for frame, samples in counter.most_common(top):
            lines.append(f"    {samples / total:>6.1%}  {frame}")
    return lines


# -- the run --------------------------------------------------------------------------


@dataclass
class Replay:
    transport: str
    got: Received
    began: float
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    #: which of ``--rounds`` it was
    round: int = 1

    @property
    def seconds(self) -> float:
        assert self.got.live_at is not None
        return self.got.live_at - self.began

    @property
    def first_ms(self) -> float:
        return ((self.got.first_at or self.began) - self.began) * 1000


async def timed_replay(
    server: FieldServer, transport: str, opener: Any, owed: int, timeout: float
) -> tuple[Replay, Any]:
    """Open a stream with ``opener(got)`` (returns the reader task and what closes the
    stream); wait for ``live``."""
    got = Received(owed=owed, label=transport)
    cpu0, client0 = server.cpu_seconds(), time.process_time()
    began = time.perf_counter()
    opened = await opener(got)
    reader = opened[0]
    live = asyncio.create_task(got.went_live.wait())
    await asyncio.wait({live, reader}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    live.cancel()
    replay = Replay(transport, got, began)
    replay.server_cpu = server.cpu_seconds() - cpu0
    replay.client_cpu = time.process_time() - client0
    if got.live is None:
        problem = "the stream ended" if reader.done() else f"no live frame after {timeout:g} s"
        got.problems.append(problem)
    return replay, opened


async def scenario(server: FieldServer, args: argparse.Namespace) -> dict[str, Any]:
    base = server.url
    async with aiohttp.ClientSession() as session:
        writer = await register(session, base, "writer", "market_researcher")
        reader = await register(session, base, "subscriber", "strategist")
        subscription = {"events": ["memory.recorded"], "min_relevance": 0, "debounce_ms": 0}
        payload = {"action": "subscribe", "subscription": subscription}
        answer = await post(
            session, f"{base}/v1/subscribe", envelope("SUBSCRIBE", "subscriber", payload), reader
        )
        sub_id, cursor = answer["subscription_id"], answer["cursor"]

        started = time.perf_counter()
        await record_many(base, writer, args.owed, args.clients)
        setup_s = time.perf_counter() - started
        owed = [p for p, _ in logged_units(server.data_dir, position_of(cursor))]
        if len(owed) != args.owed:
            raise RuntimeError(f"the log holds {len(owed)} units after the cursor, not {args.owed}")

        # -- Server-Sent Events ------------------------------------------------------
        sse_headers = {"Authorization": f"Bearer {reader}", "Last-Event-ID": cursor}
        sse_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

        async def open_sse(got: Received) -> tuple[asyncio.Task[None], Any]:
            url = f"{base}/v1/subscriptions/{sub_id}/events"
            response = await sse_session.get(url, headers=sse_headers)
            if response.status != 200:
                raise RuntimeError(f"SSE: {response.status} {await response.text()}")

            async def close() -> None:
                response.close()

            return asyncio.create_task(read_sse(response, got)), close

        ws_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

        async def open_ws(got: Received) -> tuple[asyncio.Task[None], Any]:
            url = f"{base.replace('http', 'ws', 1)}/v1/ws"
            ws = await ws_session.ws_connect(
                url, params={"since": cursor, "token": reader}, max_msg_size=0, autoping=True
            )
            return asyncio.create_task(read_ws(ws, got)), ws.close

        replays: list[Replay] = []
        profiles: dict[str, Path] = {}
        readers: list[asyncio.Task[None]] = []
        try:
            for round_ in range(1, args.rounds + 1):
                last = round_ == args.rounds
                for transport, opener in (("SSE", open_sse), ("WebSocket", open_ws)):
                    if args.profile is None or not last:
                        replay, (task, close) = await timed_replay(
                            server, transport, opener, args.owed, args.timeout
                        )
                    else:
                        out = args.profile / f"resume-{transport.lower()}.txt"
                        async with Profiler(server.pid, out):
                            replay, (task, close) = await timed_replay(
                                server, transport, opener, args.owed, args.timeout
                            )
                        profiles[transport] = out
                    replay.round = round_
                    replays.append(replay)
                    check_replay(replay, owed, cursor)
                    if last:  # kept open: the live units must arrive on it
                        readers.append(task)
                    else:
                        task.cancel()
                        await close()
            replays_live = [r for r in replays if r.round == args.rounds]

            # -- live after the seam -------------------------------------------------
            acknowledged: list[str] = []
            rng = random.Random(99)
            for n in range(args.live):
                body = envelope("RECORD", "writer", record_payload(rng, n))
                answer = await post(session, f"{base}/v1/record", body, writer)
                acknowledged.append(answer["memory_unit_id"])
                progress(n + 1, args.live, "live")
            deadline = time.perf_counter() + 10
            for replay in replays_live:
                got = replay.got
                while len(got.after_live) < args.live and time.perf_counter() < deadline:
                    got.arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(got.arrived.wait(), 0.5)
            await asyncio.sleep(0.3)  # anything more (a duplicate) would arrive by now
            new = logged_units(server.data_dir, owed[-1])
            if [unit for _, unit in new] != acknowledged:
                raise RuntimeError("the log's new units are not the acknowledged ones")
            for replay in replays_live:
                check_live(replay, new, sub_id)
        finally:
            for task in readers:
                task.cancel()
            await sse_session.close()
            await ws_session.close()
    return {"setup_s": setup_s, "replays": replays, "cursor": cursor, "profiles": profiles}


def logged_units(data_dir: Path, after: int) -> list[tuple[int, str]]:
    """(position, unit id) of every ``memory.recorded`` entry after ``after``, read from
    the SQLite log directly: the positions a subscription to every unit is owed
    (clock reservations and other entries take positions in between)."""
    conn = sqlite3.connect(f"file:{data_dir / 'field.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT position, data FROM log WHERE kind = 'memory.recorded' AND position > ?"
            " ORDER BY position",
            (after,),
        ).fetchall()
    finally:
        conn.close()
    return [(position, orjson.loads(data)["unit"]["id"]) for position, data in rows]


def check_replay(replay: Replay, owed: list[int], cursor: str) -> None:
    got = replay.got
    resume = [data for kind, data in got.controls if kind == "resume"]
    if not resume or not resume[0].get("recovered") or resume[0].get("from") != cursor:
        got.problems.append(f"resume frame {resume[:1]} (expected recovered from {cursor})")
    if got.live is not None and got.live.get("replayed") != len(owed):
        got.problems.append(f"live says replayed={got.live.get('replayed')}, owed {len(owed)}")
    if got.replayed != owed:
        # strictly increasing and equal to the owed positions: no gap, duplicate or reorder
        extra = len(set(got.replayed) - set(owed))
        missing = len(set(owed) - set(got.replayed))
        duplicates = len(got.replayed) - len(set(got.replayed))
        got.problems.append(
            f"{len(got.replayed):,} notifications before live, owed {len(owed):,}: "
            f"{missing} missing, {extra} not owed, {duplicates} duplicates"
        )
    if got.live is not None and owed and position_of(got.live["cursor"]) != owed[-1]:
        got.problems.append(f"live cursor {got.live['cursor']} is not the last owed one")


def check_live(replay: Replay, new: list[tuple[int, str]], sub_id: str) -> None:
    """After ``live``: exactly the new units, in log order, from live's cursor on."""
    got = replay.got
    if got.live is None:
        return
    start = position_of(got.live["cursor"])
    arrived = [(p, data.get("memory_unit_id")) for p, data in got.after_live]
    if arrived != new or any(p <= start for p, _ in arrived):
        got.problems.append(
            f"after live (cursor {start}): {len(arrived)} notifications {arrived[:2]}..., "
            f"expected the {len(new)} new units {new[:2]}..."
        )
    for position, data in got.after_live:
        if data.get("subscription_id") != sub_id or position_of(data["cursor"]) != position:
            got.problems.append(f"after live: bad notification {data}")
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owed", type=int, default=100_000, help="notifications owed")
    parser.add_argument(
        "--rounds", type=int, default=1, help="replays of each transport, from the same cursor"
    )
    parser.add_argument("--live", type=int, default=20, help="units recorded after live")
    parser.add_argument("--clients", type=int, default=32, help="connections recording set-up")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for live")
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the server with py-spy during each replay; write the samples here",
    )
    parser.add_argument("--top", type=int, default=15, help="functions listed per profile")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    if not 1 <= args.owed <= 1_000_000 or not 1 <= args.live <= 1000 or args.rounds < 1:
        parser.error("--owed must be in [1, 1000000], --live in [1, 1000], --rounds >= 1")

    with tempfile.TemporaryDirectory(prefix="field-resume-") as tmp:
        loop, loop_name = new_loop()
        try:
            with FieldServer(Path(tmp) / "data") as server:
                result = loop.run_until_complete(scenario(server, args))
        finally:
            loop.close()

    owed = args.owed
    print(
        f"\nResume of a subscription owed {owed:,} memory.recorded notifications "
        f"(SQLite log, --sync full; set-up: {owed:,} RECORDs over {args.clients} "
        f"connections in {result['setup_s']:.1f} s, not timed; client: {loop_name})"
    )
    print(
        f"{'transport':<11}{'round':>6}{'to live s':>10}{'first ms':>10}{'notif/s':>10}"
        f"{'srv CPU':>9}{'cli CPU':>9}{'replayed':>10}{'live ok':>9}"
    )
    failed = False
    for replay in result["replays"]:
        got = replay.got
        ok = not got.problems
        failed |= not ok
        seconds = replay.seconds if got.live_at else float("nan")
        checked = f"{len(got.after_live)}/{args.live}" if replay.round == args.rounds else "-"
        print(
            f"{replay.transport:<11}{replay.round:>6}{seconds:>10.2f}{replay.first_ms:>10.0f}"
            f"{owed / seconds:>10,.0f}{replay.server_cpu / seconds:>9.0%}"
            f"{replay.client_cpu / seconds:>9.0%}{len(got.replayed):>10,}"
            f"{checked if ok else 'NO':>9}"
        )
    if args.rounds > 1 and not failed:
        for transport in ("SSE", "WebSocket"):
            mine = [r for r in result["replays"] if r.transport == transport]
            seconds = sum(r.seconds for r in mine)
            rates = sorted(owed / r.seconds for r in mine)
            print(
                f"{transport:<11}{'all':>6}{seconds:>10.2f}{'':>10}"
                f"{owed * len(mine) / seconds:>10,.0f}"
                f"{sum(r.server_cpu for r in mine) / seconds:>9.0%}"
                f"{sum(r.client_cpu for r in mine) / seconds:>9.0%}"
                f"{len(mine) * owed:>10,}   (rounds {rates[0]:,.0f} to {rates[-1]:,.0f}/s)"
            )
    for replay in result["replays"]:
        for problem in replay.got.problems:
            print(f"  {replay.transport}: {problem}")
    print(
        f"replayed: notifications before live (must be {owed:,}: exactly the owed log "
        "positions, in order);\nlive ok: the units recorded after live arrived once each, in "
        "order, cursors continuing from live's"
    )
    print(f"refused (set-up and live RECORDs, each sent again): {REFUSALS.describe()}")
    for transport, path in result["profiles"].items():
        print(f"\nserver profile during the {transport} replay ({path}):")
        print("\n".join(summarize_profile(path, args.top)))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bracketed(main)
