"""Event log backends: the Field's source of truth (see :mod:`field.store.base`)."""

from __future__ import annotations

import os
from pathlib import Path

from field.contract.errors import OperationalError
from field.store.base import EventLog, LogEntry, StoredEntry
from field.store.memory import MemoryEventLog
from field.store.sqlite import SQLiteEventLog

__all__ = [
    "DB_FILENAME",
    "WEBHOOK_KEY_FILENAME",
    "EventLog",
    "is_log_url",
    "redact_log_url",
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


#: How a PostgreSQL log's URL begins (``--log``).
LOG_URL_SCHEMES = ("postgresql://", "postgres://")


def is_log_url(url: str) -> bool:
    """Whether ``url`` names a log this server can open (a PostgreSQL URL)."""
    return url.startswith(LOG_URL_SCHEMES)


def open_log(
    data_dir: str | os.PathLike[str] | None,
    *,
    synchronous: str = "full",
    url: str | None = None,
) -> EventLog:
    """The event log: the PostgreSQL database ``url`` names when given (shared by every
    server opened on it: the nodes of one Field); else in memory for a ``data_dir`` of
    ``None``, or ``<data_dir>/field.db``."""
    if synchronous not in ("full", "normal"):
        raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
    if url is not None:
        if not is_log_url(url):
            raise ValueError("the log URL must begin with postgresql:// or postgres://")
        from field.store.postgres import PostgresEventLog  # the driver is an optional extra

        return PostgresEventLog(url)
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


def redact_log_url(url: str) -> str:
    """``url`` as logs may show it: scheme, host, port and database, no user or password."""
    from field.store.postgres import redact

    return redact(url)
