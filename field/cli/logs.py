"""The log of ``field serve``: one line per record, as text or as JSON, on stderr.

:func:`configure` sets up every logger of the process, uvicorn's included,
to write through one handler:

* ``text`` (the default): ``<time> <LEVEL> <logger>: <message>``;
* ``json``: one JSON object per line, with ``time`` (UTC, ISO 8601),
  ``level``, ``logger`` and ``event`` (the message), then what the record
  knows among :data:`FIELDS`, each a key of its own, and a record with an
  exception its ``exception``.

With ``--access-log`` (:mod:`field.transports.access`) each HTTP request has
one line (``field.access``): ``request_id`` (the request's ``X-Request-Id``,
or one the Field made, sent back in the response's), ``client``, ``method``,
``path`` (with its query string, redacted), ``status``, ``duration_ms``,
``transport``, and what the Field learned answering it: ``agent``,
``operation``, ``outcome`` (``ok`` or the error code), ``message_id`` (the
envelope's ``id``). A push connection (WebSocket, SSE stream, an MCP
session's GET stream) has a line when it opens (``stream``: ``open``), and
its last line (``closed``) has ``subscriptions``, ``close_code`` and
``close_reason``. An operation sent on a WebSocket, or run for a RAP
invocation, has a line of its own (``field.operation``) with ``transport``,
``operation``, ``status``, ``outcome``, ``duration_ms``, ``agent``,
``message_id`` and the ``request_id`` of its WebSocket or invocation.
uvicorn's own access lines are off, and its INFO line for each WebSocket
handshake is a DEBUG line.

Every record is redacted as it is made (:mod:`field.cli.redaction`); the JSON
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
    "request_id",
    "client",
    "method",
    "path",
    "status",
    "duration_ms",
    "transport",
    "agent",
    "operation",
    "outcome",
    "message_id",
    "stream",
    "subscriptions",
    "close_code",
    "close_reason",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
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
            **{name: dict(inherit) for name in ("uvicorn", "uvicorn.access")},
            **{name: {"level": _quieter(level)} for name in QUIET_LOGGERS},
            # its errors stay; its notes of starting and stopping, which the Field's own
            # lines say better ("Field ready at ...", "... stopped; log closed"), do not
            "uvicorn.error": {**inherit, "level": _quieter(level)},
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
