"""Shared fixtures: real servers on loopback ports, real clients.

``field_server`` runs the real ASGI app on uvicorn in a background thread
(its own event loop) on a free loopback port; the tests talk to it over
TCP with aiohttp. ``spawn_server`` starts ``python -m field serve`` as a
separate process for the tests that kill or restart it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import hypothesis
import pytest

from field.cli.main import uvicorn_config
from field.client import FieldClient
from field.engine.admission import AdmissionPolicy
from field.ranking.embedding import Embedder
from field.server.app import create_app
from field.server.config import Config
from field.server.serving import FieldServer

_LISTENING = re.compile(r"listening on (http://\S+?):? ")

# Every property test runs the same cases on every machine, and takes what time it needs:
# a machine busy with other work makes a test slower, never red. A test's own @settings
# changes only what it names.
hypothesis.settings.register_profile(
    "field",
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("field")

#: Admission control off in the tests' servers (0: never refuse): a machine busy with other
#: work is not the overload they are about. The tests of admission set their own targets.
UNLOADED = {"overload_write_target": 0, "overload_read_target": 0, "overload_write_budget": 0}
#: The same for the services the tests build themselves (a FieldService without a server).
UNLOADED_POLICY = AdmissionPolicy(write_target=0, read_target=0, write_budget=0)


def _ready_signal(app: Any, ready: threading.Event) -> Any:
    """Wrap an ASGI app so ``ready`` is set once its lifespan start-up completes."""

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_and_signal(message: Any) -> None:
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                ready.set()

        await app(scope, receive, send_and_signal)

    return wrapper


class ThreadedServer:
    """The real app on uvicorn, on a loopback port, in a background thread. The socket is
    on 127.0.0.1 whatever ``config.host`` says: a test may give the app another address
    to take itself to be bound to (``0.0.0.0``: one whose ``Host`` is not checked)."""

    def __init__(
        self, config: Config, *, ws: str | None = None, embedder: Embedder | None = None
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.config = replace(config, port=self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        #: the Starlette app (its ``state`` holds the push hub once started)
        self.app = create_app(self.config, embedder=embedder)
        app = _ready_signal(self.app, self._ready)
        settings = uvicorn_config(
            app,
            self.config,
            guard=self.app.state.guard,
            responses=self.app.state.responses,
        )
        if ws is not None:  # another of uvicorn's WebSocket protocols than field serve's
            settings.ws = ws
        #: field serve's server: a stop is noticed at once and ends the push streams first
        self.server = FieldServer(settings, self.app)
        self.thread = threading.Thread(target=self._run, name="field-server", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> ThreadedServer:
        self.thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("the server did not start")
        return self

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def server_factory() -> Iterator[Callable[..., ThreadedServer]]:
    """Start servers with a given config; all are stopped after the test."""
    started: list[ThreadedServer] = []

    def start(
        *, ws: str | None = None, embedder: Embedder | None = None, **overrides: Any
    ) -> ThreadedServer:
        values: dict[str, Any] = {
            "data_dir": None,
            "log_level": "warning",
            **UNLOADED,
            **overrides,
        }
        config = Config(**values)
        server = ThreadedServer(config, ws=ws, embedder=embedder).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def field_server(
    server_factory: Callable[..., ThreadedServer], request: pytest.FixtureRequest
) -> ThreadedServer:
    """A Field with an in-memory log (parametrize indirectly with a uvicorn ``ws`` protocol name
    to serve WebSockets with it instead of ``field serve``'s)."""
    return server_factory(ws=getattr(request, "param", None))


@pytest.fixture
def sqlite_server(server_factory: Callable[..., ThreadedServer], tmp_path: Path) -> ThreadedServer:
    """A Field with a SQLite log in a temporary directory."""
    return server_factory(data_dir=tmp_path / "data", sync="normal")


@pytest.fixture
async def client(field_server: ThreadedServer) -> AsyncIterator[FieldClient]:
    async with FieldClient(field_server.url) as field_client:
        yield field_client


@dataclass
class ServerProcess:
    """``field serve`` running as a child process."""

    process: subprocess.Popen[str]
    url: str
    lines: list[str]
    drain: threading.Thread

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` and wait for the exit status; the log is then complete."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        status = self.process.wait(timeout=timeout)
        self.drain.join(timeout=timeout)
        return status


def _drain(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line.rstrip("\n"))
    process.stderr.close()


def spawn_server(
    data_dir: Path,
    *args: str,
    port: int = 0,
    preexec_fn: Callable[[], None] | None = None,
) -> ServerProcess:
    """Start ``python -m field serve`` and wait for its "listening on" line."""
    command = [
        sys.executable,
        "-m",
        "field",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *args,
    ]
    # the flags a test gives win over these
    unloaded = {f"FIELD_{name.upper()}": "0" for name in UNLOADED}
    env = {**unloaded, **os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        preexec_fn=preexec_fn,  # e.g. a resource limit set before exec
    )
    assert process.stderr is not None
    lines: list[str] = []
    for line in process.stderr:
        lines.append(line.rstrip("\n"))
        match = _LISTENING.search(line)
        if match:
            # Keep draining stderr so the child never blocks on a full pipe.
            drain = threading.Thread(target=_drain, args=(process, lines), daemon=True)
            drain.start()
            return ServerProcess(process, match.group(1), lines, drain)
    process.wait(timeout=30)
    raise RuntimeError("field serve exited before listening:\n" + "\n".join(lines))


@pytest.fixture
def server_process() -> Iterator[Callable[..., ServerProcess]]:
    """Start ``field serve`` processes; any still running are killed after the test."""
    processes: list[ServerProcess] = []

    def start(
        data_dir: Path,
        *args: str,
        port: int = 0,
        preexec_fn: Callable[[], None] | None = None,
    ) -> ServerProcess:
        proc = spawn_server(data_dir, *args, port=port, preexec_fn=preexec_fn)
        processes.append(proc)
        return proc

    yield start
    for proc in processes:
        if proc.process.poll() is None:
            proc.stop(signal.SIGKILL)


@pytest.fixture
async def raws() -> AsyncIterator[list[Any]]:
    """Raw connections a test opens (append them; each has ``close()``); closed after it."""
    opened: list[Any] = []
    yield opened
    for raw in opened:
        raw.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp session for a test's own HTTP requests, closed after it."""
    async with aiohttp.ClientSession() as session:
        yield session
