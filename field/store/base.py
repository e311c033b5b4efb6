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
  ascending, each once; positions not in the log are left out.
* The log is never rewritten: there is no update and no delete.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One state change, before it has a position."""

    epoch: int
    kind: str
    data: dict[str, Any]
    agent_id: str | None = None
    ts: float = 0.0


@dataclass(slots=True)
class StoredEntry:
    """One state change as stored in the log (never changed once read: not frozen only
    because a frozen dataclass costs 0.5 us more to build, and replays build millions)."""

    position: int
    epoch: int
    kind: str
    data: dict[str, Any]
    agent_id: str | None
    ts: float


class EventLog(abc.ABC):
    """Append-only log with integer positions (see the module docstring)."""

    #: True when entries survive a restart of the process.
    persistent: bool = False
    #: A short name for status reports ("sqlite", "memory").
    backend: str = "abstract"

    @abc.abstractmethod
    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        """Store ``entries`` atomically and durably; return their positions."""

    @abc.abstractmethod
    def read(self, after: int = 0, limit: int = 1000) -> list[StoredEntry]:
        """Entries with ``position > after``, ascending, at most ``limit``."""

    def read_positions(self, positions: Iterable[int]) -> list[StoredEntry]:
        """The entries at ``positions`` (ascending, each once; absent ones left out).

        Backends override this with one query; this fallback reads each
        position on its own.
        """
        found: list[StoredEntry] = []
        for position in sorted(set(positions)):
            if position >= 1:
                found.extend(e for e in self.read(position - 1, 1) if e.position == position)
        return found

    @abc.abstractmethod
    def last_position(self) -> int:
        """The position of the newest entry, or 0 for an empty log."""

    def iterate(self, after: int = 0, page: int = 1000) -> Iterator[StoredEntry]:
        """Every entry after ``after``, read page by page."""
        while True:
            batch = self.read(after, page)
            if not batch:
                return
            yield from batch
            after = batch[-1].position

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources; the log is unusable afterwards."""
