"""Where snapshots of the state are kept: files beside a SQLite log, rows in PostgreSQL.

A :class:`SnapshotStore` holds the snapshots of one log (their bytes are
made and checked by :mod:`field.core.snapshot`; this module only keeps
them). It lists them, newest log position first, reads one whole, writes
one atomically from the pieces it is given, and deletes all but the
newest :data:`KEEP`. A store never vouches for what it holds: the reader
checks every snapshot before it uses it.

* :class:`FileSnapshots`: one file per snapshot in ``<data dir>/snapshots``,
  named by position and time. A snapshot is written to a temporary file
  (its name holds the writer's process id), flushed to disk, renamed into
  place and the directory flushed: a reader sees a whole snapshot or none,
  whatever happens to the writer. Temporary files of writers that are gone
  are deleted by the next prune. Files are readable by their owner only
  (the state holds webhook secrets sealed, as the log does).
* ``PostgresSnapshots``: rows of chunks in the log's database (see
  :meth:`field.store.postgres.PostgresEventLog.snapshot_write`), so that a
  node starting on another machine finds them. Each operation has a
  connection of its own with the log's bounds (``lock_timeout`` 2 s,
  ``statement_timeout`` 30 s): a snapshots' table locked elsewhere fails it
  within 2 s (``LOG_UNAVAILABLE``; the next snapshot tries again), and
  holds up no request.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from field.contract.errors import OperationalError

if TYPE_CHECKING:
    from field.store.postgres import PostgresEventLog

#: Snapshots kept: the newest, and the one before it should the newest prove unusable.
KEEP = 2
#: Name of the directory of snapshot files, inside a SQLite log's directory.
DIRECTORY = "snapshots"

_NAME = re.compile(r"^snapshot-(\d{20})-(\d{16})\.fsnap$")
_TEMPORARY = re.compile(r"^\.snapshot-(\d+)-[0-9a-f]{8}\.tmp$")


#: What writes a snapshot: called with a sink, it hands it the snapshot's bytes in order.
Produce = Callable[[Callable[[bytes], object]], object]


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One snapshot a store holds, as its listing says (unchecked)."""

    #: the store's name for it (a file name, a row id)
    key: str
    position: int
    #: seconds since the epoch
    written_at: float
    #: bytes
    size: int


class SnapshotStore(abc.ABC):
    """The snapshots of one log (see the module docstring)."""

    #: where the snapshots are, for messages ("<dir>/snapshots", "the database")
    where: str = ""

    @abc.abstractmethod
    def list(self) -> list[StoredSnapshot]:
        """Every snapshot held, newest position first (then newest written)."""

    @abc.abstractmethod
    def read(self, snapshot: StoredSnapshot) -> bytes | bytearray:
        """The whole of ``snapshot``; raises OperationalError if it is gone or unreadable."""

    @abc.abstractmethod
    def write(self, position: int, written_at: float, produce: Produce) -> StoredSnapshot:
        """Store the snapshot whose bytes ``produce`` hands, in order, to the sink it is
        called with; atomically: all of it once ``produce`` returns, nothing if it raises."""

    @abc.abstractmethod
    def prune(self, keep: int = KEEP) -> int:
        """Delete all but the newest ``keep`` snapshots; returns how many were deleted."""


class FileSnapshots(SnapshotStore):
    """Snapshots as files in one directory (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.where = str(self.directory)

    def list(self) -> list[StoredSnapshot]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OperationalError(f"cannot list the snapshots in {self.where}: {exc}") from None
        found = []
        for name in names:
            match = _NAME.match(name)
            if match is None:
                continue
            try:
                size = (self.directory / name).stat().st_size
            except OSError:  # pruned meanwhile, or unreadable: not a snapshot to offer
                continue
            position, micros = int(match.group(1)), int(match.group(2))
            found.append(StoredSnapshot(name, position, micros / 1e6, size))
        found.sort(key=lambda s: (s.position, s.written_at), reverse=True)
        return found

    def read(self, snapshot: StoredSnapshot) -> bytes:
        try:
            return (self.directory / snapshot.key).read_bytes()
        except OSError as exc:
            raise OperationalError(f"cannot read the snapshot {snapshot.key}: {exc}") from None

    def write(self, position: int, written_at: float, produce: Produce) -> StoredSnapshot:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"snapshot-{position:020d}-{round(written_at * 1e6):016d}.fsnap"
        temporary = self.directory / f".snapshot-{os.getpid()}-{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as out:
                produce(out.write)
                out.flush()
                os.fsync(out.fileno())
                size = out.tell()
            os.replace(temporary, self.directory / name)
            _sync_directory(self.directory)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return StoredSnapshot(name, position, written_at, size)

    def prune(self, keep: int = KEEP) -> int:
        deleted = 0
        for snapshot in self.list()[keep:]:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / snapshot.key).unlink()
                deleted += 1
        for name in os.listdir(self.directory) if self.directory.is_dir() else ():
            match = _TEMPORARY.match(name)
            if match is not None and not _alive(int(match.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / name).unlink()
        return deleted


def _sync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (a temporary file's writer may still be writing)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: leave its file alone
        return True
    return True


class PostgresSnapshots(SnapshotStore):
    """Snapshots in the log's PostgreSQL database (the log's ``snapshot_*`` methods)."""

    def __init__(self, log: PostgresEventLog) -> None:
        self._log = log
        self.where = f"the database {log.where}"

    def list(self) -> list[StoredSnapshot]:
        return [StoredSnapshot(str(i), p, w, s) for i, p, w, s in self._log.snapshot_list()]

    def read(self, snapshot: StoredSnapshot) -> bytearray:
        return self._log.snapshot_read(int(snapshot.key))

    def write(self, position: int, written_at: float, produce: Produce) -> StoredSnapshot:
        key, size = self._log.snapshot_write(position, written_at, produce)
        return StoredSnapshot(str(key), position, written_at, size)

    def prune(self, keep: int = KEEP) -> int:
        return self._log.snapshot_prune(keep)
