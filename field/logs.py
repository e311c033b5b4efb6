"""The log of ``field serve``: one line per record, as text or as JSON, on stderr.

:func:`configure` sets up every logger of the process, uvicorn's included,
to write through one handler:

* ``text`` (the default): ``<time> <LEVEL> <logger>: <message>``;
* ``json``: one JSON object per line, with ``time`` (UTC, ISO 8601),
  ``level``, ``logger`` and ``event`` (the message), then what the record
  knows among :data:`FIELDS`: the operation lines (``field.operation``,
  ``--access-log``) carry ``transport``, ``operation``, ``status``,
  ``outcome``, ``duration_ms``, ``agent`` and ``request_id`` (the envelope's
  ``id``); uvicorn's access lines (``uvicorn.access``) ``client``,
  ``method``, ``path`` and ``status``; a record with an exception its
  ``exception``.

Every record is redacted as it is made (:mod:`field.redaction`); the JSON
formatter redacts the extra fields too, which are set on a record after it
is made.
"""

from __future__ import annotations

import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

import orjson

from .redaction import redact

#: The format of a ``text`` line.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The fields a JSON line takes from a record, when it has them.
FIELDS = (
    "transport",
    "operation",
    "status",
    "outcome",
    "duration_ms",
    "agent",
    "request_id",
)
#: uvicorn's access line: ``'%s - "%s %s HTTP/%s" %d'`` of these.
_ACCESS_ARGS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            line.update(zip(_ACCESS_ARGS, args, strict=True))
        values = record.__dict__
        for name in FIELDS:
            value = values.get(name)
            if value is not None:
                line[name] = redact(value) if isinstance(value, str) else value
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self.formatException(record.exc_info))
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = redact(record.stack_info)
        return orjson.dumps(line, default=str).decode()


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` of ``field serve``: every record, uvicorn's too,
    through one handler on stderr, formatted as ``log_format`` (``text`` or ``json``)."""
    formatter: dict[str, Any] = (
        {"()": JsonFormatter} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    inherit = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"field": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "field",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        # uvicorn's own configuration gives its loggers handlers of their own: not here
        "loggers": {
            **{name: dict(inherit) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
            **{name: {"level": _quieter(level)} for name in QUIET_LOGGERS},
        },
    }


#: Libraries' loggers whose INFO lines are notes nobody asked for (the MCP session
#: manager starting and stopping): shown from ``--log-level debug``, else from WARNING.
QUIET_LOGGERS = ("mcp.server.streamable_http_manager",)


def _quieter(level: str) -> str:
    """A quiet logger's level: WARNING, unless ``level`` is DEBUG or above WARNING."""
    if level.upper() == "DEBUG":
        return "DEBUG"
    return max(level.upper(), "WARNING", key=logging.getLevelName)


def configure(level: str, log_format: str) -> None:
    """Set up the process's logging (:func:`logging_config`)."""
    logging.config.dictConfig(logging_config(level, log_format))
