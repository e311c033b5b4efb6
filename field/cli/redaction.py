"""Secrets kept out of the log, at every level.

At ``--log-level debug`` websockets logs each handshake's headers and each
frame it sends or receives, and uvicorn logs each WebSocket's path with its
query string. Bearer tokens (``Authorization`` or ``?token=``), the operator
token, webhook and source secrets and a REGISTER response's token would all
reach the log that way. :func:`install` makes every log record redacted as it
is made (a record factory, so that every logger and every handler is covered,
uvicorn's and the libraries' included), and the line is kept:

* the payload of a WebSocket data frame is replaced by its size (a frame is
  any message: a SUBSCRIBE with a secret, a response with a token);
* the value after ``Authorization`` (its scheme kept), after ``Bearer``, of a
  ``...token=`` or ``...secret=`` parameter, of a ``"...token"`` or
  ``"...secret"`` key, of a ``whsec_`` secret, of a ``fieldreg_`` registration
  token and of a URL's password becomes ``<redacted>``;
* so does the value of every query-string parameter whose name, percent-decoded
  as the server decodes it (``?tok%65n=`` authenticates as ``?token=``), holds
  ``token``, ``secret``, ``password``, ``auth``, ``key`` or ``sig``: in
  the access log's paths, uvicorn's WebSocket lines, and a webhook URL;
* an exception's text is rendered and redacted too.

Patterns rather than known values: agent tokens are made at run time and a
process never holds them in the clear. What they cannot recognise (a secret
in free text) the Field never logs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_plus

try:
    from websockets.frames import Frame, Opcode
except ImportError:  # the client alone (field mcp): no WebSocket frame is ever logged
    Frame = Opcode = None  # type: ignore[assignment,misc]

REDACTED = "<redacted>"

#: (pattern, replacement): each keeps what names the secret and drops its value.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer x / ('authorization', 'Bearer x') / authorization=x
    (
        re.compile(
            r"(?i)(authorization['\"]?\s*[:=,]\s*(?:b?['\"])?)((?:bearer|basic|token)\s+)?"
            r"[^\s'\",;)\]}]+"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer\s+)[^\s'\",;)\]}]+"), r"\1" + REDACTED),
    # "token": "x", 'webhook_secret': 'x', token='x'
    (
        re.compile(r"(?i)\b(\w*(?:token|secret)['\"]?\s*[:=]\s*b?['\"])[^'\"]+"),
        r"\1" + REDACTED,
    ),
    # ?token=x, &secret=x, access_token=x
    (re.compile(r"(?i)\b(\w*(?:token|secret)=)(?!b?['\"])[^&\s'\"#]+"), r"\1" + REDACTED),
    (re.compile(r"whsec_[A-Za-z0-9+/=_-]+"), "whsec_" + REDACTED),
    # a registration token, wherever it stands
    (re.compile(r"fieldreg_[A-Za-z0-9_-]+"), "fieldreg_" + REDACTED),
    # scheme://user:password@host
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1" + REDACTED + "@"),
)

#: Frames whose payload is a message (the others carry a close code, or ping bytes).
_DATA_FRAMES = (
    frozenset() if Opcode is None else frozenset({Opcode.TEXT, Opcode.BINARY, Opcode.CONT})
)


#: A parameter of a URL's query string (``?name=value`` or ``&name=value``).
_QUERY_PARAMETER = re.compile(r"([?&])([^=&#\s'\"?]+)=([^&#\s'\"]*)")
#: What a query parameter's decoded name holds when its value is a credential.
_CREDENTIAL_NAMES = ("token", "secret", "password", "passwd", "auth", "key", "signature", "sig")


def _query_parameter(match: re.Match[str]) -> str:
    """A query parameter with its value redacted if its name, decoded as a server
    decodes it (``tok%65n`` is ``token``), names a credential."""
    name = unquote_plus(match.group(2)).lower()
    if not match.group(3) or not any(word in name for word in _CREDENTIAL_NAMES):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}={REDACTED}"


def redact(text: str) -> str:
    """``text`` with every secret the patterns recognise replaced by ``<redacted>``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    if "=" in text:
        text = _QUERY_PARAMETER.sub(_query_parameter, text)
    return text


def _safe_arg(arg: Any) -> Any:
    """A data frame as its opcode and size (websockets logs ``< %s`` with the frame)."""
    if Frame is not None and isinstance(arg, Frame) and arg.opcode in _DATA_FRAMES:
        return f"{arg.opcode.name} [{len(arg.data)} bytes]"
    return arg


def redact_record(record: logging.LogRecord) -> None:
    """Redact ``record`` in place: its message, its arguments, its exception text."""
    args = record.args
    if isinstance(args, tuple) and args:
        args = tuple(_safe_arg(arg) for arg in args)
    if record.name == "uvicorn.access" and isinstance(args, tuple):
        # its formatter reads the arguments one by one: keep them, redacted
        record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
    else:
        record.args = args
        record.msg = redact(record.getMessage())
        record.args = None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def install() -> None:
    """Redact every log record of this process from now on (once; idempotent)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    redacting: Callable[..., logging.LogRecord] = factory
    redacting.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting)
