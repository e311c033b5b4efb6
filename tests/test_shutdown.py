"""What every push client is told when the server stops.

A WebSocket is closed with 1001 and the reason ``server shutting down``, after
the frames already queued for it, every time: uvicorn's own WebSocket protocol
closes with 1012 (no reason) as soon as the server's shutdown reaches it, and
that used to win whenever it ran before the application's sender (about once in
twenty stops). The rounds below stop a server with a connected WebSocket again
and again, both the way ``field serve`` stops (its server class, told of a
SIGTERM) and the way plain uvicorn does (its shutdown reaches the protocol first,
which is that race lost every time), and every round must close with 1001.

An SSE stream ends with a ``shutdown`` event holding its cursor, from which a
client resumes on the restarted server without a gap.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvicorn

from field.cli.main import _Server, uvicorn_config
from field.client import AgentClient, FieldClient
from field.engine.router import SHUTDOWN
from field.server.config import Config
from field.transports import wsprotocol
from field.transports.wsprotocol import SHUTDOWN_CLOSE, SHUTDOWN_EXTENSION

from .conftest import ServerProcess, ThreadedServer
from .test_push import TIMEOUT, open_ws, record, sse_stream, subscribe

#: Stops of a server with a connected WebSocket, per way of stopping.
ROUNDS = 40
SpawnServer = Callable[..., ServerProcess]


class FieldServeThread(ThreadedServer):
    """The app on ``field serve``'s server class, stopped as a SIGTERM stops it."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.server = _Server(self.server.config, self.app)

    def stop(self) -> None:
        self.server.handle_exit(signal.SIGTERM, None)  # what the signal handler runs
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[list[ThreadedServer]]:
    started: list[ThreadedServer] = []
    yield started
    for server in started:
        if server.thread.is_alive():
            server.stop()


def start(kind: str, servers: list[ThreadedServer], **settings: Any) -> ThreadedServer:
    config = Config(**{"data_dir": None, "log_level": "warning", **settings})
    server = (FieldServeThread if kind == "field serve" else ThreadedServer)(config).start()
    servers.append(server)
    return server


async def ready_subscriber(
    field: FieldClient,
) -> tuple[AgentClient, AgentClient, dict[str, Any]]:
    writer = await field.register("writer", "analyst", interests=["pricing"])
    reader = await field.register("reader", "analyst", interests=["pricing"])
    return writer, reader, await subscribe(reader, ["memory.recorded"])


@pytest.mark.parametrize("kind", ["field serve", "uvicorn"])
async def test_every_websocket_closes_with_1001_whenever_the_server_stops(
    kind: str, servers: list[ThreadedServer]
) -> None:
    closes: list[tuple[int, str | None]] = []
    for _ in range(ROUNDS):
        server = start(kind, servers)
        async with FieldClient(server.url) as field:
            writer, reader, _ = await ready_subscriber(field)
            async with open_ws(server.url, reader.token) as ws:
                await ws.ready()
                # queued for the socket before the stop: it goes out before the close
                unit = await record(writer, "pricing: the last finding before the stop")
                stopping = asyncio.create_task(asyncio.to_thread(server.stop))
                frames, code = await ws.until_closed(timeout=TIMEOUT)
                closes.append((code, ws.connection.close_reason))
                await stopping
        assert [f["data"]["memory_unit_id"] for f in frames] == [unit["memory_unit_id"]]
    assert closes == [SHUTDOWN_CLOSE] * ROUNDS, {c: closes.count(c) for c in set(closes)}


async def test_an_sse_stream_ends_with_its_cursor_and_resumes_after_a_restart(
    servers: list[ThreadedServer], tmp_path: Path
) -> None:
    data = {"data_dir": tmp_path / "data", "sync": "normal"}
    first = start("field serve", servers, **data)
    async with FieldClient(first.url) as field, aiohttp.ClientSession() as http:
        writer, reader, stream = await ready_subscriber(field)
        async with sse_stream(http, stream["sse_url"], reader.token) as sse:
            await sse.ready()
            for n in range(2):
                await record(writer, f"pricing: finding {n}")
            sent = await sse.notifications(2)
            stopping = asyncio.create_task(asyncio.to_thread(first.stop))
            last = await sse.next()
            assert await sse.next() is None  # then the stream ends
            await stopping
    assert last is not None and last.event == "shutdown" and last.id is None
    assert last.data == {
        "subscription_id": stream["subscription_id"],
        "reason": "server shutting down",
        "cursor": sent[-1].id,
    }
    second = start("field serve", servers, **data)
    async with FieldClient(second.url) as field, aiohttp.ClientSession() as http:
        writer = AgentClient(field, writer.id, writer.token, role=writer.role)
        missed = await record(writer, "pricing: recorded while the reader was away")
        url = f"{second.url}/v1/subscriptions/{stream['subscription_id']}/events"
        async with sse_stream(http, url, reader.token, last_event_id=last.data["cursor"]) as sse:
            events = await sse.ready()
    assert events[0].event == "resume" and events[0].data["recovered"] is True
    replayed = [e.data["memory_unit_id"] for e in events if e.id is not None]
    assert replayed == [missed["memory_unit_id"]]  # exactly what was missed


async def test_field_serve_tells_both_kinds_of_stream_on_sigterm(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "data")
    async with FieldClient(proc.url) as field, aiohttp.ClientSession() as http:
        _, reader, stream = await ready_subscriber(field)
        async with (
            open_ws(proc.url, reader.token) as ws,
            sse_stream(http, stream["sse_url"], reader.token) as sse,
        ):
            await ws.ready()
            await sse.ready()
            proc.process.send_signal(signal.SIGTERM)
            _, code = await ws.until_closed(timeout=TIMEOUT)
            last = await sse.next()
    assert (code, ws.connection.close_reason) == SHUTDOWN_CLOSE
    assert last is not None and last.event == "shutdown"
    assert last.data["cursor"] == stream["cursor"]
    assert proc.stop(signal.SIGTERM) == 0
    assert not [line for line in proc.lines if "ERROR" in line or "Traceback" in line]


async def test_an_application_that_does_not_close_is_closed_with_1001(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The protocol waits ``SHUTDOWN_SECONDS`` for the application, then closes itself."""
    monkeypatch.setattr(wsprotocol, "SHUTDOWN_SECONDS", 0.2)
    told: list[str] = []

    async def deaf(scope: Any, receive: Any, send: Any) -> None:
        assert SHUTDOWN_EXTENSION in scope["extensions"]
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            told.append(message["type"])
            if message["type"] == "websocket.disconnect":
                return  # told of the shutdown, it never closed: the protocol did

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = uvicorn_config(deaf, Config(data_dir=None, log_level="warning"))
    settings.lifespan = "off"
    server = uvicorn.Server(settings)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        async with open_ws(url, None) as ws:
            server.should_exit = True
            _, code = await ws.until_closed(timeout=TIMEOUT)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 30)
        sock.close()
    assert (code, ws.connection.close_reason) == SHUTDOWN_CLOSE
    assert told == [SHUTDOWN_EXTENSION, "websocket.disconnect"]


def test_the_hub_and_the_protocol_close_alike() -> None:
    assert SHUTDOWN == SHUTDOWN_CLOSE == (1001, "server shutting down")
