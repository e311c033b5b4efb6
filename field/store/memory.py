"""An in-memory event log, for tests and for Fields that need no durability.

:class:`MemoryEventLog` keeps the invariants of :mod:`field.store.base`
except durability: its entries are lost when the process ends. Each
entry's ``data`` is validated and serialized with orjson when it is
appended, exactly as the SQLite backend does, so the two backends accept
and reject the same entries and neither is affected by later mutation of
the caller's dict.

This module also holds :func:`encode_entry`, the validation and
serialization shared by every backend.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from field.contract.errors import LogWriteError
from field.store.base import EventLog, LogEntry, StoredEntry

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _check_fields(entry: Any) -> None:
    """Raise ``TypeError``/``ValueError`` when ``entry`` is not a storable LogEntry."""
    if not isinstance(entry, LogEntry):
        raise TypeError(f"expected a LogEntry, got {type(entry).__name__}")
    if isinstance(entry.epoch, bool) or not isinstance(entry.epoch, int):
        raise TypeError(f"epoch must be an int, got {type(entry.epoch).__name__}")
    if not _INT64_MIN <= entry.epoch <= _INT64_MAX:
        raise ValueError(f"epoch {entry.epoch} does not fit in 64 bits")
    if not isinstance(entry.kind, str):
        raise TypeError(f"kind must be a str, got {type(entry.kind).__name__}")
    if entry.agent_id is not None and not isinstance(entry.agent_id, str):
        raise TypeError(f"agent_id must be a str or None, got {type(entry.agent_id).__name__}")
    if isinstance(entry.ts, bool) or not isinstance(entry.ts, int | float):
        raise TypeError(f"ts must be a number, got {type(entry.ts).__name__}")
    if not math.isfinite(entry.ts):
        raise ValueError(f"ts must be finite, got {entry.ts!r}")
    if not isinstance(entry.data, dict):
        raise TypeError(f"data must be a dict, got {type(entry.data).__name__}")


def encode_entry(entry: LogEntry, index: int = 0) -> bytes:
    """Validate ``entry`` and return its ``data`` as orjson bytes.

    Raises :class:`~field.contract.errors.LogWriteError` (chaining the cause) when
    the entry has a wrong field type or data that is not JSON-serializable.
    ``index`` is the entry's place in its batch, for the error message.
    """
    try:
        _check_fields(entry)
        return orjson.dumps(entry.data)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise LogWriteError(
            f"log entry {index} of the batch cannot be stored: {exc}",
            details={"index": index},
        ) from exc


def within(max_bytes: int, sizes: Sequence[int]) -> int:
    """How many of ``sizes``, from the first, fit in ``max_bytes`` (always at least one)."""
    total = 0
    for count, size in enumerate(sizes):
        total += size
        if total > max_bytes and count:
            return count
    return len(sizes)


def encode_batch(entries: Sequence[LogEntry]) -> list[bytes]:
    """Encode every entry of a batch, or raise LogWriteError before any is stored."""
    return [encode_entry(entry, index) for index, entry in enumerate(entries)]


class MemoryEventLog(EventLog):
    """A list-backed, thread-safe, non-persistent :class:`EventLog`.

    The log stores each entry's data as orjson bytes and decodes a fresh
    dict on every read, so neither the appender nor a reader can change
    what the log holds by mutating a dict.
    """

    persistent = False
    backend = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Row i holds position i + 1: (epoch, kind, agent_id, ts, data bytes).
        self._rows: list[tuple[int, str, str | None, float, bytes]] = []

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        """Store ``entries`` atomically; return their positions."""
        # each held as a copy of its own size: orjson's bytes keep its ~4 KB write buffer
        rows = [
            (entry.epoch, entry.kind, entry.agent_id, float(entry.ts), memoryview(blob).tobytes())
            for entry, blob in zip(entries, encode_batch(entries), strict=True)
        ]
        with self._lock:
            first = len(self._rows) + 1
            self._rows.extend(rows)
        return list(range(first, first + len(rows)))

    def read(self, after: int = 0, limit: int = 1000) -> list[StoredEntry]:
        """Entries with ``position > after``, ascending, at most ``limit``."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        start = max(after, 0)
        with self._lock:
            rows = self._rows[start : start + limit]
        return [
            StoredEntry(start + i + 1, epoch, kind, orjson.loads(blob), agent_id, ts)
            for i, (epoch, kind, agent_id, ts, blob) in enumerate(rows)
        ]

    def read_positions(
        self, positions: Iterable[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """The entries at ``positions`` (ascending, each once; absent ones left out);
        with ``max_bytes``, the prefix whose stored data fits (at least one)."""
        wanted = sorted(set(positions))
        with self._lock:
            rows = [(p, self._rows[p - 1]) for p in wanted if 1 <= p <= len(self._rows)]
        if max_bytes is not None:
            rows = rows[: within(max_bytes, [len(row[4]) for _, row in rows])]
        return [
            StoredEntry(p, epoch, kind, orjson.loads(blob), agent_id, ts)
            for p, (epoch, kind, agent_id, ts, blob) in rows
        ]

    def last_position(self) -> int:
        """The position of the newest entry, or 0 for an empty log."""
        with self._lock:
            return len(self._rows)
