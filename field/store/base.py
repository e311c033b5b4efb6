"""The event log: the Field's source of truth.

An :class:`EventLog` is an append-only sequence of :class:`StoredEntry`
records with integer positions 1, 2, 3, ... (no gaps, never reused). The
position orders everything: the Field's state is the fold of the log from
position 1, and a cursor into any push stream is a position.

Invariants every backend keeps:

* ``append`` is atomic and durable: when it returns, every entry it was
  given is stored (and survives a crash of the process, within the
  backend's durability promise); when it raises, none is.
* Positions are assigned in ``append`` order, contiguously, starting at
  ``last_position() + 1``.
* ``read(after, limit)`` returns entries with ``position > after`` in
  ascending order, at most ``limit`` of them.
* ``read_positions(positions)`` returns the entries at those positions,
  ascending, each once; positions not in the log are left out. With
  ``max_bytes`` it returns the longest prefix of them whose stored data fits
  (at least one entry).
* The log is never rewritten: there is no update and no delete.

**A shared log** (``shared``: PostgreSQL) is appended to by several
processes, the nodes of one Field. Each node's projection must include
every earlier entry before it validates a write, so a node appends only
under the log's lock: :meth:`EventLog.lock` waits for the lock and returns
the entries the other nodes appended since the node's own position; the
next :meth:`EventLog.append` stores the batch right after them and
releases the lock, and :meth:`EventLog.unlock` releases it when the
batch wrote nothing. Logs that only this process appends to keep the
default no-op lock.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from field.contract.model import LogEntry, StoredEntry

if TYPE_CHECKING:
    from field.store.snapshot_store import SnapshotStore

__all__ = ["EventLog", "LogEntry", "StoredEntry"]


class EventLog(abc.ABC):
    """Append-only log with integer positions (see the module docstring)."""

    #: True when entries survive a restart of the process.
    persistent: bool = False
    #: A short name for status reports ("sqlite", "memory").
    backend: str = "abstract"
    #: True when other processes append to this log too (several nodes, one Field).
    shared: bool = False

    @abc.abstractmethod
    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        """Store ``entries`` atomically and durably; return their positions."""

    @abc.abstractmethod
    def read(self, after: int = 0, limit: int = 1000) -> list[StoredEntry]:
        """Entries with ``position > after``, ascending, at most ``limit``."""

    def read_positions(
        self, positions: Iterable[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """The entries at ``positions`` (ascending, each once; absent ones left out).

        With ``max_bytes``, a prefix of them: the read stops before the first
        entry whose stored data would take the total past ``max_bytes`` (the
        first entry is always read), so a caller can bound what it decodes.
        Backends override this with one query; this fallback reads each
        position on its own.
        """
        found: list[StoredEntry] = []
        size = 0
        for position in sorted(set(positions)):
            if position < 1:
                continue
            for entry in self.read(position - 1, 1):
                if entry.position != position:
                    continue
                if max_bytes is not None:
                    size += len(orjson.dumps(entry.data))
                    if found and size > max_bytes:
                        return found
                found.append(entry)
        return found

    @abc.abstractmethod
    def last_position(self) -> int:
        """The position of the newest entry, or 0 for an empty log."""

    def head(self) -> int:
        """The newest position in the log now, other appenders' entries included."""
        return self.last_position()

    def check_readable(self, after: int) -> None:
        """Raise :class:`~field.contract.errors.LogUnavailable` unless the head and the entry after
        ``after`` can be read now (a shared log: without holding up the other reads)."""
        self.head()
        self.read(after, 1)

    def lock(self, after: int) -> list[StoredEntry]:
        """Take the log's append lock; return the entries after ``after`` (ascending).

        Until the next :meth:`append` or :meth:`unlock`, no other process
        appends, so a batch validated against a projection at the last of
        these entries is appended right after them. A log only this process
        appends to has nothing to lock and returns what it holds after ``after``.
        """
        return list(self.iterate(after)) if after < self.last_position() else []

    def unlock(self) -> None:  # noqa: B027 - optional hook
        """Release the append lock :meth:`lock` took, appending nothing."""

    async def follow(self) -> AsyncIterator[int]:
        """The log's head each time another process may have moved it (shared logs);
        a log only this process appends to has nothing to follow."""
        return
        yield

    def iterate(self, after: int = 0, page: int = 1000) -> Iterator[StoredEntry]:
        """Every entry after ``after``, read page by page."""
        while True:
            batch = self.read(after, page)
            if not batch:
                return
            yield from batch
            after = batch[-1].position

    def snapshots(self) -> SnapshotStore | None:
        """Where snapshots of the state built from this log are kept; None: nowhere (a log
        that does not outlive its process needs none)."""
        return None

    def location(self) -> dict[str, Any] | None:
        """Where a networked log lives (host, port, name; never a credential); None here."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources; the log is unusable afterwards."""
