"""Start-up from a snapshot, and snapshots written beside a running server.

**Start-up** (:func:`load`, from ``FieldService``): the newest snapshot of the
log that passes every check becomes the state, and only the entries after its
position are folded on top; a snapshot that fails a check is passed over with a
warning saying why, for the one before it, and with none left the whole log is
replayed, as without snapshots. On top of the checks of
:mod:`field.core.snapshot` (digest, format, fingerprint), a snapshot must be of
this log's Field (the ``field.created`` entry), of a position the log has, and
the log's entry at that position must be the one it was made after (its anchor:
a log replaced by an older copy, or by another history, is told apart).

**The fingerprint** (:func:`fingerprint`) names everything besides the log that
the state is a function of: the snapshot format, the server's version, the
embedder and its width, and the bytes of the code that folds entries (every
module of ``field.core`` and ``field.subscriptions``, and ``field.contract.model``). A
snapshot is read only by the code that wrote it; after an upgrade the first
start replays the log, and the next snapshot is of the new code.

**Writing** (:func:`write_snapshot`, ``field snapshot``) is the same start-up
in another process: it loads the newest snapshot, folds the log up to its
current last position, leaves out what a snapshot need not hold, writes the
snapshot and deletes all but the newest two. The server never encodes its
own state: its event loop would stall for seconds on a large Field, and
its state moves on while it would be encoded. :class:`Snapshotter` starts
that process (a fresh interpreter, never a fork of the server's threads) when
:class:`SnapshotPolicy` says one is due, at a lower CPU priority, one at a
time, and reads back what it wrote. The state in that process is built by the
same fold as the server's, so the snapshot is the server's state as of that
position, without the server sparing it a cycle (beyond the memory the second
process takes while it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .. import __version__
from ..contract.clock import iso_timestamp
from ..contract.errors import FieldError, OperationalError
from ..contract.model import StoredEntry
from ..core.snapshot import FORMAT, Header, UnusableSnapshot, anchor_of, compact, decode, encode
from ..core.state import FieldState
from ..ranking.embedding import Embedder
from ..store.base import EventLog
from ..store.snapshot_store import KEEP, SnapshotStore, StoredSnapshot

if TYPE_CHECKING:
    from ..core.field import Field
    from .service import FieldService

logger = logging.getLogger("field.snapshots")

#: Write a snapshot once this many entries were appended since the newest one ...
DEFAULT_ENTRIES = 100_000
#: ... or once this many seconds passed since the last one (or start-up), if any were.
DEFAULT_SECONDS = 600.0
#: Seconds between the server's looks at whether a snapshot is due (a counter's read).
CHECK_SECONDS = 1.0
#: Seconds between readings of the store's listing (another node may write snapshots).
LIST_SECONDS = 60.0
#: Seconds to wait after a snapshot process failed before the next may start.
RETRY_SECONDS = 60.0
#: Seconds a snapshot process has to end after the server asked it to, at shutdown.
STOP_SECONDS = 5.0
#: Bytes of a snapshot process's diagnostics (stderr) the server keeps to log.
MAX_DIAGNOSTICS = 64 * 1024
#: The niceness a snapshot process runs at: it yields the CPU to the server.
NICENESS = 10

#: The code whose bytes are in the fingerprint: what folds entries into the state (the
#: layers below the engine).
_PROJECTION = ("contract", "core", "subscriptions", "ranking", "expressions")


# -- the fingerprint -------------------------------------------------------------------


def fingerprint(embedder: Embedder) -> str:
    """What, besides the log, the state is a function of (see the module docstring)."""
    return _fingerprint(embedder.name, embedder.dim)


@functools.cache
def _fingerprint(embedder: str, dim: int) -> str:
    digest = hashlib.sha256()
    digest.update(orjson.dumps([FORMAT, __version__, embedder, dim]))
    package = Path(__file__).resolve().parent.parent
    files: list[Path] = []
    for name in _PROJECTION:
        files.extend(sorted((package / name).glob("*.py")))
    for path in files:
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


# -- start-up ----------------------------------------------------------------------------


def load(field: Field, log: EventLog) -> StoredSnapshot | None:
    """Fold ``log`` into ``field``: from its newest usable snapshot if there is one, then
    the entries after it; returns the snapshot started from (None: the whole log)."""
    started = time.perf_counter()
    snapshot = restore(field, log)
    after = field.state.last_position
    try:
        field.replay(log.iterate(after))
    except Exception:
        if snapshot is None:
            raise
        # the entries after it do not fold on the snapshot's state: never trust it further
        logger.exception(
            "the log after the snapshot at position %d does not fold on it: replaying the "
            "whole log",
            snapshot.position,
        )
        snapshot, after = None, 0
        field.restore(FieldState(field.limits, embedder=field.embedder))
        field.replay(log.iterate())
    seconds = time.perf_counter() - started
    replayed = field.state.last_position - after
    if snapshot is not None:
        logger.info(
            "started from the snapshot at position %d (written %s, %s), then %d entries "
            "after it, in %.2f s",
            snapshot.position,
            iso_timestamp(snapshot.written_at),
            _size(snapshot.size),
            replayed,
            seconds,
        )
    elif replayed:
        logger.info("started from the whole log: %d entries in %.2f s", replayed, seconds)
    return snapshot


def restore(field: Field, log: EventLog) -> StoredSnapshot | None:
    """Make the newest usable snapshot of ``log`` ``field``'s state; warn of each one passed
    over and why. None (the state untouched) when there is none to use."""
    store = log.snapshots()
    if store is None:
        return None
    try:
        listing = store.list()
    except FieldError as error:
        logger.warning("snapshots not read (%s): replaying the whole log", error.message)
        return None
    if not listing:
        return None
    first = log.read(0, 1)
    if not first or first[0].kind != "field.created":
        logger.warning("%d snapshot(s) in %s not read: the log is empty", len(listing), store.where)
        return None
    check = functools.partial(
        _fits_log, log=log, field_id=first[0].data["field_id"], last=log.head()
    )
    expected = fingerprint(field.embedder)
    for stored in listing:
        try:
            data = store.read(stored)
            with _no_collection():
                _, state = decode(
                    data,
                    expected,
                    limits=field.limits,
                    embedder=field.embedder,
                    expect=functools.partial(check, stored=stored),
                )
        except FieldError as error:
            logger.warning(
                "the snapshot at position %d in %s is not used: %s",
                stored.position,
                store.where,
                error.message,
            )
            continue
        field.restore(state)
        return stored
    logger.warning("no snapshot in %s could be used: replaying the whole log", store.where)
    return None


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The garbage collector paused: reading a state makes millions of objects, none of
    them garbage, and collections would walk them again and again (4x the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fits_log(
    header: Header, *, log: EventLog, field_id: str, last: int, stored: StoredSnapshot
) -> None:
    """Raise UnusableSnapshot unless ``header`` is of this log, as the module docstring says."""
    if header.field_id != field_id:
        raise UnusableSnapshot(
            f"it is of the Field {header.field_id[:64]!r}, not of this log's {field_id!r}"
        )
    if header.position != stored.position:
        raise UnusableSnapshot(
            f"it says it is of position {header.position}, its store {stored.position}"
        )
    if header.position > last:
        raise UnusableSnapshot(
            f"it is of position {header.position}, past the log's end at {last} (was the "
            "log replaced by an older copy?)"
        )
    at = log.read(header.position - 1, 1)
    if not at or at[0].position != header.position or anchor_of(at[0]) != header.anchor:
        raise UnusableSnapshot(
            f"the log's entry at position {header.position} is not the one it was made "
            "after: the log holds another history"
        )


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


# -- writing -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """What :func:`write_snapshot` did (one JSON line of ``field snapshot``)."""

    #: the snapshot written, or the newest one when none was needed
    position: int
    written_at: float
    size: int
    units: int
    #: the snapshot the state was loaded from (None: the whole log) and the entries after it
    started_from: int | None
    replayed: int
    seconds: float
    #: why nothing was written (None: a snapshot was)
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "written_at": iso_timestamp(self.written_at),
            "size": self.size,
            "units": self.units,
            "started_from": self.started_from,
            "replayed": self.replayed,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
        }


def write_snapshot(log: EventLog, field: Field) -> Written:
    """Write a snapshot of ``log`` up to its last position, built in ``field`` (a new
    Field configured as the server's), and keep the newest :data:`KEEP`."""
    store = log.snapshots()
    if store is None:
        raise OperationalError("a log kept in memory has no snapshots")
    started = time.perf_counter()
    snapshot = restore(field, log)
    after = field.state.last_position
    upto = log.head()
    field.replay(_entries(log, after, upto))
    state = field.state
    if state.last_position == 0:
        raise OperationalError("the log is empty: there is nothing to take a snapshot of")
    base = None if snapshot is None else snapshot.position
    if snapshot is not None and snapshot.position == state.last_position:
        return Written(
            snapshot.position,
            snapshot.written_at,
            snapshot.size,
            len(state.units),
            base,
            0,
            time.perf_counter() - started,
            skipped="the newest snapshot is of the log's last position",
        )
    compact(state)
    header = Header(
        format=FORMAT,
        field_id=state.field_id or "",
        position=state.last_position,
        written_at=time.time(),
        fingerprint=fingerprint(field.embedder),
        anchor=anchor_of(log.read(state.last_position - 1, 1)[0]),
        units=len(state.units),
    )
    written = store.write(
        header.position, header.written_at, functools.partial(encode, state, header)
    )
    _prune(store)
    return Written(
        written.position,
        written.written_at,
        written.size,
        header.units,
        base,
        state.last_position - after,
        time.perf_counter() - started,
    )


def _entries(log: EventLog, after: int, upto: int) -> Iterator[StoredEntry]:
    """The entries after ``after`` up to ``upto`` (the log may grow meanwhile)."""
    for entry in log.iterate(after):
        if entry.position > upto:
            return
        yield entry


def _prune(store: SnapshotStore) -> None:
    try:
        store.prune(KEEP)
    except (FieldError, OSError) as error:  # the snapshot is written: pruning can wait
        logger.warning("old snapshots in %s not deleted: %s", store.where, error)


# -- the server's side -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When a snapshot is due: ``entries`` appended since the newest one, or ``seconds``
    since the last one (or start-up) if any entry was appended. 0 turns either off."""

    entries: int = DEFAULT_ENTRIES
    seconds: float = DEFAULT_SECONDS

    def due(self, *, entries_since: int, seconds_since: float) -> bool:
        if entries_since <= 0:
            return False
        if self.entries and entries_since >= self.entries:
            return True
        return bool(self.seconds) and seconds_since >= self.seconds

    @property
    def enabled(self) -> bool:
        return bool(self.entries or self.seconds)


def snapshot_command(
    *, data_dir: Path | None, log_url: str | None, embedder: str
) -> tuple[list[str], dict[str, str]]:
    """The ``field snapshot`` command line and environment for a server's log: the
    PostgreSQL URL goes in the environment (``ps`` shows command lines, and it may hold
    a password)."""
    argv = [sys.executable, "-m", "field", "snapshot", "--embedder", embedder]
    env = dict(os.environ)
    env.pop("FIELD_LOG", None)
    if log_url is not None:
        env["FIELD_LOG"] = log_url
    elif data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    return argv, env


class Snapshotter:
    """Starts ``field snapshot`` beside the server when a snapshot is due (module docstring).

    Its state: *idle* (looking every :data:`CHECK_SECONDS` whether one is due),
    *writing* (one process runs; no other starts), back to *idle* when it ends;
    after a failure none starts for :data:`RETRY_SECONDS`.
    """

    def __init__(
        self,
        service: FieldService,
        store: SnapshotStore,
        policy: SnapshotPolicy,
        command: tuple[Sequence[str], Mapping[str, str]],
        *,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        """``may_write``: whether this server is the one to write snapshots now (None:
        always; of several nodes on one log, the holder of the deliveries' lease)."""
        self._service = service
        self._store = store
        self.policy = policy
        self._argv, self._env = list(command[0]), dict(command[1])
        #: the newest snapshot the store holds, as last listed (for the status page)
        self.newest: StoredSnapshot | None = None
        #: the position of the newest snapshot known to be usable (the one start-up read,
        #: or the last one written): what the policy counts entries from. One listed but
        #: never read may be of another version of the server, and prove nothing
        self._base = 0
        #: the snapshot process running, if any
        self.process: asyncio.subprocess.Process | None = None
        #: snapshots this server had written, and processes that failed
        self.written = 0
        self.failed = 0
        self._task: asyncio.Task[None] | None = None
        #: whether this server is the one to write snapshots now: of several nodes on one
        #: log, only the holder of the deliveries' lease does (the others would duplicate it)
        self.may_write: Callable[[], bool] = may_write or (lambda: True)

    async def start(self) -> None:
        """Read what the store holds (the status shows it from the start), then look every
        :data:`CHECK_SECONDS` whether a snapshot is due."""
        started = self._service.started_from
        self.newest, self._base = started, 0 if started is None else started.position
        await self._list()
        if self.policy.enabled:
            self._task = asyncio.create_task(self._run(), name="field-snapshots")

    async def stop(self) -> None:
        """Stop looking, and end a snapshot process under way (it leaves no snapshot)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    def status(self) -> dict[str, Any] | None:
        """The status page's ``snapshot``: the newest snapshot, and the one this server
        started from; None while the log has none."""
        newest = self.newest
        if newest is None:
            return None
        started = self._service.started_from
        return {
            "position": newest.position,
            "written_at": iso_timestamp(newest.written_at),
            "size": newest.size,
            "started_from": None if started is None else started.position,
        }

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = listed = loop.time()
        retry_at = 0.0
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            now = loop.time()
            if now - listed >= LIST_SECONDS:
                await self._list()
                listed = now
            since = self._service.log.last_position() - self._base
            if now < retry_at or not self.may_write():
                continue
            if not self.policy.due(entries_since=since, seconds_since=now - last):
                continue
            if not await self._write():
                retry_at = loop.time() + RETRY_SECONDS
            last = listed = loop.time()

    async def _list(self) -> None:
        try:
            listing = await asyncio.to_thread(self._store.list)
        except (FieldError, OSError) as error:
            logger.warning("cannot list the snapshots in %s: %s", self._store.where, error)
            return
        if listing:
            self.newest = listing[0]

    async def _write(self) -> bool:
        """Run one snapshot process to its end; whether it succeeded."""
        started = time.perf_counter()
        try:
            process = self.process = await asyncio.create_subprocess_exec(
                *self._argv,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:  # no memory, no process slot left: try again later
            self.failed += 1
            logger.error(
                "cannot start a snapshot process (%s); the next try is in %d s", exc, RETRY_SECONDS
            )
            return False
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid, NICENESS)
        logger.info(
            "writing a snapshot of the log up to position %d or after (process %d)",
            self._service.log.last_position(),
            process.pid,
        )
        assert process.stdout is not None and process.stderr is not None
        out, err = await asyncio.gather(
            _bounded(process.stdout, MAX_DIAGNOSTICS), _bounded(process.stderr, MAX_DIAGNOSTICS)
        )
        status = await process.wait()
        self.process = None
        for line in err.decode(errors="replace").splitlines():
            logger.warning("field snapshot: %s", line)
        report = _report(out) if status == 0 else None
        if report is None:
            self.failed += 1
            logger.error(
                "the snapshot process %d failed (%s); the next try is in %d s",
                process.pid,
                f"exit status {status}" if status else "it printed no report",
                RETRY_SECONDS,
            )
            return False
        self._base = report["position"]
        if report.get("skipped") is None:
            self.written += 1
            logger.info(
                "snapshot written at position %d (%s, %d units; started from %s, %d entries "
                "folded) in %.1f s",
                report["position"],
                _size(report["size"]),
                report["units"],
                "the whole log" if report["started_from"] is None else report["started_from"],
                report["replayed"],
                time.perf_counter() - started,
            )
        await self._list()
        return True


async def _bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Read ``stream`` to its end, keeping its first ``limit`` bytes."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


def _report(out: bytes) -> dict[str, Any] | None:
    """The JSON line a snapshot process printed last, or None."""
    for line in reversed(out.splitlines()):
        with contextlib.suppress(orjson.JSONDecodeError):
            report = orjson.loads(line)
            if isinstance(report, dict) and isinstance(report.get("position"), int):
                return report
    return None
