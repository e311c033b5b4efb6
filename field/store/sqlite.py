"""The durable event log: one SQLite file in WAL mode.

Layout: a single table ``log`` whose ``position`` is the INTEGER PRIMARY
KEY; ``data`` holds the orjson encoding of each entry's data. The file's
``PRAGMA user_version`` is the schema version (:data:`SCHEMA_VERSION`).

Concurrency: one process owns the file (an exclusive ``flock`` on the
sibling ``<path>.lock`` enforces it) and that process has a single
writer. Appends go through one write connection under a lock, each batch
in one ``BEGIN IMMEDIATE`` transaction; reads go through a second
connection under its own lock, and WAL lets them run while a write is in
progress without ever seeing part of a batch. A log opened ``readonly``
(``field snapshot`` beside a running server) takes no lock and only reads.

Snapshots of the state are files in ``snapshots`` beside the log's file
(:class:`~field.store.snapshot_store.FileSnapshots`): never in the log's file,
whose write lock a large snapshot would hold for seconds.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import IO

import orjson

from field.contract.errors import LogUnavailable, LogWriteError, OperationalError, StorageFull
from field.store.base import EventLog, LogEntry, StoredEntry
from field.store.memory import encode_batch, within
from field.store.snapshot_store import DIRECTORY, FileSnapshots

#: The schema version stored in ``PRAGMA user_version``.
SCHEMA_VERSION = 1

#: How long a connection waits for a lock held by another connection (ms). One process
#: owns the file, so only an outside process (a backup tool, a shell) can hold it: the
#: wait is short, and a write that finds the log locked is refused as LOG_UNAVAILABLE
#: while reads go on and the Field retries in the background.
BUSY_TIMEOUT_MS = 250

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
_SQLITE_FULL = 13

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS log (
    position INTEGER PRIMARY KEY,
    epoch    INTEGER NOT NULL,
    kind     TEXT    NOT NULL,
    agent_id TEXT,
    ts       REAL    NOT NULL,
    data     BLOB    NOT NULL
)
"""
_INSERT = "INSERT INTO log (position, epoch, kind, agent_id, ts, data) VALUES (?, ?, ?, ?, ?, ?)"
_SELECT = (
    "SELECT position, epoch, kind, agent_id, ts, data FROM log"
    " WHERE position > ? ORDER BY position LIMIT ?"
)
_SELECT_AT = (
    "SELECT position, epoch, kind, agent_id, ts, data FROM log"
    " WHERE position IN ({}) ORDER BY position"
)
_SIZES_AT = "SELECT position, length(data) FROM log WHERE position IN ({}) ORDER BY position"
#: positions asked for in one query (below SQLite's bound on parameters)
_POSITIONS_PER_QUERY = 500
_MAX_POSITION = "SELECT COALESCE(MAX(position), 0) FROM log"


def _is_disk_full(exc: sqlite3.Error) -> bool:
    """True when SQLite reports that the disk or the database is full."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_FULL:
        return True
    return "is full" in str(exc).lower()


#: Free bytes under which an I/O error on append is taken for a full disk (SQLite reports
#: some ENOSPC failures, in the WAL or at fsync, as SQLITE_IOERR rather than SQLITE_FULL).
LOW_SPACE_BYTES = 1 << 20


def _low_space(path: str) -> bool:
    try:
        stats = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < LOW_SPACE_BYTES


def _write_error(exc: sqlite3.Error, path: str) -> OperationalError:
    """The Field error for a failed append: the disk is full, or the log is unavailable."""
    if _is_disk_full(exc) or _low_space(path):
        return StorageFull(f"The event log's disk or database is full ({exc}); writes are refused")
    return LogUnavailable(f"The event log cannot be written now ({exc}); writes are refused")


def _acquire_lock(lock_path: str) -> IO[bytes]:
    """Open ``lock_path`` and hold an exclusive flock on it, or fail fast."""
    try:
        handle = open(lock_path, "ab")  # noqa: SIM115 - held for the log's lifetime
    except OSError as exc:
        raise OperationalError(f"Cannot open the lock file {lock_path}: {exc}") from exc
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise OperationalError(
            f"The data directory is in use by another field process (lock {lock_path} is held).",
            suggested_action="Stop the other field process or choose another data directory.",
        ) from exc
    except OSError as exc:
        handle.close()
        raise OperationalError(f"Cannot lock {lock_path}: {exc}") from exc
    return handle


def _connect(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit)."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _init_schema(conn: sqlite3.Connection, path: str) -> None:
    """Create the table in a new file, or check the schema version of an old one."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise OperationalError(
                f"{path} has event log schema version {version}; this server reads "
                f"version {SCHEMA_VERSION}. Use a matching field version or another "
                "data directory."
            )
        if version == 0:
            conn.execute(_CREATE_TABLE)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class SQLiteEventLog(EventLog):
    """A durable :class:`EventLog` stored in one SQLite file (see the module docstring)."""

    persistent = True
    backend = "sqlite"

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str = "full", readonly: bool = False
    ) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.path = os.fspath(path)
        self.synchronous = synchronous
        #: only reads, beside the process that owns the file (which may be appending)
        self.readonly = readonly
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False
        self._last = 0
        self._lock_file = None if readonly else _acquire_lock(self.path + ".lock")
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        try:
            if readonly:
                self._open_reader()
            else:
                self._open_connections()
        except BaseException:
            self.close()
            raise

    def _open_reader(self) -> None:
        """Open the read connection alone, on a log some other process made."""
        if not os.path.isfile(self.path):
            raise OperationalError(f"There is no event log at {self.path}.")
        try:
            self._reader = _connect(self.path)
            self._reader.execute("PRAGMA query_only = ON")
            version = self._reader.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise OperationalError(f"Cannot open the event log {self.path}: {exc}") from exc
        if version != SCHEMA_VERSION:
            raise OperationalError(
                f"{self.path} has event log schema version {version}; this server reads "
                f"version {SCHEMA_VERSION}."
            )

    def _open_connections(self) -> None:
        """Open both connections, set the PRAGMAs and load the last position."""
        try:
            self._writer = _connect(self.path)
            self._writer.execute("PRAGMA journal_mode = WAL")
            self._writer.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.synchronous]}")
            _init_schema(self._writer, self.path)
            self._last = self._writer.execute(_MAX_POSITION).fetchone()[0]
            self._reader = _connect(self.path)
            self._reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise OperationalError(f"Cannot open the event log {self.path}: {exc}") from exc

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        """Store ``entries`` in one transaction; return their positions."""
        if not entries:
            return []
        blobs = encode_batch(entries)
        with self._write_lock:
            conn = self._writer
            if conn is None:
                state = "open for reading only" if self.readonly else "closed"
                raise LogWriteError(f"The event log is {state}.", recoverable=False)
            first = self._last + 1
            rows = [
                (first + i, e.epoch, e.kind, e.agent_id, float(e.ts), blob)
                for i, (e, blob) in enumerate(zip(entries, blobs, strict=True))
            ]
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT, rows)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._recover(conn)
                raise _write_error(exc, self.path) from exc
            self._last = first + len(rows) - 1
        return list(range(first, first + len(rows)))

    def _recover(self, conn: sqlite3.Connection) -> None:
        """After a failed append: roll back and re-read the last position."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._last = conn.execute(_MAX_POSITION).fetchone()[0]
        except sqlite3.Error:
            # The database is unusable right now; the next append will fail
            # (and retry this) rather than reuse a stored position.
            pass

    def read(self, after: int = 0, limit: int = 1000) -> list[StoredEntry]:
        """Entries with ``position > after``, ascending, at most ``limit``."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        with self._read_lock:
            conn = self._reader
            if conn is None:
                raise OperationalError("The event log is closed.")
            try:
                rows = conn.execute(_SELECT, (after, limit)).fetchall()
            except sqlite3.Error as exc:
                raise OperationalError(f"Cannot read the event log: {exc}") from exc
        return [
            StoredEntry(position, epoch, kind, orjson.loads(data), agent_id, ts)
            for position, epoch, kind, agent_id, ts, data in rows
        ]

    def read_positions(
        self, positions: Iterable[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """The entries at ``positions`` (ascending, each once; absent ones left out).

        With ``max_bytes``, the prefix whose stored data fits (at least one
        entry): the sizes are read first (SQLite keeps each value's length in
        its record header), so data past the budget is never fetched.
        """
        wanted = sorted(set(positions))
        rows: list[tuple[int, int, str, str | None, float, bytes]] = []
        with self._read_lock:
            conn = self._reader
            if conn is None:
                raise OperationalError("The event log is closed.")
            try:
                if max_bytes is not None:
                    wanted = self._fitting(conn, wanted, max_bytes)
                for start in range(0, len(wanted), _POSITIONS_PER_QUERY):
                    chunk = wanted[start : start + _POSITIONS_PER_QUERY]
                    query = _SELECT_AT.format(", ".join("?" * len(chunk)))
                    rows.extend(conn.execute(query, chunk).fetchall())
            except sqlite3.Error as exc:
                raise OperationalError(f"Cannot read the event log: {exc}") from exc
        return [
            StoredEntry(position, epoch, kind, orjson.loads(data), agent_id, ts)
            for position, epoch, kind, agent_id, ts, data in rows
        ]

    @staticmethod
    def _fitting(conn: sqlite3.Connection, wanted: list[int], max_bytes: int) -> list[int]:
        """The stored ones of ``wanted``, up to the first that passes ``max_bytes`` in all."""
        sized: list[tuple[int, int]] = []
        for start in range(0, len(wanted), _POSITIONS_PER_QUERY):
            chunk = wanted[start : start + _POSITIONS_PER_QUERY]
            query = _SIZES_AT.format(", ".join("?" * len(chunk)))
            sized.extend(conn.execute(query, chunk).fetchall())
        return [p for p, _ in sized[: within(max_bytes, [size for _, size in sized])]]

    def last_position(self) -> int:
        """The position of the newest entry, or 0 for an empty log."""
        # No lock: an int read is atomic, and _last only moves after a COMMIT,
        # so this never waits for an append's fsync.
        if self._closed:
            raise OperationalError("The event log is closed.")
        if self.readonly:  # another process appends: ask the file
            with self._read_lock:
                conn = self._reader
                if conn is None:
                    raise OperationalError("The event log is closed.")
                try:
                    return int(conn.execute(_MAX_POSITION).fetchone()[0])
                except sqlite3.Error as exc:
                    raise OperationalError(f"Cannot read the event log: {exc}") from exc
        return self._last

    def snapshots(self) -> FileSnapshots:
        """Snapshot files in the ``snapshots`` directory beside the log's file."""
        return FileSnapshots(os.path.join(os.path.dirname(self.path) or ".", DIRECTORY))

    def close(self) -> None:
        """Close both connections and release the directory lock; idempotent."""
        with self._write_lock, self._read_lock:
            if self._closed:
                return
            self._closed = True
            for conn in (self._reader, self._writer):
                if conn is not None:
                    conn.close()
            self._reader = self._writer = None
            if self._lock_file is not None:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
                self._lock_file.close()

    def __repr__(self) -> str:
        return f"SQLiteEventLog({self.path!r}, synchronous={self.synchronous!r})"
