"""Event log backends: the Field's source of truth (see :mod:`field.store.base`)."""

from __future__ import annotations

import os
from pathlib import Path

from field.errors import OperationalError
from field.store.base import EventLog, LogEntry, StoredEntry
from field.store.memory import MemoryEventLog
from field.store.sqlite import SQLiteEventLog

__all__ = [
    "DB_FILENAME",
    "WEBHOOK_KEY_FILENAME",
    "EventLog",
    "LogEntry",
    "MemoryEventLog",
    "SQLiteEventLog",
    "StoredEntry",
    "open_log",
]

#: The name of the SQLite file inside a data directory.
DB_FILENAME = "field.db"
#: The key that seals webhook secrets in the log, inside a data directory by default.
WEBHOOK_KEY_FILENAME = "webhook.key"


def open_log(data_dir: str | os.PathLike[str] | None, *, synchronous: str = "full") -> EventLog:
    """The event log for ``data_dir``: in memory for ``None``, else ``<data_dir>/field.db``."""
    if synchronous not in ("full", "normal"):
        raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
    if data_dir is None:
        return MemoryEventLog()
    directory = Path(data_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationalError(
            f"cannot create the data directory: {exc.strerror or exc}",
            suggested_action="Choose a --data-dir the server can create and write.",
        ) from None
    return SQLiteEventLog(directory / DB_FILENAME, synchronous=synchronous)
